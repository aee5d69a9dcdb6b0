//! What the GPU examples share: the Llama-like block they time.

use mlx_array::{Array, Result};

/// A Llama-like block (RMS norm, 4-head attention without a mask, a SiLU
/// MLP, residuals), reduced to a scalar loss.
pub fn block(p: &[Array]) -> Result<Array> {
    let (x, wq, wk, wv, wo, w1, w2) = (&p[0], &p[1], &p[2], &p[3], &p[4], &p[5], &p[6]);
    let (t, d) = (x.shape()[0], x.shape()[1]);
    let heads = 4;
    let hd = d / heads;
    let norm = |v: &Array| -> Result<Array> {
        v.mul(&v.square()?.mean(&[-1], true)?.add_scalar(1e-5)?.rsqrt()?)
    };
    let h = norm(x)?;
    let split = |w: &Array| -> Result<Array> {
        h.matmul(w)?
            .reshape(&[t as i64, heads as i64, hd as i64])?
            .transpose(&[1, 0, 2])
    };
    let (q, k, v) = (split(wq)?, split(wk)?, split(wv)?);
    let scores = q
        .matmul(&k.swapaxes(-1, -2)?)?
        .mul_scalar(1.0 / (hd as f64).sqrt())?;
    let att = scores.softmax(&[-1])?.matmul(&v)?;
    let att = att.transpose(&[1, 0, 2])?.reshape(&[t as i64, d as i64])?;
    let x1 = x.add(&att.matmul(wo)?)?;
    let u = norm(&x1)?.matmul(w1)?;
    let x2 = x1.add(&u.mul(&u.sigmoid()?)?.matmul(w2)?)?;
    x2.square()?.mean_all()
}
