//! Rank 0's progress output and the JSON-lines metrics file.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use mlx_progress::{Mode, Task, Unit};
use serde::Serialize;

/// One line of `metrics.jsonl`.
#[derive(Clone, Debug, Serialize)]
pub struct StepMetrics {
    /// Optimizer step (1-based).
    pub step: u64,
    /// When the step ended: seconds since the Unix epoch (wall clock).
    pub unix_time: f64,
    /// How many passes over the training data the run has made at the end
    /// of the step, as a fraction (Hugging Face Trainer's `epoch`): 0.5 is
    /// half of the data seen once.
    pub epoch: f64,
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
    /// Loss on the validation split, on steps that evaluate (Hugging Face
    /// Trainer's name).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub eval_loss: Option<f32>,
    /// Global gradient norm before clipping, when clipping.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub grad_norm: Option<f32>,
    /// The loss scale after the step, in float16 runs (halved on a step
    /// skipped for overflowing gradients).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scale: Option<f64>,
}

impl StepMetrics {
    /// The step's values as TensorBoard scalars, named as Hugging Face's
    /// Trainer names them (`train/loss`, `eval/loss`, ...).
    pub fn scalars(&self) -> Vec<(&'static str, f64)> {
        let mut s = vec![
            ("train/loss", self.loss as f64),
            ("train/learning_rate", self.learning_rate),
            ("train/epoch", self.epoch),
            ("perf/tokens_per_s", self.tokens_per_s),
            ("perf/ms_per_step", self.ms_per_step),
            ("perf/comm_ms", self.comm_ms),
            ("perf/comm_wait_ms", self.comm_wait_ms),
            ("memory/peak_mib", self.peak_mib),
            ("memory/active_mib", self.active_mib),
        ];
        if let Some(v) = self.eval_loss {
            s.push(("eval/loss", v as f64));
        }
        if let Some(v) = self.grad_norm {
            s.push(("train/grad_norm", v as f64));
        }
        if let Some(v) = self.loss_scale {
            s.push(("train/loss_scale", v));
        }
        s
    }

    /// The step as a logfmt line: `step=.. loss=.. lr=.. tokens_per_s=..
    /// ms_per_step=.. peak_mib=.. eta_s=..` (then `comm_ms`, `comm_wait_ms`
    /// when communicating, and `eval_loss` when evaluated), with `eta` the
    /// time the remaining steps should take.
    pub fn logfmt(&self, eta: Duration) -> String {
        let mut l = format!(
            "step={} loss={:.4} lr={:.3e} tokens_per_s={:.0} ms_per_step={:.1} peak_mib={:.0} eta_s={:.0}",
            self.step,
            self.loss,
            self.learning_rate,
            self.tokens_per_s,
            self.ms_per_step,
            self.peak_mib,
            eta.as_secs_f64()
        );
        if self.comm_ms > 0.0 {
            l += &format!(
                " comm_ms={:.1} comm_wait_ms={:.1}",
                self.comm_ms, self.comm_wait_ms
            );
        }
        if let Some(v) = self.eval_loss {
            l += &format!(" eval_loss={v:.4}");
        }
        if let Some(s) = self.loss_scale {
            l += &format!(" loss_scale={s}");
        }
        l
    }
}

/// Where a run's metrics go (Hugging Face's `report_to`), none of which
/// needs a network: `tensorboard` event files, `jsonl` (metrics.jsonl, one
/// record per step) and `csv` (metrics.csv and loss.png at the end, drawn
/// from metrics.jsonl, which is then written too).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct ReportTo {
    /// TensorBoard event files in the run folder.
    pub tensorboard: bool,
    /// metrics.jsonl.
    pub jsonl: bool,
    /// metrics.csv and loss.png.
    pub csv: bool,
}

impl Default for ReportTo {
    fn default() -> Self {
        ReportTo {
            tensorboard: true,
            jsonl: true,
            csv: true,
        }
    }
}

impl std::str::FromStr for ReportTo {
    type Err = String;
    /// A comma-separated list of `tensorboard`, `jsonl`, `csv`, or `all`
    /// or `none`.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let mut r = ReportTo {
            tensorboard: false,
            jsonl: false,
            csv: false,
        };
        for v in s.split(',').map(str::trim) {
            match v {
                "tensorboard" => r.tensorboard = true,
                "jsonl" => r.jsonl = true,
                "csv" => r.csv = true,
                "all" => r = ReportTo::default(),
                "none" => {}
                _ => {
                    return Err(format!(
                        "unknown report destination `{v}`: use tensorboard, jsonl, csv, all or none, comma-separated"
                    ));
                }
            }
        }
        Ok(r)
    }
}

