//! `mlx-llama eval`: the loss and perplexity of a model, with or without
//! adapters, on a dataset, as `mlx_lm.perplexity` (and `mlx_lm.lora
//! --test`) report them, on one rank or many.
//!
//! The loss is the mean cross-entropy per target token (the tokens the
//! loader's mask counts: not padding, not a masked prompt), the
//! perplexity `exp(loss)`, and the standard error mlx-lm prints the
//! token losses' standard deviation over the square root of their number
//! (the perplexity's by the delta method, `ppl * se`). Under `mlx-launch
//! -n N` each rank evaluates its shard of every batch and the sums are
//! combined, so every rank gets the numbers one rank would.
//!
//! ```no_run
//! use clap::Parser;
//! #[derive(Parser)]
//! struct Cli {
//!     #[command(flatten)]
//!     eval: mlx_llama::eval::EvalArgs,
//! }
//! let args = Cli::parse_from(["eval", "--checkpoint", "runs/latest", "--data", "jsonl:test.jsonl"]).eval;
//! let world = mlx_dist::init(mlx_dist::Backend::Any)?;
//! let report = mlx_llama::eval::evaluate(&args, &world)?;
//! println!("Perplexity: {:.3} ± {:.3}", report.perplexity, report.std_err);
//! # Ok::<(), anyhow::Error>(())
//! ```

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, anyhow, bail};
use mlx_array::{Device, Dtype};
use mlx_data::{BatchMode, BatchSize, DataLoader, LoaderConfig, TokenStore};
use mlx_dist::Group;
use mlx_nn::AttentionMask;

use crate::config::{Batching, DataSource, TokenizerChoice, TrainConfig};
use crate::model::{project, segment_mask};
use crate::source::SourceKind;
use crate::{Llama, ModelSource};

/// The options of `mlx-llama eval`.
#[derive(clap::Args, Debug, Clone)]
pub struct EvalArgs {
    /// The model: a run folder (its newest intact checkpoint), a checkpoint
    /// folder (an adapter run's comes with its adapters), a Hugging Face /
    /// mlx-lm / export folder, or a Hub model name org/name or org/name@revision.
    #[arg(long, value_name = "SOURCE", default_value = "runs/latest")]
    pub checkpoint: ModelSource,
    /// Adapters in PEFT's or mlx-lm's layout (a folder with
    /// adapter_config.json) applied to the model unmerged.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// The data, as train's --data: auto, offline, hub,
    /// text:TRAIN or text:TRAIN,VALID, and jsonl:... or parquet:... alike.
    /// A single file (no VALID) is evaluated whole unless --split says
    /// otherwise.
    #[arg(long, default_value = "auto")]
    pub data: DataSource,
    /// Which split: auto (VALID when given, else the whole of TRAIN; the
    /// validation split of the other sources), valid (VALID, or without
    /// one the --valid-fraction of TRAIN that training held out), or train
    /// (TRAIN, less that held-out fraction when there is no VALID).
    #[arg(long, value_enum, default_value_t = EvalSplit::Auto)]
    pub split: EvalSplit,
    /// The tokenizer, as train's --tokenizer; by default the model's own
    /// (a model folder's tokenizer.json, a checkpoint's run's).
    #[arg(long)]
    pub tokenizer: Option<TokenizerChoice>,
    /// Tokens predicted per sequence; by default a checkpoint's run's
    /// block size, else 512 (mlx_lm.perplexity's --sequence-length).
    #[arg(long)]
    pub block_size: Option<usize>,
    /// Sequences per batch across all ranks (a multiple of their number);
    /// shrunk to fit a split that holds fewer.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Batches to evaluate (0: the whole split; a final partial batch is
    /// left out). More than the split holds is the whole split.
    #[arg(long, default_value_t = 0)]
    pub batches: usize,
    /// Packing (documents concatenated and cut into windows of
    /// --block-size, as mlx_lm.perplexity) or padding (one document per
    /// sequence, truncated; padding does not count).
    #[arg(long, value_enum, default_value_t = Batching::Pack)]
    pub batching: Batching,
    /// The order sequences are drawn in (train's --seed: with its
    /// --block-size, --batch and --batching, the first batches are the ones
    /// its validation loss used).
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// As train's --separator: eot, blank-line or a literal marker.
    #[arg(long, value_name = "SEP", default_value = "eot")]
    pub separator: String,
    /// As train's --chat-template: a Jinja chat template file for
    /// {"messages"} and {"prompt", "completion"} rows.
    #[arg(long, value_name = "FILE")]
    pub chat_template: Option<PathBuf>,
    /// Only the assistant turns (the completion) count, as train's
    /// --mask-prompt.
    #[arg(long)]
    pub mask_prompt: bool,
    /// The held-out share of TRAIN that --split valid evaluates (train's
    /// --valid-fraction).
    #[arg(long, value_name = "F", default_value_t = 0.05)]
    pub valid_fraction: f64,
    /// Cache folder for token stores and tokenizers (default:
    /// MLX_DATA_CACHE or ~/.cache/mlx-data).
    #[arg(long)]
    pub data_cache: Option<PathBuf>,
    /// Device: cpu or gpu.
    #[arg(long, default_value = "cpu")]
    pub device: String,
    /// Print the report as JSON (rank 0) instead of text.
    #[arg(long)]
    pub json: bool,
    /// Read a checkpoint of format 1, whose manifest records no checksums,
    /// without verifying its files (refused otherwise).
    #[arg(long)]
    pub allow_old_checkpoint_format: bool,
}

