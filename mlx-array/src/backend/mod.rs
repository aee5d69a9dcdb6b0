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
/// The wgpu backend; without the `gpu` feature, a stub whose entry points
/// say so (`no_gpu.rs`), so that callers need no `cfg`.
#[cfg_attr(not(feature = "gpu"), path = "no_gpu.rs")]
pub mod gpu;
