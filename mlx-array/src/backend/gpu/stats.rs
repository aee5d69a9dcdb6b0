//! Process-wide counters of the backend's work: dispatches recorded and
//! kernels compiled (for profiling and for tests that check fusion and
//! which variants were built).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::device::{context, lock};
use crate::Result;

pub(super) static DISPATCHES: AtomicUsize = AtomicUsize::new(0);

pub(super) static UNCHECKED_PIPELINES: AtomicUsize = AtomicUsize::new(0);

/// Kernels compiled, each variant once, since the process started (for
/// tests that check which variants were built).
pub fn pipeline_count() -> Result<usize> {
    Ok(lock(&context()?.pipelines).len())
}

/// Kernels compiled without wgpu's runtime checks since the process
/// started (see [`crate::settings::GpuChecks`]).
pub fn unchecked_pipeline_count() -> usize {
    UNCHECKED_PIPELINES.load(Ordering::Relaxed)
}

/// Kernel dispatches recorded since the process started (for profiling and
/// for tests that check fusion).
pub fn dispatch_count() -> usize {
    DISPATCHES.load(Ordering::Relaxed)
}
