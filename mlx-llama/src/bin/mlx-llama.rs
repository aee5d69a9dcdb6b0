//! `mlx-llama`: train the Llama model (on 1 rank, or N under `mlx-launch`)
//! and sample text from a checkpoint.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use mlx_llama::options_file;
use mlx_llama::{
    Batching, CommunicationDtype, DataSource, FloatDtype, LlamaConfig, ScheduleKind,
    TokenizerChoice, TrainConfig, train,
};

#[derive(Parser)]
#[command(
    version,
    about = "Train a small Llama data-parallel, or sample from a checkpoint"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Train (the same program on 1 rank or N ranks under mlx-launch).
    #[command(args_override_self = true)]
    Train(Box<TrainArgs>),
    /// Sample text from a checkpoint.
    Generate(GenerateArgs),
    /// Write a checkpoint as a folder for transformers (hf) or mlx-lm (mlx).
    Export(mlx_llama::export::ExportArgs),
}

#[derive(Args, Debug)]
struct TrainArgs {
    /// A TOML file of these options (keys are their long names, with `_` or
    /// `-`; `true` turns a switch on); flags given here override it. The run
    /// folder keeps the resolved options as run.toml.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Optimizer steps.
    #[arg(long, default_value_t = 100)]
    steps: u64,
    /// Sequences per step across all ranks.
    #[arg(long, default_value_t = 4)]
    global_batch: usize,
    /// Sequences per step on each rank (overrides --global-batch).
    #[arg(long)]
    per_rank_batch: Option<usize>,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 512)]
    block_size: usize,
    /// Peak learning rate (AdamW).
    #[arg(long, default_value_t = 3e-4)]
    lr: f64,
    /// Schedule after warmup.
    #[arg(long, value_enum, default_value_t = ScheduleKind::Constant)]
    schedule: ScheduleKind,
    /// Linear warmup steps.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// AdamW weight decay.
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    /// Clip the gradient norm to this.
    #[arg(long)]
    grad_clip: Option<f64>,
    /// Micro-batches accumulated per step.
    #[arg(long, default_value_t = 1)]
    grad_accumulation: usize,
    /// Seed of the weights and the data order.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Data: auto (TinyStories' parquet from the Hub, else offline), offline, hub,
    /// text:TRAIN,VALID, jsonl:TRAIN,VALID or parquet:TRAIN,VALID (files or folders of
    /// *.parquet with a `text` column).
    #[arg(long, default_value = "auto")]
    data: String,
    /// Tokenizer: auto (GPT-2, embedded), a tokenizer.json path, gpt2:DIR (vocab.json +
    /// merges.txt) or train:N.
    #[arg(long, default_value = "auto")]
    tokenizer: String,
    /// Padding (one story per row) or packing.
    #[arg(long, value_enum, default_value_t = Batching::Pack)]
    batching: Batching,
    /// Model: layers.
    #[arg(long, default_value_t = 4)]
    layers: usize,
    /// Model: width.
    #[arg(long, default_value_t = 256)]
    dims: usize,
    /// Model: heads.
    #[arg(long, default_value_t = 4)]
    heads: usize,
    /// Model: MLP width.
    #[arg(long, default_value_t = 512)]
    mlp_dims: usize,
    /// Model: vocabulary; 0 takes the tokenizer's (50,257 for GPT-2), a smaller one grows to fit it.
    #[arg(long, default_value_t = 0)]
    vocab: usize,
    /// Cache folder for token stores and tokenizers.
    #[arg(long)]
    data_cache: Option<PathBuf>,
    /// Each rank appends its array memory per step to PATH.rank<R>.jsonl.
    #[arg(long)]
    memory_log: Option<PathBuf>,
    /// Each rank appends the samples of every step (epoch and token-store
    /// indices of its rows) to PATH.rank<R>.jsonl.
    #[arg(long)]
    sample_log: Option<PathBuf>,
    /// Bytes per gradient communication bucket (MLX's all_reduce_size;
    /// 0: one collective per tensor); suffixes KiB, MiB, GiB, K, M, G allowed.
    #[arg(long, default_value = "32MiB", value_parser = byte_size)]
    all_reduce_size: usize,
    /// The dtype gradients travel in between the ranks (MLX's
    /// communication_type): bf16 or f16 halve the bytes of f32 gradients;
    /// default: their own dtype.
    #[arg(long, value_enum, alias = "communication-type")]
    communication_dtype: Option<CommunicationDtype>,
    /// The dtype the model computes in: f32, or bf16 / f16 with float32
    /// master weights and optimizer state (f16 with a dynamic loss scale).
    /// Which is fast where: on a CPU with AMX or AVX512_BF16, bf16; on a GPU
    /// whose adapter offers cooperative matrices (NVIDIA's tensor cores
    /// through Vulkan), f16 matmuls, attention and the output projection +
    /// loss run on them while bf16 computes in f32 (no bf16 cooperative
    /// matrix there); elsewhere f32.
    #[arg(long, value_enum, default_value = "f32")]
    dtype: FloatDtype,
    /// The first loss scale with --dtype f16 (default 65536); halved on
    /// every step whose gradients overflow, doubled after 2,000 good ones.
    #[arg(long)]
    loss_scale: Option<f64>,
    /// Send the embedding's whole gradient between the ranks (by default
    /// only the rows of the batch's tokens travel: the rest are zero).
    #[arg(long)]
    dense_embedding_gradients: bool,
    /// Keep the whole AdamW state on every rank and average whole gradients
    /// (by default, with several ranks, each keeps only its shard).
    #[arg(long)]
    no_shard_optimizer: bool,
    /// Split each model over this many consecutive ranks (tensor
    /// parallelism: every block's heads and MLP); the world is that many
    /// times the data-parallel replicas (e.g. -n 4 with 2: two replicas of
    /// two shards). Each shard keeps its optimizer state whole: with more
    /// than one, the optimizer is not sharded (--no-shard-optimizer is implied).
    #[arg(long, default_value_t = 1)]
    tensor_parallel: usize,
    /// Evaluate on the validation split every N steps (0: never); the
    /// validation loss is `eval_loss` in metrics.jsonl and loss.png.
    #[arg(long, default_value_t = 25)]
    eval_every: u64,
    /// Validation batches per rank per evaluation.
    #[arg(long, default_value_t = 4)]
    eval_batches: usize,
    /// Checkpoint every N steps (always at the end, and on SIGINT/SIGTERM).
    /// Without it: a checkpoint every 10 minutes, or 50 times as long as
    /// the last one took if longer (under 2% of the run).
    #[arg(long)]
    checkpoint_every: Option<u64>,
    /// Keep only the newest N checkpoints, deleting older ones as new ones
    /// are published (0: keep all).
    #[arg(long, default_value_t = 0)]
    keep_checkpoints: usize,
    /// Run folder for metrics and checkpoints.
    #[arg(long, default_value = "runs/latest")]
    out: PathBuf,
    /// Continue from the latest checkpoint in the run folder (implied in a
    /// job that `mlx-launch --max-restarts` started again); an error when
    /// there is none. Changed options go to run.resume-N.toml.
    #[arg(long, conflicts_with = "fresh")]
    resume: bool,
    /// Start afresh even if the run folder holds an earlier run (its
    /// checkpoints, metrics and curves are removed).
    #[arg(long)]
    fresh: bool,
    /// Log every N steps.
    #[arg(long, default_value_t = 1)]
    log_every: u64,
    /// Device: cpu or gpu (any adapter wgpu finds; Mesa's lavapipe on Linux without a GPU).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Seconds a collective waits for a live rank that is late (a long
    /// evaluation or checkpoint on one rank); default MLX_DIST_TIMEOUT_MS, else 600.
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    collective_timeout: Option<std::time::Duration>,
    /// Seconds without a heartbeat after which a rank is declared dead;
    /// default MLX_DIST_LIVENESS_MS, else 5.
    #[arg(long, value_name = "SECS", value_parser = positive_secs)]
    liveness_timeout: Option<std::time::Duration>,
    /// Collective backend: any, ring, quic, mpi.
    #[arg(long, default_value = "any")]
    backend: String,
    /// Write the run's summary as JSON to this file (rank 0).
    #[arg(long)]
    summary: Option<PathBuf>,
    /// Where the metrics go, comma-separated: tensorboard (event files in
    /// the run folder: `tensorboard --logdir runs`), jsonl (metrics.jsonl),
    /// csv (metrics.csv and loss.png, drawn from metrics.jsonl, which is then
    /// written too); all or none. None needs a network.
    #[arg(long, default_value = "all")]
    report_to: mlx_llama::metrics::ReportTo,
    /// Start from pretrained weights: a Hugging Face or mlx-lm Llama folder
    /// (config.json, model.safetensors or shards with
    /// model.safetensors.index.json); its config.json sets the model's
    /// shape (the model options are then ignored).
    #[arg(long, value_name = "DIR")]
    init_from: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// A run folder (its latest checkpoint) or a checkpoint folder.
    #[arg(long, default_value = "runs/latest")]
    checkpoint: PathBuf,
    /// Text to continue; `-` reads it from standard input.
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// Tokens to sample at most (generation stops earlier at the
    /// tokenizer's end of text, `<|endoftext|>`).
    #[arg(long, default_value_t = 100)]
    max_tokens: usize,
    /// Sampling temperature (0: greedy).
    #[arg(long, alias = "temp", default_value_t = 0.8, value_parser = temperature)]
    temperature: f64,
    /// Sample only from the most likely tokens whose probabilities add up
    /// to this (1: all).
    #[arg(long, default_value_t = 1.0, value_parser = probability)]
    top_p: f64,
    /// Sample only from the K most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Penalise the tokens of the recent context (mlx-lm's): their positive
    /// logits are divided by it, negative ones multiplied (1: none).
    #[arg(long, value_parser = temperature)]
    repetition_penalty: Option<f64>,
    /// How many recent tokens the repetition penalty looks at.
    #[arg(long, default_value_t = 20)]
    repetition_context_size: usize,
    /// Sampling seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Split the model over the ranks of mlx-launch: `tensor` (every
    /// block's heads and MLP), `pipeline` (the blocks, in order), or `none`
    /// (one process).
    #[arg(long, value_enum, default_value_t = Parallel::None)]
    parallel: Parallel,
}

