//! Scaled dot-product attention as one fused node (MLX's
//! `mx.fast.scaled_dot_product_attention`).

use crate::primitives::attention::Attention;
use crate::{Array, Result};

/// `softmax(scale * q @ k^T + mask) @ v` over the last two axes of
/// `q [B, H, Lq, d]`, `k [B, H_kv, Lk, d]` and `v [B, H_kv, Lk, dv]`, where
/// the mask, when `causal`, hides from query `i` every key after position
/// `i + Lk - Lq` (the queries are the last `Lq` positions, as when new
/// tokens attend to a cache of earlier ones).
///
/// Grouped-query attention: `H` must be a multiple of `H_kv` (`H_kv = H` is
/// multi-head attention, `H_kv = 1` multi-query), and query head `h` attends
/// to key/value head `h / (H / H_kv)`. The kernels read each key/value head
/// in place for its whole group (no repeated copy of `k` and `v`, in the
/// forward pass or the gradient), and the gradients of `k` and `v` have
/// their own shapes, each head's the sum over its group's query heads.
///
/// One fused primitive on the CPU and the GPU, computed in f32 (the result
/// has the inputs' dtype; with bf16 inputs on a CPU with AMX tiles the
/// products take bf16 operands and f32 sums, the probabilities and score
/// gradients rounded to bf16 for them, as FlashAttention does in bf16;
/// the softmax statistics stay f32): the `[B, H, Lq, Lk]` scores and probabilities
/// are never held (each block is recomputed for the gradient from its rows'
/// logsumexps), and under a causal mask the hidden half of the products is
/// skipped.
///
/// ```
/// use mlx_array::{Array, Dtype, arange, fused_attention};
/// let q = Array::ones(&[1, 2, 3, 4], Dtype::F32);
/// let v = arange(0.0, 24.0, 1.0, Dtype::F32).unwrap().reshape(&[1, 2, 3, 4]).unwrap();
/// let o = fused_attention(&q, &q, &v, 0.5, true).unwrap();
/// // Equal scores: each query averages the values it sees.
/// assert_eq!(o.to_vec::<f32>().unwrap()[..4], [0.0, 1.0, 2.0, 3.0]);
/// assert_eq!(o.to_vec::<f32>().unwrap()[4..8], [2.0, 3.0, 4.0, 5.0]);
/// // Two query heads sharing one key/value head (multi-query).
/// let k = Array::ones(&[1, 1, 3, 4], Dtype::F32);
/// let v1 = v.slice_axis(1, 0, 1).unwrap();
/// let o = fused_attention(&q, &k, &v1, 0.5, true).unwrap();
/// assert_eq!(o.shape(), [1, 2, 3, 4]);
/// assert_eq!(o.to_vec::<f32>().unwrap()[12..16], [0.0, 1.0, 2.0, 3.0]);
/// ```
pub fn fused_attention(q: &Array, k: &Array, v: &Array, scale: f64, causal: bool) -> Result<Array> {
    const OP: &str = "fused_attention";
    let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
    if q.ndim() != 4 || k.ndim() != 4 || v.ndim() != 4 {
        return Err(crate::Error::shape(
            OP,
            format!("q, k and v must be [B, H, L, d]; got {qs:?}, {ks:?} and {vs:?}"),
        ));
    }
    if ks[0] != qs[0] || vs[..3] != ks[..3] || ks[3] != qs[3] {
        return Err(crate::Error::shape(
            OP,
            format!(
                "expected q [B, H, Lq, d], k [B, H_kv, Lk, d] and v [B, H_kv, Lk, dv]; got {qs:?}, {ks:?} and {vs:?}"
            ),
        ));
    }
    if ks[1] == 0 || !qs[1].is_multiple_of(ks[1]) {
        return Err(crate::Error::shape(
            OP,
            format!(
                "the query heads must be a multiple of the key/value heads; got {} query heads and {} key/value heads (q {qs:?}, k {ks:?})",
                qs[1], ks[1]
            ),
        ));
    }
    if ks[2] == 0 || qs[3] == 0 || vs[3] == 0 {
        return Err(crate::Error::shape(
            OP,
            format!(
                "attention needs at least one key and non-empty heads; got k {ks:?} and v {vs:?}"
            ),
        ));
    }
    if causal && qs[2] > ks[2] {
        return Err(crate::Error::shape(
            OP,
            format!(
                "a causal mask needs no more queries than keys (the queries are the last positions); got {} queries and {} keys",
                qs[2], ks[2]
            ),
        ));
    }
    let dtype = q.dtype();
    if !dtype.is_float() || k.dtype() != dtype || v.dtype() != dtype {
        return Err(crate::Error::dtype(
            OP,
            dtype,
            format!(
                "q, k and v must share one float dtype; got {dtype}, {} and {}",
                k.dtype(),
                v.dtype()
            ),
        ));
    }
    if !scale.is_finite() {
        return Err(crate::Error::invalid(
            OP,
            format!("the scale must be finite, got {scale}"),
        ));
    }
    let node = Attention {
        scale: scale as f32,
        causal,
    };
    // The GPU kernels read heads in place through their strides (a
    // projection's `[B, L, H, d]` viewed as `[B, H, L, d]`), no copy. The
    // output in the inputs' dtype: the f32 one, or for half precision the
    // node's third output (stored `[B, L, H, dv]` by the kernel, so the
    // usual merge of the heads after it is a view).
    let mut outputs = node.build(q, k, v);
    Ok(outputs.swap_remove(if dtype.is_half() { 2 } else { 0 }))
}
