//! Learning-rate schedules: functions of the step count, as in `mlx.optimizers`.
//!
//! A [`Schedule`] maps the number of updates already applied (0 for the first
//! update) to a value, evaluated in `f64` on the host once per update. Because
//! it depends on the step count alone, and the step count is part of the saved
//! optimizer state, a resumed run sees exactly the values an uninterrupted one
//! would.
//!
//! ```
//! use mlx_optim::schedule::{cosine_decay, join_schedules, linear_schedule};
//! let warmup = linear_schedule(0.0, 1e-1, 10).unwrap();
//! let cosine = cosine_decay(1e-1, 200, 0.0).unwrap();
//! let lr = join_schedules(vec![warmup, cosine], &[10]).unwrap();
//! assert_eq!(lr.at(0), 0.0);
//! assert!((lr.at(5) - 0.05).abs() < 1e-12);
//! assert_eq!(lr.at(10), 0.1);
//! ```

use std::fmt;
use std::sync::Arc;

use crate::{Error, Result};

/// A value (usually the learning rate) as a function of the step count.
///
/// Plain numbers convert into constant schedules, so every optimizer
/// constructor accepts either `3e-4` or a schedule.
#[derive(Clone)]
pub struct Schedule {
    f: Arc<dyn Fn(u64) -> f64 + Send + Sync>,
    name: String,
}

impl Schedule {
    /// A schedule from any function of the step count; `name` is shown by `Debug`.
    pub fn new(name: impl Into<String>, f: impl Fn(u64) -> f64 + Send + Sync + 'static) -> Self {
        Schedule {
            f: Arc::new(f),
            name: name.into(),
        }
    }

    /// The value at `step` (the number of updates applied before this one).
    pub fn at(&self, step: u64) -> f64 {
        (self.f)(step)
    }
}

impl fmt::Debug for Schedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Schedule({})", self.name)
    }
}

impl From<f64> for Schedule {
    fn from(v: f64) -> Self {
        constant(v)
    }
}

impl From<f32> for Schedule {
    fn from(v: f32) -> Self {
        constant(v as f64)
    }
}

/// The same value at every step.
pub fn constant(value: f64) -> Schedule {
    Schedule::new(format!("constant({value})"), move |_| value)
}

/// `init * decay_rate^step` (MLX's `exponential_decay`).
pub fn exponential_decay(init: f64, decay_rate: f64) -> Schedule {
    Schedule::new(
        format!("exponential_decay({init}, {decay_rate})"),
        move |step| init * decay_rate.powf(step as f64),
    )
}

/// `init * decay_rate^(step / step_size)` with integer division: the value
/// drops by `decay_rate` every `step_size` steps (MLX's `step_decay`).
pub fn step_decay(init: f64, decay_rate: f64, step_size: u64) -> Result<Schedule> {
    if step_size == 0 {
        return Err(Error::Config(
            "step_decay: step_size must be at least 1".into(),
        ));
    }
    Ok(Schedule::new(
        format!("step_decay({init}, {decay_rate}, {step_size})"),
        move |step| init * decay_rate.powf((step / step_size) as f64),
    ))
}

/// Cosine decay from `init` to `end` over `decay_steps` steps, then `end`
/// (MLX's `cosine_decay`): `end + (init - end) * 0.5 * (1 + cos(pi * min(step, decay_steps) / decay_steps))`.
pub fn cosine_decay(init: f64, decay_steps: u64, end: f64) -> Result<Schedule> {
    if decay_steps == 0 {
        return Err(Error::Config(
            "cosine_decay: decay_steps must be at least 1".into(),
        ));
    }
    Ok(Schedule::new(
        format!("cosine_decay({init}, {decay_steps}, {end})"),
        move |step| {
            let s = step.min(decay_steps) as f64;
            let decay = 0.5 * (1.0 + (std::f64::consts::PI / decay_steps as f64 * s).cos());
            end + decay * (init - end)
        },
    ))
}

/// A straight line from `init` (step 0) to `end` (step `steps` and after):
/// the usual linear warmup (MLX's `linear_schedule`).
pub fn linear_schedule(init: f64, end: f64, steps: u64) -> Result<Schedule> {
    if steps == 0 {
        return Err(Error::Config(
            "linear_schedule: steps must be at least 1".into(),
        ));
    }
    Ok(Schedule::new(
        format!("linear_schedule({init}, {end}, {steps})"),
        move |step| step.min(steps) as f64 * ((end - init) / steps as f64) + init,
    ))
}

/// Joins schedules at step boundaries (MLX's `join_schedules`): from
/// `boundaries[i]` on, schedule `i + 1` is used and is given the number of
/// steps since that boundary. Needs exactly one boundary fewer than schedules.
pub fn join_schedules(schedules: Vec<Schedule>, boundaries: &[u64]) -> Result<Schedule> {
    if schedules.is_empty() {
        return Err(Error::Config(
            "join_schedules: needs at least one schedule".into(),
        ));
    }
    if schedules.len() != boundaries.len() + 1 {
        return Err(Error::Config(format!(
            "join_schedules: {} boundaries given, {} expected for {} schedules",
            boundaries.len(),
            schedules.len() - 1,
            schedules.len()
        )));
    }
    let name = format!(
        "join_schedules([{}], {boundaries:?})",
        schedules
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );
    let boundaries = boundaries.to_vec();
    Ok(Schedule::new(name, move |step| {
        let mut out = schedules[0].at(step);
        for (b, s) in boundaries.iter().zip(&schedules[1..]) {
            if step >= *b {
                out = s.at(step - b);
            }
        }
        out
    }))
}
