//! What a run is built from: its data pipeline, batch size, learning-rate
//! schedule, model and optimizer.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use mlx_array::Dtype;
use mlx_data::{
    BatchMode, BatchSize, DataConfig, DataLoader, HubClient, LoaderConfig, Split, TextTokenizer,
    TokenStore, TokenizerSpec,
};
use mlx_dist::Group;
use mlx_optim::{AdamW, Schedule, schedule};

use crate::config::{Batching, DataSource, FloatDtype, ScheduleKind, TokenizerChoice, TrainConfig};
use crate::source::Resolved;
use crate::{Llama, LlamaConfig};

/// The data pipeline settings of a run (also used to find its tokenizer again).
pub fn data_config_for(cfg: &TrainConfig) -> DataConfig {
    use mlx_data::{LocalFormat, LocalSource, OfflineCorpus, SourceSpec};
    let mut d = DataConfig::default();
    if let Some(dir) = &cfg.data_cache {
        d.cache_dir = dir.clone();
    }
    let local = |train: &PathBuf, validation: &Option<PathBuf>, format: LocalFormat| {
        SourceSpec::Local(LocalSource {
            train: train.clone(),
            validation: validation.clone(),
            options: local_options(cfg, &format),
            format,
        })
    };
    d.source = match &cfg.data {
        DataSource::Auto => d.source.clone(),
        DataSource::Offline => SourceSpec::Offline(OfflineCorpus::default()),
        DataSource::Hub => match &d.source {
            SourceSpec::Auto { hub, .. } => SourceSpec::Hub(hub.clone()),
            s => s.clone(),
        },
        DataSource::Text { train, validation } => local(
            train,
            validation,
            LocalFormat::Text {
                separator: separator(&cfg.separator),
            },
        ),
        DataSource::JsonLines { train, validation } => {
            local(train, validation, LocalFormat::JsonLines)
        }
        DataSource::Parquet { train, validation } => local(
            train,
            validation,
            LocalFormat::Parquet {
                column: "text".into(),
            },
        ),
    };
    d.tokenizer = match &cfg.tokenizer {
        TokenizerChoice::Auto => TokenizerSpec::default(),
        TokenizerChoice::File(p) => TokenizerSpec::File(p.clone()),
        TokenizerChoice::Gpt2Files(dir) => TokenizerSpec::VocabMerges {
            vocab: dir.join("vocab.json"),
            merges: dir.join("merges.txt"),
        },
        TokenizerChoice::Train(n) => TokenizerSpec::TrainByteLevel { vocab_size: *n },
    };
    d
}

/// `--separator`'s text: `eot` is `<|endoftext|>`, `blank-line` is
/// [`mlx_data::source::corpus::BLANK_LINE`], anything else itself.
fn separator(s: &str) -> String {
    match s {
        "eot" => mlx_data::tokenizer::ENDOFTEXT.into(),
        "blank-line" => mlx_data::source::corpus::BLANK_LINE.into(),
        other => other.into(),
    }
}

/// The chat template, prompt masking, JSON Lines separator and held-out
/// fraction of a local source. The template is `--chat-template`'s, else
/// the tokenizer's: the folder of `--tokenizer`'s tokenizer.json, or of
/// `--init-from` (a model folder). A template that cannot be read is
/// logged and left out (chat rows then say they need one).
fn local_options(cfg: &TrainConfig, format: &mlx_data::LocalFormat) -> mlx_data::LocalOptions {
    let mut o = mlx_data::LocalOptions {
        mask_prompt: cfg.mask_prompt,
        valid_fraction_ppm: (cfg.valid_fraction.clamp(0.0, 1.0) * 1e6).round() as u32,
        ..Default::default()
    };
    if *format != mlx_data::LocalFormat::JsonLines {
        return o;
    }
    if cfg.separator != "eot" {
        o.jsonl_separator = Some(separator(&cfg.separator));
    }
    let dir = match (&cfg.tokenizer, &cfg.init_from) {
        (TokenizerChoice::File(p), _) => p.parent().map(PathBuf::from),
        (_, Some(src)) => match src.locate() {
            Ok(crate::source::Located::Path(p)) => Some(p),
            _ => None,
        },
        _ => None,
    };
    let own = dir.and_then(
        |d: PathBuf| match mlx_data::ChatTemplate::from_model_dir(&d) {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "the tokenizer's chat template cannot be read");
                None
            }
        },
    );
    o.chat_template = match &cfg.chat_template {
        Some(file) => {
            let base = own.unwrap_or_else(|| mlx_data::ChatTemplate {
                source: String::new(),
                bos_token: mlx_data::tokenizer::ENDOFTEXT.into(),
                eos_token: mlx_data::tokenizer::ENDOFTEXT.into(),
                origin: String::new(),
            });
            match base.with_file(file) {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(error = %e, "--chat-template cannot be read");
                    None
                }
            }
        }
        None => own,
    };
    o
}

