//! What the last products recorded chose (tilings, stagings, the kernel
//! family), kept in process-wide statics for tests that check which
//! kernel ran.

/// Products recorded on the cooperative kernel's template (either
/// fragment implementation) since the process started.
pub(super) static COOP_PRODUCTS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

/// Products recorded on the cooperative-matrix (tensor-core) template
/// since the process started, with either fragment implementation (for
/// tests that check which kernel a product took).
pub fn coop_product_count() -> usize {
    COOP_PRODUCTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The last value of a choice made while recording products (tilings,
/// stagings), kept for tests that check which kernel ran.
pub(super) struct Last(std::sync::atomic::AtomicUsize);

impl Last {
    /// None recorded yet.
    pub(super) const fn new() -> Last {
        Last(std::sync::atomic::AtomicUsize::new(0))
    }

    /// Records `n` (non-zero) as the latest.
    pub(super) fn set(&self, n: usize) {
        self.0.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The latest, `None` before the first.
    pub(super) fn get(&self) -> Option<usize> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

pub(super) static LAST_COOP_SUBGROUPS: Last = Last::new();
pub(super) static LAST_COOP_STAGED: Last = Last::new();
pub(super) static LAST_COOP_BUFFERS: Last = Last::new();
pub(super) static LAST_PRODUCT_TILE: Last = Last::new();

/// The subgroups per workgroup of the last product recorded on the
/// cooperative template, `None` before the first (for tests that check
/// which tiling ran).
pub fn last_coop_subgroups() -> Option<usize> {
    LAST_COOP_SUBGROUPS.get()
}

/// How many output fragments per subgroup the last product recorded on
/// the cooperative template staged at a time (`coop::staged_per_round`),
/// `None` before the first (for tests that check which epilogue ran).
pub fn last_coop_staged() -> Option<usize> {
    LAST_COOP_STAGED.get()
}

/// How many buffers of staged depth slices per operand (1 or 2) the last
/// product recorded on the cooperative template used
/// (`coop::Staging::choose`), `None` before the first (for tests that
/// check which main loop ran).
pub fn last_coop_buffers() -> Option<usize> {
    LAST_COOP_BUFFERS.get()
}

/// The output tile side (64 or 128) of the last product recorded on
/// either kernel, `None` before the first (for tests that check which
/// tiles, and so which split, a product took).
pub fn last_product_tile() -> Option<usize> {
    LAST_PRODUCT_TILE.get()
}
