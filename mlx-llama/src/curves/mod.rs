//! The end of a run in a form people read: `metrics.csv` and `loss.png` (the
//! training and validation loss over the steps, with tokens per second and
//! the learning rate below) beside `metrics.jsonl`.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! // After `mlx-llama train --out runs/a`: runs/a/metrics.csv and runs/a/loss.png.
//! mlx_llama::curves::write(std::path::Path::new("runs/a"))?;
//! # Ok(()) }
//! ```

mod csv;
mod plot;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Deserialize;

pub use plot::{EVAL_COLOUR, LR_COLOUR, SIZE, TRAIN_COLOUR, render_rgb};

/// One step of `metrics.jsonl`, as far as the curves need it.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Point {
    /// Optimizer step (1-based).
    pub step: u64,
    /// The passes over the training data at the end of the step (runs
    /// before it was recorded have none).
    #[serde(default)]
    pub epoch: Option<f64>,
    /// When the step ended, seconds since the Unix epoch.
    #[serde(default)]
    pub unix_time: Option<f64>,
    /// Training loss.
    pub loss: f64,
    /// Validation loss (Hugging Face Trainer's `eval_loss`; older runs wrote `val_loss`).
    #[serde(default, alias = "val_loss")]
    pub eval_loss: Option<f64>,
    /// Learning rate.
    #[serde(default)]
    pub learning_rate: f64,
    /// Tokens per second over the world.
    #[serde(default)]
    pub tokens_per_s: f64,
    /// Wall time of the step.
    #[serde(default)]
    pub ms_per_step: f64,
    /// Time of the validation after the step, on steps that evaluate.
    #[serde(default)]
    pub eval_ms: Option<f64>,
    /// Time in collectives.
    #[serde(default)]
    pub comm_ms: f64,
    /// Time blocked on collectives.
    #[serde(default)]
    pub comm_wait_ms: f64,
    /// Peak array memory of rank 0, MiB.
    #[serde(default)]
    pub peak_mib: f64,
    /// Live array memory of rank 0 after the step, MiB.
    #[serde(default)]
    pub active_mib: f64,
    /// Gradient norm before clipping.
    #[serde(default)]
    pub grad_norm: Option<f64>,
    /// The loss scale after the step, in float16 runs.
    #[serde(default)]
    pub loss_scale: Option<f64>,
}

/// Reads `metrics.jsonl`; a step written twice (a run resumed from an
/// earlier checkpoint repeats the steps after it) keeps its last record.
pub fn read(path: &Path) -> Result<Vec<Point>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut by_step = BTreeMap::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let p: Point = serde_json::from_str(line)
            .with_context(|| format!("{} line {}: not a metrics record", path.display(), n + 1))?;
        by_step.insert(p.step, p);
    }
    Ok(by_step.into_values().collect())
}

/// What [`write()`] produced.
#[derive(Clone, Debug)]
pub struct Written {
    /// The CSV of every step.
    pub csv: PathBuf,
    /// The loss curve.
    pub png: PathBuf,
}

/// Writes `metrics.csv` and `loss.png` beside the run folder's `metrics.jsonl`.
pub fn write(run: &Path) -> Result<Written> {
    let points = read(&run.join("metrics.jsonl"))?;
    let written = Written {
        csv: run.join("metrics.csv"),
        png: run.join("loss.png"),
    };
    std::fs::write(&written.csv, csv::to_csv(&points))
        .with_context(|| format!("writing {}", written.csv.display()))?;
    let title = run
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    plot::write_png(&points, &title, &written.png)?;
    Ok(written)
}

#[cfg(test)]
mod tests;
