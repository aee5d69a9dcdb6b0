//! Which attention kernels ran, counted in process-wide statics for the
//! tests that check it.

use std::sync::atomic::{AtomicUsize, Ordering};

pub(super) static FRAGMENT_FORWARDS: AtomicUsize = AtomicUsize::new(0);
/// The last f32-compute kernel's tiles, `bq << 16 | bk` (0: none yet).
pub(super) static LAST_SCALAR_TILES: AtomicUsize = AtomicUsize::new(0);

/// The tiles (query rows, key rows) of the last f32-compute attention
/// kernel recorded, forward or gradient; `None` before the first and
/// after the per-row fallback (for tests that check which kernels ran).
pub fn last_scalar_tiles() -> Option<(usize, usize)> {
    match LAST_SCALAR_TILES.load(Ordering::Relaxed) {
        0 => None,
        t => Some((t >> 16, t & 0xffff)),
    }
}

pub(super) static FRAGMENT_GRADS: AtomicUsize = AtomicUsize::new(0);

/// Forwards and gradients run on the f16 fragment kernels (`fragments`,
/// `fragments_backward`) since the process started (for tests that
/// check which kernels ran).
pub fn fragment_runs() -> (usize, usize) {
    (
        FRAGMENT_FORWARDS.load(Ordering::Relaxed),
        FRAGMENT_GRADS.load(Ordering::Relaxed),
    )
}

/// f32-compute kernels recorded with inputs staged by quads since the
/// process started.
pub(super) static SCALAR_QUAD_STAGED: AtomicUsize = AtomicUsize::new(0);

/// f32-compute attention kernels (forward or gradient pass) recorded with
/// their inputs staged by quads since the process started (for tests that
/// check which loads ran).
pub fn scalar_quad_staged_runs() -> usize {
    SCALAR_QUAD_STAGED.load(Ordering::Relaxed)
}

/// Fragment kernels recorded with inputs staged by quads
/// ([`super::staging::Loads::Quads`]) since the process started.
pub(super) static QUAD_STAGED: AtomicUsize = AtomicUsize::new(0);

/// Fragment kernels (forward or gradient pass) recorded with their inputs
/// staged by quads since the process started (for tests that check which
/// loads ran).
pub fn quad_staged_runs() -> usize {
    QUAD_STAGED.load(Ordering::Relaxed)
}
