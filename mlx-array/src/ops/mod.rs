//! Operations: validating builders that record primitives in the graph.
//!
//! Each op is a free function here and a method on [`Array`](crate::Array).
//! Nothing is computed until [`eval`](fn@crate::eval).

mod attention;
mod creation;
mod elementwise;
mod indexing;
mod linalg;
mod norm;
mod reduce;
mod rope;
mod shape;

pub use attention::*;
pub use creation::*;
pub use elementwise::*;
pub use indexing::*;
pub use linalg::*;
pub use norm::*;
pub use reduce::*;
pub use rope::*;
pub use shape::*;

/// The input of `x` when `x` is a cast (`astype`, or a remembered cast)
/// not yet computed.
pub(crate) fn pending_cast_source(x: &crate::Array) -> Option<crate::Array> {
    let state = x.lock();
    let (primitive, inputs) = state.pending()?;
    matches!(
        (primitive.name(), inputs.len()),
        ("astype", 1) | ("remembered_cast", 2)
    )
    .then(|| inputs[0].clone())
}

/// The array of `dtype` that `x` casts, when `x` is a pending cast of one
/// (a gradient handed back through a cast goes back unrounded).
pub(crate) fn pending_cast_from(x: &crate::Array, dtype: crate::Dtype) -> Option<crate::Array> {
    pending_cast_source(x).filter(|source| source.dtype() == dtype)
}
