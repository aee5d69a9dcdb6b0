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
    /// Local text files: train and validation paths, documents split on
    /// `--separator`. Without a validation path, `--valid-fraction` of the
    /// training documents is held out.
    Text {
        train: PathBuf,
        validation: Option<PathBuf>,
    },
    /// Local JSON Lines: `text`, `messages` or `prompt` / `completion` rows.
    JsonLines {
        train: PathBuf,
        validation: Option<PathBuf>,
    },
    /// Local parquet with a `text` column: each path a file or a folder of `*.parquet`.
    Parquet {
        train: PathBuf,
        validation: Option<PathBuf>,
    },
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

/// `TRAIN,VALID` as two paths, or `TRAIN` alone (no validation file).
fn pair(s: &str) -> Result<(PathBuf, Option<PathBuf>), String> {
    if s.is_empty() {
        return Err("expected TRAIN[,VALID] paths, got nothing".into());
    }
    Ok(match s.split_once(',') {
        Some((a, b)) => (a.into(), Some(b.into())),
        None => (s.into(), None),
    })
}

impl std::str::FromStr for DataSource {
    type Err = String;
    /// `auto`, `offline`, `hub`, `text:TRAIN[,VALID]`, `jsonl:TRAIN[,VALID]`
    /// or `parquet:TRAIN[,VALID]`.
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => DataSource::Auto,
            "offline" => DataSource::Offline,
            "hub" => DataSource::Hub,
            _ if s.starts_with("text:") => {
                let (train, validation) = pair(&s[5..])?;
                DataSource::Text { train, validation }
            }
            _ if s.starts_with("jsonl:") => {
                let (train, validation) = pair(&s[6..])?;
                DataSource::JsonLines { train, validation }
            }
            _ if s.starts_with("parquet:") => {
                let (train, validation) = pair(&s[8..])?;
                DataSource::Parquet { train, validation }
            }
            _ => {
                return Err(format!(
                    "unknown --data `{s}`: use auto, offline, hub, text:TRAIN[,VALID], \
                     jsonl:TRAIN[,VALID] or parquet:TRAIN[,VALID]"
                ));
            }
        })
    }
}

impl std::str::FromStr for TokenizerChoice {
    type Err = String;
    /// `auto`, `gpt2:DIR`, `train:N`, or a tokenizer.json path.
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s {
            "auto" => TokenizerChoice::Auto,
            _ if s.starts_with("gpt2:") => TokenizerChoice::Gpt2Files(s[5..].into()),
            _ if s.starts_with("train:") => TokenizerChoice::Train(
                s[6..]
                    .parse()
                    .map_err(|_| format!("bad vocabulary size in `{s}`"))?,
            ),
            _ => TokenizerChoice::File(s.into()),
        })
    }
}

/// A size in bytes: digits with an optional binary (KiB, MiB, GiB) or
/// decimal-looking (K, M, G, taken as powers of 1024 too) suffix.
fn byte_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: usize = digits
        .parse()
        .map_err(|_| format!("expected a number of bytes like 4194304 or 4MiB, got `{s}`"))?;
    let scale: usize = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        u => return Err(format!("unknown unit `{u}` in `{s}`: use KiB, MiB or GiB")),
    };
    n.checked_mul(scale)
        .ok_or_else(|| format!("`{s}` is too large"))
}

/// Learning-rate schedule after warmup, as Hugging Face's and torchtitan's
/// (see `trainer::lr_schedule`): with `t` the updates applied before a step,
/// `W` the warmup and `T` the steps, the rate after warmup goes from the
/// base rate at `t = W` towards `--min-lr` at `t = T`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
pub enum ScheduleKind {
    /// The base rate throughout.
    Constant,
    /// Cosine decay to --min-lr (default 10% of the base rate) at --steps
    /// (Hugging Face's cosine_with_min_lr).
    Cosine,
    /// Linear decay to --min-lr (default 0) at --steps (Hugging Face's linear).
    Linear,
    /// Warmup-stable-decay: the base rate, then over the last
    /// --decay-fraction of the steps a linear decay to --min-lr (default 0)
    /// at --steps (torchtitan's wsd with decay_type linear).
    Wsd,
    /// Warmup-stable-decay whose decay is 1 - sqrt(progress) (torchtitan's
    /// sqrt, Hugging Face's 1-sqrt; Hägele et al. 2024).
    WsdSqrt,
}