/// How `generate` splits the model over the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Parallel {
    /// The whole model in one process.
    None,
    /// Tensor parallelism: each rank holds a slice of every block.
    Tensor,
    /// Pipeline parallelism: each rank holds some of the blocks.
    Pipeline,
}

fn pair(s: &str) -> Result<(PathBuf, PathBuf)> {
    let (a, b) = s
        .split_once(',')
        .with_context(|| format!("expected TRAIN,VALID paths, got `{s}`"))?;
    Ok((a.into(), b.into()))
}

fn data_source(s: &str) -> Result<DataSource> {
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
        _ => bail!(
            "unknown --data `{s}`: use auto, offline, hub, text:TRAIN,VALID, jsonl:TRAIN,VALID \
             or parquet:TRAIN,VALID"
        ),
    })
}

fn tokenizer(s: &str) -> Result<TokenizerChoice> {
    Ok(match s {
        "auto" => TokenizerChoice::Auto,
        _ if s.starts_with("gpt2:") => TokenizerChoice::Gpt2Files(s[5..].into()),
        _ if s.starts_with("train:") => TokenizerChoice::Train(
            s[6..]
                .parse()
                .with_context(|| format!("bad vocabulary size in `{s}`"))?,
        ),
        _ => TokenizerChoice::File(s.into()),
    })
}

