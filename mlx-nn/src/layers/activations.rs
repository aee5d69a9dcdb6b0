//! Activation functions and their parameter-free modules.

use mlx_array::{Array, Result};

/// `x * sigmoid(x)`.
pub fn silu(x: &Array) -> Result<Array> {
    x.multiply(&x.sigmoid()?)
}

/// `max(x, 0)`.
pub fn relu(x: &Array) -> Result<Array> {
    x.maximum(&x.scalar_like(0.0))
}

/// The exact GELU: `x * (1 + erf(x / sqrt 2)) / 2`.
pub fn gelu(x: &Array) -> Result<Array> {
    x.multiply(
        &x.mul_scalar(std::f64::consts::FRAC_1_SQRT_2)?
            .erf()?
            .add_scalar(1.0)?,
    )?
    .mul_scalar(0.5)
}

/// The tanh approximation of GELU.
pub fn gelu_approx(x: &Array) -> Result<Array> {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    let inner = x
        .add(&x.pow_scalar(3.0)?.mul_scalar(0.044715)?)?
        .mul_scalar(c)?
        .tanh()?;
    x.multiply(&inner.add_scalar(1.0)?)?.mul_scalar(0.5)
}

/// The SiLU activation as a layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct SiLU;
crate::impl_module!(SiLU {});

/// The GELU activation as a layer (exact, or the tanh approximation).
#[derive(Clone, Copy, Debug, Default)]
pub struct GELU {
    /// Use the tanh approximation.
    pub approximate: bool,
}
crate::impl_module!(GELU {});

/// The ReLU activation as a layer.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReLU;
crate::impl_module!(ReLU {});

impl crate::Layer for SiLU {
    fn forward(&self, x: &Array) -> Result<Array> {
        silu(x)
    }
}

impl crate::Layer for GELU {
    fn forward(&self, x: &Array) -> Result<Array> {
        if self.approximate {
            gelu_approx(x)
        } else {
            gelu(x)
        }
    }
}

impl crate::Layer for ReLU {
    fn forward(&self, x: &Array) -> Result<Array> {
        relu(x)
    }
}
