//! Prints our model's logits for a text as JSON, for comparing exports
//! with other libraries (bench/export_check.py):
//!
//! `cargo run -p mlx-llama --example logits -- --checkpoint runs/latest --text "Once upon a time"`
//!
//! Output: `{"checkpoint": DIR, "ids": [token ids], "logits": [[vocab floats] per token]}`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use mlx_array::Array;

fn main() -> Result<()> {
    let mut checkpoint = PathBuf::from("runs/latest");
    let mut text = String::from("Once upon a time");
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let value = args
            .next()
            .with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--checkpoint" => checkpoint = value.into(),
            "--text" => text = value,
            _ => bail!("unknown argument `{flag}`: use --checkpoint DIR and --text TEXT"),
        }
    }
    let trained = mlx_llama::checkpoint::load_trained(&checkpoint)?;
    let tokenizer = mlx_llama::trainer::tokenizer_for(&trained.config)?;
    let ids = tokenizer.encode(&text)?;
    if ids.is_empty() {
        bail!("`{text}` has no tokens");
    }
    let tokens = Array::from_slice(&ids, &[1, ids.len()])?;
    let logits = trained.model.forward(&tokens)?.to_vec::<f32>()?;
    let rows: Vec<&[f32]> = logits.chunks(trained.model.config.vocab_size).collect();
    let out = serde_json::json!({
        "checkpoint": trained.dir,
        "ids": ids,
        "logits": rows,
    });
    println!("{out}");
    Ok(())
}