/// Which split `eval` reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum EvalSplit {
    /// The validation file when there is one, else the whole training
    /// file; the validation split of the built-in and Hub sources.
    Auto,
    /// The validation split, as training saw it.
    #[value(alias = "validation")]
    Valid,
    /// The training split, as training saw it.
    Train,
}

/// What `eval` measured, the same on every rank.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct EvalReport {
    /// The mean cross-entropy per target token (nats).
    pub loss: f64,
    /// `exp(loss)`.
    pub perplexity: f64,
    /// The perplexity's standard error (`perplexity * loss_std_err`).
    pub std_err: f64,
    /// The loss's standard error: the token losses' standard deviation
    /// over the square root of their number.
    pub loss_std_err: f64,
    /// Target tokens that counted.
    pub tokens: u64,
    /// Sequences (rows) with at least one target that counted.
    pub sequences: u64,
    /// Batches evaluated (each across all ranks).
    pub batches: u64,
}

/// Host-side sums of token losses, in f64.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Sums {
    /// Sum of the counted token losses.
    loss: f64,
    /// Sum of their squares.
    squares: f64,
    /// Counted tokens.
    tokens: f64,
    /// Rows with a counted token.
    sequences: f64,
}

impl Sums {
    fn to_bytes(self) -> Vec<u8> {
        [self.loss, self.squares, self.tokens, self.sequences]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect()
    }

    fn from_bytes(b: &[u8]) -> Sums {
        let v: Vec<f64> = b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
            .collect();
        Sums {
            loss: v[0],
            squares: v[1],
            tokens: v[2],
            sequences: v[3],
        }
    }

    fn add(self, o: Sums) -> Sums {
        Sums {
            loss: self.loss + o.loss,
            squares: self.squares + o.squares,
            tokens: self.tokens + o.tokens,
            sequences: self.sequences + o.sequences,
        }
    }

    /// Every rank's sums, added in rank order (each rank gathers them all,
    /// so every rank computes the same numbers to the bit).
    fn all_sum(self, group: &Group) -> Result<Sums> {
        if group.size() == 1 {
            return Ok(self);
        }
        // Gathered as raw bytes: the collectives have no f64 and f32 sums
        // would round.
        let all = group
            .all_gather_bytes(&self.to_bytes(), Dtype::U32)
            .context("combining the ranks' sums")?;
        Ok(all
            .chunks_exact(32)
            .map(Sums::from_bytes)
            .fold(Sums::default(), Sums::add))
    }

