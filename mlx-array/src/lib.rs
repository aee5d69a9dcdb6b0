//! Lazy n-dimensional arrays for machine learning, in the spirit of MLX.
pub mod dtype;

pub use dtype::{Bool8, Dtype, Element, ALL_DTYPES};
