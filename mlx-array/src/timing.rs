//! The part of the profile ([`crate::profile`]) that the GPU backend feeds,
//! kept in the leaf under the kernels so that the backend need not import
//! the profile (whose report reads the backend's transfer counters): which
//! primitive the calling thread is running (the tag its GPU passes carry),
//! the GPU execution time per primitive, and why the GPU's passes go
//! untimed when they do. The profile sets the tag, reads the times back and
//! reports them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The primitive a thread is running, as the tag of the GPU passes it records.
#[derive(Debug)]
pub(crate) struct Tag {
    /// The primitive's name.
    pub(crate) name: &'static str,
    /// Its (first) output's shape.
    pub(crate) shape: Vec<usize>,
    /// Which run of a kernel: the passes of one run count as one call.
    call: u64,
}

thread_local! {
    static CURRENT: RefCell<Option<Arc<Tag>>> = const { RefCell::new(None) };
}

static CALLS: AtomicU64 = AtomicU64::new(0);

/// `(primitive name, output shape)` -> `(calls, total GPU time)`.
type GpuTable = HashMap<(&'static str, Vec<usize>), (u64, Duration)>;

static GPU_TIMES: Mutex<Option<GpuTable>> = Mutex::new(None);

/// Why the GPU's passes are not timed, when they are not (set by the GPU
/// backend as it creates its device; kept across [`reset_gpu_times`], as the
/// device is).
static GPU_UNTIMED: Mutex<Option<String>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Makes a new run of `name` (output `shape`) the calling thread's current
/// primitive and returns its tag.
pub(crate) fn begin(name: &'static str, shape: &[usize]) -> Arc<Tag> {
    let tag = Arc::new(Tag {
        name,
        shape: shape.to_vec(),
        call: CALLS.fetch_add(1, Ordering::Relaxed),
    });
    CURRENT.with(|c| *c.borrow_mut() = Some(tag.clone()));
    tag
}

/// The calling thread runs no primitive any more.
pub(crate) fn end() {
    CURRENT.with(|c| *c.borrow_mut() = None);
}

/// The primitive the calling thread is running, while the profile is on.
#[allow(dead_code)] // for the GPU backend: unused in a build without the `gpu` feature
pub(crate) fn current() -> Option<Arc<Tag>> {
    CURRENT.with(|c| c.borrow().clone())
}

/// Adds the GPU execution times of one submission's passes (each with the
/// primitive that recorded it); a kernel's passes count as one call.
#[allow(dead_code)] // for the GPU backend: unused in a build without the `gpu` feature
pub(crate) fn record_gpu(passes: impl IntoIterator<Item = (Arc<Tag>, Duration)>) {
    let mut calls: HashMap<u64, (Arc<Tag>, Duration)> = HashMap::new();
    for (tag, dt) in passes {
        calls
            .entry(tag.call)
            .or_insert_with(|| (tag, Duration::ZERO))
            .1 += dt;
    }
    let mut t = lock(&GPU_TIMES);
    let t = t.get_or_insert_with(HashMap::new);
    for (tag, dt) in calls.into_values() {
        let e = t.entry((tag.name, tag.shape.clone())).or_default();
        e.0 += 1;
        e.1 += dt;
    }
}

/// The GPU times recorded so far: `(name, shape, calls, total)`, in no
/// particular order.
pub(crate) fn gpu_times() -> Vec<(&'static str, Vec<usize>, u64, Duration)> {
    lock(&GPU_TIMES)
        .iter()
        .flatten()
        .map(|(&(name, ref shape), &(calls, total))| (name, shape.clone(), calls, total))
        .collect()
}

/// Forgets the GPU times recorded so far.
pub(crate) fn reset_gpu_times() {
    *lock(&GPU_TIMES) = None;
}

/// Notes why the GPU's passes go untimed (shown once in the profile's report).
#[allow(dead_code)] // for the GPU backend: unused in a build without the `gpu` feature
pub(crate) fn set_gpu_untimed(reason: String) {
    *lock(&GPU_UNTIMED) = Some(reason);
}

/// Why GPU execution times are unavailable (`None` while the GPU is unused,
/// or when its passes are timed).
pub(crate) fn gpu_untimed() -> Option<String> {
    lock(&GPU_UNTIMED).clone()
}
