//! GPU cases for this family of primitives (see `NOT_YET_ON_GPU` in main.rs).

/// The primitives this module checks on the GPU.
pub const NAMES: &[&str] = &[];