fn config(a: &TrainArgs) -> Result<TrainConfig> {
    Ok(TrainConfig {
        model: LlamaConfig {
            num_layers: a.layers,
            vocab_size: a.vocab,
            dims: a.dims,
            mlp_dims: a.mlp_dims,
            num_heads: a.heads,
            ..LlamaConfig::default()
        },
        steps: a.steps,
        global_batch: a.global_batch,
        per_rank_batch: a.per_rank_batch,
        block_size: a.block_size,
        learning_rate: a.lr,
        schedule: a.schedule,
        warmup: a.warmup,
        weight_decay: a.weight_decay,
        grad_clip: a.grad_clip,
        grad_accumulation: a.grad_accumulation,
        tensor_parallel: a.tensor_parallel,
        seed: a.seed,
        data: data_source(&a.data)?,
        // A pretrained folder's own tokenizer, unless another is named.
        tokenizer: match &a.init_from {
            Some(d) if a.tokenizer == "auto" && d.join("tokenizer.json").is_file() => {
                TokenizerChoice::File(d.join("tokenizer.json"))
            }
            _ => tokenizer(&a.tokenizer)?,
        },
        batching: a.batching,
        eval_every: a.eval_every,
        eval_batches: a.eval_batches,
        checkpoint_every: a.checkpoint_every.unwrap_or(0),
        checkpoint_interval_s: if a.checkpoint_every.is_some() { 0 } else { 600 },
        keep_checkpoints: a.keep_checkpoints,
        out_dir: a.out.clone(),
        log_every: a.log_every,
        all_reduce_size: a.all_reduce_size,
        communication_dtype: a.communication_dtype,
        dtype: a.dtype,
        loss_scale: a.loss_scale,
        sparse_embedding_gradients: !a.dense_embedding_gradients,
        device: a.device.clone(),
        data_cache: a.data_cache.clone(),
        memory_log: a.memory_log.clone(),
        sample_log: a.sample_log.clone(),
        shard_optimizer: !a.no_shard_optimizer,
        report_to: a.report_to,
        init_from: a.init_from.clone(),
    })
}