impl std::fmt::Display for ReportTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = [
            (self.tensorboard, "tensorboard"),
            (self.jsonl, "jsonl"),
            (self.csv, "csv"),
        ]
        .iter()
        .filter(|(on, _)| *on)
        .map(|(_, n)| *n)
        .collect();
        if names.is_empty() {
            f.write_str("none")
        } else {
            f.write_str(&names.join(","))
        }
    }
}

/// Where rank 0 reports: always the metrics file; a live bar (or, under a
/// launcher drawing bars, progress events) whose message says the loss,
/// throughput and ETA; in plain mode (and with progress off) a logfmt line
/// every `log_every` steps. The validation loss always gets a line.
pub struct Reporter {
    /// The bar, in [`Mode::Bar`] and [`Mode::Events`].
    task: Option<Task>,
    file: Option<std::fs::File>,
    events: Option<crate::tensorboard::EventWriter>,
    steps: u64,
}

impl Reporter {
    /// Opens (appends to) `metrics.jsonl` in `out` and sets up the display
    /// of a run of `steps` steps resumed after `first`.
    pub fn new(out: &Path, steps: u64, first: u64) -> Result<Reporter> {
        Self::reporting_to(out, steps, first, ReportTo::default())
    }

    /// [`Reporter::new`] writing only to the destinations of `to`: a new
    /// TensorBoard event file per run (TensorBoard joins them).
    pub fn reporting_to(out: &Path, steps: u64, first: u64, to: ReportTo) -> Result<Reporter> {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join("metrics.jsonl");
        let file = (to.jsonl || to.csv)
            .then(|| {
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("opening {}", path.display()))
            })
            .transpose()?;
        let events = to
            .tensorboard
            .then(|| crate::tensorboard::EventWriter::create(out))
            .transpose()?;
        let task = matches!(mlx_progress::mode(), Mode::Bar | Mode::Events).then(|| {
            Task::builder("training", Unit::Steps)
                .total(Some(steps))
                .position(first)
                .start()
        });
        Ok(Reporter {
            task,
            file,
            events,
            steps,
        })
    }

    /// Records a step; with `log`, a plain run prints its line.
    pub fn step(&mut self, m: &StepMetrics, log: bool) -> Result<()> {
        // One write per record: a rank killed mid-step leaves whole lines,
        // which a restarted run appends to.
        if let Some(f) = self.file.as_mut() {
            f.write_all(format!("{}\n", serde_json::to_string(m)?).as_bytes())?;
        }
        if let Some(w) = self.events.as_mut() {
            w.scalars(m.step, m.unix_time, &m.scalars())?;
        }
        let left = self.steps.saturating_sub(m.step);
        let eta = Duration::from_secs_f64(left as f64 * m.ms_per_step.max(0.0) / 1e3);
        match &self.task {
            Some(t) => {
                t.set_position(m.step);
                let mut msg = format!(
                    "loss {:.4} | {} tok/s | {:.0} ms/step",
                    m.loss,
                    mlx_progress::format::amount(Unit::Tokens, m.tokens_per_s as u64),
                    m.ms_per_step,
                );
                if left > 0 {
                    msg += &format!(" | eta {}", mlx_progress::format::duration(eta));
                }
                t.set_message(msg);
                if let Some(v) = m.eval_loss {
                    t.println(format!("step {} eval_loss {v:.4}", m.step));
                }
            }
            None if log || m.eval_loss.is_some() => crate::console::line(&m.logfmt(eta)),
            None => {}
        }
        Ok(())
    }

    /// Finishes the bar.
    pub fn finish(&self) {
        if let Some(t) = &self.task {
            t.finish();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_plain_line_is_logfmt_with_the_eval_loss_when_evaluated() {
        let mut m = StepMetrics {
            step: 20,
            unix_time: 1.8e9,
            epoch: 0.25,
            loss: 3.25,
            learning_rate: 3e-4,
            tokens_per_s: 12345.6,
            ms_per_step: 250.0,
            comm_wait_ms: 0.0,
            comm_ms: 0.0,
            peak_mib: 512.4,
            active_mib: 100.0,
            eval_loss: None,
            grad_norm: None,
            loss_scale: None,
        };
        assert_eq!(
            m.logfmt(Duration::from_secs(20)),
            "step=20 loss=3.2500 lr=3.000e-4 tokens_per_s=12346 ms_per_step=250.0 peak_mib=512 eta_s=20"
        );
        m.eval_loss = Some(3.5);
        m.comm_ms = 10.0;
        m.comm_wait_ms = 2.5;
        let l = m.logfmt(Duration::ZERO);
        assert!(
            l.ends_with(" eta_s=0 comm_ms=10.0 comm_wait_ms=2.5 eval_loss=3.5000"),
            "{l}"
        );
        let json: serde_json::Value = serde_json::to_value(&m).unwrap();
        assert_eq!(json["eval_loss"], 3.5);
        assert!(json.get("val_loss").is_none());
    }
}