/// Padding or packing of stories into rows.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize, clap::ValueEnum)]
pub enum Batching {
    /// One story per row, truncated or padded (padding does not count in the loss).
    Pad,
    /// Stories concatenated and cut into contiguous windows.
    Pack,
}

/// What each data-parallel rank keeps of the training state (`--shard`):
/// the ZeRO stages, PyTorch's `ZeroRedundancyOptimizer` and FSDP.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ShardMode {
    /// Everything whole on every rank: gradients averaged with all-sums.
    None,
    /// ZeRO stage 1: the optimizer state sharded; each rank receives only
    /// its shard of the averaged gradients (a reduce-scatter) and the new
    /// parameters are gathered whole.
    #[default]
    Optimizer,
    /// ZeRO stage 2: the gradients sharded too. The same run as
    /// `optimizer` here: the step's graph is evaluated lazily, so a
    /// bucket's gradients are reduce-scattered as soon as the backward pass
    /// has computed them and freed after; no rank ever holds the averaged
    /// gradients whole (PyTorch's stage 1 all-reduces them and keeps them).
    Gradients,
    /// ZeRO stage 3 (FSDP): the parameters sharded too. Each rank keeps a
    /// flat, padded shard of every parameter; a block's weights are
    /// gathered from every rank just before its forward pass (the next
    /// block's while this one computes), freed after it, gathered again
    /// for its backward pass, and its gradients reduce-scattered.
    Parameters,
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

