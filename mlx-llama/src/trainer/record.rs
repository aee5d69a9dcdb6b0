//! What a run records of its steps: the summary it returns, rank 0's
//! metrics file and progress lines, and each rank's memory and sample logs.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use mlx_array::eval::CommunicationTimes;
use mlx_array::{Array, memory};
use mlx_dist::Group;

use crate::config::TrainConfig;
use crate::metrics::{Reporter, StepMetrics};

use super::batch::Drawn;

/// What a finished run reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Training loss of every step run (the world's mean).
    pub losses: Vec<f32>,
    /// Losses on the validation split `(step, loss)` (Hugging Face Trainer's `eval_loss`).
    pub eval_losses: Vec<(u64, f32)>,
    /// Median milliseconds per step (steps after the first).
    pub median_ms: f64,
    /// Milliseconds of every step run, in order.
    pub step_ms: Vec<f64>,
    /// Of every step, the milliseconds this rank sat blocked waiting for
    /// collectives (see [`mlx_array::eval::communication_times`]).
    pub comm_wait_ms: Vec<f64>,
    /// Of every step, the milliseconds this rank's communication thread
    /// spent in collectives, overlapped with computation or not.
    pub comm_ms: Vec<f64>,
    /// Of every step, the bytes this rank handed to collectives and the bytes
    /// the ring algorithms sent from it for them ([`mlx_dist::stats`],
    /// counted from one step's record to the next; all zero at world 1).
    pub payload_bytes: Vec<u64>,
    /// See `payload_bytes`.
    pub sent_bytes: Vec<u64>,
    /// Median over the steps after the first of the time each rank waited
    /// for collectives, per rank (index: rank).
    pub median_comm_wait_ms: Vec<f64>,
    /// Tokens per second over the world at the median step time.
    pub tokens_per_s: f64,
    /// This rank's peak array memory, MiB.
    pub peak_mib: f64,
    /// Where the last checkpoint went.
    pub checkpoint: Option<PathBuf>,
    /// Which data source was used (`hub`, `local` or `offline`).
    pub source: String,
    /// Steps skipped because their float16 gradients overflowed (the
    /// loss scale's count, over the whole run when resumed).
    pub skipped_steps: u64,
    /// What crossed between the host and the GPU in every step run, in
    /// order (all zero on the CPU): the step itself, its records and
    /// progress line, and the validation and checkpoint when due.
    pub transfers: Vec<StepTransfers>,
    /// The steps done before this run (resumed from a checkpoint; 0 when
    /// it started afresh).
    pub resumed_at: u64,
    /// The step after which the run stopped on a signal, its checkpoint
    /// written (`None`: it ran to its last step).
    pub stopped_at: Option<u64>,
    /// The signal that stopped it then (SIGTERM, SIGINT or SIGHUP, as the
    /// ranks agreed: see `mlx-llama train --help`'s exit statuses).
    pub stop_signal: Option<i32>,
}

/// What crossed between the host and the GPU during one step (this
/// process's transfers: see [`mlx_array::backend::gpu::transfers`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct StepTransfers {
    /// Arrays copied to the GPU.
    pub to_device: u64,
    /// Their bytes.
    pub to_device_bytes: u64,
    /// Arrays copied to the host.
    pub to_host: u64,
    /// Their bytes.
    pub to_host_bytes: u64,
}

impl From<mlx_array::backend::gpu::Transfers> for StepTransfers {
    fn from(t: mlx_array::backend::gpu::Transfers) -> Self {
        StepTransfers {
            to_device: t.to_device,
            to_device_bytes: t.to_device_bytes,
            to_host: t.to_host,
            to_host_bytes: t.to_host_bytes,
        }
    }
}

/// What one step measured.
pub(super) struct Stepped {
    /// The world's mean loss.
    pub loss: f32,
    /// The learning rate reported for the step.
    pub learning_rate: f64,
    /// Wall time of the step.
    pub seconds: f64,
    /// The step's waits for, and time in, collectives.
    pub comm: CommunicationTimes,
    /// The global gradient norm before clipping, when clipping.
    pub grad_norm: Option<f32>,
    /// The samples of each of this rank's micro-batches.
    pub drawn: Vec<Drawn>,
    /// The loss scale after the step (float16 runs).
    pub loss_scale: Option<f64>,
}

