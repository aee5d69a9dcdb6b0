//! Everything a training run is configured by, serialisable into checkpoints.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::LlamaConfig;

/// Where the text comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DataSource {
    /// TinyStories from the Hub (its parquet shards), else the built-in offline corpus.
    Auto,
    /// The built-in offline corpus only.
    Offline,
    /// TinyStories from the Hub only.
    Hub,
    /// Local text files: train and validation paths, stories separated by `<|endoftext|>`.
    Text { train: PathBuf, validation: PathBuf },
    /// Local JSON Lines with a `text` field.
    JsonLines { train: PathBuf, validation: PathBuf },
    /// Local parquet with a `text` column: each path a file or a folder of `*.parquet`.
    Parquet { train: PathBuf, validation: PathBuf },
}

/// Which tokenizer to use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum TokenizerChoice {
    /// GPT-2, embedded in the binary (no network, no files).
    Auto,
    /// A `tokenizer.json` file.
    File(PathBuf),
    /// A folder with GPT-2's `vocab.json` and `merges.txt`.
    Gpt2Files(PathBuf),
    /// A byte-level BPE of this size trained on the corpus.
    Train(usize),
}

/// Learning-rate schedule after warmup.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ScheduleKind {
    /// The base rate throughout.
    Constant,
    /// Cosine decay to 10% of the base rate at the last step.
    Cosine,
}

/// Padding or packing of stories into rows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Batching {
    /// One story per row, truncated or padded (padding does not count in the loss).
    Pad,
    /// Stories concatenated and cut into contiguous windows.
    Pack,
}

/// A floating-point dtype a run computes or communicates in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FloatDtype {
    /// 32-bit floats.
    #[default]
    F32,
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
    /// IEEE half precision: 11 bits of mantissa, a narrow range.
    F16,
}

impl FloatDtype {
    /// The array dtype.
    pub fn dtype(self) -> mlx_array::Dtype {
        match self {
            FloatDtype::F32 => mlx_array::Dtype::F32,
            FloatDtype::Bf16 => mlx_array::Dtype::BF16,
            FloatDtype::F16 => mlx_array::Dtype::F16,
        }
    }
}

/// The dtype gradients travel in between the ranks (MLX's
/// `communication_type` of `average_gradients`; PyTorch's bf16/fp16
/// compression hooks of DDP): they are cast to it before their collectives
/// and back to their own dtype after, which halves the bytes on the wire
/// for f32 gradients at the cost of rounding each rank's gradient (and each
/// partial sum) to it. The new parameters a sharded optimizer gathers always
/// travel in their own dtype.
pub type CommunicationDtype = FloatDtype;

