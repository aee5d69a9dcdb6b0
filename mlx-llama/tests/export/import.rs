//! `--init-from` and `generate --checkpoint` on a model folder: an export
//! read back ([`mlx_llama::import`]) gives the same weights and logits, in
//! either format and sharded; what we cannot honour is refused by name;
//! training starts from the imported weights.

use std::path::Path;

use mlx_array::Array;
use mlx_llama::export::{self, Format};
use mlx_llama::import;
use mlx_llama::{LlamaConfig, TokenizerChoice, TrainConfig};
use mlx_nn::ModuleExt;

use super::{BLOCK, config, model, ours, tokenizer};

fn weights(m: &mlx_llama::Llama) -> Vec<(String, Vec<f32>)> {
    m.named_parameters()
        .into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect()
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let p = dir.join("config.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
    edit(&mut v);
    std::fs::write(&p, v.to_string()).unwrap();
}

#[test]
fn an_export_imports_to_the_same_weights_and_logits_in_both_formats() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let m = model();
    for format in [Format::Hf, Format::Mlx] {
        let dir = tmp.path().join(format!("{format:?}"));
        export::write(&m, &tok, BLOCK, &dir, format).unwrap();
        assert!(import::is_model_folder(&dir));
        let back = import::load(&dir).unwrap();
        // The same model, which now knows its context length.
        let want = LlamaConfig {
            max_position_embeddings: BLOCK,
            ..m.config.clone()
        };
        assert_eq!(back.config, want, "{format:?}");
        assert_eq!(weights(&back), weights(&m), "{format:?}");
        assert_eq!(ours(&back), ours(&m), "{format:?}");
    }
}

#[test]
fn sharded_weights_with_an_index_import_as_one_file_does() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let m = model();
    let dir = tmp.path().join("sharded");
    export::write(&m, &tok, BLOCK, &dir, Format::Hf).unwrap();
    let (tensors, _) = mlx_array::load_safetensors(dir.join("model.safetensors")).unwrap();
    std::fs::remove_file(dir.join("model.safetensors")).unwrap();
    let mut map = serde_json::Map::new();
    let (a, b): (Vec<_>, Vec<_>) = tensors
        .into_iter()
        .enumerate()
        .partition(|(i, _)| i % 2 == 0);
    for (file, part) in [
        ("model-00001-of-00002.safetensors", a),
        ("model-00002-of-00002.safetensors", b),
    ] {
        let part: Vec<(String, Array)> = part.into_iter().map(|(_, t)| t).collect();
        for (n, _) in &part {
            map.insert(n.clone(), file.into());
        }
        mlx_array::save_safetensors(dir.join(file), &part, None).unwrap();
    }
    std::fs::write(
        dir.join(import::INDEX),
        serde_json::json!({"metadata": {}, "weight_map": map}).to_string(),
    )
    .unwrap();
    assert!(import::is_model_folder(&dir));
    assert_eq!(ours(&import::load(&dir).unwrap()), ours(&m));
}

