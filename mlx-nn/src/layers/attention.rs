//! Scaled dot-product attention, the causal mask, and multi-head attention.

use mlx_array::{Array, Dtype, Result, arange};

use crate::impl_module;
use crate::layers::linear::Linear;

/// `[n, n]` additive mask: 0 on and below the diagonal, -1e9 above (MLX's
/// `create_additive_causal_mask`).
pub fn create_additive_causal_mask(n: usize, dtype: Dtype) -> Result<Array> {
    let i = arange(0.0, n as f64, 1.0, Dtype::I32)?;
    let future = i
        .reshape(&[n as i64, 1])?
        .less(&i.reshape(&[1, n as i64])?)?;
    future.astype(dtype)?.mul_scalar(-1e9)
}

/// `softmax(q k^T * scale + mask) v` for `q: [..., L, d]`, `k, v: [..., S, d]`.
pub fn scaled_dot_product_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f64,
    mask: Option<&Array>,
) -> Result<Array> {
    let mut scores = q.mul_scalar(scale)?.matmul(&k.swapaxes(-1, -2)?)?;
    if let Some(m) = mask {
        scores = scores.add(m)?;
    }
    scores.softmax(&[-1])?.astype(v.dtype())?.matmul(v)
}

/// Multi-head attention with query, key, value and output projections,
/// named as in MLX (`query_proj`, `key_proj`, `value_proj`, `out_proj`).
#[derive(Clone, Debug)]
pub struct MultiHeadAttention {
    /// Number of heads; `dims` must divide by it.
    pub num_heads: usize,
    /// Query projection.
    pub query_proj: Linear,
    /// Key projection.
    pub key_proj: Linear,
    /// Value projection.
    pub value_proj: Linear,
    /// Output projection.
    pub out_proj: Linear,
}

impl_module!(MultiHeadAttention {
    query_proj,
    key_proj,
    value_proj,
    out_proj
});

/// `[B, L, H*d]` to `[B, H, L, d]`.
pub fn split_heads(x: &Array, heads: usize) -> Result<Array> {
    let (b, l) = (x.shape()[0] as i64, x.shape()[1] as i64);
    x.reshape(&[b, l, heads as i64, -1])?
        .transpose(&[0, 2, 1, 3])
}

/// `[B, H, L, d]` to `[B, L, H*d]`.
pub fn merge_heads(x: &Array) -> Result<Array> {
    let (b, l) = (x.shape()[0] as i64, x.shape()[2] as i64);
    x.transpose(&[0, 2, 1, 3])?.reshape(&[b, l, -1])
}

impl MultiHeadAttention {
    /// Projections of `dims -> dims`, with or without bias.
    pub fn new(
        dims: usize,
        num_heads: usize,
        bias: bool,
        key: &Array,
    ) -> Result<MultiHeadAttention> {
        if num_heads == 0 || !dims.is_multiple_of(num_heads) {
            return Err(mlx_array::Error::Invalid {
                op: "MultiHeadAttention",
                message: format!("dims {dims} do not divide into {num_heads} heads"),
            });
        }
        let ks = mlx_array::random::split_keys(key, 4)?;
        Ok(MultiHeadAttention {
            num_heads,
            query_proj: Linear::new(dims, dims, bias, &ks[0])?,
            key_proj: Linear::new(dims, dims, bias, &ks[1])?,
            value_proj: Linear::new(dims, dims, bias, &ks[2])?,
            out_proj: Linear::new(dims, dims, bias, &ks[3])?,
        })
    }

    /// Attends `queries [B, L, D]` to `keys`/`values [B, S, D]` with an optional additive mask.
    pub fn forward(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: Option<&Array>,
    ) -> Result<Array> {
        let q = split_heads(&self.query_proj.forward(queries)?, self.num_heads)?;
        let k = split_heads(&self.key_proj.forward(keys)?, self.num_heads)?;
        let v = split_heads(&self.value_proj.forward(values)?, self.num_heads)?;
        let scale = 1.0 / (*q.shape().last().expect("4-d") as f64).sqrt();
        let o = scaled_dot_product_attention(&q, &k, &v, scale, mask)?;
        self.out_proj.forward(&merge_heads(&o)?)
    }
}
