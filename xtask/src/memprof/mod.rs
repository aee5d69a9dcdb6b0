//! `cargo xtask memprof --worlds 1,2,4`: the reference experiment at several
//! world sizes, with the resident memory (RSS) and CPU time of the launcher and
//! of every rank polled about ten times a second, and each rank's own array
//! memory (`memory::active()`/`peak()`, from the trainer's `--memory-log`).
//!
//! Writes into the run folder: `samples.csv` (every sample), `memprof.md` (peak
//! and mean per process and in total, per world size, and the checks of issue
//! 8: per-rank peak within 10% of world 1, launcher under 1% of a core) and
//! `memprof.png` (memory over time per process, one panel per world size).
//!
//! With `--shards` and `--grad-checkpoints` (lists), every combination
//! runs at every world size, each in a folder of its own with the report
//! above, and `sharding.md` / `sharding.png` compare them: per-rank peak
//! RSS and array bytes against the world size, one line per combination.
//!
//! One file a job: this one holds the options, the samples and the entry;
//! `measure.rs` starts the runs and polls their processes; `report.rs`
//! summarises the samples and writes the CSV, the table and the chart;
//! `sweep.rs` compares the sharding modes.

mod measure;
mod report;
mod sweep;

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;

use crate::util::{RunnerArgs, root, timestamp};

/// Options of `cargo xtask memprof`; anything after `--` goes to `mlx-llama train`.
#[derive(ClapArgs, Debug, Clone)]
pub struct Args {
    /// World sizes to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub worlds: Vec<usize>,
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Sequences per step on each rank (the same at every world size, so that
    /// per-rank memory is comparable).
    #[arg(long, default_value_t = 2)]
    pub per_rank_batch: usize,
    /// Milliseconds between samples.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// Run folder (default: `runs/memprof-<UTC time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Skip the unmonitored one-step run that first prepares the data (tokenizer
    /// and token store), so that the first world size does not pay for it.
    #[arg(long)]
    pub no_prepare: bool,
    /// `--shard` modes to compare (none, optimizer, gradients, parameters),
    /// comma-separated; none given: the trainer's default, one report.
    #[arg(long, value_delimiter = ',')]
    pub shards: Vec<String>,
    /// `--grad-checkpoint` policies to compare (none, all, or K), with
    /// `--shards`.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    pub grad_checkpoints: Vec<String>,
    /// Where the binaries come from and how the ranks talk.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// Options for `mlx-llama train` (see `mlx-llama train --help`).
    #[arg(last = true)]
    pub trainer: Vec<String>,
}

/// Who a sample is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Launcher,
    Rank(usize),
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Launcher => write!(f, "launcher"),
            Who::Rank(r) => write!(f, "rank{r}"),
        }
    }
}

/// One poll of one process.
#[derive(Clone, Debug)]
struct Sample {
    world: usize,
    tick: u64,
    /// Seconds since the launcher was started.
    t_s: f64,
    unix_ms: u128,
    who: Who,
    pid: u32,
    rss: u64,
    cpu_ms: u64,
}

/// One line of a rank's `--memory-log`.
#[derive(Clone, Debug)]
struct ArrayMem {
    t_s: f64,
    active: u64,
    peak: u64,
}

/// What one world size produced.
struct WorldRun {
    world: usize,
    samples: Vec<Sample>,
    /// Per rank, the memory-log lines (time relative to the launcher's start).
    arrays: BTreeMap<usize, Vec<ArrayMem>>,
    /// Wall time of the launcher, seconds.
    wall_s: f64,
}

/// Runs the experiment at every world size and writes the report.
pub fn run(a: Args) -> Result<()> {
    if a.worlds.is_empty() || a.worlds.contains(&0) {
        bail!("--worlds needs world sizes of at least 1, e.g. 1,2,4");
    }
    if a.per_rank_batch == 0 || a.interval_ms == 0 {
        bail!("--per-rank-batch and --interval-ms must be at least 1");
    }
    let bins = a.runner.binaries()?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| root().join("runs").join(format!("memprof-{}", timestamp())));
    let out = if out.is_absolute() {
        out
    } else {
        root().join(out)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    if !a.no_prepare {
        measure::prepare(&a, &bins, &out)?;
    }
    if a.shards.is_empty() {
        let runs = run_worlds(&a, &bins, &out)?;
        return report::write(&a, &bins, &out, &runs);
    }
    let mut compared = vec![];
    for shard in &a.shards {
        for gc in &a.grad_checkpoints {
            let mut one = a.clone();
            one.trainer.extend([
                "--shard".into(),
                shard.clone(),
                "--grad-checkpoint".into(),
                gc.clone(),
            ]);
            let dir = out.join(format!("shard-{shard}-gc-{gc}"));
            std::fs::create_dir_all(&dir)?;
            let runs = run_worlds(&one, &bins, &dir)?;
            report::write(&one, &bins, &dir, &runs)?;
            compared.push(sweep::Config::new(shard, gc, &runs));
        }
    }
    sweep::write(&a, &out, &compared)
}

/// Every world size of `a`, one after the other, into `out`.
fn run_worlds(a: &Args, bins: &std::path::Path, out: &std::path::Path) -> Result<Vec<WorldRun>> {
    a.worlds
        .iter()
        .map(|&world| measure::run_world(a, bins, out, world))
        .collect()
}
