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