/// A training run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The model. A `vocab_size` of 0 takes the tokenizer's vocabulary (50,257
    /// for GPT-2); a larger tokenizer always grows the model to fit.
    pub model: LlamaConfig,
    /// Optimizer steps.
    pub steps: u64,
    /// Sequences per step across all ranks (split evenly), unless `per_rank_batch` is set.
    pub global_batch: usize,
    /// Sequences per step on each rank (overrides `global_batch`).
    pub per_rank_batch: Option<usize>,
    /// Tokens predicted per sequence.
    pub block_size: usize,
    /// Peak learning rate.
    pub learning_rate: f64,
    /// Schedule after warmup.
    pub schedule: ScheduleKind,
    /// Linear warmup steps from 0.
    pub warmup: u64,
    /// AdamW's decoupled weight decay.
    pub weight_decay: f64,
    /// Clip the global gradient norm to this.
    pub grad_clip: Option<f64>,
    /// Ranks each model is split over (tensor parallelism: every block's
    /// heads and MLP hidden features); the world is that many times the
    /// data-parallel replicas. 1: every rank holds the whole model.
    #[serde(default = "one")]
    pub tensor_parallel: usize,
    /// Micro-batches accumulated per optimizer step.
    pub grad_accumulation: usize,
    /// Seed of the initial weights and the data order.
    pub seed: u64,
    /// Text source.
    pub data: DataSource,
    /// Tokenizer.
    pub tokenizer: TokenizerChoice,
    /// Padding or packing.
    pub batching: Batching,
    /// Evaluate on the validation split every this many steps (0: never).
    pub eval_every: u64,
    /// Validation batches per rank per evaluation.
    pub eval_batches: usize,
    /// Checkpoint every this many steps (0: only at the end).
    pub checkpoint_every: u64,
    /// Besides `checkpoint_every`, a checkpoint once this many seconds have
    /// passed since the last one, and at least 50 times as long as the last
    /// one took, so checkpoints cost under 2% of the run (0: off).
    #[serde(default)]
    pub checkpoint_interval_s: u64,
    /// Keep only the newest this many checkpoints, deleting older ones after
    /// each new one is published (0: keep all; `latest` is never deleted).
    #[serde(default)]
    pub keep_checkpoints: usize,
    /// Run folder: metrics, checkpoints.
    pub out_dir: PathBuf,
    /// Log every this many steps.
    pub log_every: u64,
    /// Bucket size of gradient averaging in bytes (MLX's `all_reduce_size`).
    pub all_reduce_size: usize,
    /// The dtype gradients travel in between the ranks; `None`: their own.
    #[serde(default)]
    pub communication_dtype: Option<CommunicationDtype>,
    /// Send only the rows of the embedding's gradient that the batch's
    /// tokens touch (the rest are zero), as PyTorch's sparse embedding
    /// gradients: at world 2 bit for bit the dense average, with a fiftieth
    /// of the reference model's embedding bytes.
    #[serde(default = "yes")]
    pub sparse_embedding_gradients: bool,
    /// The dtype of the forward and backward passes: `f32`, or `bf16` /
    /// `f16` with float32 master weights and optimizer state (mixed
    /// precision; `f16` with a dynamic loss scale).
    #[serde(default)]
    pub dtype: FloatDtype,
    /// The first loss scale of a float16 run (default 65,536, PyTorch's
    /// `GradScaler`); it halves on every step whose gradients overflow and
    /// doubles after 2,000 good ones.
    #[serde(default)]
    pub loss_scale: Option<f64>,
    /// Device: `cpu` or `gpu` (any adapter wgpu finds).
    pub device: String,
    /// Where token stores and tokenizers are cached (default: `MLX_DATA_CACHE`
    /// or `~/.cache/mlx-data`).
    pub data_cache: Option<PathBuf>,
    /// Each rank appends its array memory (`memory::active`/`peak`) after
    /// every step to `<this>.rank<R>.jsonl`, for memory profiling.
    pub memory_log: Option<PathBuf>,
    /// Each rank appends the samples of every step (epoch, and the index in
    /// the token store of each of its rows) to `<this>.rank<R>.jsonl`, to
    /// audit which data a run used.
    #[serde(default)]
    pub sample_log: Option<PathBuf>,
    /// With more than one rank, shard AdamW's moments over the ranks (ZeRO
    /// stage 1: each rank keeps `1 / world` of them, the same results); off,
    /// every rank averages whole gradients and keeps the whole state.
    pub shard_optimizer: bool,
    /// Where the metrics go: TensorBoard event files, metrics.jsonl,
    /// metrics.csv and loss.png (default: all).
    #[serde(default)]
    pub report_to: crate::metrics::ReportTo,
    /// Start from these pretrained weights: a Hugging Face or mlx-lm Llama
    /// folder (config.json and safetensors), which also sets the model's
    /// shape ([`crate::import`]).
    #[serde(default)]
    pub init_from: Option<PathBuf>,
}

impl Default for TrainConfig {
    /// The reference experiment: the reference Llama, batch 4 x 512, AdamW 3e-4, seed 42, 100 steps.
    fn default() -> Self {
        TrainConfig {
            model: LlamaConfig {
                vocab_size: 0,
                ..LlamaConfig::default()
            },
            steps: 100,
            global_batch: 4,
            per_rank_batch: None,
            block_size: 512,
            learning_rate: 3e-4,
            schedule: ScheduleKind::Constant,
            warmup: 0,
            weight_decay: 0.01,
            grad_clip: None,
            grad_accumulation: 1,
            tensor_parallel: 1,
            seed: 42,
            data: DataSource::Auto,
            tokenizer: TokenizerChoice::Auto,
            batching: Batching::Pack,
            eval_every: 0,
            eval_batches: 4,
            checkpoint_every: 0,
            checkpoint_interval_s: 0,
            keep_checkpoints: 0,
            out_dir: PathBuf::from("runs/latest"),
            log_every: 1,
            all_reduce_size: 32 << 20,
            communication_dtype: None,
            sparse_embedding_gradients: true,
            dtype: FloatDtype::F32,
            loss_scale: None,
            device: "cpu".into(),
            data_cache: None,
            memory_log: None,
            sample_log: None,
            shard_optimizer: true,
            report_to: crate::metrics::ReportTo::default(),
            init_from: None,
        }
    }
}

/// `true`, the default of fields added after checkpoints were first written.
fn yes() -> bool {
    true
}

/// 1, the default of counts added after checkpoints were first written.
fn one() -> usize {
    1
}

impl TrainConfig {
    /// The parts of the configuration a checkpoint must agree with to resume.
    pub fn resume_key(&self) -> serde_json::Value {
        serde_json::json!({
            "model": self.model,
            "global_batch": self.global_batch,
            "per_rank_batch": self.per_rank_batch,
            "block_size": self.block_size,
            "grad_accumulation": self.grad_accumulation,
            "seed": self.seed,
            "data": self.data,
            "tokenizer": self.tokenizer,
            "batching": self.batching,
            "shard_optimizer": self.shard_optimizer,
        })
    }
}
