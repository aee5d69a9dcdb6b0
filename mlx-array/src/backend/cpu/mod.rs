//! The CPU backend: multithreaded kernels over strided views.

pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod copy;
pub(crate) mod indexing;
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
pub use matmul::blas;

/// A pointer handed to parallel tasks, which only read through it or
/// write disjoint parts of what it points to (the creator's promise, with
/// the tasks waited for before the memory goes).
#[cfg(target_arch = "x86_64")]
pub(super) struct Shared<T>(pub(super) *mut T);

#[cfg(target_arch = "x86_64")]
impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        *self
    }
}
#[cfg(target_arch = "x86_64")]
impl<T> Copy for Shared<T> {}
// SAFETY: see the type's promise.
#[cfg(target_arch = "x86_64")]
unsafe impl<T> Send for Shared<T> {}
#[cfg(target_arch = "x86_64")]
unsafe impl<T> Sync for Shared<T> {}

#[cfg(target_arch = "x86_64")]
impl<T> Shared<T> {
    /// The pointer (a method, so that closures capture the `Sync` wrapper
    /// rather than the pointer).
    fn ptr(&self) -> *mut T {
        self.0
    }
}

/// Which instructions compute bfloat16 matrix products (matmul and the
/// one-pass output projection + loss) in this process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bf16Products {
    /// AMX tiles (`tdpbf16ps`), float32 sums.
    Amx,
    /// AVX512_BF16 (`vdpbf16ps`), float32 sums.
    Avx512Bf16,
    /// Operands converted to float32 for the BLAS and the f32 kernels
    /// (no bfloat16 instructions, or `MLX_CPU_TUNING=bf16=off`).
    Float32,
}

/// The bfloat16 product path this CPU, operating system and the settings
/// (`MLX_CPU_TUNING`'s `bf16` and `amx`) give.
pub fn bf16_products() -> Bf16Products {
    #[cfg(target_arch = "x86_64")]
    if crate::settings::cpu_tuning().bf16 && matmul::gemm_bf16::available() {
        return if matmul::amx::available() {
            Bf16Products::Amx
        } else {
            Bf16Products::Avx512Bf16
        };
    }
    Bf16Products::Float32
}
