//! Rank 0's progress output and the JSON-lines metrics file.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use mlx_progress::{Mode, Task, Unit};
use serde::Serialize;

use crate::tensorboard::HParam;

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
    /// How long that validation took, on steps that evaluate: measured
    /// apart, so neither `ms_per_step` nor `tokens_per_s` includes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_ms: Option<f64>,
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
        if let Some(v) = self.eval_ms {
            s.push(("perf/eval_ms", v));
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
    /// when communicating, and `eval_loss`, `eval_ms` when evaluated), with
    /// `eta` the time the remaining steps should take. The [`Reporter`]
    /// prints it with the means over the steps since its last line.
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
        if let Some(v) = self.eval_ms {
            l += &format!(" eval_ms={v:.1}");
        }
        if let Some(s) = self.loss_scale {
            l += &format!(" loss_scale={s}");
        }
        l
    }
}

/// The run's options as TensorBoard hyperparameters, named as `run.toml`
/// names them (the long option, `-` written `_`) with their command-line
/// values: numbers, switches (`true` when given) and text; options left
/// unset are left out.
pub fn hparams(cfg: &crate::TrainConfig) -> Vec<(String, HParam)> {
    use serde_json::Value;
    let json = serde_json::to_value(cfg).unwrap_or_default();
    let field = |id: &str| {
        json.get(id)
            .or_else(|| json["model"].get(id))
            .or_else(|| json["adapters"].get(id))
            .cloned()
    };
    let mut out = vec![];
    for arg in crate::TrainConfig::command().get_arguments() {
        let (id, Some(long)) = (arg.get_id().as_str(), arg.get_long()) else {
            continue;
        };
        let value = match field(id) {
            // The options whose fields are not their command-line text.
            _ if id == "report_to" => HParam::Text(cfg.report_to.to_string()),
            _ if id == "data" => HParam::Text(data_text(&cfg.data)),
            _ if id == "tokenizer" => HParam::Text(tokenizer_text(&cfg.tokenizer)),
            _ if id == "lora_targets" => HParam::Text(cfg.adapters.lora_targets.to_string()),
            None | Some(Value::Null) => continue,
            // A switch that turns a field off (`--no-shard-optimizer`).
            Some(Value::Bool(b)) if matches!(arg.get_action(), clap::ArgAction::SetFalse) => {
                HParam::Bool(!b)
            }
            Some(Value::Bool(b)) => HParam::Bool(b),
            Some(Value::Number(n)) => HParam::Number(n.as_f64().unwrap_or(f64::NAN)),
            // A choice by its command-line name (`WsdSqrt` is `wsd-sqrt`).
            Some(Value::String(t)) => {
                let bare = |s: &str| s.replace(['-', '_'], "").to_ascii_lowercase();
                let named = arg
                    .get_possible_values()
                    .into_iter()
                    .find(|v| bare(v.get_name()) == bare(&t));
                HParam::Text(named.map_or(t, |v| v.get_name().to_string()))
            }
            Some(other) => HParam::Text(other.to_string()),
        };
        out.push((long.replace('-', "_"), value));
    }
    out
}

/// `--data`'s value as given on the command line.
fn data_text(d: &crate::DataSource) -> String {
    use crate::DataSource as D;
    let pair = |kind: &str, train: &Path, valid: &Option<std::path::PathBuf>| match valid {
        Some(v) => format!("{kind}:{},{}", train.display(), v.display()),
        None => format!("{kind}:{}", train.display()),
    };
    match d {
        D::Auto => "auto".into(),
        D::Offline => "offline".into(),
        D::Hub => "hub".into(),
        D::Text { train, validation } => pair("text", train, validation),
        D::JsonLines { train, validation } => pair("jsonl", train, validation),
        D::Parquet { train, validation } => pair("parquet", train, validation),
    }
}