/// The run's tokenizer alone, without building token stores: the embedded
/// GPT-2, a file, or a trained BPE from the data cache (trained now if the
/// cache lost it); GPT-2 from the Hub goes through [`mlx_data::prepare`].
pub fn tokenizer_for(cfg: &TrainConfig) -> Result<TextTokenizer> {
    let d = data_config_for(cfg);
    Ok(match &d.tokenizer {
        TokenizerSpec::Gpt2 => TextTokenizer::gpt2()?,
        TokenizerSpec::File(p) => TextTokenizer::from_file(p)?,
        TokenizerSpec::VocabMerges { vocab, merges } => {
            TextTokenizer::from_vocab_merges(vocab, merges)?
        }
        TokenizerSpec::TrainByteLevel { vocab_size } => {
            let hub = HubClient::new(d.hub.clone());
            let train = d.source.resolve(Split::Train, &hub)?;
            mlx_data::pipeline::trained_tokenizer(
                &d.cache_dir,
                &train,
                *vocab_size,
                d.lock_deadline,
            )?
        }
        _ => mlx_data::prepare(&d)?.tokenizer,
    })
}

/// The learning rate of every step as `cfg` configures it: `--warmup`
/// steps from 0 to `--lr`, then `--schedule` towards `--min-lr`, as Hugging
/// Face's schedulers define them (`transformers.optimization`), with the
/// same step count: `t`, the updates applied before the step (0 for the
/// first), `W` the warmup steps and `T` the run's steps.
///
/// - warmup (`t < W`): `lr * t / W`;
/// - constant: `lr`;
/// - cosine: `min + (lr - min) * (1 + cos(pi * (t - W) / (T - W))) / 2`,
///   `min` 10% of `lr` unless given (`get_cosine_with_min_lr_schedule_with_warmup`);
/// - linear: `min + (lr - min) * (T - t) / (T - W)`, `min` 0 unless given
///   (`get_linear_schedule_with_warmup`, which decays to 0);
/// - wsd, wsd-sqrt: `D = round(T * decay_fraction)` (at least 1) decay
///   steps at the end: `lr` until `t = T - D`, then with `p = (t - T + D) /
///   D`, `min + (lr - min) * (1 - p)` or `(1 - sqrt(p))`, `min` 0 unless
///   given (`get_wsd_schedule` with `decay_type` linear or 1-sqrt; the
///   shapes of torchtitan's `lr_scheduler.decay_type`).
///
/// Refuses `--min-lr` with the constant schedule, `--decay-fraction`
/// with any but wsd, a floor above `--lr`, and a decay that would start
/// before the warmup ends.
pub fn lr_schedule(cfg: &TrainConfig) -> Result<Schedule> {
    let (lr, steps, warmup) = (cfg.learning_rate, cfg.steps, cfg.warmup);
    let wsd = matches!(cfg.schedule, ScheduleKind::Wsd | ScheduleKind::WsdSqrt);
    if !(lr.is_finite() && lr >= 0.0) {
        bail!("--lr {lr} must be a finite number of at least 0");
    }
    if cfg.schedule == ScheduleKind::Constant && cfg.min_lr.is_some() {
        bail!(
            "--min-lr is the floor a schedule decays to: --schedule constant does not decay (use cosine, linear, wsd or wsd-sqrt)"
        );
    }
    if !wsd && cfg.decay_fraction.is_some() {
        bail!(
            "--decay-fraction is the share of the steps a wsd schedule decays over: use it with --schedule wsd or wsd-sqrt"
        );
    }
    let min = cfg.min_lr.unwrap_or(match cfg.schedule {
        ScheduleKind::Cosine => lr * 0.1,
        _ => 0.0,
    });
    if !(0.0..=lr).contains(&min) {
        bail!("--min-lr {min} must be between 0 and --lr {lr}");
    }
    // The steps after warmup (at least one).
    let after = steps.saturating_sub(warmup).max(1);
    let main = match cfg.schedule {
        ScheduleKind::Constant => schedule::constant(lr),
        ScheduleKind::Cosine => schedule::cosine_decay(lr, after, min)?,
        ScheduleKind::Linear => schedule::linear_schedule(lr, min, after)?,
        ScheduleKind::Wsd | ScheduleKind::WsdSqrt => {
            let fraction = cfg.decay_fraction.unwrap_or(0.2);
            if !(fraction > 0.0 && fraction <= 1.0) {
                bail!("--decay-fraction {fraction} must be above 0 and at most 1");
            }
            let decay = ((steps as f64 * fraction).round() as u64).max(1);
            let stable = steps.checked_sub(warmup + decay).with_context(|| {
                format!(
                    "--schedule wsd: the decay ({decay} steps, --decay-fraction {fraction} of {steps}) would start before the {warmup} warmup steps end"
                )
            })?;
            let sqrt = cfg.schedule == ScheduleKind::WsdSqrt;
            let tail = Schedule::new(
                format!(
                    "{}({lr}, {min}, {decay})",
                    if sqrt { "sqrt_decay" } else { "linear_decay" }
                ),
                move |s| {
                    let p = s.min(decay) as f64 / decay as f64;
                    let left = if sqrt { 1.0 - p.sqrt() } else { 1.0 - p };
                    min + (lr - min) * left
                },
            );
            schedule::join_schedules(vec![schedule::constant(lr), tail], &[stable])?
        }
    };
    if warmup == 0 {
        return Ok(main);
    }
    let warm = schedule::linear_schedule(0.0, lr, warmup)?;
    Ok(schedule::join_schedules(vec![warm, main], &[warmup])?)
}

