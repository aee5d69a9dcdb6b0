//! The loss kernels, one file a job: row-wise softmax and the fused softmax
//! cross-entropy on materialised logits (`cross_entropy`); the output
//! projection fused with the cross-entropy, which never materialises the
//! logits (`linear`; its AVX-512 row-block kernel is `super::lce_avx512`);
//! and the row helpers they, attention and the norms share (`rows`).

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
