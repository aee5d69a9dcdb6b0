//! `cargo xtask train --world N`: the end-to-end data-parallel experiment.

use std::path::PathBuf;
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
    /// Run folder (default: `runs/train-world<N>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Where the binaries come from and how the ranks talk.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// Options for `mlx-llama train` (see `mlx-llama train --help`).
    #[arg(last = true)]
    pub trainer: Vec<String>,
}

/// Builds, then starts `world` ranks of `mlx-llama train` through `mlx-launch`.
pub fn run(a: TrainArgs) -> Result<()> {
    if a.world == 0 {
        bail!("--world must be at least 1");
    }
    let bins = a.runner.binaries()?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| root().join("runs").join(format!("train-world{}", a.world)));
    let mut trainer = vec![
        "train".to_string(),
        "--out".into(),
        out.display().to_string(),
    ];
    if !a.trainer.iter().any(|t| t == "--resume") {
        trainer.push("--fresh".into());
    }
    trainer.extend(a.trainer.iter().cloned());
    eprintln!(
        "xtask: {} rank(s) of mlx-llama {}",
        a.world,
        trainer.join(" ")
    );
    let status = Command::new(bins.join("mlx-launch"))
        .args([
            "-n",
            &a.world.to_string(),
            "--backend",
            &a.runner.backend,
            "--",
        ])
        .arg(bins.join("mlx-llama"))
        .args(&trainer)
        .current_dir(root())
        .status()
        .context("starting mlx-launch")?;
    if !status.success() {
        bail!("training failed ({status})");
    }
    eprintln!("xtask: metrics in {}", out.join("metrics.jsonl").display());
    Ok(())
}
