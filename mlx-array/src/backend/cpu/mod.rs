//! The CPU backend: multithreaded kernels over strided views.

pub(crate) mod attention;
pub(crate) mod binary;
pub mod blas;
pub(crate) mod copy;

/// A contiguous view of `data` (itself when already dense, else a copy), for
/// primitives in other crates that need raw bytes.
pub fn copy_contiguous(
    data: &crate::ArrayData,
    shape: &[usize],
    dtype: crate::Dtype,
) -> crate::Result<crate::ArrayData> {
    Ok(copy::contiguous(data, shape, dtype))
}
#[cfg(target_arch = "x86_64")]
mod gemm_bf16;
pub(crate) mod indexing;
#[cfg(target_arch = "x86_64")]
mod lce_avx512;
#[cfg(target_arch = "x86_64")]
mod lce_bf16;
pub(crate) mod loss;
pub(crate) mod math;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod rope;
pub(crate) mod scan;
pub(crate) mod strided;
pub(crate) mod unary;

pub(crate) use super::common::dispatch;
