//! The loss kernels, one file a job: row-wise softmax and the fused softmax
//! cross-entropy on materialised logits (`cross_entropy`); the output
//! projection fused with the cross-entropy, which never materialises the
//! logits (`linear`; its AVX-512 row-block kernel is `avx512`, and `bf16` the same
//! block's products for bfloat16 on AVX512_BF16 or AMX);
//! and the row helpers they, attention and the norms share (`rows`).

#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod bf16;
mod cross_entropy;
mod linear;
mod rows;

pub use cross_entropy::{cross_entropy, cross_entropy_grad, softmax};
pub use linear::{
    linear_cross_entropy, linear_cross_entropy_grad, linear_cross_entropy_value_and_grad,
};
#[cfg(target_arch = "x86_64")]
pub(super) use rows::IGNORED;
pub(super) use rows::{exp_shifted_in_place, max_of, vectorised};
