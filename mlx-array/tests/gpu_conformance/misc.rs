//! GPU cases for this family of primitives (see `NOT_YET_ON_GPU` in main.rs).

/// The primitives this module checks on the GPU.
/// (`tracer`, autodiff's identity node, runs in every gradient case.)
pub const NAMES: &[&str] = &["tracer"];
