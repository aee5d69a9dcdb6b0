//! `cargo xtask train --world N`: the end-to-end data-parallel experiment.
//!
//! Each run gets its own folder (`runs/train-<date>-<time>-world<N>`) unless
//! `--out` names one; a folder that already holds checkpoints is never
//! overwritten without `--fresh`, nor continued without `--resume`. With
//! `--max-restarts K` a failed job is started again (see `mlx-launch`) and
//! resumes from its newest checkpoint.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::util::{RunnerArgs, root};

/// Options of `cargo xtask train`; anything after `--` goes to `mlx-llama train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Number of processes.
    #[arg(long, default_value_t = 2)]
    pub world: usize,
    /// Run folder (default: a new `runs/train-<date>-<time>-world<N>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A TOML file of `mlx-llama train` options (flags after `--` override it).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Continue from the latest checkpoint in `--out`.
    #[arg(long, conflicts_with = "fresh")]
    pub resume: bool,
    /// Start over in `--out`, deleting its checkpoints and metrics.
    #[arg(long)]
    pub fresh: bool,
    /// When a rank fails, restart the whole job up to K times (`mlx-launch
    /// --max-restarts`); the restarted trainer resumes from its newest checkpoint.
    #[arg(long, value_name = "K", default_value_t = 0)]
    pub max_restarts: u32,
    /// Where the binaries come from and how the ranks talk.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// Options for `mlx-llama train` (see `mlx-llama train --help`).
    #[arg(last = true)]
    pub trainer: Vec<String>,
}

/// A new run folder under `runs/`, named by the local time it starts.
fn new_run_folder(world: usize) -> PathBuf {
    let stamp = chrono::Local::now().format("%Y%m%d-%H%M%S");
    root()
        .join("runs")
        .join(format!("train-{stamp}-world{world}"))
}

/// Whether `out` holds a checkpoint of an earlier run.
fn holds_checkpoints(out: &Path) -> bool {
    std::fs::read_dir(out.join("checkpoints")).is_ok_and(|mut d| d.next().is_some())
}

/// The `mlx-llama` arguments of the run.
fn trainer_args(a: &TrainArgs, out: &Path) -> Result<Vec<String>> {
    let mut args = vec![
        "train".to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if let Some(c) = &a.config {
        if !c.is_file() {
            bail!("--config {}: no such file", c.display());
        }
        args.extend(["--config".into(), c.display().to_string()]);
    }
    if a.resume {
        args.push("--resume".into());
    }
    if a.fresh {
        args.push("--fresh".into());
    }
    args.extend(a.trainer.iter().cloned());
    Ok(args)
}

/// The `mlx-launch` options of the run (before `--`).
fn launcher_args(a: &TrainArgs) -> Vec<String> {
    let mut args = vec![
        "-n".to_string(),
        a.world.to_string(),
        "--backend".into(),
        a.runner.backend.clone(),
    ];
    if a.max_restarts > 0 {
        args.extend(["--max-restarts".into(), a.max_restarts.to_string()]);
    }
    args
}

/// Builds, then starts `world` ranks of `mlx-llama train` through `mlx-launch`.
pub fn run(a: TrainArgs) -> Result<()> {
    if a.world == 0 {
        bail!("--world must be at least 1");
    }
    if a.trainer.iter().any(|t| t == "--out") {
        bail!("give the run folder as `cargo xtask train --out DIR`, before `--`");
    }
    if a.resume && a.out.is_none() {
        bail!("--resume continues the run in --out DIR: name the folder");
    }
    let out = a.out.clone().unwrap_or_else(|| new_run_folder(a.world));
    let asked = a.resume || a.fresh || a.trainer.iter().any(|t| t == "--resume" || t == "--fresh");
    if holds_checkpoints(&out) && !asked {
        bail!(
            "{} already holds checkpoints of an earlier run: pass --resume to continue it, \
             --fresh to delete them and start over, or a new --out (without --out every run \
             gets a new folder)",
            out.display()
        );
    }
    let trainer = trainer_args(&a, &out)?;
    let bins = a.runner.binaries()?;
    eprintln!(
        "xtask: {} rank(s) of mlx-llama {}",
        a.world,
        trainer.join(" ")
    );
    let status = Command::new(bins.join("mlx-launch"))
        .args(launcher_args(&a))
        .arg("--")
        .arg(bins.join("mlx-llama"))
        .args(&trainer)
        .current_dir(root())
        .status()
        .context("starting mlx-launch")?;
    if !status.success() {
        bail!(
            "training failed ({status}); its folder is {} (continue with --out {} --resume)",
            out.display(),
            out.display()
        );
    }
    eprintln!(
        "xtask: run folder {}: metrics.jsonl, metrics.csv, loss.png, run.toml, checkpoints/\n\
         xtask: export for transformers or mlx-lm: {} export --checkpoint {} --format hf --out {}",
        out.display(),
        bins.join("mlx-llama").display(),
        out.display(),
        out.join("hf").display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        train: TrainArgs,
    }

    fn launcher_args_of(argv: &[&str]) -> Vec<String> {
        let cli =
            Cli::try_parse_from(std::iter::once("train").chain(argv.iter().copied())).unwrap();
        launcher_args(&cli.train)
    }

    #[test]
    fn max_restarts_reaches_mlx_launch() {
        let with = launcher_args_of(&["--world", "3", "--max-restarts", "2"]);
        let at = with
            .iter()
            .position(|a| a == "--max-restarts")
            .expect("passed on");
        assert_eq!(with[at + 1], "2");
        assert_eq!(with[..2], ["-n", "3"]);
        let without = launcher_args_of(&["--world", "3"]);
        assert!(
            !without.iter().any(|a| a == "--max-restarts"),
            "{without:?}"
        );
    }
}