/// `--tokenizer`'s value as given on the command line.
fn tokenizer_text(t: &crate::TokenizerChoice) -> String {
    use crate::TokenizerChoice as T;
    match t {
        T::Auto => "auto".into(),
        T::File(p) => p.display().to_string(),
        T::Gpt2Files(p) => format!("gpt2:{}", p.display()),
        T::Train(n) => format!("train:{n}"),
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

/// The steps since the last logged line, whose means the next line reports.
#[derive(Clone, Debug, Default)]
struct Interval {
    steps: u64,
    loss: f64,
    ms: f64,
    tokens: f64,
    comm_ms: f64,
    comm_wait_ms: f64,
}

impl Interval {
    fn add(&mut self, m: &StepMetrics) {
        self.steps += 1;
        self.loss += m.loss as f64;
        self.ms += m.ms_per_step;
        self.tokens += m.tokens_per_s * m.ms_per_step / 1e3;
        self.comm_ms += m.comm_ms;
        self.comm_wait_ms += m.comm_wait_ms;
    }

    /// `last` (the interval's last step) with the interval's means in
    /// place of its own loss, times and throughput.
    fn mean(&self, last: &StepMetrics) -> StepMetrics {
        let n = self.steps.max(1) as f64;
        StepMetrics {
            loss: (self.loss / n) as f32,
            ms_per_step: self.ms / n,
            tokens_per_s: if self.ms > 0.0 {
                self.tokens / (self.ms / 1e3)
            } else {
                0.0
            },
            comm_ms: self.comm_ms / n,
            comm_wait_ms: self.comm_wait_ms / n,
            ..last.clone()
        }
    }
}

/// The median step time of a run so far, over its steps after the first
/// (all of them while there is one), as the run's summary computes it.
#[derive(Clone, Debug, Default)]
struct MedianMs {
    seen: u64,
    /// Sorted.
    after_first: Vec<f64>,
    first: f64,
}

impl MedianMs {
    fn add(&mut self, ms: f64) {
        if self.seen == 0 {
            self.first = ms;
        } else {
            let at = self.after_first.partition_point(|x| *x < ms);
            self.after_first.insert(at, ms);
        }
        self.seen += 1;
    }

    fn get(&self) -> f64 {
        match self.after_first.len() {
            0 => self.first,
            n => self.after_first[n / 2],
        }
    }
}

/// Where rank 0 reports: every step's own figures to the metrics file and
/// TensorBoard; a live bar (or, under a launcher drawing bars, progress
/// events) whose message says the loss, throughput and ETA; in plain mode
/// (and with progress off) a logfmt line every `--log-every` steps and
/// after the last, whose loss, step time, throughput and communication
/// times are the means over the steps since the line before (as Hugging
/// Face's Trainer and mlx-lm report the loss). A validation always gets a
/// line, its time apart (`eval_ms`).
///
/// The bar shows the same mean loss over the steps of the current
/// interval so far, and the median step time over the run's steps after
/// its first (the figure of the run's summary line), with the tokens per
/// second at that time and the ETA it gives.
pub struct Reporter {
    /// The bar, in [`Mode::Bar`] and [`Mode::Events`].
    task: Option<Task>,
    file: Option<std::fs::File>,
    events: Option<crate::tensorboard::EventWriter>,
    steps: u64,
    interval: Interval,
    median: MedianMs,
    /// The last step recorded, for the line of an unfinished interval.
    last: Option<StepMetrics>,
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
            interval: Interval::default(),
            median: MedianMs::default(),
            last: None,
        })
    }

    /// Writes the run's options to the TensorBoard event file, if any, for
    /// the HParams dashboard (see [`hparams`]), the run starting now.
    pub fn write_hparams(&mut self, cfg: &crate::TrainConfig) -> Result<()> {
        let Some(w) = self.events.as_mut() else {
            return Ok(());
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        w.hparams(now, &hparams(cfg))
    }

    /// Records a step; with `log`, a plain run prints its line (the means
    /// since the last one).
    pub fn step(&mut self, m: &StepMetrics, log: bool) -> Result<()> {
        // One write per record: a rank killed mid-step leaves whole lines,
        // which a restarted run appends to.
        if let Some(f) = self.file.as_mut() {
            f.write_all(format!("{}\n", serde_json::to_string(m)?).as_bytes())?;
        }
        if let Some(w) = self.events.as_mut() {
            w.scalars(m.step, m.unix_time, &m.scalars())?;
        }
        for line in self.show(m, log) {
            crate::console::line(&line);
        }
        Ok(())
    }

    /// Updates the bar with step `m`, or returns the plain lines it calls for.
    fn show(&mut self, m: &StepMetrics, log: bool) -> Vec<String> {
        self.interval.add(m);
        self.median.add(m.ms_per_step);
        self.last = Some(m.clone());
        let eta = self.eta(m.step);
        let mut lines = vec![];
        match &self.task {
            Some(t) => {
                let median = self.median.get();
                // The step's tokens (its throughput times its time) at the median time.
                let tokens = m.tokens_per_s * m.ms_per_step / 1e3;
                let speed = if median > 0.0 {
                    tokens / (median / 1e3)
                } else {
                    0.0
                };
                let mut msg = format!(
                    "loss {:.4} | {} tok/s | {:.0} ms/step (median)",
                    self.interval.mean(m).loss,
                    mlx_progress::format::amount(Unit::Tokens, speed as u64),
                    median,
                );
                if m.step < self.steps {
                    msg += &format!(" | eta {}", mlx_progress::format::duration(eta));
                }
                t.set_position_and_message(m.step, msg);
                if let (Some(v), Some(ms)) = (m.eval_loss, m.eval_ms) {
                    t.println(format!("step {} eval_loss {v:.4} eval_ms {ms:.0}", m.step));
                }
                if log {
                    self.interval = Interval::default();
                }
            }
            None if log => {
                lines.push(self.interval.mean(m).logfmt(eta));
                self.interval = Interval::default();
            }
            None if m.eval_loss.is_some() => {
                // Between logged lines: the validation alone.
                let mut l = format!("step={}", m.step);
                if let Some(v) = m.eval_loss {
                    l += &format!(" eval_loss={v:.4}");
                }
                if let Some(v) = m.eval_ms {
                    l += &format!(" eval_ms={v:.1}");
                }
                lines.push(l);
            }
            None => {}
        }
        lines
    }

    /// The time the steps after `step` should take, at the median step time.
    fn eta(&self, step: u64) -> Duration {
        let left = self.steps.saturating_sub(step);
        Duration::from_secs_f64(left as f64 * self.median.get().max(0.0) / 1e3)
    }

    /// The line of the steps since the last one, if any (a run that ends,
    /// or stops, between two logged steps).
    fn unfinished(&mut self) -> Option<String> {
        let last = self.last.as_ref()?;
        if self.task.is_some() || self.interval.steps == 0 {
            return None;
        }
        let mut m = self.interval.mean(last);
        // Its validation, if any, had its line.
        (m.eval_loss, m.eval_ms) = (None, None);
        let line = m.logfmt(self.eta(last.step));
        self.interval = Interval::default();
        Some(line)
    }

    /// Prints the line of the steps not yet logged, and finishes the bar.
    pub fn finish(&mut self) {
        if let Some(line) = self.unfinished() {
            crate::console::line(&line);
        }
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
            eval_ms: None,
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

    /// A step of 1000 tokens taking `ms`, at rate 1e-3 / step.
    fn stepped(step: u64, loss: f32, ms: f64) -> StepMetrics {
        StepMetrics {
            step,
            unix_time: 1.8e9 + step as f64,
            epoch: step as f64 / 100.0,
            loss,
            learning_rate: 1e-3 / step as f64,
            tokens_per_s: 1000.0 / (ms / 1e3),
            ms_per_step: ms,
            comm_wait_ms: 0.0,
            comm_ms: 0.0,
            peak_mib: 64.0,
            active_mib: 32.0,
            eval_loss: None,
            eval_ms: None,
            grad_norm: None,
            loss_scale: None,
        }
    }

    fn reporter(steps: u64, task: Option<Task>) -> Reporter {
        Reporter {
            task,
            file: None,
            events: None,
            steps,
            interval: Interval::default(),
            median: MedianMs::default(),
            last: None,
        }
    }

    /// The median of `ms` past the first, computed apart from [`MedianMs`].
    fn median_after_first(ms: &[f64]) -> f64 {
        let mut v = ms[1..].to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    }

    #[test]
    fn a_logged_line_has_the_means_since_the_line_before_and_a_validation_its_own_time() {
        let losses = [4.0, 3.0, 2.0, 1.0, 0.5, 0.25, 2.0];
        let ms = [200.0, 100.0, 100.0, 300.0, 100.0, 100.0, 100.0];
        let mut r = reporter(7, None);
        let mut lines = vec![];
        for (i, (&loss, &t)) in losses.iter().zip(&ms).enumerate() {
            let step = i as u64 + 1;
            let mut m = stepped(step, loss, t);
            if step == 2 {
                (m.eval_loss, m.eval_ms) = (Some(5.0), Some(400.0));
            }
            // --log-every 3 over 7 steps: lines after 3 and 6, and at the end.
            lines.extend(r.show(&m, step.is_multiple_of(3)));
        }
        lines.extend(r.unfinished());
        assert_eq!(
            lines,
            [
                // The validation between two lines: its own line, its own time.
                "step=2 eval_loss=5.0000 eval_ms=400.0".to_string(),
                // (4 + 3 + 2) / 3 = 3; 3000 tokens in 400 ms; 4 steps left
                // at the median of 100 and 100 ms.
                "step=3 loss=3.0000 lr=3.333e-4 tokens_per_s=7500 ms_per_step=133.3 peak_mib=64 eta_s=0"
                    .to_string(),
                // (1 + 0.5 + 0.25) / 3 = 0.5833; 3000 tokens in 500 ms.
                "step=6 loss=0.5833 lr=1.667e-4 tokens_per_s=6000 ms_per_step=166.7 peak_mib=64 eta_s=0"
                    .to_string(),
                // The last step alone.
                "step=7 loss=2.0000 lr=1.429e-4 tokens_per_s=10000 ms_per_step=100.0 peak_mib=64 eta_s=0"
                    .to_string(),
            ]
        );
        // Nothing is left to log.
        assert_eq!(r.unfinished(), None);
    }

    /// Output a test reads back.
    #[derive(Clone, Default)]
    struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_bar_shows_each_step_with_its_own_interval_mean_and_ends_on_the_runs_median() {
        let out = Shared::default();
        let task = Task::builder("training", Unit::Steps)
            .total(Some(6))
            .mode(Mode::Events)
            .interval(Duration::ZERO)
            .writer(out.clone())
            .start();
        let mut r = reporter(6, Some(task));
        let losses = [4.0f32, 3.0, 2.0, 1.0, 0.5, 0.25];
        let ms = [900.0, 100.0, 120.0, 110.0, 500.0, 105.0];
        for (i, (&loss, &t)) in losses.iter().zip(&ms).enumerate() {
            let step = i as u64 + 1;
            assert!(
                r.show(&stepped(step, loss, t), step.is_multiple_of(2))
                    .is_empty()
            );
        }
        r.finish();
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let events: Vec<mlx_progress::Event> = text
            .lines()
            .map(|l| mlx_progress::Event::decode(l).unwrap().unwrap())
            .filter(|e| e.kind == mlx_progress::Kind::Update)
            .collect();
        assert_eq!(events.len(), 6, "{text}");
        // --log-every 2: the loss is the mean of the steps since the last
        // even one, this one included, beside this step's count.
        let want = [4.0, 3.5, 2.0, 1.5, 0.5, 0.375];
        for (e, w) in events.iter().zip(want) {
            assert!(
                e.msg.starts_with(&format!("loss {w:.4} | ")),
                "step {}: {}",
                e.pos,
                e.msg
            );
        }
        // The last shows the median the run's summary reports (steps after
        // the first: 105, 110, 120, 500 and 100 ms -> 110), and 1000 tokens
        // in 110 ms.
        let last = &events[5];
        assert_eq!(last.pos, 6);
        assert_eq!(median_after_first(&ms), 110.0);
        assert!(
            last.msg.ends_with("| 9.09k tok/s | 110 ms/step (median)"),
            "{}",
            last.msg
        );
    }

    #[test]
    fn the_hparams_are_the_options_as_run_toml_names_them() {
        let args = [
            "--schedule",
            "wsd-sqrt",
            "--min-lr",
            "1e-5",
            "--data",
            "jsonl:a.jsonl,b.jsonl",
            "--tokenizer",
            "train:300",
            "--no-shard-optimizer",
            "--report-to",
            "jsonl,tensorboard",
            "--lora-targets",
            "q,v",
        ];
        let cfg = <crate::TrainConfig as clap::FromArgMatches>::from_arg_matches(
            &crate::TrainConfig::command()
                .try_get_matches_from(std::iter::once("train").chain(args))
                .unwrap(),
        )
        .unwrap();
        let h: std::collections::BTreeMap<String, HParam> = hparams(&cfg).into_iter().collect();
        let text = |s: &str| HParam::Text(s.into());
        assert_eq!(h["schedule"], text("wsd-sqrt"));
        assert_eq!(h["min_lr"], HParam::Number(1e-5));
        assert_eq!(h["lr"], HParam::Number(3e-4));
        assert_eq!(h["steps"], HParam::Number(100.0));
        assert_eq!(h["data"], text("jsonl:a.jsonl,b.jsonl"));
        assert_eq!(h["tokenizer"], text("train:300"));
        assert_eq!(h["no_shard_optimizer"], HParam::Bool(true));
        assert_eq!(h["no_overlap_steps"], HParam::Bool(false));
        assert_eq!(h["report_to"], text("tensorboard,jsonl"));
        assert_eq!(h["lora_targets"], text("q,v"));
        assert_eq!(h["dtype"], text("f32"));
        // Unset options are left out.
        assert!(!h.contains_key("decay_fraction") && !h.contains_key("init_from"));
    }
}
