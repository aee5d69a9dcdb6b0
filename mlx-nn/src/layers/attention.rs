//! Scaled dot-product attention, the causal mask, and multi-head attention.

use mlx_array::{Array, Dtype, Result, arange};

use crate::impl_module;
use crate::layers::linear::Linear;

/// `[n, n]` additive mask: 0 on and below the diagonal, -1e9 above (MLX's
/// `create_additive_causal_mask`; -1e9 rounds to -inf in float16).
pub fn create_additive_causal_mask(n: usize, dtype: Dtype) -> Result<Array> {
    let i = arange(0.0, n as f64, 1.0, Dtype::I32)?;
    let future = i
        .reshape(&[n as i64, 1])?
        .less(&i.reshape(&[1, n as i64])?)?;
    // A select, not `future * -1e9`: in float16 that is 0 * -inf, NaN.
    future.where_(&Array::full(&[], -1e9, dtype), &Array::zeros(&[], dtype))
}

/// The mask of [`scaled_dot_product_attention`] (MLX's `mask=None`,
/// `"causal"` or an array).
#[derive(Clone, Copy, Debug, Default)]
pub enum AttentionMask<'a> {
    /// Every query sees every key.
    #[default]
    None,
    /// Query `i` sees keys up to its own position; with fewer queries than
    /// keys the queries are the last positions (new tokens after a cache).
    Causal,
    /// Added to the scores before the softmax (for example
    /// [`create_additive_causal_mask`]); broadcast against `[..., L, S]`.
    Additive(&'a Array),
}

impl<'a> From<Option<&'a Array>> for AttentionMask<'a> {
    fn from(m: Option<&'a Array>) -> Self {
        m.map_or(AttentionMask::None, AttentionMask::Additive)
    }
}

impl<'a> From<&'a Array> for AttentionMask<'a> {
    fn from(m: &'a Array) -> Self {
        AttentionMask::Additive(m)
    }
}

/// `softmax(q k^T * scale + mask) v` for `q: [..., L, d]`, `k, v: [..., S, d]`.
///
/// Grouped-query attention: `k` and `v` may have fewer heads (axis -3)
/// than `q`, a divisor of its heads (1 is multi-query attention); query
/// head `h` then attends to key/value head `h / (H / H_kv)`.
///
/// For 4-d `[B, H, L, d]` inputs without an additive mask this is
/// [`mlx_array::fused_attention`], which reads grouped keys and values in
/// place (keys and values shared over the batch are broadcast, a view): no
/// `[B, H, L, S]` scores are kept for the gradient, no copy of `k` and `v`
/// per query head is made, and a causal mask skips the hidden half of the
/// work. Otherwise (an additive mask, other ranks) it is a graph of ops,
/// where grouped keys and values are repeated to the query heads first.
///
/// ```
/// use mlx_array::{Array, Dtype};
/// use mlx_nn::{AttentionMask, create_additive_causal_mask, scaled_dot_product_attention};
/// let x = mlx_array::random::normal(&mlx_array::random::key(0), &[1, 2, 3, 4], Dtype::F32).unwrap();
/// let fused = scaled_dot_product_attention(&x, &x, &x, 0.5, AttentionMask::Causal).unwrap();
/// let mask = create_additive_causal_mask(3, Dtype::F32).unwrap();
/// let composite = scaled_dot_product_attention(&x, &x, &x, 0.5, &mask).unwrap();
/// let (a, b) = (fused.to_vec::<f32>().unwrap(), composite.to_vec::<f32>().unwrap());
/// assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
/// // Two query heads sharing one key/value head, fused and composite.
/// let kv = x.slice_axis(1, 0, 1).unwrap();
/// let fused = scaled_dot_product_attention(&x, &kv, &kv, 0.5, AttentionMask::Causal).unwrap();
/// let composite = scaled_dot_product_attention(&x, &kv, &kv, 0.5, &mask).unwrap();
/// assert_eq!(fused.shape(), [1, 2, 3, 4]);
/// let (a, b) = (fused.to_vec::<f32>().unwrap(), composite.to_vec::<f32>().unwrap());
/// assert!(a.iter().zip(&b).all(|(x, y)| (x - y).abs() < 1e-5));
/// ```
pub fn scaled_dot_product_attention<'a>(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f64,
    mask: impl Into<AttentionMask<'a>>,
) -> Result<Array> {
    let mask = mask.into();
    // The fused primitive takes `[B, H, L, d]` queries and `[B, H_kv, S, d]`
    // keys and values, `H_kv` dividing `H` (read in place per group): keys
    // and values shared over the batch are broadcast (a view). Other ranks
    // run the graph of ops.
    let fused = || -> Option<(Array, Array)> {
        if q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 {
            return None;
        }
        let (batch, heads) = (q.shape()[0], q.shape()[1]);
        // Grouped heads as they are where k and v agree on them; else both
        // broadcast to the queries' heads.
        let hkv = k.shape()[1];
        let grouped = hkv == v.shape()[1] && hkv > 0 && heads.is_multiple_of(hkv);
        let to_q = |x: &Array| {
            let s = x.shape();
            let h = if grouped { s[1] } else { heads };
            x.broadcast_to(&[batch, h, s[2], s[3]]).ok()
        };
        Some((to_q(k)?, to_q(v)?))
    };
    let causal = matches!(mask, AttentionMask::Causal);
    if (causal || matches!(mask, AttentionMask::None))
        && let Some((k, v)) = fused()
    {
        return mlx_array::fused_attention(q, &k, &v, scale, causal);
    }
    match mask {
        AttentionMask::Causal => {
            let (l, s) = (q.shape()[q.ndim() - 2], k.shape()[k.ndim() - 2]);
            if l > s {
                return Err(mlx_array::Error::Shape {
                    op: "scaled_dot_product_attention",
                    message: format!(
                        "a causal mask needs no more queries than keys (the queries are the last positions); got {l} queries and {s} keys"
                    ),
                });
            }
            let m = create_additive_causal_mask(s, q.dtype())?.slice_axis(
                0,
                (s - l) as i64,
                s as i64,
            )?;
            composite_attention(q, k, v, scale, Some(&m))
        }
        AttentionMask::None => composite_attention(q, k, v, scale, None),
        AttentionMask::Additive(m) => composite_attention(q, k, v, scale, Some(m)),
    }
}

