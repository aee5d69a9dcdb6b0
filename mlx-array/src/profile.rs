//! Opt-in time spent in each kind of primitive: with `MLX_PROFILE=1` in the
//! environment, the evaluator times every kernel it runs and [`report`] lists
//! the totals by primitive name and output shape, largest first, and the
//! kernel (compute or collective) by which array memory reached its peak.
//! Off by default (one relaxed atomic load per node).
//!
//! Two clocks, reported in two tables:
//!
//! - **CPU**: the host time of each CPU kernel, collective and wait for one.
//!   A GPU primitive's kernel only records dispatches into the command
//!   encoder, so its host time is listed apart, as `name (GPU recording)`:
//!   the cost of feeding the GPU, not of running the work. (A transfer to
//!   the CPU waits for the GPU's queued work: its host time includes that.)
//! - **GPU**: execution time on the GPU, from timestamp queries written at
//!   the beginning and end of every compute pass, each pass tagged with the
//!   primitive that recorded it. They are read back when the eval's work is
//!   submitted, which waits for the GPU: profiling synchronises, so the GPU
//!   no longer overlaps the next eval's recording. Transfers' copies and the
//!   clearing of packed outputs are not passes and go untimed.
//!
//! GPU times need the adapter's `TIMESTAMP_QUERY` feature, requested only
//! when profiling is on as the GPU is first used (so set `MLX_PROFILE=1`, or
//! call [`crate::settings::set_profile`], before that). Without it there is
//! no GPU table, and the report says once why.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::timing::{self, Tag};

/// What a recorded time measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Clock {
    /// Host time of a CPU kernel, a collective, or a wait for one.
    Cpu,
    /// Host time a GPU primitive spent recording its dispatches (not running them).
    GpuRecording,
    /// GPU execution time of a primitive's compute passes.
    Gpu,
}

/// One row of the profile: a primitive's total on one clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// What the time measures.
    pub clock: Clock,
    /// The primitive's name.
    pub name: &'static str,
    /// Its (first) output's shape.
    pub shape: Vec<usize>,
    /// Kernel runs.
    pub calls: u64,
    /// Their total time.
    pub total: Duration,
}