    fn report(self, batches: u64) -> EvalReport {
        let n = self.tokens;
        let loss = if n > 0.0 { self.loss / n } else { f64::NAN };
        let var = if n > 1.0 {
            ((self.squares - self.loss * self.loss / n) / (n - 1.0)).max(0.0)
        } else {
            0.0
        };
        let loss_std_err = if n > 0.0 { (var / n).sqrt() } else { f64::NAN };
        let perplexity = loss.exp();
        EvalReport {
            loss,
            perplexity,
            std_err: perplexity * loss_std_err,
            loss_std_err,
            tokens: n as u64,
            sequences: self.sequences as u64,
            batches,
        }
    }
}

/// Token positions whose logits are computed at once (about 2^26 logits,
/// 256 MiB of float32, whatever the vocabulary).
fn chunk_positions(vocab: usize) -> usize {
    ((1usize << 26) / vocab.max(1)).max(1)
}

/// The cross-entropy of each target of `batch` under `model` `[B * L]`
/// (float32), the logits computed a chunk of positions at a time.
fn token_losses(model: &Llama, batch: &mlx_data::Batch) -> Result<Vec<f32>> {
    let a = batch.to_arrays()?;
    let hidden = match &a.segments {
        Some(s) => {
            let mask = segment_mask(s, model.head_weight().dtype())?;
            model.hidden_masked(&a.inputs, AttentionMask::Additive(&mask))?
        }
        None => model.hidden(&a.inputs)?,
    };
    let rows = batch.batch_size * batch.block_size;
    let dims = *hidden.shape().last().expect("hidden states [B, L, D]");
    let hidden = mlx_array::reshape_to(&hidden, &[rows, dims])?;
    let targets = mlx_array::reshape_to(&a.targets, &[rows])?;
    let step = chunk_positions(model.config.vocab_size);
    let mut out = Vec::with_capacity(rows);
    let mut start = 0;
    while start < rows {
        let end = (start + step).min(rows);
        let h = hidden.slice_axis(0, start as i64, end as i64)?;
        let t = targets.slice_axis(0, start as i64, end as i64)?;
        let logits = project(&h, model.head_weight())?.astype(Dtype::F32)?;
        out.extend(mlx_array::cross_entropy(&logits, &t)?.to_vec::<f32>()?);
        start = end;
    }
    Ok(out)
}

/// The loss and perplexity of `model` over `batches` batches of `loader`
/// (every rank's shard of each), the sums combined over `group`.
/// `batches` 0, or more than an epoch holds, is one epoch: the whole
/// split, less a final partial batch.
pub fn evaluate_loader(
    model: &Llama,
    loader: &mut DataLoader,
    batches: usize,
    group: &Group,
) -> Result<EvalReport> {
    let per_epoch = loader.batches_per_epoch();
    let n = match batches as u64 {
        0 => per_epoch,
        b => b.min(per_epoch),
    };
    let progress = group.rank() == 0 && std::io::stderr().is_terminal();
    let mut sums = Sums::default();
    for i in 0..n {
        let batch = loader.next_batch()?;
        let losses = token_losses(model, &batch)?;
        let l = batch.block_size;
        for (r, row) in batch.loss_mask.chunks_exact(l).enumerate() {
            let mut counted = 0u64;
            for (j, &m) in row.iter().enumerate() {
                if m != 0 {
                    let x = f64::from(losses[r * l + j]);
                    sums.loss += x;
                    sums.squares += x * x;
                    counted += 1;
                }
            }
            sums.tokens += counted as f64;
            sums.sequences += f64::from(u8::from(counted > 0));
        }
        if progress {
            eprint!("  Processed {}/{n} batches...\r", i + 1);
            let _ = std::io::stderr().flush();
        }
    }
    if progress && n > 0 {
        eprintln!();
    }
    Ok(sums.all_sum(group)?.report(n))
}

