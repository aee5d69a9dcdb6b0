//! Opt-in time spent in each kind of primitive: with `MLX_PROFILE=1` in the
//! environment, the evaluator times every kernel it runs and [`report`] lists
//! the totals by primitive name and output shape, largest first, and the
//! kernel (compute or collective) by which array memory reached its peak.
//! Off by default (one relaxed atomic load per node).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// `(primitive name, output shape)` -> `(calls, total time)`.
type Table = HashMap<(&'static str, Vec<usize>), (u64, Duration)>;

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The most array memory seen (the process's peak), and the kernel during
/// or right before which it was first reached.
static PEAK: Mutex<Option<(usize, &'static str, Vec<usize>)>> = Mutex::new(None);

/// True when `MLX_PROFILE=1` or [`crate::settings::set_profile`] asks for it
/// (a value that is not understood is the first eval's error).
pub fn enabled() -> bool {
    crate::settings::profile().unwrap_or(false)
}

/// Adds one kernel run to the table.
pub(crate) fn record(name: &'static str, shape: &[usize], dt: Duration) {
    let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let e = t
        .get_or_insert_with(HashMap::new)
        .entry((name, shape.to_vec()))
        .or_default();
    e.0 += 1;
    e.1 += dt;
    drop(t);
    // Right after a kernel its output and all its inputs are alive: the
    // moments at which array memory peaks.
    // The process's peak may also have been reached inside a kernel (its
    // scratch) or between kernels: a new peak since the last record is put
    // down to this kernel.
    let active = crate::memory::active().max(crate::memory::peak());
    let mut p = PEAK.lock().unwrap_or_else(|e| e.into_inner());
    if p.as_ref().is_none_or(|(most, _, _)| active > *most) {
        *p = Some((active, name, shape.to_vec()));
    }
}

/// Forgets everything recorded so far.
pub fn reset() {
    *TABLE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    *PEAK.lock().unwrap_or_else(|e| e.into_inner()) = None;
}

/// The recorded totals as a text table (at most `rows` lines after the
/// header, largest total first), with each name's share of the time.
pub fn report(rows: usize) -> String {
    let t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(t) = t.as_ref() else {
        return "no primitives were timed (set MLX_PROFILE=1)\n".into();
    };
    let total: f64 = t.values().map(|(_, d)| d.as_secs_f64()).sum();
    let mut by_name: HashMap<&str, f64> = HashMap::new();
    for ((n, _), (_, d)) in t {
        *by_name.entry(n).or_default() += d.as_secs_f64();
    }
    let mut names: Vec<_> = by_name.into_iter().collect();
    names.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut out = format!("primitive time: {total:.3} s in all\n");
    if let Some((bytes, name, shape)) = PEAK.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
        out += &format!(
            "peak array memory: {:.1} MiB, reached by {name} {shape:?}\n",
            *bytes as f64 / (1 << 20) as f64
        );
    }
    for (n, s) in names.iter().take(rows) {
        out += &format!(
            "  {n:<28} {s:>9.3} s {:>5.1}%\n",
            100.0 * s / total.max(1e-12)
        );
    }
    let mut entries: Vec<_> = t.iter().collect();
    entries.sort_by_key(|e| std::cmp::Reverse(e.1.1));
    out += "by output shape:\n";
    for ((n, shape), (calls, d)) in entries.into_iter().take(rows) {
        out += &format!(
            "  {n:<28} {:<22} {calls:>6} calls {:>9.3} s\n",
            format!("{shape:?}"),
            d.as_secs_f64()
        );
    }
    out
}