/// A training run: `mlx-llama train`'s options (the field docs are its
/// `--help`), the checkpoints' record of the run (serde), and, through
/// [`Default`], the reference experiment. Each option's default is written
/// once, in its `#[arg]` attribute: [`TrainConfig::default`] is the empty
/// command line, and the run folder's `run.toml` holds the options by their
/// long names ([`crate::options_file`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct TrainConfig {
    /// The model. A `vocab_size` of 0 takes the tokenizer's vocabulary (50,257
    /// for GPT-2); a larger tokenizer always grows the model to fit.
    #[command(flatten, next_help_heading = "Model")]
    pub model: LlamaConfig,
    /// Optimizer steps.
    #[arg(help_heading = "Optimisation", long, default_value_t = 100)]
    pub steps: u64,
    /// Sequences per step across all ranks (split evenly), unless
    /// --per-rank-batch is set.
    #[arg(help_heading = "Optimisation", long, default_value_t = 4)]
    pub global_batch: usize,
    /// Sequences per step on each rank (overrides --global-batch).
    #[arg(help_heading = "Optimisation", long)]
    pub per_rank_batch: Option<usize>,
    /// Tokens predicted per sequence.
    #[arg(help_heading = "Data", long, default_value_t = 512)]
    pub block_size: usize,
    /// Peak learning rate (AdamW).
    #[arg(
        help_heading = "Optimisation",
        long = "lr",
        value_name = "LR",
        default_value_t = 3e-4
    )]
    pub learning_rate: f64,
    /// Schedule after warmup.
    #[arg(help_heading = "Optimisation", long, value_enum, default_value_t = ScheduleKind::Constant)]
    pub schedule: ScheduleKind,
    /// Linear warmup steps from 0.
    #[arg(help_heading = "Optimisation", long, default_value_t = 0)]
    pub warmup: u64,
    /// The rate --schedule decays to at --steps (default: 10% of --lr for
    /// cosine, 0 for linear, wsd and wsd-sqrt, as Hugging Face's and
    /// torchtitan's); refused with constant.
    #[serde(default)]
    #[arg(help_heading = "Optimisation", long, value_name = "LR")]
    pub min_lr: Option<f64>,
    /// With --schedule wsd or wsd-sqrt, the share of --steps at the end
    /// over which the rate decays (default 0.2, rounded to whole steps);
    /// the steps between warmup and the decay keep the base rate.
    #[serde(default)]
    #[arg(help_heading = "Optimisation", long, value_name = "F")]
    pub decay_fraction: Option<f64>,
    /// AdamW's decoupled weight decay.
    #[arg(help_heading = "Optimisation", long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Clip the global gradient norm to this.
    #[arg(help_heading = "Optimisation", long)]
    pub grad_clip: Option<f64>,
    /// Split each model over this many consecutive ranks (tensor
    /// parallelism: every block's heads and MLP hidden features); the world
    /// is that many times the data-parallel replicas (e.g. -n 4 with 2: two
    /// replicas of two shards). 1: every rank holds the whole model. Each
    /// shard keeps its optimizer state whole: with more than one, the
    /// optimizer is not sharded (--no-shard-optimizer is implied).
    #[serde(default = "one")]
    #[arg(
        help_heading = "Parallelism and communication",
        long,
        default_value_t = 1
    )]
    pub tensor_parallel: usize,
    /// Micro-batches accumulated per optimizer step.
    #[arg(help_heading = "Optimisation", long, default_value_t = 1)]
    pub grad_accumulation: usize,
    /// Seed of the initial weights and the data order.
    #[arg(help_heading = "Optimisation", long, default_value_t = 42)]
    pub seed: u64,
    /// Data: auto (TinyStories' parquet from the Hub, else offline),
    /// offline, hub, text:TRAIN or text:TRAIN,VALID, jsonl:... or
    /// parquet:... alike (files or folders of *.parquet with a `text`
    /// column). JSON Lines rows are {"text"}, {"messages": [{"role",
    /// "content"}, ...]} (rendered with the tokenizer's chat template) or
    /// {"prompt", "completion"} (a user and an assistant message; without a
    /// template, the prompt then the completion), one format per file.
    /// Without VALID, --valid-fraction of the training documents is held out.
    #[arg(help_heading = "Data", long, default_value = "auto")]
    pub data: DataSource,
    /// Tokenizer: auto (GPT-2, embedded; with --init-from, the source's
    /// own: a model folder's tokenizer.json, a checkpoint's run's), a
    /// tokenizer.json path, gpt2:DIR (vocab.json + merges.txt) or train:N.
    #[arg(help_heading = "Data", long, default_value = "auto")]
    pub tokenizer: TokenizerChoice,
    /// Padding (one story per row) or packing. Packed chat or
    /// prompt/completion examples do not attend to each other.
    #[arg(help_heading = "Data", long, value_enum, default_value_t = Batching::Pack)]
    pub batching: Batching,
    /// Where text: files (and JSON Lines text rows) split into documents:
    /// eot (`<|endoftext|>`; JSON Lines text rows stay whole), blank-line
    /// (one or more lines holding only whitespace), or any literal marker.
    #[serde(default = "eot")]
    #[arg(help_heading = "Data", long, value_name = "SEP", default_value = "eot")]
    pub separator: String,
    /// A Jinja chat template file for {"messages"} and {"prompt",
    /// "completion"} rows, instead of the tokenizer's own
    /// (tokenizer_config.json's chat_template or chat_template.jinja beside
    /// the --init-from model's or --tokenizer's tokenizer.json).
    #[serde(default)]
    #[arg(help_heading = "Data", long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Only the assistant turns (the completion of prompt/completion rows)
    /// count in the loss, as mlx-lm's --mask-prompt.
    #[serde(default)]
    #[arg(help_heading = "Data", long)]
    pub mask_prompt: bool,
    /// Without a validation file, the share of the training documents held
    /// out for validation (and not trained on): the first document, then
    /// one in every 1/F.
    #[serde(default = "valid_fraction")]
    #[arg(help_heading = "Data", long, value_name = "F", default_value_t = 0.05)]
    pub valid_fraction: f64,
    /// Evaluate on the validation split every N steps and after the last
    /// (0: never); the validation loss is `eval_loss` in metrics.jsonl and
    /// loss.png.
    #[arg(help_heading = "Evaluation", long, default_value_t = 25)]
    pub eval_every: u64,
    /// Validation batches per rank per evaluation.
    #[arg(help_heading = "Evaluation", long, default_value_t = 4)]
    pub eval_batches: usize,
    /// Besides --checkpoint-every, a checkpoint once this many seconds have
    /// passed since the last one, and at least 50 times as long as the last
    /// one took, so checkpoints cost under 2% of the run; the first comes
    /// sooner (--first-checkpoint-s) (0: off; giving --checkpoint-every
    /// turns it off unless this is given too).
    //
    // Declared before `checkpoint_every`: clap fills defaults in this
    // order, so here `checkpoint_every` is present only when given.
    #[serde(default)]
    #[arg(
        help_heading = "Checkpoints and the run folder",
        long,
        value_name = "SECS",
        default_value_t = 600,
        default_value_if("checkpoint_every", clap::builder::ArgPredicate::IsPresent, "0")
    )]
    pub checkpoint_interval_s: u64,
    /// The first checkpoint by time comes this many seconds into the run
    /// when --checkpoint-interval-s is longer, so that a run killed early
    /// keeps its first minutes.
    #[serde(default = "first_checkpoint_s")]
    #[arg(help_heading = "Checkpoints and the run folder", long, value_name = "SECS", default_value_t = first_checkpoint_s())]
    pub first_checkpoint_s: u64,
    /// Checkpoint every N steps (0: by time only, see
    /// --checkpoint-interval-s); always at the end, and on SIGINT/SIGTERM.
    #[arg(
        help_heading = "Checkpoints and the run folder",
        long,
        default_value_t = 0
    )]
    pub checkpoint_every: u64,
    /// Keep only the newest N checkpoints, deleting older ones after each
    /// new one is published (0: keep all; `latest` is never deleted).
    #[serde(default)]
    #[arg(
        help_heading = "Checkpoints and the run folder",
        long,
        default_value_t = 0
    )]
    pub keep_checkpoints: usize,
    /// Run folder for metrics and checkpoints.
    #[arg(
        help_heading = "Checkpoints and the run folder",
        long = "out",
        value_name = "OUT",
        default_value = "runs/latest"
    )]
    pub out_dir: PathBuf,
    /// Print a line every N steps, and after the last, whose loss,
    /// ms_per_step, tokens_per_s and comm times are the means over the
    /// steps since the line before (lr and memory: the step's own; Hugging
    /// Face's and mlx-lm's loss); a validation adds eval_loss and eval_ms,
    /// its own time, which ms_per_step and tokens_per_s leave out. The
    /// progress bar shows that mean loss so far and the median step time
    /// (the run's last line's). metrics.jsonl, metrics.csv and TensorBoard
    /// keep every step's own figures.
    #[arg(help_heading = "Logging", long, default_value_t = 1)]
    pub log_every: u64,
    /// Bytes per gradient communication bucket (MLX's all_reduce_size; 0:
    /// one collective per tensor); suffixes KiB, MiB, GiB, K, M, G allowed.
    #[arg(help_heading = "Parallelism and communication", long, default_value = "32MiB", value_parser = byte_size)]
    pub all_reduce_size: usize,
    /// The dtype gradients travel in between the ranks (MLX's
    /// communication_type): bf16 or f16 halve the bytes of f32 gradients;
    /// default: their own dtype.
    #[serde(default)]
    #[arg(
        help_heading = "Parallelism and communication",
        long,
        value_enum,
        alias = "communication-type"
    )]
    pub communication_dtype: Option<CommunicationDtype>,
    /// Send the embedding's whole gradient between the ranks (by default
    /// only the rows of the batch's tokens travel, as PyTorch's sparse
    /// embedding gradients: the rest are zero; at world 2 bit for bit the
    /// dense average, with a fiftieth of the reference model's embedding
    /// bytes).
    #[serde(default = "yes")]
    #[arg(help_heading = "Parallelism and communication", long = "dense-embedding-gradients", action = clap::ArgAction::SetFalse)]
    pub sparse_embedding_gradients: bool,
    /// The dtype the model computes in: f32, or bf16 / f16 with float32
    /// master weights and optimizer state (f16 with a dynamic loss scale).
    /// Which is fast where: on a CPU with AMX or AVX512_BF16, bf16; on a GPU
    /// whose adapter offers cooperative matrices (NVIDIA's tensor cores
    /// through Vulkan), f16 matmuls, attention and the output projection +
    /// loss run on them while bf16 computes in f32 (no bf16 cooperative
    /// matrix there); elsewhere f32.
    #[serde(default)]
    #[arg(
        help_heading = "Precision, device and memory",
        long,
        value_enum,
        default_value_t
    )]
    pub dtype: FloatDtype,
    /// The first loss scale with --dtype f16 (default 65536, PyTorch's
    /// `GradScaler`); halved on every step whose gradients overflow,
    /// doubled after 2,000 good ones.
    #[serde(default)]
    #[arg(help_heading = "Precision, device and memory", long)]
    pub loss_scale: Option<f64>,
    /// Device: cpu or gpu (any adapter wgpu finds; Mesa's lavapipe on Linux
    /// without a GPU).
    #[arg(
        help_heading = "Precision, device and memory",
        long,
        default_value = "cpu"
    )]
    pub device: String,
    /// Cache folder for token stores and tokenizers (default:
    /// MLX_DATA_CACHE or ~/.cache/mlx-data).
    #[arg(help_heading = "Data", long)]
    pub data_cache: Option<PathBuf>,
    /// Each rank appends its array memory (`memory::active`/`peak`) per step
    /// to `PATH.rank<R>.jsonl`, for memory profiling.
    #[arg(help_heading = "Logging", long)]
    pub memory_log: Option<PathBuf>,
    /// Each rank appends the samples of every step (epoch and token-store
    /// indices of its rows) to `PATH.rank<R>.jsonl`, to audit which data a
    /// run used.
    #[serde(default)]
    #[arg(help_heading = "Logging", long)]
    pub sample_log: Option<PathBuf>,
    /// Keep the whole AdamW state on every rank and average whole gradients
    /// (by default, with several ranks, each keeps only its shard: ZeRO
    /// stage 1, the same results).
    #[arg(help_heading = "Parallelism and communication", long = "no-shard-optimizer", action = clap::ArgAction::SetFalse)]
    pub shard_optimizer: bool,
    /// What each data-parallel rank keeps of the training state, with
    /// several ranks: `optimizer` (ZeRO-1, the default), `gradients`
    /// (ZeRO-2: the same here, see docs/training.md), `parameters` (ZeRO-3,
    /// FSDP: each rank keeps 1/N of the weights, gathering a block's just
    /// before it computes), or `none` (everything whole: as
    /// `--no-shard-optimizer`). Every mode trains the same model.
    #[serde(default)]
    #[arg(
        help_heading = "Parallelism and communication",
        long,
        value_enum,
        default_value_t
    )]
    pub shard: ShardMode,
    /// Recompute blocks' activations in the backward pass instead of
    /// keeping them from the forward (mlx-lm's `--grad-checkpoint`,
    /// `torch.utils.checkpoint`): alone, every block; `K`, every K-th block
    /// (torchtitan's per-layer policy); `none`, the default. The gradients
    /// are the same (bit for bit on the CPU); a checkpointed block holds
    /// only its input until the backward pass reaches it, for about a
    /// third more compute.
    #[serde(default)]
    #[arg(
        help_heading = "Precision, device and memory",
        long,
        value_name = "all|K|none",
        num_args = 0..=1,
        default_value = "none",
        default_missing_value = "all"
    )]
    pub grad_checkpoint: crate::grad_checkpoint::GradCheckpoint,
    /// Before the run starts, estimate what each rank would hold
    /// (parameters, gradients, optimizer state, activations at the chosen
    /// checkpointing, communication buffers), print it, and refuse the run,
    /// naming the largest part, when it is over this many bytes: 1.5GiB,
    /// 800MiB, 2GB (powers of 1000) or plain bytes (see
    /// `mlx_llama::memory_budget`).
    #[serde(default)]
    #[arg(help_heading = "Precision, device and memory", long, value_name = "BYTES", value_parser = crate::memory_budget::parse_budget)]
    pub memory_budget: Option<u64>,
    /// Wait for each step's loss before building the next step. By default
    /// the host builds and records step n + 1 while the device runs step n,
    /// and writes step n's metrics when its loss arrives (as MLX's
    /// `async_eval` loops): the same losses, with the GPU kept busy. A step
    /// followed by validation, a checkpoint or a stop is always waited for.
    #[serde(default = "yes")]
    #[arg(help_heading = "Parallelism and communication", long = "no-overlap-steps", action = clap::ArgAction::SetFalse)]
    pub overlap_steps: bool,
    /// Where the metrics go, comma-separated: tensorboard (event files in
    /// the run folder: `tensorboard --logdir runs`), jsonl (metrics.jsonl),
    /// csv (metrics.csv and loss.png, drawn from metrics.jsonl, which is then
    /// written too); all or none. None needs a network.
    #[serde(default)]
    #[arg(help_heading = "Logging", long, default_value = "all")]
    pub report_to: crate::metrics::ReportTo,
    /// Start from pretrained weights (a new run, not a resume): a run
    /// folder (its newest intact checkpoint), a checkpoint folder, a
    /// Hugging Face / mlx-lm / export folder (config.json, model.safetensors
    /// or shards with model.safetensors.index.json), or a Hub model name
    /// `org/name[@revision]` fetched into the Hugging Face cache. Its shape
    /// replaces the model options and its tokenizer is used unless
    /// --tokenizer is given.
    #[serde(default)]
    #[arg(help_heading = "Model", long, value_name = "SOURCE")]
    pub init_from: Option<crate::ModelSource>,
    /// Fine-tuning with adapters (`--fine-tune`, `--lora-*`, `--base-dtype`).
    #[serde(default)]
    #[command(flatten, next_help_heading = "Fine-tuning (adapters)")]
    pub adapters: crate::adapters::AdapterOptions,
}

