//! Optimizers for `mlx-array` parameter trees, with MLX's semantics:
//! [`Sgd`], [`Adam`], [`AdamW`], learning-rate [`schedule`]s,
//! [`clip_grad_norm`], and optimizer state that saves to and resumes from
//! safetensors bit for bit.
//!
//! The [`Optimizer`] trait works over [`Tree`](mlx_array::Tree)s: it takes
//! the gradients and the parameters, builds the update lazily, and keeps its
//! per-parameter state (created on the first update, only for parameters that
//! have a gradient) in an [`OptimizerState`] that mirrors the parameter
//! names. Evaluate the parameters and the state together, as in MLX:
//!
//! ```
//! use mlx_array::{eval, Array, Tree};
//! use mlx_optim::{schedule, AdamW, Optimizer};
//!
//! // Minimise |w - target|^2, whose gradient is 2 (w - target).
//! let target = Array::from_slice(&[1.0f32, -2.0, 3.0], &[3]).unwrap();
//! let mut params = Tree::unflatten([("w".to_string(), mlx_array::zeros_like(&target))]).unwrap();
//! let lr = schedule::join_schedules(
//!     vec![schedule::linear_schedule(0.0, 0.1, 10).unwrap(), schedule::cosine_decay(0.1, 200, 0.0).unwrap()],
//!     &[10],
//! ).unwrap();
//! let mut opt = AdamW::new(lr).weight_decay(0.0);
//! for _ in 0..200 {
//!     let w = params.get_array("w").unwrap();
//!     let g = w.sub(&target).unwrap().mul_scalar(2.0).unwrap();
//!     let grads = Tree::unflatten([("w".to_string(), g)]).unwrap();
//!     opt.update_tree(&mut params, &grads).unwrap();
//!     eval((&params, opt.state())).unwrap();
//! }
//! let w: Vec<f32> = params.get_array("w").unwrap().to_vec().unwrap();
//! assert!(w.iter().zip([1.0, -2.0, 3.0]).all(|(a, b)| (a - b).abs() < 1e-2));
//! assert_eq!(opt.step(), 200);
//! ```
//!
//! With a module (`mlx-nn`), `optimizer.update(model, grads)` is one line:
//! `model.update(opt.apply_gradients(&grads, &model.trainable_parameters())?)`.
//!
//! Resuming: [`Optimizer::save_state`] writes the step count and every slot
//! (`step`, `learning_rate`, `<parameter>.<slot>`); [`Optimizer::load_state`]
//! reads them back and checks them against the model's parameters.
//!
//! On the GPU, Adam(W)'s fused kernel steps many parameters per dispatch
//! (PyTorch's multi-tensor Adam): from the second step, when a
//! parameter's state is the rows its previous step wrote, the rule builds
//! one node for a group of parameters ([`Optimizer::apply_many`]), with
//! the values of stepping each alone.
//!
//! Data-parallel training: wrap the optimizer in [`Sharded`] to keep only
//! `1 / world` of its state on each rank (ZeRO stage 1). It takes each
//! rank's own gradients and averages them itself, one `mean_scatter` per
//! bucket, then gathers the updated parameters: the traffic of one
//! all-reduce, the results of averaging whole gradients.

#![warn(missing_docs)]

mod adam;
mod clip;
mod device_scale;
mod error;
mod fused;
mod gate;
mod gpu_indices;
mod io;
mod loss_scale;
mod module;
mod optimizer;
mod reshard;
mod scale_update;
pub mod schedule;
mod sgd;
mod sharded;
mod state;
mod tree_util;
mod unscale;
mod widen;

pub use adam::{Adam, AdamConfig, AdamW};
pub use clip::{clip_by_norm_squared, clip_grad_norm};
pub use device_scale::DeviceLossScaler;
pub use error::{Error, Result};
pub use gate::Gate;
pub use loss_scale::{LossScaler, non_finite_flag};
pub use module::ModuleOptimizer;
pub use optimizer::{Optimizer, ParamUpdate, StepContext};
pub use reshard::read_whole_state;
pub use schedule::Schedule;
pub use sgd::Sgd;
pub use sharded::{Sharded, shard_of, shard_range};
pub use state::OptimizerState;

/// The conformance specifications of the fused Adam(W) primitives, of
/// the gradients' unscale-and-check and of the loss scale's update
/// (feature `conformance`), for
/// `mlx_array::conformance::main`: each step against the f64 update formula
/// and, bit for bit, the op-by-op graph; the check against float32 products.
#[cfg(feature = "conformance")]
pub fn conformance_specs() -> Vec<mlx_array::conformance::Spec> {
    let mut specs = fused::spec::specs();
    specs.extend(unscale::spec::specs());
    specs.extend(scale_update::spec::specs());
    specs
}
