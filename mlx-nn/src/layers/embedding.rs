//! `Embedding`: a lookup table of vectors.

use mlx_array::{Array, Result};

use crate::{Param, impl_module, init};

/// A `[num_embeddings, dims]` table, initialised normal with std `1/sqrt(dims)` as in MLX.
#[derive(Clone, Debug)]
pub struct Embedding {
    /// `[num_embeddings, dims]`.
    pub weight: Param,
}

impl_module!(Embedding { weight });

impl Embedding {
    /// A new table with MLX's initialisation from `key`.
    pub fn new(num_embeddings: usize, dims: usize, key: &Array) -> Result<Embedding> {
        let std = (1.0 / dims as f64).sqrt();
        Ok(Embedding {
            weight: Param::new(init::normal(key, std, &[num_embeddings, dims])?),
        })
    }

    /// The rows for integer `ids` of any shape: `[..., dims]`.
    pub fn forward(&self, ids: &Array) -> Result<Array> {
        self.weight.value().take(ids, 0)
    }

    /// Uses the table as an output projection: `x @ W^T` (weight tying).
    pub fn as_linear(&self, x: &Array) -> Result<Array> {
        x.matmul(&self.weight.value().t()?)
    }
}