/// Attention as a graph of ops: scores, the additive mask, softmax; keys
/// and values of fewer heads than the queries repeated to theirs.
fn composite_attention(
    q: &Array,
    k: &Array,
    v: &Array,
    scale: f64,
    mask: Option<&Array>,
) -> Result<Array> {
    let (k, v) = (&repeat_heads(k, q)?, &repeat_heads(v, q)?);
    let mut scores = q.mul_scalar(scale)?.matmul(&k.swapaxes(-1, -2)?)?;
    if let Some(m) = mask {
        scores = scores.add(m)?;
    }
    scores.softmax(&[-1])?.astype(v.dtype())?.matmul(v)
}

/// `x` (keys or values, `[..., H_kv, S, d]`) with each head repeated over
/// its group of `q`'s `H` heads (axis -3) where `H_kv` is a divisor of `H`
/// other than `H` and 1 (which broadcast as they are): a copy, made only
/// for the composite path.
fn repeat_heads(x: &Array, q: &Array) -> Result<Array> {
    let n = x.ndim();
    if n < 3 || q.ndim() != n {
        return Ok(x.clone());
    }
    let (heads, hkv) = (q.shape()[n - 3], x.shape()[n - 3]);
    if hkv == heads || hkv <= 1 || !heads.is_multiple_of(hkv) {
        return Ok(x.clone());
    }
    // [..., H_kv, S, d] -> [..., H_kv, 1, S, d] -> [..., H_kv, g, S, d] -> [..., H, S, d]
    let mut shape = x.shape().to_vec();
    shape.insert(n - 2, 1);
    let one: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    shape[n - 2] = heads / hkv;
    let mut merged: Vec<i64> = x.shape().iter().map(|&d| d as i64).collect();
    merged[n - 3] = heads as i64;
    x.reshape(&one)?.broadcast_to(&shape)?.reshape(&merged)
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

    /// Attends `queries [B, L, D]` to `keys`/`values [B, S, D]` under `mask`
    /// (`None`, `AttentionMask::Causal`, or an additive mask array).
    pub fn forward<'a>(
        &self,
        queries: &Array,
        keys: &Array,
        values: &Array,
        mask: impl Into<AttentionMask<'a>>,
    ) -> Result<Array> {
        let q = split_heads(&self.query_proj.forward(queries)?, self.num_heads)?;
        let k = split_heads(&self.key_proj.forward(keys)?, self.num_heads)?;
        let v = split_heads(&self.value_proj.forward(values)?, self.num_heads)?;
        let scale = 1.0 / (*q.shape().last().expect("4-d") as f64).sqrt();
        let o = scaled_dot_product_attention(&q, &k, &v, scale, mask)?;
        self.out_proj.forward(&merge_heads(&o)?)
    }
}
