//! Kernels, one folder per backend, one file per family of kernels.

pub mod cpu;
#[cfg(feature = "gpu")]
pub mod gpu;
