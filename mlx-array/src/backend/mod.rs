//! Kernels, one folder per backend, one file per family of kernels, and
//! `common`: the kernel descriptions both backends read.
//!
//! The layers point one way: primitives call the backends, the backends
//! read `common` and the core (`ArrayData`, dtypes, shapes, memory
//! accounting), and the GPU backend never reaches into the CPU one.
//! `tests/layers.rs` checks it.

pub mod common;
pub mod cpu;
/// The wgpu backend; without the `gpu` feature, a stub whose entry points
/// say so (`no_gpu.rs`), so that callers need no `cfg`.
#[cfg_attr(not(feature = "gpu"), path = "no_gpu.rs")]
pub mod gpu;
