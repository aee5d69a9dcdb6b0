//! Kernels, one folder per backend, one file per family of kernels, and
//! `common`: the kernel descriptions both backends read.
//!
//! The layers point one way: primitives call the backends, the backends
//! read `common` and the leaf under them (`crate::data`: the [`Operand`]s
//! kernels take, one per operand, and dtypes, shapes, memory accounting,
//! settings), and the GPU backend never reaches into the CPU one.
//! `cargo xtask layers` checks it against `layers.toml`.
//!
//! [`Operand`]: crate::data::Operand

pub mod common;
pub mod cpu;
// Before `gpu`: its macros are in scope from here on.
#[macro_use]
mod gpu_entry_points;
/// The wgpu backend; without the `gpu` feature, a stub whose entry points
/// say so (`no_gpu.rs`), so that callers need no `cfg`. Both take their
/// functions' signatures from one table, `gpu_entry_points.rs`.
#[cfg_attr(not(feature = "gpu"), path = "no_gpu.rs")]
pub mod gpu;