/// `(clock, primitive name, output shape)` -> `(calls, total time)`.
type Table = HashMap<(Clock, &'static str, Vec<usize>), (u64, Duration)>;

static TABLE: Mutex<Option<Table>> = Mutex::new(None);

/// The most array memory seen (the process's peak), and the kernel during
/// or right before which it was first reached.
static PEAK: Mutex<Option<(usize, &'static str, Vec<usize>)>> = Mutex::new(None);

/// True when `MLX_PROFILE=1` or [`crate::settings::set_profile`] asks for it
/// (a value that is not understood is the first eval's error).
pub fn enabled() -> bool {
    crate::settings::profile().unwrap_or(false)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn add(clock: Clock, name: &'static str, shape: &[usize], calls: u64, dt: Duration) {
    let mut t = lock(&TABLE);
    let e = t
        .get_or_insert_with(HashMap::new)
        .entry((clock, name, shape.to_vec()))
        .or_default();
    e.0 += calls;
    e.1 += dt;
}

/// Adds one CPU kernel run (or collective, or wait) to the table.
pub(crate) fn record(name: &'static str, shape: &[usize], dt: Duration) {
    record_host(Clock::Cpu, name, shape, dt);
}

fn record_host(clock: Clock, name: &'static str, shape: &[usize], dt: Duration) {
    add(clock, name, shape, 1, dt);
    // Right after a kernel its output and all its inputs are alive: the
    // moments at which array memory peaks.
    // The process's peak may also have been reached inside a kernel (its
    // scratch) or between kernels: a new peak since the last record is put
    // down to this kernel.
    let active = crate::memory::active().max(crate::memory::peak());
    let mut p = lock(&PEAK);
    if p.as_ref().is_none_or(|(most, _, _)| active > *most) {
        *p = Some((active, name, shape.to_vec()));
    }
}

/// Times one kernel run on the host and tags the GPU passes it records;
/// started by [`start`].
pub(crate) struct Kernel {
    t0: Instant,
    on_gpu: bool,
    tag: Arc<Tag>,
}

/// Starts timing a run of `name` (output `shape`); `on_gpu` when its kernel
/// records GPU work rather than doing the work.
pub(crate) fn start(name: &'static str, shape: &[usize], on_gpu: bool) -> Kernel {
    // The GPU backend tags the passes it records with the thread's current
    // primitive, read from the leaf (`timing`), and adds their times there.
    let tag = timing::begin(name, shape);
    Kernel {
        t0: Instant::now(),
        on_gpu,
        tag,
    }
}

impl Kernel {
    /// Adds the host time since [`start`] to the table.
    pub(crate) fn stop(self) {
        // Recording time is kept (not dropped) but on its own rows: it is
        // real host work (encoding, a kernel's first compile, an upload's
        // staging copy) that bounds how fast the CPU feeds the GPU, and it
        // must never read as the GPU's execution time.
        let clock = if self.on_gpu {
            Clock::GpuRecording
        } else {
            Clock::Cpu
        };
        record_host(clock, self.tag.name, &self.tag.shape, self.t0.elapsed());
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        timing::end();
    }
}

/// Why GPU execution times are unavailable (`None` while the GPU is unused,
/// or when its passes are timed).
pub fn gpu_untimed() -> Option<String> {
    timing::gpu_untimed()
}

/// Forgets everything recorded so far.
pub fn reset() {
    *lock(&TABLE) = None;
    *lock(&PEAK) = None;
    timing::reset_gpu_times();
}

/// Everything recorded so far, in no particular order.
pub fn entries() -> Vec<Entry> {
    let t = lock(&TABLE);
    let host = t
        .iter()
        .flatten()
        .map(|(&(clock, name, ref shape), &(calls, total))| Entry {
            clock,
            name,
            shape: shape.clone(),
            calls,
            total,
        });
    let gpu = timing::gpu_times()
        .into_iter()
        .map(|(name, shape, calls, total)| Entry {
            clock: Clock::Gpu,
            name,
            shape,
            calls,
            total,
        });
    host.chain(gpu).collect()
}

/// The recorded totals as text: a CPU table, then (when any) a GPU table,
/// each by name (at most `rows` lines, largest total first, with each
/// name's share of its clock's time) and by output shape (`rows` lines).
pub fn report(rows: usize) -> String {
    let all = entries();
    if all.is_empty() {
        return "no primitives were timed (set MLX_PROFILE=1)\n".into();
    }
    // Host and GPU time are separate tables: the GPU runs after (or, without
    // profiling, while) the host records, so one sum of both would be
    // neither the wall time nor either device's busy time.
    let (gpu, host): (Vec<Entry>, Vec<Entry>) =
        all.into_iter().partition(|e| e.clock == Clock::Gpu);
    let mut out = String::new();
    if let Some((bytes, name, shape)) = lock(&PEAK).as_ref() {
        out += &format!(
            "peak array memory: {:.1} MiB, reached by {name} {shape:?}\n",
            *bytes as f64 / (1 << 20) as f64
        );
    }
    out += &table("primitive time on the CPU", &host, rows);
    if !gpu.is_empty() {
        out += &table("GPU execution time (timestamp queries)", &gpu, rows);
    }
    let recorded_gpu_work = host.iter().any(|e| e.clock == Clock::GpuRecording);
    if recorded_gpu_work {
        // Over the process's life, not since `reset`.
        out += &format!(
            "host-GPU transfers (whole process): {}\n",
            crate::backend::gpu::transfers()
        );
    }
    if let Some(why) = gpu_untimed().filter(|_| recorded_gpu_work) {
        out += &format!(
            "GPU execution times unavailable: {why}; `(GPU recording)` rows are host time \
             to record GPU work, not to run it\n"
        );
    }
    out
}

/// One clock's entries as text under `title`.
fn table(title: &str, entries: &[Entry], rows: usize) -> String {
    let label = |e: &Entry| match e.clock {
        Clock::GpuRecording => format!("{} (GPU recording)", e.name),
        _ => e.name.to_string(),
    };
    let total: f64 = entries.iter().map(|e| e.total.as_secs_f64()).sum();
    let mut by_name: HashMap<String, f64> = HashMap::new();
    for e in entries {
        *by_name.entry(label(e)).or_default() += e.total.as_secs_f64();
    }
    let mut names: Vec<_> = by_name.into_iter().collect();
    names.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut out = format!("{title}: {total:.3} s in all\n");
    for (n, s) in names.iter().take(rows) {
        out += &format!(
            "  {n:<28} {s:>9.3} s {:>5.1}%\n",
            100.0 * s / total.max(1e-12)
        );
    }
    let mut sorted: Vec<&Entry> = entries.iter().collect();
    sorted.sort_by_key(|e| std::cmp::Reverse(e.total));
    out += "by output shape:\n";
    for e in sorted.into_iter().take(rows) {
        out += &format!(
            "  {:<28} {:<22} {:>6} calls {:>9.3} s\n",
            label(e),
            format!("{:?}", e.shape),
            e.calls,
            e.total.as_secs_f64()
        );
    }
    out
}
