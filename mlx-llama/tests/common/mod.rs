//! What several of the trainer's test files share: the tiny model they
//! train and a checkpoint's weights.

// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use mlx_llama::{Batching, DataSource, LlamaConfig, TrainConfig};

/// Two layers of 32 dimensions on blocks of 32 tokens of the offline corpus,
/// 4 sequences a step: trains in well under a second a step.
pub fn tiny(out: &Path, steps: u64) -> TrainConfig {
    TrainConfig {
        model: LlamaConfig {
            num_layers: 2,
            vocab_size: 0,
            dims: 32,
            mlp_dims: 64,
            num_heads: 2,
            ..LlamaConfig::default()
        },
        steps,
        global_batch: 4,
        block_size: 32,
        learning_rate: 3e-3,
        data: DataSource::Offline,
        batching: Batching::Pack,
        out_dir: out.to_path_buf(),
        data_cache: Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mlx-data-cache")),
        ..TrainConfig::default()
    }
}

/// The f32 weights of the newest checkpoint under `out`, by name.
pub fn weights(out: &Path) -> Vec<(String, Vec<f32>)> {
    let dir = mlx_llama::checkpoint::latest(out)
        .unwrap()
        .expect("a checkpoint");
    let (w, _) = mlx_array::load_safetensors(dir.join("model.safetensors")).unwrap();
    w.into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect()
}
