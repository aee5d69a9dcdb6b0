//! The SwiGLU feed-forward block.

use mlx_array::{Array, Result, random};

use crate::impl_module;
use crate::layers::linear::Linear;

/// `linear3(silu(linear1(x)) * linear2(x))`, without biases, with the names
/// of the reference Llama (`linear1` gate, `linear2` up, `linear3` down).
#[derive(Clone, Debug)]
pub struct SwiGLU {
    /// Gate projection `dims -> hidden`.
    pub linear1: Linear,
    /// Up projection `dims -> hidden`.
    pub linear2: Linear,
    /// Down projection `hidden -> dims`.
    pub linear3: Linear,
}

impl_module!(SwiGLU {
    linear1,
    linear2,
    linear3
});

impl SwiGLU {
    /// A new block with MLX's Linear initialisation.
    pub fn new(dims: usize, hidden: usize, key: &Array) -> Result<SwiGLU> {
        let ks = random::split_keys(key, 3)?;
        Ok(SwiGLU {
            linear1: Linear::new(dims, hidden, false, &ks[0])?,
            linear2: Linear::new(dims, hidden, false, &ks[1])?,
            linear3: Linear::new(hidden, dims, false, &ks[2])?,
        })
    }

    /// Applies the block over the last axis (the activation is one fused
    /// primitive, [`mlx_array::swiglu`]).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let a = self.linear1.forward(x)?;
        let b = self.linear2.forward(x)?;
        self.linear3.forward(&mlx_array::swiglu(&a, &b)?)
    }
}