/// A run's records so far.
pub(super) struct Recorder {
    rank: usize,
    summary: Summary,
    /// Seconds of every step.
    times: Vec<f64>,
    /// Rank 0's metrics file and progress display.
    reporter: Option<Reporter>,
    memory_log: Option<File>,
    sample_log: Option<File>,
    world: usize,
    /// The fraction of an epoch one step reads (its micro-batches over an
    /// epoch's batches on a rank).
    epochs_per_step: f64,
    /// [`mlx_dist::stats`]' payload and sent bytes at the last step recorded.
    bytes_at: (u64, u64),
}

impl Recorder {
    /// Records of a run on `rank` that starts after `first_step` steps, with
    /// data from `source`.
    pub(super) fn new(
        cfg: &TrainConfig,
        (rank, world): (usize, usize),
        first_step: u64,
        source: &str,
    ) -> Result<Recorder> {
        let reporter = if rank == 0 {
            // Steps past the checkpoint resumed from are run again: their
            // records from before go.
            crate::run_folder::keep_metrics_through(&cfg.out_dir, first_step)?;
            let mut r = Reporter::reporting_to(&cfg.out_dir, cfg.steps, first_step, cfg.report_to)?;
            r.write_hparams(cfg)?;
            Some(r)
        } else {
            None
        };
        let summary = Summary {
            losses: vec![],
            eval_losses: vec![],
            median_ms: 0.0,
            step_ms: vec![],
            comm_wait_ms: vec![],
            comm_ms: vec![],
            payload_bytes: vec![],
            sent_bytes: vec![],
            median_comm_wait_ms: vec![],
            tokens_per_s: 0.0,
            peak_mib: 0.0,
            checkpoint: None,
            source: source.into(),
            skipped_steps: 0,
            transfers: vec![],
            resumed_at: first_step,
            stopped_at: None,
            stop_signal: None,
        };
        let rank_file = |p: &PathBuf, append: bool| {
            let path = PathBuf::from(format!("{}.rank{rank}.jsonl", p.display()));
            if let Some(parent) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(parent)
                    .with_context(|| format!("creating {}", parent.display()))?;
            }
            std::fs::OpenOptions::new()
                .create(true)
                .write(true)
                .append(append)
                .truncate(!append)
                .open(&path)
                .with_context(|| format!("opening {}", path.display()))
        };
        let memory_log = cfg
            .memory_log
            .as_ref()
            .map(|p| rank_file(p, false))
            .transpose()?;
        // Appended to: a resumed run adds the steps it runs.
        let sample_log = cfg
            .sample_log
            .as_ref()
            .map(|p| rank_file(p, true))
            .transpose()?;
        Ok(Recorder {
            rank,
            summary,
            times: vec![],
            reporter,
            memory_log,
            sample_log,
            world,
            epochs_per_step: 0.0,
            bytes_at: (
                mlx_dist::stats::payload_bytes(),
                mlx_dist::stats::sent_bytes(),
            ),
        })
    }

    /// Sets the length of an epoch: `batches` per rank, of which a step
    /// reads `micro_batches`.
    pub(super) fn with_epoch_length(mut self, batches: u64, micro_batches: usize) -> Self {
        self.epochs_per_step = micro_batches as f64 / batches.max(1) as f64;
        self
    }

    /// Records step `done` (1-based): its times, a line of the memory log
    /// and its loss.
    pub(super) fn step(&mut self, done: u64, s: &Stepped) -> Result<()> {
        self.times.push(s.seconds);
        self.summary.step_ms.push(s.seconds * 1e3);
        self.summary
            .comm_wait_ms
            .push(s.comm.waited.as_secs_f64() * 1e3);
        self.summary.comm_ms.push(s.comm.busy.as_secs_f64() * 1e3);
        let bytes = (
            mlx_dist::stats::payload_bytes(),
            mlx_dist::stats::sent_bytes(),
        );
        self.summary.payload_bytes.push(bytes.0 - self.bytes_at.0);
        self.summary.sent_bytes.push(bytes.1 - self.bytes_at.1);
        self.bytes_at = bytes;
        if let Some(f) = self.memory_log.as_mut() {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            writeln!(
                f,
                "{{\"unix_ms\":{now},\"rank\":{},\"step\":{done},\"active\":{},\"peak\":{},\"cache\":{}}}",
                self.rank,
                memory::active(),
                memory::peak(),
                memory::cache()
            )?;
        }
        if let Some(f) = self.sample_log.as_mut() {
            let line = serde_json::json!({
                "step": done,
                "rank": self.rank,
                "world": self.world,
                "micro_batches": s.drawn,
            });
            writeln!(f, "{line}")?;
        }
        self.summary.losses.push(s.loss);
        Ok(())
    }

    /// Records the validation loss after step `done`.
    pub(super) fn eval_loss(&mut self, done: u64, loss: f32) {
        self.summary.eval_losses.push((done, loss));
    }

    /// Rank 0 writes step `done`'s metrics (with `tokens` per step over the
    /// world, and the validation loss and milliseconds of a step that
    /// evaluated) and, with `log`, its progress line.
    pub(super) fn report(
        &mut self,
        done: u64,
        s: &Stepped,
        eval: Option<(f32, f64)>,
        tokens: f64,
        log: bool,
    ) -> Result<()> {
        let Some(r) = self.reporter.as_mut() else {
            return Ok(());
        };
        r.step(
            &StepMetrics {
                step: done,
                unix_time: std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_secs_f64(),
                epoch: done as f64 * self.epochs_per_step,
                loss: s.loss,
                learning_rate: s.learning_rate,
                tokens_per_s: tokens / s.seconds,
                ms_per_step: s.seconds * 1e3,
                comm_wait_ms: s.comm.waited.as_secs_f64() * 1e3,
                comm_ms: s.comm.busy.as_secs_f64() * 1e3,
                peak_mib: memory::peak() as f64 / (1 << 20) as f64,
                active_mib: memory::active() as f64 / (1 << 20) as f64,
                eval_loss: eval.map(|e| e.0),
                eval_ms: eval.map(|e| e.1),
                grad_norm: s.grad_norm,
                loss_scale: s.loss_scale,
            },
            log,
        )
    }

    /// Records what crossed between the host and the GPU in the step just
    /// recorded.
    pub(super) fn transfers(&mut self, t: StepTransfers) {
        self.summary.transfers.push(t);
    }

    /// Records where the latest checkpoint went.
    pub(super) fn checkpoint(&mut self, dir: PathBuf) {
        self.summary.checkpoint = Some(dir);
    }

    /// The summary of the run, with `tokens` per step over the world; every
    /// rank calls it (the ranks' waits are gathered).
    pub(super) fn finish(mut self, tokens: f64, group: &Group) -> Result<Summary> {
        if let Some(r) = self.reporter.as_mut() {
            r.finish();
        }
        let mut summary = self.summary;
        summary.median_ms = median_after_first(&self.times) * 1e3;
        summary.tokens_per_s = if summary.median_ms > 0.0 {
            tokens / (summary.median_ms / 1e3)
        } else {
            0.0
        };
        summary.peak_mib = memory::peak() as f64 / (1 << 20) as f64;
        // Every rank's median wait (the faster ranks wait for the slower ones).
        let waits = median_after_first(&summary.comm_wait_ms);
        summary.median_comm_wait_ms = if group.size() > 1 {
            let mine = Array::from_slice(&[waits as f32], &[1])?;
            mlx_dist::all_gather(&mine, group)?
                .to_vec::<f32>()?
                .into_iter()
                .map(f64::from)
                .collect()
        } else {
            vec![waits]
        };
        Ok(summary)
    }
}

/// The median of `xs` past the first (all of them when there is one).
fn median_after_first(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().skip(1).copied().collect();
    if v.is_empty() {
        v = xs.to_vec();
    }
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}
