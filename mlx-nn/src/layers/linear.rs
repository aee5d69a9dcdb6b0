//! `Linear`: `y = x W^T + b`.

use mlx_array::{Array, Result, random};

use crate::{Param, impl_module, init};

/// An affine map with weight `[out, in]` and optional bias `[out]`, both
/// initialised uniform in `±1/sqrt(in)` as in MLX.
#[derive(Clone, Debug)]
pub struct Linear {
    /// `[output_dims, input_dims]`.
    pub weight: Param,
    /// `[output_dims]`, if present.
    pub bias: Option<Param>,
}

impl_module!(Linear { weight, bias });

impl Linear {
    /// A new layer with MLX's initialisation from `key`.
    pub fn new(input_dims: usize, output_dims: usize, bias: bool, key: &Array) -> Result<Linear> {
        let [kw, kb] = random::split2(key)?;
        let scale = (1.0 / input_dims as f64).sqrt();
        Ok(Linear {
            weight: Param::new(init::uniform(&kw, scale, &[output_dims, input_dims])?),
            bias: if bias {
                Some(Param::new(init::uniform(&kb, scale, &[output_dims])?))
            } else {
                None
            },
        })
    }

    /// `x @ W^T (+ b)` over the last axis of `x`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        affine(x, &self.weight, &self.bias)
    }
}

/// `x W^T (+ b)` over the last axis of `x`.
pub(crate) fn affine(x: &Array, weight: &Param, bias: &Option<Param>) -> Result<Array> {
    let y = x.matmul(&weight.value().t()?)?;
    match bias {
        Some(b) => y.add(b.value()),
        None => Ok(y),
    }
}
