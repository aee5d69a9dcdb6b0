//! The tokenizer files transformers' `AutoTokenizer` (and so mlx-lm) loads.

use std::path::Path;

use anyhow::{Context, Result};
use mlx_data::TextTokenizer;
use serde_json::json;

/// Writes `tokenizer.json`, `tokenizer_config.json` (a plain fast tokenizer
/// that adds no BOS, so its ids are ours) and `special_tokens_map.json`
/// into `dir`.
pub fn write_files(tokenizer: &TextTokenizer, dir: &Path) -> Result<()> {
    let path = dir.join("tokenizer.json");
    tokenizer
        .save(&path)
        .with_context(|| format!("writing {}", path.display()))?;
    let eos = tokenizer
        .inner()
        .id_to_token(tokenizer.eos_id())
        .with_context(|| format!("the tokenizer has no token {}", tokenizer.eos_id()))?;
    let config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": eos,
        "eos_token": eos,
        "unk_token": eos,
        "add_bos_token": false,
        "add_eos_token": false,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": 1_000_000_000_000_000_000u64,
    });
    let special = json!({ "bos_token": eos, "eos_token": eos, "unk_token": eos });
    for (name, value) in [
        ("tokenizer_config.json", config),
        ("special_tokens_map.json", special),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(&value)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}
