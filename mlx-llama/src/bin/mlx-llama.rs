//! `mlx-llama`: train the Llama model (on 1 rank, or N under `mlx-launch`)
//! and sample text from a checkpoint.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, CommandFactory, FromArgMatches, Parser, Subcommand};
use mlx_llama::options_file;
use mlx_llama::source::SourceKind;
use mlx_llama::{ModelSource, TokenizerChoice, TrainConfig, train_accepted};

// Every subcommand takes negative numbers as values (`--temp -1` is
// refused for its value, not taken for a flag) and a repeated option's
// last value, as argparse's tools do.
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
    #[command(
        args_override_self = true,
        allow_negative_numbers = true,
        after_help = TRAIN_EXIT_STATUS
    )]
    Train(Box<TrainArgs>),
    /// Sample text from a checkpoint, a model folder or a Hub model.
    #[command(args_override_self = true, allow_negative_numbers = true)]
    Generate(GenerateArgs),
    /// Write a checkpoint as a folder for transformers (hf) or mlx-lm (mlx).
    #[command(args_override_self = true, allow_negative_numbers = true)]
    Export(mlx_llama::export::ExportArgs),
    /// Loss and perplexity of a model (with or without adapters) on a
    /// dataset, on 1 rank or N under mlx-launch.
    #[command(args_override_self = true, allow_negative_numbers = true)]
    Eval(mlx_llama::eval::EvalArgs),
}

/// `train`'s exit statuses, for `--help` (the README's table says the same).
const TRAIN_EXIT_STATUS: &str = "\
Exit status (each rank's, and mlx-launch's for the job):
  0        trained to --steps (or nothing was left to train)
  1        failed; the error says why (under mlx-launch, which rank)
  2        the command line or --config file was refused
  128+N    stopped by signal N after its step, with a checkpoint: 130 for
           Ctrl-C (SIGINT), 143 for SIGTERM, 129 for SIGHUP; continue with
           --resume. A second signal ends at once with the same status,
           losing the steps since the last checkpoint.";

#[derive(Args, Debug)]
struct TrainArgs {
    /// A TOML file of these options (keys are their long names, with `_` or
    /// `-`; `true` turns a switch on); flags given here override it. The run
    /// folder keeps the resolved options as run.toml.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The run's options: one field of `TrainConfig` each.
    #[command(flatten)]
    run: TrainConfig,
    /// Continue from the latest checkpoint in the run folder (implied in a
    /// job that `mlx-launch --max-restarts` started again); an error when
    /// there is none. Changed options go to run.resume-N.toml.
    #[arg(
        help_heading = "Checkpoints and the run folder",
        long,
        conflicts_with = "fresh"
    )]
    resume: bool,
    /// Start afresh even if the run folder holds an earlier run (its
    /// checkpoints, metrics and curves are removed).
    #[arg(help_heading = "Checkpoints and the run folder", long)]
    fresh: bool,
    /// Resume from a checkpoint of format 1, whose manifest records no
    /// checksums, without verifying its files (refused otherwise). Not kept
    /// in run.toml: each resume that needs it asks again.
    #[arg(help_heading = "Checkpoints and the run folder", long)]
    allow_old_checkpoint_format: bool,
    /// Seconds a collective waits for a live rank that is late (a long
    /// evaluation or checkpoint on one rank); default MLX_DIST_TIMEOUT_MS, else 600.
    #[arg(help_heading = "Parallelism and communication", long, value_name = "SECS", value_parser = positive_secs)]
    collective_timeout: Option<std::time::Duration>,
    /// Seconds without a heartbeat after which a rank is declared dead;
    /// default MLX_DIST_LIVENESS_MS, else 5.
    #[arg(help_heading = "Parallelism and communication", long, value_name = "SECS", value_parser = positive_secs)]
    liveness_timeout: Option<std::time::Duration>,
    /// Collective backend: any, ring, quic, mpi.
    #[arg(
        help_heading = "Parallelism and communication",
        long,
        default_value = "any"
    )]
    backend: String,
    /// Write the run's summary as JSON to this file (rank 0).
    #[arg(help_heading = "Logging", long)]
    summary: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct GenerateArgs {
    /// The model: a run folder (its newest intact checkpoint), a checkpoint
    /// folder, a Hugging Face / mlx-lm / export folder, or a Hub model name
    /// org/name or org/name@revision (fetched into the Hugging Face cache;
    /// HF_HUB_OFFLINE=1 uses only the cache).
    #[arg(long, value_name = "SOURCE", default_value = "runs/latest")]
    checkpoint: ModelSource,
    /// The tokenizer, as train's --tokenizer; by default the model's own
    /// (a model folder's tokenizer.json, a checkpoint's run's).
    #[arg(long)]
    tokenizer: Option<TokenizerChoice>,
    /// Text to continue; `-` reads it from standard input.
    #[arg(long, default_value = "Once upon a time")]
    prompt: String,
    /// Tokens to sample at most (generation stops earlier at the
    /// tokenizer's end of text, `<|endoftext|>`, and at the model's own
    /// end-of-sequence tokens).
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
    /// Use the prompt as it is. By default, when the model's tokenizer has a
    /// chat template (tokenizer_config.json or chat_template.jinja beside
    /// tokenizer.json), the prompt is a user message rendered with it and
    /// the assistant's turn opened, as mlx_lm.generate does.
    #[arg(long)]
    ignore_chat_template: bool,
    /// A system message before the prompt, with the chat template.
    #[arg(long, value_name = "TEXT")]
    system_prompt: Option<String>,
    /// Adapters in PEFT's or mlx-lm's layout (a folder with
    /// adapter_config.json: an adapter run's checkpoint, or its mlx-lm/
    /// subfolder) applied to the model unmerged (one process).
    #[arg(long, value_name = "DIR")]
    adapter: Option<PathBuf>,
    /// Read a checkpoint of format 1, whose manifest records no checksums,
    /// without verifying its files (refused otherwise).
    #[arg(long)]
    allow_old_checkpoint_format: bool,
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

/// A stopping signal's name.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        libc::SIGINT => "SIGINT",
        libc::SIGTERM => "SIGTERM",
        libc::SIGHUP => "SIGHUP",
        _ => "a signal",
    }
}

