//! Neural-network building blocks for `mlx-array`, in the shape of `mlx.nn`,
//! with the tensor-parallel layers of `mlx.nn.layers.distributed`
//! ([`AllToShardedLinear`], [`ShardedToAllLinear`], [`shard_linear`],
//! [`shard_inplace`]), and the low-rank adapters of PEFT and mlx-lm for
//! fine-tuning ([`LoRALinear`], [`DoRALinear`]).
//!
//! A model is a struct of layers implementing [`Module`] (one line with
//! [`impl_module!`]); [`value_and_grad`] gives its loss and gradients as a
//! tree; layers, losses and initializers follow MLX's names and defaults.
//!
//! ```
//! use mlx_array::{eval, random, Array, Dtype};
//! use mlx_nn::{impl_module, losses, value_and_grad, Linear, ModuleExt};
//!
//! struct Mlp { l1: Linear, l2: Linear }
//! impl_module!(Mlp { l1, l2 });
//! impl Mlp {
//!     fn forward(&self, x: &Array) -> mlx_array::Result<Array> {
//!         self.l2.forward(&mlx_nn::silu(&self.l1.forward(x)?)?)
//!     }
//! }
//! let k = random::key(0);
//! let [k1, k2] = random::split2(&k).unwrap();
//! let mut model = Mlp { l1: Linear::new(2, 8, true, &k1).unwrap(), l2: Linear::new(8, 1, true, &k2).unwrap() };
//! let x = Array::from_slice(&[0f32, 0., 0., 1., 1., 0., 1., 1.], &[4, 2]).unwrap();
//! let y = Array::from_slice(&[0f32, 1., 1., 0.], &[4, 1]).unwrap();
//! let step = value_and_grad(|m: &Mlp, (x, y): &(Array, Array)| losses::mse_loss(&m.forward(x)?, y, losses::Reduction::Mean));
//! let (loss, grads) = step(&mut model, &(x, y)).unwrap();
//! // Plain SGD: p - 0.1 * g, evaluated together with the loss.
//! let new = model.trainable_parameters().zip_map(&grads, |_, p, g| p.subtract(&g.mul_scalar(0.1)?)).unwrap();
//! model.update(&new).unwrap();
//! eval((&loss, &model.parameters())).unwrap();
//! ```

mod distributed;
pub mod init;
pub mod layers;
pub mod losses;
pub mod module;
mod value_and_grad;

pub use distributed::{AverageOptions, average_gradients, average_sparse_rows, gradient_buckets};
pub use layers::activations::{GELU, ReLU, SiLU, gelu, gelu_approx, relu, silu};
pub use layers::attention::{
    AttentionMask, MultiHeadAttention, create_additive_causal_mask, merge_heads,
    scaled_dot_product_attention, split_heads,
};
pub use layers::dropout::Dropout;
pub use layers::embedding::Embedding;
pub use layers::linear::Linear;
pub use layers::lora::{DoRALinear, LoRAConfig, LoRALinear};
pub use layers::mlp::SwiGLU;
pub use layers::norm::{LayerNorm, RMSNorm};
pub use layers::rope::{RoPE, RopeScaling};
pub use layers::sequential::{Layer, Sequential};
pub use layers::sharded::{
    AllToShardedLinear, AnyLinear, ShardedToAllLinear, Sharding, gather_axis, load_sharded_weights,
    load_sharded_weights_except, shard_axis, shard_inplace, shard_linear,
};
pub use module::{Module, ModuleExt, Param};
pub use value_and_grad::{value_and_grad, value_and_grad_in};
