//! The loss family: row-wise softmax and the fused softmax cross-entropy
//! ([`rows`]), and the output projection fused with it, with its gradient
//! in one pass or two ([`linear`]).

mod linear;
mod rows;

pub use linear::{
    linear_cross_entropy, linear_cross_entropy_grad, linear_cross_entropy_value_and_grad,
};
pub use rows::{cross_entropy, cross_entropy_grad, softmax};
