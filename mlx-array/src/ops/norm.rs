//! RMS normalisation (MLX's `mx.fast.rms_norm`).

use crate::primitives::norm::RmsNorm;
use crate::{Array, Dtype, Result};

/// `x * weight / sqrt(mean(x^2) + eps)` over the last axis of `x`
/// (`[..., D]`), with `weight` of shape `[D]` (`None`: ones). One pass per
/// row forward and one backward, computed in f32 whatever the dtypes of
/// `x` and `weight` (read as they are stored); the result has `x`'s dtype
/// ([`rms_norm_as`] chooses another). Only `x` and `weight` are kept for
/// the gradient.
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
    rms_norm_as(x, weight, eps, x.dtype())
}

/// [`rms_norm`] with its result in `dtype`: rounded once from the f32
/// computation, as a cast of [`rms_norm`]'s float32 result would round,
/// but with no cast kernel on either side. A mixed-precision block norms
/// its float32 residual stream into the dtype its projections compute in
/// (and the gradient reads that dtype's cotangent as it is).
///
/// ```
/// use mlx_array::{Array, Dtype, rms_norm, rms_norm_as};
/// let x = Array::from_slice(&[3.0f32, 4.0, 0.1, -2.0], &[2, 2]).unwrap();
/// let w = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
/// let half = rms_norm_as(&x, Some(&w), 1e-5, Dtype::F16).unwrap();
/// let cast = rms_norm(&x, Some(&w), 1e-5).unwrap().astype(Dtype::F16).unwrap();
/// assert_eq!(half.dtype(), Dtype::F16);
/// assert_eq!(half.to_vec::<half::f16>().unwrap(), cast.to_vec::<half::f16>().unwrap());
/// ```
pub fn rms_norm_as(x: &Array, weight: Option<&Array>, eps: f64, dtype: Dtype) -> Result<Array> {
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
    if !dtype.is_float() {
        return Err(crate::Error::dtype(
            "rms_norm",
            dtype,
            format!("the result is a float dtype, not {dtype}"),
        ));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(crate::Error::invalid(
            "rms_norm",
            format!("eps must be finite and not negative, got {eps}"),
        ));
    }
    let w = match weight {
        Some(w) if w.shape() == [width] && w.dtype().is_float() => w.clone(),
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
    Ok(Array::from_primitive(
        RmsNorm {
            eps: eps as f32,
            out: dtype,
        },
        vec![x.clone(), w],
        x.shape().to_vec(),
        dtype,
    ))
}
