//! Lazy n-dimensional arrays for machine learning, in the spirit of MLX.
//!
//! Building an expression records a graph and costs almost nothing;
//! [`eval`](fn@crate::eval) runs it on multithreaded CPU kernels or, for arrays
//! placed on [`Device::Gpu`], on WGSL kernels through wgpu
//! (Vulkan, Metal), frees intermediates as soon as they are no longer needed,
//! and leaves the results detached from their inputs.
//!
//! ```
//! use mlx_array::{eval, random, Array, Dtype};
//! let x = random::normal(&random::key(0), &[64, 32], Dtype::F32).unwrap();
//! let w = Array::ones(&[32, 8], Dtype::F32);
//! let y = x.matmul(&w).unwrap().softmax(&[-1]).unwrap();
//! let total = y.sum(&[-1], false).unwrap();
//! eval((&y, &total)).unwrap();
//! assert!(total.to_vec::<f32>().unwrap().iter().all(|s| (s - 1.0).abs() < 1e-5));
//! ```
//!
//! The pieces:
//! - [`Array`], [`Dtype`] and the ops in [`ops`] (also methods on `Array`);
//! - [`Primitive`]: the open trait every graph node implements;
//! - [`eval`](fn@crate::eval) and [`Evaluable`];
//! - [`memory`]: MLX-style byte accounting;
//! - [`random`]: counter-based random numbers from explicit keys;
//! - [`Tree`]: nested parameter trees; [`io`]: safetensors files;
//! - fused ops, like MLX's `mx.fast`: [`fused_attention`] (optionally
//!   causal, never holding the `[B, H, L, L]` scores), [`rope`],
//!   [`rms_norm`], [`swiglu`], and [`linear_cross_entropy_sum`] (the output
//!   projection, loss and gradients in one pass). Each is one primitive
//!   with CPU and GPU kernels whose gradient keeps only what it needs.

pub mod array;
pub mod autodiff;
pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod data;
pub mod device;
pub mod dtype;
pub mod error;
pub mod eval;
mod format;
pub mod io;
pub mod memory;
pub mod ops;
pub mod primitive;
pub mod primitives;
pub mod profile;
pub mod random;
mod read;
pub mod settings;
pub mod shape;
mod timing;
pub mod tree;

pub use array::{Array, OutputSpec};
pub use autodiff::{grad, value_and_grad, value_and_grad_tree, vjp};
pub use backend::cpu::blas;
pub use data::{ArrayData, Operand};
pub use device::{Device, default_device, set_default_device};
pub use dtype::{ALL_DTYPES, Bool8, Dtype, Element};
pub use error::{Error, Result};
pub use eval::{Evaluable, eval};
pub use io::{
    Part, load_safetensors, load_safetensors_parts, load_tree, save_safetensors, save_tree,
};
pub use ops::*;
pub use primitive::{Primitive, Stream};
pub use read::HostRead;
pub use tree::Tree;