/// AdamW as configured, with mlx-optim's fused float32 kernel (one pass
/// per parameter, on the CPU or the GPU, whichever the step runs on). A
/// half-precision run on the GPU has the kernel write each new weight's
/// copy in the compute dtype too, which the next forward pass reads
/// instead of casting every weight again (a kernel fewer per parameter a
/// step; on the CPU a cast costs little, and the copies would be two bytes
/// a parameter more memory between steps).
pub(super) fn adamw(cfg: &TrainConfig) -> Result<AdamW> {
    let copy = match cfg.dtype {
        _ if mlx_array::default_device() != mlx_array::Device::Gpu => None,
        FloatDtype::F32 => None,
        FloatDtype::Bf16 => Some(Dtype::BF16),
        FloatDtype::F16 => Some(Dtype::F16),
    };
    Ok(AdamW::new(lr_schedule(cfg)?)
        .weight_decay(cfg.weight_decay)
        .cast_copy(copy))
}

/// `cfg` for a new run from `init`'s weights: the model's shape is the
/// source's, and with `--tokenizer auto` the tokenizer is the source's (a
/// model folder's tokenizer.json; the one a checkpoint's run used, a
/// tokenizer that run trained written to the run folder as tokenizer.json).
pub(super) fn from_source(cfg: &TrainConfig, init: &Resolved) -> Result<TrainConfig> {
    let mut out = TrainConfig {
        model: init.model_config()?,
        ..cfg.clone()
    };
    if cfg.tokenizer == TokenizerChoice::Auto {
        out.tokenizer = match init.tokenizer()? {
            TokenizerChoice::Train(_) => {
                let run = init
                    .trained_config()?
                    .context("a checkpoint's configuration")?;
                let tokenizer = tokenizer_for(&run).with_context(|| {
                    format!("the tokenizer {} was trained with", init.dir.display())
                })?;
                let path = cfg.out_dir.join("tokenizer.json");
                std::fs::create_dir_all(&cfg.out_dir)
                    .with_context(|| format!("creating {}", cfg.out_dir.display()))?;
                // Every rank writes the same bytes; each renames its own copy.
                let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
                tokenizer.save(&tmp)?;
                std::fs::rename(&tmp, &path)
                    .with_context(|| format!("writing {}", path.display()))?;
                TokenizerChoice::File(path)
            }
            // A checkpoint's tokenizer files (its copy, or files inside its
            // run folder: never a path its manifest names elsewhere, see
            // checkpoint::tokenizer_of) are copied into this run's folder,
            // which the run's options then name: they stay when the
            // source's checkpoints are pruned, and name the same files at
            // every resume.
            t @ (TokenizerChoice::File(_) | TokenizerChoice::Gpt2Files(_))
                if init.kind == crate::source::SourceKind::Checkpoint =>
            {
                std::fs::create_dir_all(&cfg.out_dir)
                    .with_context(|| format!("creating {}", cfg.out_dir.display()))?;
                crate::checkpoint::copy_tokenizer(&t, &cfg.out_dir)
                    .with_context(|| format!("the tokenizer of {}", init.dir.display()))?;
                match t {
                    TokenizerChoice::File(_) => {
                        TokenizerChoice::File(cfg.out_dir.join(crate::checkpoint::TOKENIZER_FILE))
                    }
                    _ => TokenizerChoice::Gpt2Files(cfg.out_dir.clone()),
                }
            }
            t => t,
        };
    }
    Ok(out)
}