#[test]
fn tied_embeddings_stay_one_tensor_and_what_we_cannot_honour_is_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, tok) = tokenizer(tmp.path());
    let m = model();
    let dir = tmp.path().join("m");
    export::write(&m, &tok, BLOCK, &dir, Format::Hf).unwrap();
    let refused = |edit: &dyn Fn(&mut serde_json::Value), names: &str| {
        let copy = tmp.path().join("copy");
        std::fs::create_dir_all(&copy).unwrap();
        for f in ["config.json", "model.safetensors"] {
            std::fs::copy(dir.join(f), copy.join(f)).unwrap();
        }
        edit_config(&copy, |v| edit(v));
        let e = format!("{:#}", import::load(&copy).unwrap_err());
        assert!(e.contains(names), "{names}: {e}");
    };
    refused(
        &|v| v["architectures"] = serde_json::json!(["GPT2LMHeadModel"]),
        "`architectures`",
    );
    refused(
        &|v| v["rope_scaling"] = serde_json::json!({"rope_type": "yarn", "factor": 8.0}),
        "`rope_scaling.rope_type`",
    );
    refused(
        &|v| v["num_key_value_heads"] = serde_json::json!(3),
        "`num_key_value_heads`",
    );
    // Heads wider than the tensors in the file.
    refused(
        &|v| v["head_dim"] = serde_json::json!(16),
        "model.layers.0.self_attn.q_proj.weight",
    );
    refused(
        &|v| v["intermediate_size"] = serde_json::json!(64),
        "model.layers.0.mlp.gate_proj.weight",
    );
    // Tied: the output projection is the embedding itself.
    let (tensors, _) = mlx_array::load_safetensors(dir.join("model.safetensors")).unwrap();
    let tensors: Vec<(String, Array)> = tensors
        .into_iter()
        .filter(|(n, _)| n != "lm_head.weight")
        .collect();
    mlx_array::save_safetensors(dir.join("model.safetensors"), &tensors, None).unwrap();
    let e = format!("{:#}", import::load(&dir).unwrap_err());
    assert!(e.contains("`lm_head.weight`"), "{e}");
    edit_config(&dir, |v| v["tie_word_embeddings"] = true.into());
    let tied = import::load(&dir).unwrap();
    assert!(tied.out_proj.is_none() && tied.config.tie_embeddings);
    assert_eq!(
        tied.named_parameters().len() + 1,
        m.named_parameters().len()
    );
    // Its logits are those of the untied model whose output projection is
    // a copy of the embedding.
    let mut copy = m.clone();
    copy.out_proj
        .as_mut()
        .unwrap()
        .weight
        .set(m.embedding.weight.value().clone());
    let tokens = Array::from_slice(&[1u32, 5, 9, 2], &[1, 4]).unwrap();
    assert_eq!(
        tied.forward(&tokens).unwrap().to_vec::<f32>().unwrap(),
        copy.forward(&tokens).unwrap().to_vec::<f32>().unwrap()
    );
}

#[test]
fn training_from_an_export_starts_from_its_weights_and_generate_reads_the_folder() {
    let tmp = tempfile::tempdir().unwrap();
    let (tok_path, tok) = tokenizer(tmp.path());
    let m = model();
    let dir = tmp.path().join("pretrained");
    export::write(&m, &tok, BLOCK, &dir, Format::Hf).unwrap();
    // The model options differ from the folder's: its config.json rules.
    let run = tmp.path().join("run");
    let cfg = TrainConfig {
        model: mlx_llama::LlamaConfig {
            dims: 64,
            ..config()
        },
        steps: 1,
        global_batch: 2,
        block_size: 16,
        learning_rate: 0.0,
        weight_decay: 0.0,
        data: mlx_llama::DataSource::Offline,
        tokenizer: TokenizerChoice::File(tok_path),
        out_dir: run.clone(),
        data_cache: Some(tmp.path().join("cache")),
        init_from: Some(dir.clone().into()),
        eval_every: 0,
        checkpoint_interval_s: 0,
        ..TrainConfig::default()
    };
    mlx_llama::train(&cfg, &mlx_dist::Group::single()).unwrap();
    // At learning rate 0 the checkpoint holds the imported weights.
    let trained = mlx_llama::checkpoint::load_trained(&run).unwrap();
    let want = LlamaConfig {
        max_position_embeddings: BLOCK,
        ..m.config.clone()
    };
    assert_eq!(trained.model.config, want);
    assert_eq!(weights(&trained.model), weights(&m));
    // generate reads the folder as it reads a checkpoint.
    let run_generate = |checkpoint: &Path| {
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
            .args([
                "generate",
                "--temp",
                "0",
                "--max-tokens",
                "6",
                "--prompt",
                "w1 w2 w3",
            ])
            .arg("--checkpoint")
            .arg(checkpoint)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let from_folder = run_generate(&dir);
    assert_eq!(from_folder, run_generate(&run));
    let want = m
        .generate(&tok.encode("w1 w2 w3").unwrap(), 6, 0.0, 0)
        .unwrap();
    let stop = want
        .iter()
        .position(|&t| t == tok.eos_id())
        .unwrap_or(want.len());
    assert_eq!(
        from_folder,
        format!("w1 w2 w3{}\n", tok.decode(&want[..stop]).unwrap())
    );
}
