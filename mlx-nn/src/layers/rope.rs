//! Rotary positional encoding (RoPE).

use mlx_array::{Array, Dtype, Error, Result, SliceArg, arange, concatenate, stack};

/// Rotates pairs of features by a position-dependent angle, as MLX's
/// `nn.RoPE`: `traditional` rotates consecutive pairs `(x[2i], x[2i+1])`,
/// otherwise the halves `(x[i], x[i + d/2])`. Positions run along axis -2,
/// starting at `offset` (for generation with a KV cache). Features beyond
/// `dims` pass through unchanged. No parameters.
#[derive(Clone, Debug)]
pub struct RoPE {
    /// Number of features rotated (even).
    pub dims: usize,
    /// Consecutive pairs (true) or halves (false).
    pub traditional: bool,
    /// Base of the frequencies (10000 by default).
    pub base: f64,
    /// Scale applied to positions.
    pub scale: f64,
}

crate::impl_module!(RoPE {});

impl RoPE {
    /// MLX's defaults: base 10000, scale 1.
    pub fn new(dims: usize, traditional: bool) -> RoPE {
        RoPE {
            dims,
            traditional,
            base: 10_000.0,
            scale: 1.0,
        }
    }

    /// Applies the rotation to `x` of shape `[..., L, D]` with positions
    /// `offset..offset + L`.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        let d = self.dims;
        if x.ndim() < 2 || !d.is_multiple_of(2) || d > *x.shape().last().unwrap_or(&0) {
            return Err(Error::Shape {
                op: "rope",
                message: format!(
                    "cannot rotate {d} features of an input of shape {:?}",
                    x.shape()
                ),
            });
        }
        let l = x.shape()[x.ndim() - 2];
        let half = d / 2;
        // theta[p, i] = (offset + p) * scale * base^(-2i/d)
        let inv_freq = arange(0.0, half as f64, 1.0, Dtype::F32)?
            .mul_scalar(-2.0 * self.base.ln() / d as f64)?
            .exp()?;
        let pos =
            arange(offset as f64, (offset + l) as f64, 1.0, Dtype::F32)?.mul_scalar(self.scale)?;
        let theta = pos
            .reshape(&[l as i64, 1])?
            .multiply(&inv_freq.reshape(&[1, half as i64])?)?;
        let (cos, sin) = (theta.cos()?, theta.sin()?);
        let xf = x.astype(Dtype::F32)?;
        let last = x.ndim() as i32 - 1;
        let rot = xf.slice_axis(last, 0, d as i64)?;
        let (x1, x2) = if self.traditional {
            let mut even = vec![SliceArg::FULL; x.ndim()];
            let mut odd = even.clone();
            even[x.ndim() - 1] = SliceArg::FULL.step(2);
            odd[x.ndim() - 1] = SliceArg::from(1).step(2);
            (rot.slice(&even)?, rot.slice(&odd)?)
        } else {
            (
                rot.slice_axis(last, 0, half as i64)?,
                rot.slice_axis(last, half as i64, d as i64)?,
            )
        };
        let r1 = x1.multiply(&cos)?.subtract(&x2.multiply(&sin)?)?;
        let r2 = x1.multiply(&sin)?.add(&x2.multiply(&cos)?)?;
        let rotated = if self.traditional {
            let mut shape: Vec<i64> = rot.shape().iter().map(|&s| s as i64).collect();
            shape[x.ndim() - 1] = d as i64;
            stack(&[r1, r2], -1)?.reshape(&shape)?
        } else {
            concatenate(&[r1, r2], last)?
        };
        let full = if d < x.shape()[x.ndim() - 1] {
            concatenate(
                &[
                    rotated,
                    xf.slice_axis(last, d as i64, x.shape()[x.ndim() - 1] as i64)?,
                ],
                last,
            )?
        } else {
            rotated
        };
        full.astype(x.dtype())
    }
}