/// A tokenizer file `eval` wrote for the run of a checkpoint whose
/// tokenizer was trained on its data, removed when dropped.
struct TempFile(PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The model `args` name (with its adapters), the training configuration
/// that builds its data and tokenizer, and a file to remove afterwards.
fn model_and_data(
    args: &EvalArgs,
    group: &Group,
) -> Result<(Llama, TrainConfig, Option<TempFile>)> {
    let source = args
        .checkpoint
        .resolve(&mlx_data::HubConfig::from_env())
        .with_context(|| format!("--checkpoint {}", args.checkpoint))?;
    let (mut model, run) = match source.kind {
        SourceKind::ModelFolder => (source.load()?, None),
        SourceKind::Checkpoint => {
            let t = crate::checkpoint::load_trained(&source.dir)?;
            (t.model, Some(t.config))
        }
    };
    if let Some(dir) = &args.adapter {
        if model.has_adapters() {
            bail!(
                "{} holds adapters already: --adapter {} would stack a second set (merge the first with export --fuse)",
                source.dir.display(),
                dir.display()
            );
        }
        crate::adapters::apply_from(dir, &mut model)
            .with_context(|| format!("--adapter {}", dir.display()))?;
    }
    let mut temp = None;
    let tokenizer = match &args.tokenizer {
        Some(t) => t.clone(),
        None => match (source.tokenizer()?, &run) {
            // A tokenizer the run trained on its data: written out whole,
            // since the data here would train another.
            (TokenizerChoice::Train(_), Some(run)) => {
                let tok = crate::trainer::tokenizer_for(run).with_context(|| {
                    format!("the tokenizer {} was trained with", source.dir.display())
                })?;
                let path = std::env::temp_dir().join(format!(
                    "mlx-llama-eval-{}-{}.tokenizer.json",
                    std::process::id(),
                    group.rank()
                ));
                tok.save(&path)?;
                temp = Some(TempFile(path.clone()));
                TokenizerChoice::File(path)
            }
            (t, _) => t,
        },
    };
    let data = match (&args.data, args.split) {
        // A single file is the split.
        (
            DataSource::Text {
                train,
                validation: None,
            },
            EvalSplit::Auto,
        ) => DataSource::Text {
            train: train.clone(),
            validation: Some(train.clone()),
        },
        (
            DataSource::JsonLines {
                train,
                validation: None,
            },
            EvalSplit::Auto,
        ) => DataSource::JsonLines {
            train: train.clone(),
            validation: Some(train.clone()),
        },
        (
            DataSource::Parquet {
                train,
                validation: None,
            },
            EvalSplit::Auto,
        ) => DataSource::Parquet {
            train: train.clone(),
            validation: Some(train.clone()),
        },
        (d, _) => d.clone(),
    };
    check_files(&data)?;
    let block_size = args
        .block_size
        .or(run.as_ref().map(|r| r.block_size))
        .unwrap_or(512);
    if block_size == 0 {
        bail!("--block-size must be at least 1");
    }
    let cfg = TrainConfig {
        data,
        tokenizer,
        batching: args.batching,
        block_size,
        seed: args.seed,
        separator: args.separator.clone(),
        chat_template: args.chat_template.clone(),
        mask_prompt: args.mask_prompt,
        valid_fraction: args.valid_fraction,
        data_cache: args.data_cache.clone(),
        device: args.device.clone(),
        // Where the chat template is looked for, after --tokenizer's folder.
        init_from: Some(ModelSource::from(source.dir.as_path())),
        ..TrainConfig::default()
    };
    Ok((model, cfg, temp))
}

/// Local data files that do not exist, named before anything is read.
fn check_files(data: &DataSource) -> Result<()> {
    let paths: Vec<&Path> = match data {
        DataSource::Text { train, validation }
        | DataSource::JsonLines { train, validation }
        | DataSource::Parquet { train, validation } => std::iter::once(train.as_path())
            .chain(validation.as_deref())
            .collect(),
        _ => vec![],
    };
    for p in paths {
        if !p.exists() {
            bail!("--data: {} does not exist", p.display());
        }
    }
    Ok(())
}

/// The split `args` asks for of the prepared data.
fn store(args: &EvalArgs, data: &mlx_data::Prepared) -> Arc<TokenStore> {
    match args.split {
        EvalSplit::Train => data.train.clone(),
        EvalSplit::Auto | EvalSplit::Valid => data.validation.clone(),
    }
}

/// This rank's loader of `store`: `batch` sequences across the world,
/// fewer when the store holds fewer samples (a multiple of the world).
fn loader(
    store: Arc<TokenStore>,
    cfg: &TrainConfig,
    batch: usize,
    group: &Group,
) -> Result<DataLoader> {
    let world = group.size();
    if batch == 0 || !batch.is_multiple_of(world) {
        bail!(
            "--batch {batch} does not split evenly over {world} ranks (use a multiple of {world})"
        );
    }
    let mode = match cfg.batching {
        Batching::Pad => BatchMode::Pad,
        Batching::Pack => BatchMode::Pack,
    };
    let samples = match mode {
        BatchMode::Pad => store.n_docs(),
        BatchMode::Pack => store.n_tokens().saturating_sub(1) / cfg.block_size as u64,
    } as usize;
    let fits = samples / world * world;
    if fits == 0 {
        bail!(
            "the data holds {samples} sequences ({} tokens, {:?} mode, block size {}): too few for one on each of {world} ranks (try a smaller --block-size or --batching pad)",
            store.n_tokens(),
            mode,
            cfg.block_size
        );
    }
    let batch = if batch > fits {
        tracing::warn!(
            batch,
            samples,
            "the split holds fewer sequences than --batch: using {fits}"
        );
        fits
    } else {
        batch
    };
    let lc = LoaderConfig {
        block_size: cfg.block_size,
        batch: BatchSize::Global(batch),
        mode,
        seed: cfg.seed,
        rank: group.rank(),
        world,
        release_pages: true,
    };
    Ok(DataLoader::new(store, lc)?)
}

/// The loss and perplexity `args` ask for, on this rank's share of the
/// data, combined over `group` (every rank gets the same report).
pub fn evaluate(args: &EvalArgs, group: &Group) -> Result<EvalReport> {
    let device: Device = args.device.parse().map_err(|e| anyhow!("{e}"))?;
    if device == Device::Gpu {
        mlx_array::device::gpu_available()
            .map_err(|e| anyhow!("--device gpu: no usable GPU adapter: {e}"))?;
    }
    mlx_array::device::with_device(device, || {
        let (model, cfg, _temp) = model_and_data(args, group)?;
        let data = mlx_data::prepare(&crate::trainer::data_config_for(&cfg))
            .context("preparing the data")?;
        if data.tokenizer.vocab_size() > model.config.vocab_size {
            bail!(
                "the tokenizer has {} tokens but the model only {} rows of embedding: pass its tokenizer with --tokenizer",
                data.tokenizer.vocab_size(),
                model.config.vocab_size
            );
        }
        let mut loader = loader(store(args, &data), &cfg, args.batch, group)?;
        evaluate_loader(&model, &mut loader, args.batches, group)
    })
}

/// `mlx-llama eval`: joins the ranks of `mlx-launch` (one without),
/// evaluates, and prints the report on rank 0.
pub fn run(args: EvalArgs) -> Result<()> {
    crate::checkpoint::allow_old_format(args.allow_old_checkpoint_format);
    let group = mlx_dist::init(mlx_dist::Backend::Any).context("joining the ranks")?;
    let t0 = std::time::Instant::now();
    let r = evaluate(&args, &group)?;
    if group.rank() != 0 {
        return Ok(());
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&r)?);
        return Ok(());
    }
    let secs = t0.elapsed().as_secs_f64();
    println!("Model: {}", args.checkpoint);
    if let Some(a) = &args.adapter {
        println!("Adapter: {}", a.display());
    }
    println!("Perplexity: {:.3} ± {:.3}", r.perplexity, r.std_err);
    println!("Loss: {:.3} ± {:.3}", r.loss, r.loss_std_err);
    println!(
        "Evaluated {} tokens in {} sequences ({} batch{}) on {} rank{} in {secs:.2} s",
        r.tokens,
        r.sequences,
        r.batches,
        if r.batches == 1 { "" } else { "es" },
        group.size(),
        if group.size() == 1 { "" } else { "s" }
    );
    Ok(())
}
