//! RMS normalisation as one primitive (see [`crate::rms_norm`]).

use crate::{Array, ArrayData, Dtype, OutputSpec, Primitive, Result};

/// `x * w / sqrt(mean(x^2) + eps)` over the last axis, computed in f32.
/// Inputs: `x` `[..., D]` and `w` `[D]`, floats of any dtype (read as
/// stored); the output in `out`. Its vector-Jacobian product is one
/// [`RmsNormGrad`] node for `dx` and `dw` together (the row statistics are
/// recomputed there, not kept), which reads the cotangent in its own dtype.
#[derive(Debug, Clone, Copy)]
pub struct RmsNorm {
    /// Added to the mean square.
    pub eps: f32,
    /// The output's dtype.
    pub out: Dtype,
}

impl Primitive for RmsNorm {
    fn name(&self) -> &'static str {
        "rms_norm"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (x, w) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::rms_norm(&x, &w, self.eps, self.out)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (x, w) = (inputs[0].operand()?, inputs[1].operand()?);
        Ok(crate::backend::cpu::norm::rms_norm(
            &x, &w, self.eps, self.out,
        ))
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        self.vjp_accumulating(inputs, out, ct, &mut [])
    }
    /// A float32 `x`'s cotangent so far (a residual stream's) is added to
    /// `dx` in the gradient's row pass: the same f32 sum, one kernel fewer.
    fn vjp_accumulating(
        &self,
        inputs: &[Array],
        _out: &Array,
        ct: &Array,
        accumulated: &mut [Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        let (x, w) = (&inputs[0], &inputs[1]);
        let (n, d) = (x.size() as i64, w.size() as i64);
        // A cotangent that is a pending cast of an f32 array is read as
        // that array (a cast of an f32 result would hand it back so).
        let ct = crate::ops::pending_cast_from(ct, Dtype::F32).unwrap_or_else(|| ct.clone());
        let mut grad_inputs = vec![x.clone(), w.clone(), ct];
        if x.dtype() == Dtype::F32
            && let Some(slot) = accumulated.first_mut()
            && slot
                .as_ref()
                .is_some_and(|a| a.dtype() == Dtype::F32 && a.shape() == x.shape())
        {
            grad_inputs.extend(slot.take());
        }
        let packed_len = x.size() + w.size() + x.size().checked_div(w.size()).unwrap_or(0);
        let node = RmsNormGrad(*self);
        let (packed, half) = match half_dx(x.dtype(), self.out) {
            None => (
                Array::from_primitive(node, grad_inputs, vec![packed_len], Dtype::F32),
                None,
            ),
            Some(half) => {
                let specs = vec![
                    OutputSpec {
                        shape: vec![packed_len],
                        dtype: Dtype::F32,
                    },
                    OutputSpec {
                        shape: x.shape().to_vec(),
                        dtype: half,
                    },
                ];
                let mut outputs = Array::from_primitive_outputs(node, grad_inputs, specs);
                let half = outputs.pop();
                (outputs.swap_remove(0), half)
            }
        };
        // Each gradient in its input's dtype: a pending cast of the f32
        // result, which a half-precision weight's own cast (f32 master
        // weights) takes back unrounded.
        let dx = crate::reshape_to(&packed.slice_axis(0, 0, n)?, x.shape())?;
        if let Some(half) = &half {
            dx.remember_cast(half)?;
        }
        let dw = packed.slice_axis(0, n, n + d)?;
        Ok(vec![
            Some(dx.astype(x.dtype())?),
            Some(dw.astype(w.dtype())?),
        ])
    }
}

/// The dtype in which the gradient also stores `dx`, for `x` of `x` and a
/// norm output of `out`: a float32 `x` (a residual stream) normed into a
/// half-precision model's dtype gets `dx` in that dtype too, remembered as
/// its cast ([`Array::remember_cast`]): the stream's cotangent is rounded
/// to it anyway for the half-precision branch added to the stream (the
/// projection's backward), and the cast then runs no kernel.
fn half_dx(x: Dtype, out: Dtype) -> Option<Dtype> {
    (x == Dtype::F32 && out.is_half()).then_some(out)
}

/// `dx`, `dw` and each row's inverse RMS of an [`RmsNorm`], packed, in
/// f32. Inputs: `x`, `w`, the cotangent of the output (each read as
/// stored), and optionally a float32 addend of `x`'s shape (`x`'s
/// cotangent from elsewhere), added to `dx` as it is stored. Built with a
/// second output (of `x`'s shape, f16 or bf16), it also stores `dx` in
/// that dtype, rounded as a cast rounds.
#[derive(Debug, Clone, Copy)]
pub struct RmsNormGrad(pub RmsNorm);

impl RmsNormGrad {
    /// The packed gradients, and `dx` in `half` if given, on the GPU or
    /// the CPU.
    fn run(&self, inputs: &[Array], half: Option<Dtype>, gpu: bool) -> Result<Vec<ArrayData>> {
        let [x, w, c] = [&inputs[0], &inputs[1], &inputs[2]].map(Array::operand);
        let (x, w, c) = (x?, w?, c?);
        let addend = inputs.get(3).map(Array::operand).transpose()?;
        let eps = self.0.eps;
        let (packed, half) = if gpu {
            crate::backend::gpu::rms_norm_grad(&x, &w, &c, addend.as_ref(), eps, half)?
        } else {
            let packed = crate::backend::cpu::norm::rms_norm_grad(&x, &w, &c, addend.as_ref(), eps);
            let half = half.map(|d| {
                let dx = crate::backend::cpu::copy::cast_f32_prefix(&packed, x.size(), d);
                dx.view(crate::shape::contiguous_strides(x.shape), dx.offset())
            });
            (packed, half)
        };
        Ok([packed].into_iter().chain(half).collect())
    }
}

impl Primitive for RmsNormGrad {
    fn name(&self) -> &'static str {
        "rms_norm_grad"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        Ok(self.run(inputs, None, true)?.swap_remove(0))
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        Ok(self.run(inputs, None, false)?.swap_remove(0))
    }
    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        self.run(inputs, outputs.get(1).map(|o| o.dtype), true)
    }
    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        self.run(inputs, outputs.get(1).map(|o| o.dtype), false)
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        Err(crate::primitive::no_second_derivatives("rms_norm_grad"))
    }
    fn vjp_outputs(
        &self,
        _inputs: &[Array],
        _outputs: &[Array],
        _cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        Err(crate::primitive::no_second_derivatives("rms_norm_grad"))
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