/// A size in bytes: digits with an optional binary (KiB, MiB, GiB) or
/// decimal-looking (K, M, G, taken as powers of 1024 too) suffix.
fn byte_size(s: &str) -> std::result::Result<usize, String> {
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

/// A temperature (or penalty): a finite number of at least 0.
fn temperature(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(t) if t.is_finite() && t >= 0.0 => Ok(t),
        _ => Err(format!("expected a finite number of at least 0, got `{s}`")),
    }
}

/// A probability: a number from 0 to 1.
fn probability(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(p) if (0.0..=1.0).contains(&p) => Ok(p),
        _ => Err(format!("expected a number from 0 to 1, got `{s}`")),
    }
}

/// A timeout in seconds: finite and above zero (the launcher's own rule).
fn positive_secs(s: &str) -> std::result::Result<std::time::Duration, String> {
    mlx_dist::config::parse_seconds(s, true)
}

fn run_train(a: TrainArgs, resolved: String) -> Result<()> {
    let cfg = config(&a)?;
    let backend = mlx_dist::Backend::from_name(&a.backend)
        .with_context(|| format!("unknown --backend `{}`", a.backend))?;
    let mut join = mlx_dist::InitOptions::new(backend);
    join.collective_timeout = a.collective_timeout;
    join.liveness_timeout = a.liveness_timeout;
    let group = mlx_dist::init_with(&join).context("joining the distributed job")?;
    // A job that mlx-launch --max-restarts started again resumes, as --resume.
    let restarted = mlx_dist::config::restart_count()? > 0;
    let intent = mlx_llama::run_folder::Intent {
        resume: a.resume,
        fresh: a.fresh,
        restarted,
    };
    // Held until the run ends: no second run writes into the folder.
    let _lock = mlx_llama::run_folder::prepare(&cfg.out_dir, intent, &group)?;
    if group.rank() == 0 {
        let resuming = (a.resume || restarted) && !a.fresh;
        mlx_llama::run_folder::record_options(&cfg.out_dir, &resolved, resuming)?;
    }
    let s = train(&cfg, &group)?;
    if mlx_array::profile::enabled() {
        eprintln!("rank {}: {}", group.rank(), mlx_array::profile::report(30));
    }
    if let Some(step) = s.stopped_at {
        bail!(
            "stopped by a signal after step {step} of {}; checkpoint {}; to continue, run the same command with --resume (or: mlx-llama train --config {} --resume)",
            cfg.steps,
            s.checkpoint
                .as_ref()
                .map_or("none".into(), |p| p.display().to_string()),
            cfg.out_dir.join("run.toml").display()
        );
    }
    if group.rank() == 0 && !s.losses.is_empty() {
        mlx_llama::console::line(&format!(
            "done: {} steps, final loss {:.4}, median {:.0} ms/step, {:.0} tokens/s, peak {:.0} MiB per rank; checkpoint {}",
            s.losses.len(),
            s.losses.last().copied().unwrap_or(f32::NAN),
            s.median_ms,
            s.tokens_per_s,
            s.peak_mib,
            s.checkpoint
                .as_ref()
                .map_or("none".into(), |p| p.display().to_string())
        ));
    }
    if group.rank() == 0
        && let Some(p) = &a.summary
    {
        std::fs::write(p, serde_json::to_string_pretty(&s)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

fn run_generate(a: GenerateArgs) -> Result<()> {
    let group = mlx_dist::init(mlx_dist::Backend::Any).context("joining the ranks")?;
    let (rank, world) = (group.rank(), group.size());
    if world > 1 && a.parallel == Parallel::None {
        bail!(
            "generate runs on {world} ranks: pass --parallel tensor or --parallel pipeline to split the model over them"
        );
    }
    // Each rank reads only its part of the weights.
    let (config, part) = match a.parallel {
        // A Hugging Face or mlx-lm folder (an export, or pretrained weights).
        Parallel::None if mlx_llama::import::is_model_folder(&a.checkpoint) => {
            let model = mlx_llama::import::load(&a.checkpoint)?;
            let file = a.checkpoint.join("tokenizer.json");
            let config = TrainConfig {
                tokenizer: if file.is_file() {
                    TokenizerChoice::File(file)
                } else {
                    TokenizerChoice::Auto
                },
                ..TrainConfig::default()
            };
            (config, Part::Shard(model))
        }
        Parallel::None | Parallel::Tensor => {
            let trained = mlx_llama::checkpoint::load_trained_shard(&a.checkpoint, &group)?;
            (trained.config, Part::Shard(trained.model))
        }
        Parallel::Pipeline => {
            let (stage, config) = mlx_llama::pipeline::PipelineStage::load(&a.checkpoint, &group)?;
            (config, Part::Stage(stage))
        }
    };
    let params = match &part {
        Part::Shard(m) => mlx_nn::ModuleExt::named_parameters(m)
            .iter()
            .map(|(_, a)| a.nbytes())
            .sum(),
        Part::Stage(s) => s.parameter_bytes(),
    };
    let tokenizer = mlx_llama::trainer::tokenizer_for(&config).context("loading the tokenizer")?;
    let prompt = if a.prompt == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the prompt from standard input")?;
        text
    } else {
        a.prompt.clone()
    };
    let ids = tokenizer.encode(&prompt)?;
    let sampling = mlx_llama::sampling::Sampling {
        temperature: a.temperature,
        top_p: a.top_p,
        top_k: a.top_k,
        repetition_penalty: a.repetition_penalty.unwrap_or(1.0),
        repetition_context_size: a.repetition_context_size,
    };
    sampling.check().map_err(anyhow::Error::msg)?;
    let load_peak = mlx_array::memory::peak();
    mlx_array::memory::reset_peak();
    // Rank 0 prints the text as it comes, each token flushed (a token that
    // ends inside a UTF-8 character waits for the rest).
    let mut stdout = std::io::stdout().lock();
    if rank == 0 {
        let _ = write!(stdout, "{prompt}").and_then(|_| stdout.flush());
    }
    let mut so_far = Vec::new();
    let mut printed = 0;
    let mut first_token = None;
    let t0 = std::time::Instant::now();
    let mut on_token = |id: u32| -> mlx_array::Result<()> {
        first_token.get_or_insert_with(std::time::Instant::now);
        if rank != 0 {
            return Ok(());
        }
        so_far.push(id);
        let text = tokenizer
            .decode(&so_far)
            .map_err(|e| mlx_array::Error::eval("decode", e.to_string()))?;
        if !text.ends_with('\u{FFFD}') && text.len() > printed && text.is_char_boundary(printed) {
            // Output nobody reads (a closed pipe) does not stop the generation.
            let _ = write!(stdout, "{}", &text[printed..]).and_then(|_| stdout.flush());
            printed = text.len();
        }
        Ok(())
    };
    let stop = [tokenizer.eos_id()];
    let out = match &part {
        Part::Shard(m) => {
            m.generate_with(&ids, a.max_tokens, &sampling, a.seed, &stop, &mut on_token)?
        }
        Part::Stage(s) => {
            s.generate_with(&ids, a.max_tokens, &sampling, a.seed, &stop, &mut on_token)?
        }
    };
    let end = std::time::Instant::now();
    if rank == 0 {
        let text = tokenizer.decode(&out)?;
        let _ = writeln!(stdout, "{}", text.get(printed..).unwrap_or(""));
    }
    if mlx_array::profile::enabled() {
        eprintln!("rank {rank}: {}", mlx_array::profile::report(30));
    }
    eprintln!(
        "rank {rank}: holds {:.1} MiB of parameters, peak {:.1} MiB of arrays while loading, {:.1} MiB while generating",
        params as f64 / 1048576.0,
        load_peak as f64 / 1048576.0,
        mlx_array::memory::peak() as f64 / 1048576.0
    );
    if rank == 0 {
        // mlx-lm's lines: the prompt's rate is its tokens over the time to
        // the first new token; the generation's, the new tokens over the
        // time after the first.
        let first = first_token.unwrap_or(end);
        let prompt_secs = (first - t0).as_secs_f64();
        let generation_secs = (end - first).as_secs_f64();
        eprintln!("==========");
        eprintln!(
            "Prompt: {} tokens, {:.3} tokens-per-sec",
            ids.len(),
            ids.len() as f64 / prompt_secs
        );
        eprintln!(
            "Generation: {} tokens, {:.3} tokens-per-sec",
            out.len(),
            if generation_secs > 0.0 {
                out.len() as f64 / generation_secs
            } else {
                0.0
            }
        );
        eprintln!(
            "Ran as {}",
            match a.parallel {
                Parallel::None => "one process".to_string(),
                Parallel::Tensor => format!("tensor parallel over {world} ranks"),
                Parallel::Pipeline => format!("pipeline parallel over {world} ranks"),
            }
        );
    }
    Ok(())
}

/// This rank's part of the model `generate` runs.
enum Part {
    /// The whole model, or with tensor parallelism this rank's shard of it.
    Shard(mlx_llama::Llama),
    /// This rank's stage of a pipeline.
    Stage(mlx_llama::pipeline::PipelineStage),
}

/// The command line, with `train --config FILE`'s options put before the
/// flags given (which override them), and the train options as resolved,
/// as TOML (empty for the other commands).
fn parse_command_line() -> (Cli, String) {
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let command = Cli::command();
    let train = command
        .find_subcommand("train")
        .expect("the train subcommand")
        .clone();
    let argv = if argv.get(1).is_some_and(|a| a == "train") {
        let mut merged = argv[..1].to_vec();
        match options_file::with_config_file(&train, argv[1..].to_vec(), "config") {
            Ok(args) => merged.extend(args),
            Err(e) => {
                eprintln!("error: {e:#}");
                std::process::exit(2);
            }
        }
        merged
    } else {
        argv
    };
    let matches = command.get_matches_from(argv);
    let resolved = matches
        .subcommand_matches("train")
        .map(|m| options_file::resolved_toml(&train, m, &["config", "resume", "fresh"]))
        .unwrap_or_default();
    match Cli::from_arg_matches(&matches) {
        Ok(cli) => (cli, resolved),
        Err(e) => e.exit(),
    }
}

fn main() {
    // SAFETY: the first statement of main; no other thread exists yet.
    unsafe { mlx_array::blas::prefer_native_openblas_kernels() };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MLX_LOG")
                .unwrap_or_else(|_| "warn".into()),
        )
        .with_ansi(mlx_progress::stderr_color())
        .with_writer(mlx_progress::stderr)
        .init();
    let (cli, resolved) = parse_command_line();
    if matches!(cli.cmd, Cmd::Train(_))
        && let Err(e) = mlx_llama::trainer::stop::install_signal_handlers()
    {
        eprintln!("warning: {e:#}; a signal ends the run without a checkpoint");
    }
    let result = match cli.cmd {
        Cmd::Train(a) => run_train(*a, resolved),
        Cmd::Generate(a) => run_generate(a),
        Cmd::Export(a) => mlx_llama::export::run(a),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        // Under MPI, aborts the job so the other ranks do not wait for this one.
        mlx_dist::exit_rank(1);
    }
}
