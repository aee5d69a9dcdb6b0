//! The Llama model and its data-parallel trainer: the end-to-end experiment
//! of this workspace.
//!
//! ```no_run
//! use mlx_llama::{train, TrainConfig};
//! let world = mlx_dist::init(mlx_dist::Backend::Any)?;   // size 1 without mlx-launch
//! let summary = train(&TrainConfig::default(), &world)?; // the reference experiment
//! println!("final loss {:?}", summary.losses.last());
//! # Ok::<(), anyhow::Error>(())
//! ```
pub mod adapters;
pub mod checkpoint;
pub mod config;
pub mod console;
pub mod curves;
pub mod eval;
pub mod export;
pub mod grad_checkpoint;
pub mod import;
pub mod memory_budget;
pub mod metrics;
pub mod model;
pub mod options_file;
pub mod pipeline;
pub mod run_folder;
pub mod sampling;
pub mod source;
mod sync;
pub mod tensorboard;
#[doc(hidden)]
pub mod testing;
pub mod trainer;
pub mod weights;

pub use config::{
    Batching, CommunicationDtype, DataSource, FloatDtype, ScheduleKind, ShardMode, TokenizerChoice,
    TrainConfig,
};
pub use model::{KvCache, Llama, LlamaConfig};
pub use source::ModelSource;
pub use trainer::{StepTransfers, Summary, train, train_accepted};
