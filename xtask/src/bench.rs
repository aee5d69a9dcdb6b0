//! `cargo xtask bench train`: tokens/s and ms/step of the trainer at several
//! world sizes (default 1 and 2) with the same global batch, and the scaling
//! efficiency against world 1. Prints a table and writes `bench.md` and
//! `bench.json` into the run folder. With `--hosts N` it runs across
//! emulated hosts over shaped links instead (`bench_train_hosts.rs`).
//! `bench collectives` lives in `bench_collectives.rs`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};

use crate::util::{RunnerArgs, log_tail, root, spawn_trainer, timestamp};

#[path = "bench_train_hosts.rs"]
mod train_hosts;

/// What to benchmark.
#[derive(Subcommand, Debug)]
pub enum What {
    /// Training throughput at world 1 and 2 (the same global batch), and the
    /// scaling efficiency; with --hosts N, the step across emulated hosts
    /// over shaped links, overlap on/off, f32/bf16 gradients.
    Train(TrainArgs),
    /// all_sum and all_gather, 1 KiB to 256 MiB at world 2 and 4, per backend
    /// (ring, quic, mpi) beside one TCP stream; then average_gradients against
    /// one all_sum per tensor on the reference Llama's gradients.
    Collectives(crate::bench_collectives::CollectivesArgs),
}

/// Options of `cargo xtask bench train`; anything after `--` goes to `mlx-llama train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// World sizes to run, one after the other (default 1,2; with --hosts
    /// 2,4, as many as there are hosts).
    #[arg(long, value_delimiter = ',')]
    pub worlds: Option<Vec<usize>>,
    /// Optimizer steps per run (the first is not timed when there are more).
    #[arg(long, default_value_t = 6)]
    pub steps: u64,
    /// Run folder (default: `runs/bench-train-<UTC time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the binaries come from and how the ranks talk.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// Across emulated hosts instead of loopback.
    #[command(flatten)]
    pub hosts: train_hosts::HostsArgs,
    /// Options for `mlx-llama train` (see `mlx-llama train --help`).
    #[arg(last = true)]
    pub trainer: Vec<String>,
}

impl TrainArgs {
    /// The worlds of the loopback mode.
    fn loopback_worlds(&self) -> Vec<usize> {
        self.worlds.clone().unwrap_or_else(|| vec![1, 2])
    }
}

/// Runs the benchmark named by `what`.
pub fn run(what: What) -> Result<()> {
    match what {
        What::Train(a) => train(a),
        // Across emulated hosts (or redrawn from a run), bench_multihost
        // measures; it stands on bench_collectives' options and rows.
        What::Collectives(a) if a.hosts.is_some() || a.from_run.is_some() => {
            crate::bench_multihost::run(&a)
        }
        What::Collectives(a) => crate::bench_collectives::run(a),
    }
}

/// The figures of one world size, from the trainer's `--summary`.
struct Row {
    world: usize,
    median_ms: f64,
    tokens_per_s: f64,
    peak_mib: f64,
    final_loss: Option<f64>,
    wall_s: f64,
}

