//! RMS normalisation (MLX's `mx.fast.rms_norm`).

use crate::primitives::norm::RmsNorm;
use crate::{Array, Dtype, Result};

/// `x * weight / sqrt(mean(x^2) + eps)` over the last axis of `x`
/// (`[..., D]`), with `weight` of shape `[D]` (`None`: ones). One pass per
/// row forward and one backward, computed in f32; the result has `x`'s
/// dtype. Only `x` and `weight` are kept for the gradient.
///
/// ```
/// use mlx_array::{Array, rms_norm};
/// let x = Array::from_slice(&[3.0f32, 4.0], &[1, 2]).unwrap();
/// let w = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// // mean(x^2) = 12.5, so each element is divided by sqrt(12.5).
/// let y = rms_norm(&x, Some(&w), 0.0).unwrap().to_vec::<f32>().unwrap();
/// let r = 12.5f32.sqrt();
/// assert!((y[0] - 3.0 / r).abs() < 1e-6 && (y[1] - 8.0 / r).abs() < 1e-6);
/// ```
pub fn rms_norm(x: &Array, weight: Option<&Array>, eps: f64) -> Result<Array> {
    let width = x.shape().last().copied().unwrap_or(0);
    if x.ndim() == 0 || !x.dtype().is_float() {
        return Err(crate::Error::dtype(
            "rms_norm",
            x.dtype(),
            format!(
                "the input must be a floating point array of at least one axis; got shape {:?}",
                x.shape()
            ),
        ));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(crate::Error::invalid(
            "rms_norm",
            format!("eps must be finite and not negative, got {eps}"),
        ));
    }
    let w = match weight {
        Some(w) if w.shape() == [width] && w.dtype().is_float() => w.astype(Dtype::F32)?,
        Some(w) => {
            return Err(crate::Error::shape(
                "rms_norm",
                format!(
                    "the weight must be floats of shape [{width}] (the last axis of {:?}); got {} {:?}",
                    x.shape(),
                    w.dtype(),
                    w.shape()
                ),
            ));
        }
        None => crate::stop_gradient(&Array::ones(&[width], Dtype::F32))?,
    };
    let out = Array::from_primitive(
        RmsNorm { eps: eps as f32 },
        vec![x.astype(Dtype::F32)?, w],
        x.shape().to_vec(),
        Dtype::F32,
    );
    out.astype(x.dtype())
}