/// Trains; returns the exit status (0, or 128 + the signal that stopped
/// the run with a checkpoint).
fn run_train(a: TrainArgs, resolved: String) -> Result<i32> {
    mlx_llama::checkpoint::allow_old_format(a.allow_old_checkpoint_format);
    let cfg = a.run;
    // A source that is neither a folder nor a Hub name fails before the run
    // folder is touched (the trainer makes it local and reads it).
    if let Some(source) = &cfg.init_from {
        source.locate().context("--init-from")?;
    }
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
    // The options are recorded once the run is accepted (a refused resume
    // writes nothing).
    let resuming = (a.resume || restarted) && !a.fresh;
    let mut record = || {
        if group.rank() == 0 {
            mlx_llama::run_folder::record_options(&cfg.out_dir, &resolved, resuming)?;
        }
        Ok(())
    };
    let s = train_accepted(&cfg, &group, &mut record)?;
    if mlx_array::profile::enabled() {
        eprintln!("rank {}: {}", group.rank(), mlx_array::profile::report(30));
    }
    if let (Some(step), Some(signal)) = (s.stopped_at, s.stop_signal) {
        // One line for the job (rank 0's), not an error: the run did what
        // the signal asked.
        if group.rank() == 0 {
            mlx_llama::console::line(&format!(
                "stopped by {} after step {step} of {}; checkpoint {}; to continue, run the same command with --resume (or: mlx-llama train --config {} --resume)",
                signal_name(signal),
                cfg.steps,
                s.checkpoint
                    .as_ref()
                    .map_or("none".into(), |p| p.display().to_string()),
                cfg.out_dir.join("run.toml").display()
            ));
        }
        return Ok(mlx_llama::trainer::stop::exit_status(signal));
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
    Ok(0)
}

fn run_generate(a: GenerateArgs) -> Result<()> {
    mlx_llama::checkpoint::allow_old_format(a.allow_old_checkpoint_format);
    let group = mlx_dist::init(mlx_dist::Backend::Any).context("joining the ranks")?;
    let (rank, world) = (group.rank(), group.size());
    if world > 1 && a.parallel == Parallel::None {
        bail!(
            "generate runs on {world} ranks: pass --parallel tensor or --parallel pipeline to split the model over them"
        );
    }
    let source = a
        .checkpoint
        .resolve(&mlx_data::HubConfig::from_env())
        .with_context(|| format!("--checkpoint {}", a.checkpoint))?;
    // Each rank reads only its part of our checkpoints' weights.
    let (mut config, part) = match (source.kind, a.parallel) {
        // A Hugging Face or mlx-lm folder (an export, pretrained weights, a
        // Hub model made local): read whole, then cut for tensor parallelism.
        (SourceKind::ModelFolder, Parallel::None | Parallel::Tensor) => {
            let mut model = source.load()?;
            if a.parallel == Parallel::Tensor {
                model
                    .shard(&group)
                    .with_context(|| format!("splitting the model over {world} ranks"))?;
            }
            let config = TrainConfig {
                tokenizer: source.tokenizer()?,
                ..TrainConfig::default()
            };
            (config, Part::Shard(model))
        }
        (SourceKind::ModelFolder, Parallel::Pipeline) => bail!(
            "--parallel pipeline reads our checkpoints, and {} is a model folder: run with --parallel tensor or none, or train from it first (train --init-from {} --steps 1 --lr 0)",
            source.dir.display(),
            a.checkpoint
        ),
        // One process: the whole model, an adapter run's with its adapters.
        (SourceKind::Checkpoint, Parallel::None) => {
            let trained = mlx_llama::checkpoint::load_trained(&source.dir)?;
            (trained.config, Part::Shard(trained.model))
        }
        (SourceKind::Checkpoint, Parallel::Tensor) => {
            let trained = mlx_llama::checkpoint::load_trained_shard(&source.dir, &group)?;
            (trained.config, Part::Shard(trained.model))
        }
        (SourceKind::Checkpoint, Parallel::Pipeline) => {
            let (stage, config) = mlx_llama::pipeline::PipelineStage::load(&source.dir, &group)?;
            (config, Part::Stage(stage))
        }
    };
    config.tokenizer = match (&a.tokenizer, source.kind) {
        (Some(t), _) => t.clone(),
        // The checkpoint's own tokenizer, never a path its manifest names
        // outside the run folder.
        (None, SourceKind::Checkpoint) => mlx_llama::checkpoint::tokenizer_of(&source.dir)?,
        (None, SourceKind::ModelFolder) => config.tokenizer,
    };
    let part = match (part, &a.adapter) {
        (Part::Shard(mut model), Some(dir)) if a.parallel == Parallel::None => {
            if model.has_adapters() {
                bail!(
                    "{} holds adapters already: --adapter {} would stack a second set (merge the first with export --fuse)",
                    source.dir.display(),
                    dir.display()
                );
            }
            mlx_llama::adapters::apply_from(dir, &mut model)
                .with_context(|| format!("--adapter {}", dir.display()))?;
            Part::Shard(model)
        }
        (_, Some(_)) => bail!(
            "--adapter runs in one process (--parallel none); to split an adapted model, merge it first (export --fuse)"
        ),
        (part, None) => part,
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
    let prompt = match (a.ignore_chat_template, chat_template(&config, &source)?) {
        (false, Some(template)) => {
            let mut messages = vec![];
            if let Some(system) = &a.system_prompt {
                messages.push(serde_json::json!({"role": "system", "content": system}));
            }
            messages.push(serde_json::json!({"role": "user", "content": prompt}));
            template.renderer()?.render(&messages, true)?
        }
        (_, None) if a.system_prompt.is_some() => {
            bail!("--system-prompt needs a chat template, and the model's tokenizer has none")
        }
        _ => prompt,
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
    // The tokenizer's end of text, and the model's own end-of-sequence
    // tokens (generation_config.json, config.json, tokenizer_config.json).
    let mut stop = vec![tokenizer.eos_id()];
    stop.extend(source.stop_tokens()?);
    stop.sort_unstable();
    stop.dedup();
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

/// The chat template of the run's tokenizer (the folder of its
/// tokenizer.json), or of a model folder; `None` without one.
fn chat_template(
    config: &TrainConfig,
    source: &mlx_llama::source::Resolved,
) -> Result<Option<mlx_data::ChatTemplate>> {
    let dir = match &config.tokenizer {
        TokenizerChoice::File(p) => p.parent().map(std::path::Path::to_path_buf),
        _ if source.kind == SourceKind::ModelFolder => Some(source.dir.clone()),
        _ => None,
    };
    Ok(match dir {
        Some(d) => mlx_data::ChatTemplate::from_model_dir(&d)?,
        None => None,
    })
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
        .map(|m| {
            options_file::resolved_toml(
                &train,
                m,
                &["config", "resume", "fresh", "allow_old_checkpoint_format"],
            )
        })
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
        Cmd::Generate(a) => run_generate(a).map(|()| 0),
        Cmd::Export(a) => mlx_llama::export::run(a).map(|()| 0),
        Cmd::Eval(a) => mlx_llama::eval::run(a).map(|()| 0),
    };
    match result {
        Ok(0) => {}
        // Stopped by a signal with a checkpoint: every rank exits so.
        Ok(status) => std::process::exit(status),
        Err(e) => {
            eprintln!("error: {e:#}");
            // Under MPI, aborts the job so the other ranks do not wait for this one.
            mlx_dist::exit_rank(1);
        }
    }
}