fn train(a: TrainArgs) -> Result<()> {
    let worlds = a.loopback_worlds();
    if worlds.is_empty() || worlds.contains(&0) {
        bail!("--worlds needs world sizes of at least 1, e.g. 1,2");
    }
    if a.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if a.hosts.hosts == Some(0) {
        bail!("--hosts needs at least 2 hosts");
    }
    let bins = a.runner.binaries()?;
    let out = a.out.clone().unwrap_or_else(|| match a.hosts.hosts {
        Some(_) => train_hosts::default_out(),
        None => root()
            .join("runs")
            .join(format!("bench-train-{}", timestamp())),
    });
    let out = if out.is_absolute() {
        out
    } else {
        root().join(out)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    if let Some(n) = a.hosts.hosts {
        return train_hosts::run(&a, &a.hosts, n, &bins, &out);
    }
    let mut rows = vec![];
    for &world in &worlds {
        rows.push(run_world(&a, &bins, &out, world)?);
    }
    let table = markdown(&a, &rows);
    let md = out.join("bench.md");
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let json = out.join("bench.json");
    std::fs::write(&json, serde_json::to_string_pretty(&to_json(&a, &rows))?)
        .with_context(|| format!("writing {}", json.display()))?;
    println!("{table}");
    println!("xtask: table {}", md.display());
    println!("xtask: json  {}", json.display());
    Ok(())
}

fn run_world(a: &TrainArgs, bins: &Path, out: &Path, world: usize) -> Result<Row> {
    let dir = out.join(format!("world{world}"));
    std::fs::create_dir_all(&dir)?;
    let summary = dir.join("summary.json");
    let _ = std::fs::remove_file(&summary);
    let mut args: Vec<String> = vec![
        "--out".into(),
        dir.join("train").display().to_string(),
        "--fresh".into(),
        "--steps".into(),
        a.steps.to_string(),
        // Measure training steps only (mlx-llama evaluates every 25 by default).
        "--eval-every".into(),
        "0".into(),
        "--summary".into(),
        summary.display().to_string(),
    ];
    args.extend(a.trainer.iter().cloned());
    let log = dir.join("train.log");
    eprintln!(
        "xtask: bench world {world}: mlx-llama train {} (log {})",
        args.join(" "),
        log.display()
    );
    let start = Instant::now();
    let status = spawn_trainer(bins, world, &a.runner.backend, &args, &log)?
        .wait()
        .context("waiting for mlx-launch")?;
    let wall_s = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "world {world}: the run failed ({status}); the end of {}:\n{}",
            log.display(),
            log_tail(&log, 30)
        );
    }
    let text = std::fs::read_to_string(&summary)
        .with_context(|| format!("reading {} (written by rank 0)", summary.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", summary.display()))?;
    let num = |k: &str| {
        v[k].as_f64()
            .with_context(|| format!("{}: no number {k:?}", summary.display()))
    };
    let row = Row {
        world,
        median_ms: num("median_ms")?,
        tokens_per_s: num("tokens_per_s")?,
        peak_mib: num("peak_mib")?,
        final_loss: v["losses"]
            .as_array()
            .and_then(|l| l.last())
            .and_then(|l| l.as_f64()),
        wall_s,
    };
    eprintln!(
        "xtask: bench world {world}: {:.0} ms/step, {:.0} tokens/s, peak {:.0} MiB/rank ({:.1} s)",
        row.median_ms, row.tokens_per_s, row.peak_mib, wall_s
    );
    Ok(row)
}

/// tokens/s of the smallest world (world 1 when it ran), the base of speed-ups.
fn base(rows: &[Row]) -> Option<&Row> {
    rows.iter().min_by_key(|r| r.world)
}

/// Speed-up over the base and the scaling efficiency (speed-up / world ratio).
fn scaling(row: &Row, base: &Row) -> (f64, f64) {
    let speedup = row.tokens_per_s / base.tokens_per_s;
    (speedup, speedup * base.world as f64 / row.world as f64)
}

fn markdown(a: &TrainArgs, rows: &[Row]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`cargo xtask bench train --worlds {} --steps {} --backend {}{}{}`: the same global \
         batch split across the ranks; ms/step is the median step (the first step excluded when \
         there are more), tokens/s counts the whole world; {} logical cores here.\n",
        a.loopback_worlds()
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(","),
        a.steps,
        a.runner.backend,
        if a.runner.debug { " --debug" } else { "" },
        if a.trainer.is_empty() {
            String::new()
        } else {
            format!(" -- {}", a.trainer.join(" "))
        },
        std::thread::available_parallelism().map_or(0, |n| n.get()),
    );
    let bw = base(rows).map_or(1, |b| b.world);
    let _ = writeln!(
        s,
        "| world | ms/step | tokens/s | speed-up vs world {bw} | scaling efficiency | peak MiB/rank (arrays) | final loss | wall s |"
    );
    let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|---:|---:|");
    for r in rows {
        let (speedup, eff) = base(rows).map_or((1.0, 1.0), |b| scaling(r, b));
        let _ = writeln!(
            s,
            "| {} | {:.0} | {:.1} | {:.2}x | {:.0}% | {:.1} | {} | {:.1} |",
            r.world,
            r.median_ms,
            r.tokens_per_s,
            speedup,
            eff * 100.0,
            r.peak_mib,
            r.final_loss.map_or("-".into(), |l| format!("{l:.4}")),
            r.wall_s
        );
    }
    s
}

fn to_json(a: &TrainArgs, rows: &[Row]) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = rows
        .iter()
        .map(|r| {
            let (speedup, eff) = base(rows).map_or((1.0, 1.0), |b| scaling(r, b));
            serde_json::json!({
                "world": r.world,
                "median_ms": r.median_ms,
                "tokens_per_s": r.tokens_per_s,
                "speedup": speedup,
                "scaling_efficiency": eff,
                "peak_mib": r.peak_mib,
                "final_loss": r.final_loss,
                "wall_s": r.wall_s,
            })
        })
        .collect();
    serde_json::json!({
        "steps": a.steps,
        "backend": a.runner.backend,
        "debug": a.runner.debug,
        "trainer": a.trainer,
        "runs": runs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(world: usize, tokens_per_s: f64) -> Row {
        Row {
            world,
            median_ms: 1.0,
            tokens_per_s,
            peak_mib: 1.0,
            final_loss: None,
            wall_s: 1.0,
        }
    }

    #[test]
    fn efficiency_is_speedup_over_world_ratio() {
        let rows = [row(1, 100.0), row(2, 150.0), row(4, 400.0)];
        let b = base(&rows).unwrap();
        assert_eq!(scaling(&rows[1], b), (1.5, 0.75));
        assert_eq!(scaling(&rows[2], b), (4.0, 1.0));
        // Without world 1, the smallest world is the base.
        let rows = [row(4, 400.0), row(2, 300.0)];
        assert_eq!(
            scaling(&rows[0], base(&rows).unwrap()),
            (4.0 / 3.0, 2.0 / 3.0)
        );
    }
}
