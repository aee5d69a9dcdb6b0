//! Test support, not part of the API: the tiny run the tests of this crate
//! (unit and integration) train, written once.

use std::path::{Path, PathBuf};

use crate::{Batching, DataSource, LlamaConfig, TrainConfig};

/// `num_layers` blocks of `dims` width with an MLP twice as wide and two
/// heads, taking the tokenizer's vocabulary.
pub fn tiny_model(num_layers: usize, dims: usize) -> LlamaConfig {
    LlamaConfig {
        num_layers,
        vocab_size: 0,
        dims,
        mlp_dims: 2 * dims,
        num_heads: 2,
        ..LlamaConfig::default()
    }
}

/// Two layers of 32 dimensions on blocks of 32 tokens of the offline
/// corpus, 4 sequences a step at learning rate 3e-3, its token store cached
/// in `data_cache`; without the reference experiment's evaluations and
/// timed checkpoints. Trains in well under a second a step.
pub fn tiny(out: &Path, steps: u64, data_cache: PathBuf) -> TrainConfig {
    TrainConfig {
        model: tiny_model(2, 32),
        steps,
        global_batch: 4,
        block_size: 32,
        learning_rate: 3e-3,
        data: DataSource::Offline,
        batching: Batching::Pack,
        eval_every: 0,
        checkpoint_interval_s: 0,
        out_dir: out.to_path_buf(),
        data_cache: Some(data_cache),
        ..TrainConfig::default()
    }
}