impl Default for TrainConfig {
    /// The reference experiment, which is `mlx-llama train` without
    /// options: the reference Llama, batch 4 x 512, AdamW 3e-4, seed 42,
    /// 100 steps, an evaluation every 25 steps, a checkpoint every 10
    /// minutes (or 50 times as long as the last took) and at the end.
    fn default() -> Self {
        use clap::FromArgMatches;
        let matches = TrainConfig::command()
            .try_get_matches_from(["train"])
            .expect("every option has a default or is optional");
        TrainConfig::from_arg_matches(&matches).expect("the defaults are valid values")
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

/// `eot`, the default `--separator` (documents end at `<|endoftext|>`).
fn eot() -> String {
    "eot".into()
}

/// 120 s, the default `--first-checkpoint-s`.
fn first_checkpoint_s() -> u64 {
    120
}

/// 0.05, the default `--valid-fraction`.
fn valid_fraction() -> f64 {
    0.05
}

impl TrainConfig {
    /// The options as a clap command named `train` (a later value of an
    /// option overrides an earlier one, as `--config FILE` needs).
    pub fn command() -> clap::Command {
        use clap::Args;
        TrainConfig::augment_args(clap::Command::new("train").args_override_self(true))
    }

    /// What each data-parallel rank keeps: `--shard`, or `none` with
    /// `--no-shard-optimizer`.
    pub fn sharding(&self) -> ShardMode {
        if self.shard_optimizer {
            self.shard
        } else {
            ShardMode::None
        }
    }

    /// Whether the optimizer state is sharded over the data-parallel ranks
    /// (every `--shard` mode but `none`).
    pub fn shards_optimizer(&self) -> bool {
        self.sharding() != ShardMode::None
    }

    /// The parts of the configuration a checkpoint must agree with to resume.
    pub fn resume_key(&self) -> serde_json::Value {
        let mut key = serde_json::json!({
            "model": self.model,
            "global_batch": self.global_batch,
            "per_rank_batch": self.per_rank_batch,
            "block_size": self.block_size,
            "grad_accumulation": self.grad_accumulation,
            "seed": self.seed,
            "data": self.data,
            "tokenizer": self.tokenizer,
            "batching": self.batching,
            "shard_optimizer": self.shards_optimizer(),
        });
        // Only an adapter run's key names its adapters: a full run's stays
        // what checkpoints written before adapters existed recorded.
        if self.adapters.fine_tune != crate::adapters::FineTune::Full {
            key["adapters"] = serde_json::json!({
                "fine_tune": self.adapters.fine_tune,
                "rank": self.adapters.lora_rank,
                "alpha": self.adapters.lora_alpha,
                "layers": self.adapters.lora_layers,
                "targets": self.adapters.lora_targets,
            });
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use clap::{ArgAction, FromArgMatches};
    use serde_json::Value;

    use super::*;
    use crate::options_file::{file_args, resolved_toml};

    fn matches(args: &[&str]) -> clap::ArgMatches {
        let argv = std::iter::once("train").chain(args.iter().copied());
        TrainConfig::command().try_get_matches_from(argv).unwrap()
    }

    fn parse(args: &[&str]) -> TrainConfig {
        TrainConfig::from_arg_matches(&matches(args)).unwrap()
    }

    /// The serialised field an option sets: `id` at the top or in `model`.
    fn field<'a>(json: &'a Value, id: &str) -> Option<&'a Value> {
        json.get(id)
            .or_else(|| json["model"].get(id))
            .or_else(|| json["adapters"].get(id))
    }

    /// The part of `--help` about `--long`.
    fn help_of(help: &str, long: &str) -> String {
        // `--long <VALUE>`, or `--long [<VALUE>]` when the value is optional.
        let start = help
            .find(&format!("\n      --{long} <"))
            .or_else(|| help.find(&format!("\n      --{long} [<")))
            .unwrap_or_else(|| panic!("--{long} missing from the help:\n{help}"));
        let rest = &help[start + 1..];
        let end = rest.find("\n      --").unwrap_or(rest.len());
        rest[..end].to_string()
    }

    #[test]
    fn the_help_shows_each_default_and_it_is_the_default_config() {
        let default = TrainConfig::default();
        assert_eq!(parse(&[]), default, "the empty command line");
        let json = serde_json::to_value(&default).unwrap();
        let help = TrainConfig::command().render_long_help().to_string();
        // Not built, so without clap's own --help.
        let cmd = TrainConfig::command();
        let mut ids = vec![];
        for arg in cmd.get_arguments() {
            let (id, long) = (arg.get_id().as_str(), arg.get_long().unwrap());
            ids.push(id.to_string());
            let own = field(&json, id).unwrap_or_else(|| panic!("--{long} sets no field {id}"));
            match (arg.get_action(), arg.get_default_values()) {
                (ArgAction::SetTrue | ArgAction::SetFalse, _) => {
                    let on = serde_json::to_value(parse(&[&format!("--{long}")])).unwrap();
                    assert_eq!(
                        field(&on, id),
                        Some(&Value::Bool(!own.as_bool().unwrap())),
                        "--{long} flips {id}"
                    );
                }
                (_, []) => assert_eq!(own, &Value::Null, "--{long} has no default: unset"),
                (_, [shown]) => {
                    let shown = shown.to_str().unwrap();
                    let section = help_of(&help, long);
                    assert!(
                        section.contains(&format!("[default: {shown}]")),
                        "{section}"
                    );
                    // The default shown, given, is the default's value.
                    let given =
                        serde_json::to_value(parse(&[&format!("--{long}"), shown])).unwrap();
                    assert_eq!(field(&given, id), Some(own), "--{long} {shown}");
                }
                (_, many) => panic!("--{long} has several defaults: {many:?}"),
            }
        }
        // Every field is an option, but the model's constants (what an
        // imported configuration sets).
        let mut fields: Vec<String> = json.as_object().unwrap().keys().cloned().collect();
        fields.extend(json["model"].as_object().unwrap().keys().cloned());
        fields.extend(json["adapters"].as_object().unwrap().keys().cloned());
        let constants = [
            "model",
            "adapters",
            "norm_eps",
            "rope_base",
            "rope_scaling",
            "max_position_embeddings",
        ];
        fields.retain(|f| !constants.contains(&f.as_str()));
        fields.sort();
        ids.sort();
        assert_eq!(fields, ids);
    }

    /// Every option away from its default.
    const ALL_SET: &[&str] = &[
        "--layers",
        "2",
        "--vocab",
        "300",
        "--dims",
        "32",
        "--mlp-dims",
        "64",
        "--heads",
        "2",
        "--steps",
        "7",
        "--global-batch",
        "8",
        "--per-rank-batch",
        "2",
        "--block-size",
        "64",
        "--lr",
        "0.001",
        "--schedule",
        "cosine",
        "--warmup",
        "3",
        "--min-lr",
        "0.0001",
        "--decay-fraction",
        "0.3",
        "--weight-decay",
        "0.1",
        "--grad-clip",
        "1.5",
        "--tensor-parallel",
        "2",
        "--grad-accumulation",
        "2",
        "--seed",
        "7",
        "--data",
        "text:a.txt,b.txt",
        "--tokenizer",
        "train:300",
        "--batching",
        "pad",
        "--separator",
        "blank-line",
        "--chat-template",
        "chat.jinja",
        "--mask-prompt",
        "--valid-fraction",
        "0.1",
        "--eval-every",
        "5",
        "--eval-batches",
        "2",
        "--checkpoint-every",
        "3",
        "--first-checkpoint-s",
        "30",
        "--keep-checkpoints",
        "2",
        "--out",
        "runs/x",
        "--log-every",
        "2",
        "--all-reduce-size",
        "4MiB",
        "--communication-dtype",
        "bf16",
        "--dense-embedding-gradients",
        "--dtype",
        "bf16",
        "--loss-scale",
        "1024",
        "--device",
        "gpu",
        "--data-cache",
        "cache",
        "--memory-log",
        "memory",
        "--sample-log",
        "samples",
        "--no-shard-optimizer",
        "--no-overlap-steps",
        "--shard",
        "parameters",
        "--grad-checkpoint",
        "2",
        "--memory-budget",
        "1.5GiB",
        "--report-to",
        "jsonl,csv",
        "--init-from",
        "weights",
        "--fine-tune",
        "dora",
        "--lora-rank",
        "4",
        "--lora-alpha",
        "8",
        "--lora-dropout",
        "0.1",
        "--lora-layers",
        "2",
        "--lora-targets",
        "q,v",
        "--base-dtype",
        "bf16",
    ];

    #[test]
    fn a_run_toml_and_serde_read_back_to_the_same_config() {
        let all_set = parse(ALL_SET);
        let (a, b) = (
            serde_json::to_value(&all_set).unwrap(),
            serde_json::to_value(TrainConfig::default()).unwrap(),
        );
        for f in a.as_object().unwrap().keys().filter(|f| *f != "model") {
            assert_ne!(a[f], b[f], "ALL_SET leaves {f} at its default");
        }
        let dir = tempfile::tempdir().unwrap();
        let cmd = TrainConfig::command();
        for args in [&[][..], ALL_SET] {
            let cfg = parse(args);
            // run.toml: the options by their names, read back as a command line.
            let text = resolved_toml(&cmd, &matches(args), &[]);
            let file = dir.path().join("run.toml");
            std::fs::write(&file, &text).unwrap();
            let again: Vec<String> = file_args(&cmd, &file)
                .unwrap()
                .into_iter()
                .map(|a| a.into_string().unwrap())
                .collect();
            let again: Vec<&str> = again.iter().map(String::as_str).collect();
            assert_eq!(parse(&again), cfg, "{text}");
            // The serde forms (a checkpoint's manifest holds the JSON).
            let toml_text = toml::to_string(&cfg).unwrap();
            assert_eq!(
                toml::from_str::<TrainConfig>(&toml_text).unwrap(),
                cfg,
                "{toml_text}"
            );
            let json = serde_json::to_string(&cfg).unwrap();
            assert_eq!(serde_json::from_str::<TrainConfig>(&json).unwrap(), cfg);
        }
    }

    #[test]
    fn checkpoints_come_by_time_unless_checkpoint_every_is_given() {
        assert_eq!(parse(&[]).checkpoint_interval_s, 600);
        let by_steps = parse(&["--checkpoint-every", "5"]);
        assert_eq!(
            (by_steps.checkpoint_every, by_steps.checkpoint_interval_s),
            (5, 0)
        );
        let both = parse(&["--checkpoint-every", "5", "--checkpoint-interval-s", "60"]);
        assert_eq!((both.checkpoint_every, both.checkpoint_interval_s), (5, 60));
        // A run.toml written before the interval was an option.
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("run.toml");
        std::fs::write(&file, "checkpoint_every = 5\nsteps = 9\n").unwrap();
        let args: Vec<String> = file_args(&TrainConfig::command(), &file)
            .unwrap()
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect();
        let old = parse(&args.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(
            (old.steps, old.checkpoint_every, old.checkpoint_interval_s),
            (9, 5, 0)
        );
    }

    #[test]
    fn data_and_tokenizer_values_parse_or_say_what_is_wrong() {
        assert_eq!(
            "jsonl:a,b".parse::<DataSource>(),
            Ok(DataSource::JsonLines {
                train: "a".into(),
                validation: Some("b".into())
            })
        );
        assert_eq!(
            "text:a".parse::<DataSource>(),
            Ok(DataSource::Text {
                train: "a".into(),
                validation: None
            })
        );
        assert!(
            "web"
                .parse::<DataSource>()
                .unwrap_err()
                .contains("unknown --data `web`")
        );
        assert_eq!(
            "train:300".parse::<TokenizerChoice>(),
            Ok(TokenizerChoice::Train(300))
        );
        assert_eq!(
            "gpt2:d".parse::<TokenizerChoice>(),
            Ok(TokenizerChoice::Gpt2Files("d".into()))
        );
        assert!(
            "train:x"
                .parse::<TokenizerChoice>()
                .unwrap_err()
                .contains("bad vocabulary size")
        );
        assert_eq!(byte_size("4MiB"), Ok(4 << 20));
        assert!(byte_size("4 parsecs").unwrap_err().contains("unknown unit"));
    }
}
