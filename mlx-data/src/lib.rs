//! Data for training language models on N processes: sources (TinyStories' parquet
//! shards on the Hugging Face Hub, local text, JSON Lines or parquet files, a
//! built-in offline corpus), tokenizers, a pre-tokenized memory-mapped token store
//! built once per machine (parquet and JSON Lines are streamed into it batch by
//! batch, row group by row group), and a sharded, resumable, prefetching loader
//! that gives each rank only its own samples.
//!
//! ```no_run
//! use mlx_data::{prepare, DataConfig, DataLoader, LoaderConfig, BatchSize, Prefetcher};
//!
//! # fn main() -> mlx_data::Result<()> {
//! let data = prepare(&DataConfig::default())?; // Hub if reachable, else offline corpus
//! let cfg = LoaderConfig { rank: 0, world: 2, batch: BatchSize::Global(4), ..Default::default() };
//! let mut batches = Prefetcher::spawn(DataLoader::new(data.train.clone(), cfg)?, 4)?;
//! let batch = batches.next_batch()?;          // 2 rows of block_size + 1 tokens
//! let (x, y) = batch.inputs_targets()?;       // (2, 512) u32 Arrays: [:, :-1], [:, 1:]
//! let mask = batch.loss_mask_array()?;        // (2, 512) f32, 0 on padding targets
//! let saved = batches.state().to_json();      // for an exact resume later
//! # let _ = (x, y, mask, saved);
//! # Ok(()) }
//! ```

pub mod arrays;
pub mod batch;
pub mod chat;
pub mod corpus;
pub mod error;
pub mod hub;
pub mod loader;
pub mod lockfile;
pub mod pipeline;
pub mod prefetch;
pub mod rng;
pub mod sampler;
pub mod source;
pub mod split;
pub mod store;
pub mod tokenizer;

pub use arrays::BatchArrays;
pub use batch::{Batch, BatchMode};
pub use chat::{ChatRenderer, ChatTemplate};
pub use corpus::OfflineCorpus;
pub use error::{DataError, Result};
pub use hub::{HubClient, HubConfig, RepoKind};
pub use loader::{BatchSize, DataLoader, LoaderConfig, LoaderState};
pub use pipeline::{DataConfig, Prepared, TokenizerSpec, prepare};
pub use prefetch::Prefetcher;
pub use sampler::ShardedSampler;
pub use source::{
    Corpus, Example, HubDataset, HubFiles, LocalFormat, LocalOptions, LocalSource, SourceSpec,
};
pub use split::Split;
pub use store::{TokenStore, Verify};
pub use tokenizer::TextTokenizer;
