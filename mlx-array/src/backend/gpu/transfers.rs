//! What crosses between host and GPU, and how long the host waits for the
//! GPU: process-wide counters, a few relaxed atomics per transfer or wait.
//!
//! Array contents cross in two places only: `upload` (a [`crate::device::Transfer`]
//! to the GPU) and `download` (one to the host, the only place the host
//! waits for queued work besides reading timestamps back while profiling).
//! Kernel arguments (a few words of sizes and strides per dispatch, packed
//! into the meta arena and written once per submission: see `meta_arena`)
//! are not array contents and are not counted.

use std::ops::Sub;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Transfers between the host and the GPU since the process started (see
/// [`transfers`]); subtract two readings for what crossed in between.
///
/// ```
/// let before = mlx_array::backend::gpu::transfers();
/// // ... a training step ...
/// let step = mlx_array::backend::gpu::transfers() - before;
/// assert_eq!(step.to_host_bytes, 0);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Transfers {
    /// Arrays copied from the host to the GPU.
    pub to_device: u64,
    /// Their bytes (the arrays' dense sizes).
    pub to_device_bytes: u64,
    /// Arrays copied from the GPU to the host.
    pub to_host: u64,
    /// Their bytes.
    pub to_host_bytes: u64,
    /// Times the host blocked until the GPU finished its queued work (each
    /// download, and while profiling each submission's timestamp readback).
    pub waits: u64,
    /// The host time those waits took.
    pub waited: Duration,
}

impl Sub for Transfers {
    type Output = Transfers;
    /// What happened between two readings (`later - earlier`).
    fn sub(self, earlier: Transfers) -> Transfers {
        Transfers {
            to_device: self.to_device - earlier.to_device,
            to_device_bytes: self.to_device_bytes - earlier.to_device_bytes,
            to_host: self.to_host - earlier.to_host,
            to_host_bytes: self.to_host_bytes - earlier.to_host_bytes,
            waits: self.waits - earlier.waits,
            waited: self.waited.saturating_sub(earlier.waited),
        }
    }
}

impl std::fmt::Display for Transfers {
    /// `3 arrays (1.2 KiB) to the GPU, 1 (4 B) to the host; waited 2 times, 1.5 ms`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} arrays ({}) to the GPU, {} ({}) to the host; waited {} times, {:.1} ms",
            self.to_device,
            bytes(self.to_device_bytes),
            self.to_host,
            bytes(self.to_host_bytes),
            self.waits,
            self.waited.as_secs_f64() * 1e3
        )
    }
}

fn bytes(n: u64) -> String {
    match n {
        n if n >= 1 << 20 => format!("{:.1} MiB", n as f64 / (1u64 << 20) as f64),
        n if n >= 1 << 10 => format!("{:.1} KiB", n as f64 / 1024.0),
        n => format!("{n} B"),
    }
}

static TO_DEVICE: AtomicU64 = AtomicU64::new(0);
static TO_DEVICE_BYTES: AtomicU64 = AtomicU64::new(0);
static TO_HOST: AtomicU64 = AtomicU64::new(0);
static TO_HOST_BYTES: AtomicU64 = AtomicU64::new(0);
static WAITS: AtomicU64 = AtomicU64::new(0);
static WAITED_NS: AtomicU64 = AtomicU64::new(0);

/// Every transfer and wait of this process so far (all threads).
pub fn transfers() -> Transfers {
    let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
    Transfers {
        to_device: r(&TO_DEVICE),
        to_device_bytes: r(&TO_DEVICE_BYTES),
        to_host: r(&TO_HOST),
        to_host_bytes: r(&TO_HOST_BYTES),
        waits: r(&WAITS),
        waited: Duration::from_nanos(r(&WAITED_NS)),
    }
}

/// Counts an upload of `bytes`.
pub(super) fn uploaded(bytes: usize) {
    TO_DEVICE.fetch_add(1, Ordering::Relaxed);
    TO_DEVICE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts a download of `bytes`.
pub(super) fn downloaded(bytes: usize) {
    TO_HOST.fetch_add(1, Ordering::Relaxed);
    TO_HOST_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// Counts one wait for the GPU that took `dt`.
pub(super) fn waited(dt: Duration) {
    WAITS.fetch_add(1, Ordering::Relaxed);
    WAITED_NS.fetch_add(dt.as_nanos() as u64, Ordering::Relaxed);
}
