//! The look of a bar, by unit: shared by a process's own bars and the bars
//! a launcher draws for its ranks, so both read the same.

use std::time::Duration;

use indicatif::{ProgressState, ProgressStyle};

use crate::{Unit, format};

/// How often a bar with no total (a spinner) turns while nothing happens.
pub(crate) const SPIN_EVERY: Duration = Duration::from_millis(120);

/// The style of a bar counting `unit`, with a known total or as a spinner.
pub(crate) fn style(unit: Unit, has_total: bool) -> ProgressStyle {
    let template = match (unit, has_total) {
        (Unit::Steps, true) => "{prefix} [{bar:30}] {pos}/{len} [{elapsed}] {msg}",
        (Unit::Bytes, true) => {
            "{prefix} [{bar:30}] {done}/{total} {rate} [{elapsed}, eta {eta}] {msg}"
        }
        (_, true) => {
            "{prefix} [{bar:30}] {done}/{total} {what} {rate} [{elapsed}, eta {eta}] {msg}"
        }
        (_, false) => "{spinner} {prefix} {done}{rate} [{elapsed}] {msg}",
    };
    ProgressStyle::with_template(template)
        .expect("the bar templates are valid")
        .progress_chars("=> ")
        .with_key(
            "done",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                if has_total || s.pos() > 0 {
                    let _ = write!(w, "{}", format::amount(unit, s.pos()));
                    if !has_total && unit != Unit::Bytes {
                        let _ = write!(w, " {}", unit.name());
                    }
                }
            },
        )
        .with_key(
            "total",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{}", format::amount(unit, s.len().unwrap_or(0)));
            },
        )
        .with_key(
            "what",
            move |_: &ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{}", unit.name());
            },
        )
        .with_key(
            "rate",
            move |s: &ProgressState, w: &mut dyn std::fmt::Write| {
                if has_total || s.pos() > 0 {
                    let lead = if has_total { "" } else { " " };
                    let _ = write!(w, "{lead}{}", format::rate(unit, s.per_sec()));
                }
            },
        )
}
