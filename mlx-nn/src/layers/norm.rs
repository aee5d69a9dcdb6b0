//! Normalisation layers: `RMSNorm` and `LayerNorm`.

use mlx_array::{Array, Dtype, Result};

use crate::{Param, impl_module};

/// Root-mean-square normalisation over the last axis, with a learned scale
/// (ones at start): `x / sqrt(mean(x^2) + eps) * weight`, computed in f32.
#[derive(Clone, Debug)]
pub struct RMSNorm {
    /// `[dims]`.
    pub weight: Param,
    /// Added to the mean square.
    pub eps: f64,
}

impl_module!(RMSNorm { weight });

impl RMSNorm {
    /// With MLX's default `eps = 1e-5`.
    pub fn new(dims: usize) -> RMSNorm {
        RMSNorm::with_eps(dims, 1e-5)
    }
    /// With a given `eps`.
    pub fn with_eps(dims: usize, eps: f64) -> RMSNorm {
        RMSNorm {
            weight: Param::new(Array::ones(&[dims], Dtype::F32)),
            eps,
        }
    }
    /// Normalises `x` over its last axis (one fused primitive,
    /// [`mlx_array::rms_norm`]).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        mlx_array::rms_norm(x, Some(self.weight.value()), self.eps)
    }
    /// [`forward`](Self::forward) with the result in `dtype`, rounded once
    /// ([`mlx_array::rms_norm_as`]): a float32 residual stream normed into
    /// the dtype the next projections compute in, with no cast kernel.
    pub fn forward_as(&self, x: &Array, dtype: Dtype) -> Result<Array> {
        mlx_array::rms_norm_as(x, Some(self.weight.value()), self.eps, dtype)
    }
}

/// Layer normalisation over the last axis, with optional learned scale and bias.
#[derive(Clone, Debug)]
pub struct LayerNorm {
    /// `[dims]` scale (ones at start), when affine.
    pub weight: Option<Param>,
    /// `[dims]` shift (zeros at start), when affine with bias.
    pub bias: Option<Param>,
    /// Added to the variance.
    pub eps: f64,
}

impl_module!(LayerNorm { weight, bias });

impl LayerNorm {
    /// MLX's defaults: `eps = 1e-5`, affine with bias.
    pub fn new(dims: usize) -> LayerNorm {
        LayerNorm::with_options(dims, 1e-5, true, true)
    }
    /// With explicit options.
    pub fn with_options(dims: usize, eps: f64, affine: bool, bias: bool) -> LayerNorm {
        LayerNorm {
            weight: affine.then(|| Param::new(Array::ones(&[dims], Dtype::F32))),
            bias: (affine && bias).then(|| Param::new(Array::zeros(&[dims], Dtype::F32))),
            eps,
        }
    }
    /// Normalises `x` over its last axis.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let xf = x.astype(Dtype::F32)?;
        let mean = xf.mean(&[-1], true)?;
        let centered = xf.subtract(&mean)?;
        let var = centered.square()?.mean(&[-1], true)?;
        let mut y = centered.multiply(&var.add_scalar(self.eps)?.rsqrt()?)?;
        if let Some(w) = &self.weight {
            y = y.multiply(w.value())?;
        }
        if let Some(b) = &self.bias {
            y = y.add(b.value())?;
        }
        y.astype(x.dtype())
    }
}
