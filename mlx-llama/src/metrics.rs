//! Rank 0's progress output and the JSON-lines metrics file.

use std::io::{IsTerminal, Write};
use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize)]
pub struct StepMetrics {
    /// Optimizer step (1-based).
    pub step: u64,
    /// Mean training loss of the step over the whole world.
    pub loss: f32,
    /// Learning rate used.
    pub learning_rate: f64,
    /// Tokens per second over the whole world.
    pub tokens_per_s: f64,
    /// Wall time of the step.
    pub ms_per_step: f64,
    /// Of the step's wall time, how long this rank sat blocked waiting for
    /// collectives (communication the step could not overlap with
    /// computation, and waits for slower ranks).
    pub comm_wait_ms: f64,
    /// How long this rank's communication thread spent in collectives during
    /// the step, overlapped or not.
    pub comm_ms: f64,
    /// This rank's peak array memory so far, MiB.
    pub peak_mib: f64,
    /// This rank's live array memory after the step, MiB.
    pub active_mib: f64,
    /// Validation loss, on steps that evaluate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_loss: Option<f32>,
    /// Global gradient norm before clipping, when clipping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f32>,
}

/// Where rank 0 reports: a progress bar on a terminal, plain lines otherwise,
/// and always the metrics file.
pub struct Reporter {
    bar: Option<ProgressBar>,
    file: std::fs::File,
}

impl Reporter {
    /// Opens (appends to) `metrics.jsonl` in `out` and sets up the display.
    pub fn new(out: &Path, steps: u64, first: u64) -> Result<Reporter> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join("metrics.jsonl");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::new(steps);
            b.set_style(
                ProgressStyle::with_template(
                    "{bar:30} {pos}/{len} {msg} [{elapsed_precise}<{eta_precise}]",
                )
                .expect("valid template"),
            );
            b.set_position(first);
            b
        });
        Ok(Reporter { bar, file })
    }

    /// Records a step.
    pub fn step(&mut self, m: &StepMetrics, log: bool) -> Result<()> {
        writeln!(self.file, "{}", serde_json::to_string(m)?)?;
        let mut line = format!(
            "step {:>5} loss {:.4} lr {:.2e} {:.0} tok/s {:.0} ms/step peak {:.0} MiB",
            m.step, m.loss, m.learning_rate, m.tokens_per_s, m.ms_per_step, m.peak_mib
        );
        if m.comm_ms > 0.0 {
            line.push_str(&format!(
                " comm {:.0} ms (waited {:.0})",
                m.comm_ms, m.comm_wait_ms
            ));
        }
        if let Some(v) = m.val_loss {
            line.push_str(&format!(" val_loss {v:.4}"));
        }
        match &self.bar {
            Some(b) => {
                b.set_position(m.step);
                b.set_message(line);
            }
            None if log || m.val_loss.is_some() => println!("{line}"),
            None => {}
        }
        Ok(())
    }

    /// Prints a message above the bar (or as a line).
    pub fn note(&self, msg: &str) {
        match &self.bar {
            Some(b) => b.println(msg),
            None => println!("{msg}"),
        }
    }

    /// Finishes the bar.
    pub fn finish(&self) {
        if let Some(b) = &self.bar {
            b.finish();
        }
    }
}