/// The model as configured, its vocabulary grown to fit a tokenizer of
/// `tokenizer_vocab` tokens (taken whole when the configured one is 0), or
/// `init`'s weights.
pub(super) fn model(
    cfg: &TrainConfig,
    init: Option<&Resolved>,
    tokenizer_vocab: usize,
) -> Result<Llama> {
    if let Some(init) = init {
        let model = init.load()?;
        if tokenizer_vocab > model.config.vocab_size {
            bail!(
                "the tokenizer has {tokenizer_vocab} tokens but {} only {} rows of embedding: pass its tokenizer with --tokenizer",
                init.dir.display(),
                model.config.vocab_size
            );
        }
        return Ok(model);
    }
    let vocab = if cfg.model.vocab_size == 0 {
        tokenizer_vocab
    } else {
        cfg.model.vocab_size.max(tokenizer_vocab)
    };
    let model_cfg = LlamaConfig {
        vocab_size: vocab,
        ..cfg.model.clone()
    };
    Ok(Llama::new(&model_cfg, cfg.seed)?)
}

/// An adapter run's adapters put into `model` (`--fine-tune lora|dora`):
/// the model frozen, its base held in `--base-dtype`; a full run's model
/// is left as it is. Adapters the model came with (an adapter run's
/// checkpoint given to --init-from) are merged into it first, and a full
/// run trains the merged model.
pub(super) fn adapt(cfg: &TrainConfig, model: &mut Llama) -> Result<()> {
    if model.has_adapters() {
        model.fuse_adapters()?;
    }
    let Some(spec) = cfg.adapters.spec(model.config.num_layers) else {
        return Ok(());
    };
    if cfg.tensor_parallel > 1 {
        bail!(
            "--fine-tune {:?} trains adapters on whole layers: it does not combine with --tensor-parallel {} (the base is frozen and small next to full training: replicate it)",
            cfg.adapters.fine_tune,
            cfg.tensor_parallel
        );
    }
    model
        .add_adapters(&spec, cfg.seed)
        .context("adding the adapters")?;
    let base = cfg.adapters.base_dtype.dtype();
    if base != Dtype::F32 {
        model.cast_frozen(base)?;
    }
    Ok(())
}

/// This rank's loader of `store`.
pub(super) fn loader(
    store: Arc<TokenStore>,
    cfg: &TrainConfig,
    group: &Group,
    batch: BatchSize,
) -> Result<DataLoader> {
    let lc = LoaderConfig {
        block_size: cfg.block_size,
        batch,
        mode: match cfg.batching {
            Batching::Pad => BatchMode::Pad,
            Batching::Pack => BatchMode::Pack,
        },
        seed: cfg.seed,
        rank: group.rank(),
        world: group.size(),
        release_pages: true,
    };
    Ok(DataLoader::new(store, lc)?)
}

/// The per-rank batch size, or a clear error.
pub(super) fn per_rank(cfg: &TrainConfig, world: usize) -> Result<BatchSize> {
    if let Some(b) = cfg.per_rank_batch {
        return Ok(BatchSize::PerRank(b));
    }
    if cfg.global_batch == 0 || !cfg.global_batch.is_multiple_of(world) {
        bail!(
            "the global batch of {} sequences does not split evenly over {world} ranks (use a multiple of {world}, or --per-rank-batch)",
            cfg.global_batch
        );
    }
    Ok(BatchSize::Global(cfg.global_batch))
}
