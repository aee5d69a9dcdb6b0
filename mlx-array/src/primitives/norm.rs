//! RMS normalisation as one primitive (see [`crate::rms_norm`]).

use crate::{Array, ArrayData, Dtype, Primitive, Result};

/// `x * w / sqrt(mean(x^2) + eps)` over the last axis. Inputs: f32 `x`
/// `[..., D]`, f32 `w` `[D]`. Its vector-Jacobian product is one
/// [`RmsNormGrad`] node for `dx` and `dw` together (the row statistics are
/// recomputed there, not kept).
#[derive(Debug, Clone, Copy)]
pub struct RmsNorm {
    /// Added to the mean square.
    pub eps: f32,
}

impl Primitive for RmsNorm {
    fn name(&self) -> &'static str {
        "rms_norm"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (x, w) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::rms_norm(&x, &w, self.eps)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (x, w) = (inputs[0].operand()?, inputs[1].operand()?);
        Ok(crate::backend::cpu::norm::rms_norm(&x, &w, self.eps))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let (x, w) = (&inputs[0], &inputs[1]);
        let (n, d) = (x.size() as i64, w.size() as i64);
        let packed = Array::from_primitive(
            RmsNormGrad(*self),
            vec![x.clone(), w.clone(), ct.astype(Dtype::F32)?],
            vec![x.size() + w.size() + x.size().checked_div(w.size()).unwrap_or(0)],
            Dtype::F32,
        );
        Ok(vec![
            Some(crate::reshape_to(&packed.slice_axis(0, 0, n)?, x.shape())?),
            Some(packed.slice_axis(0, n, n + d)?),
        ])
    }
}

/// `dx`, `dw` and each row's inverse RMS of an [`RmsNorm`], packed.
/// Inputs: `x`, `w`, the f32 cotangent of the output.
#[derive(Debug, Clone, Copy)]
pub struct RmsNormGrad(pub RmsNorm);

impl Primitive for RmsNormGrad {
    fn name(&self) -> &'static str {
        "rms_norm_grad"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let [x, w, c] = [&inputs[0], &inputs[1], &inputs[2]].map(Array::operand);
        crate::backend::gpu::rms_norm_grad(&x?, &w?, &c?, self.0.eps)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let [x, w, c] = [&inputs[0], &inputs[1], &inputs[2]].map(Array::operand);
        Ok(crate::backend::cpu::norm::rms_norm_grad(
            &x?, &w?, &c?, self.0.eps,
        ))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        Err(crate::Error::invalid(
            "vjp",
            "rms_norm_grad has no vector-Jacobian product (no second derivatives)",
        ))
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
