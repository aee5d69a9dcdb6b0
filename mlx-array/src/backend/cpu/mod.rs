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
pub(crate) mod indexing;
#[cfg(target_arch = "x86_64")]
mod lce_avx512;
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

/// Runs `$body` with `$T` bound to the Rust element type of `$dtype`.
macro_rules! dispatch {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::Dtype::Bool => {
                type $T = $crate::Bool8;
                $body
            }
            $crate::Dtype::U32 => {
                type $T = u32;
                $body
            }
            $crate::Dtype::I32 => {
                type $T = i32;
                $body
            }
            $crate::Dtype::I64 => {
                type $T = i64;
                $body
            }
            $crate::Dtype::F16 => {
                type $T = half::f16;
                $body
            }
            $crate::Dtype::BF16 => {
                type $T = half::bf16;
                $body
            }
            $crate::Dtype::F32 => {
                type $T = f32;
                $body
            }
        }
    };
}
pub(crate) use dispatch;
