//! The fused softmax cross-entropy and its gradient.

use crate::backend::cpu::loss;
use crate::primitive::no_gradient;
use crate::{Array, ArrayData, Primitive, Result};

/// Per-row `logsumexp(logits) - logits[target]` over the last axis, without
/// materialising a log-softmax. Inputs: logits `[..., V]`, integer targets `[...]`.
#[derive(Debug, Clone)]
pub struct CrossEntropy;

impl Primitive for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    #[cfg(feature = "gpu")]
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t) = (&inputs[0], &inputs[1]);
        crate::backend::gpu::cross_entropy(&l.data()?, l.shape(), l.dtype(), &t.data()?, t.dtype())
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t) = (&inputs[0], &inputs[1]);
        loss::cross_entropy(&l.data()?, l.shape(), l.dtype(), &t.data()?, t.dtype())
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let l = &inputs[0];
        let g = Array::from_primitive(
            CrossEntropyGrad,
            vec![l.clone(), inputs[1].clone(), ct.clone()],
            l.shape().to_vec(),
            l.dtype(),
        );
        Ok(vec![Some(g), None])
    }
}

/// `(softmax(logits) - onehot(targets)) * ct[..., None]` in one pass: the
/// gradient of [`CrossEntropy`]. Inputs: logits, targets, the row cotangents.
#[derive(Debug, Clone)]
pub struct CrossEntropyGrad;

impl Primitive for CrossEntropyGrad {
    fn name(&self) -> &'static str {
        "cross_entropy_grad"
    }
    #[cfg(feature = "gpu")]
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t, c) = (&inputs[0], &inputs[1], &inputs[2]);
        let (data, td, cd) = (l.data()?, t.data()?, c.data()?);
        let donated = l.is_donatable(&data);
        crate::backend::gpu::cross_entropy_grad(
            data,
            l.shape(),
            l.dtype(),
            &td,
            t.dtype(),
            &cd,
            c.dtype(),
            donated,
        )
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t, c) = (&inputs[0], &inputs[1], &inputs[2]);
        let (data, td, cd) = (l.data()?, t.data()?, c.data()?);
        let donated = l.is_donatable(&data);
        loss::cross_entropy_grad(
            data,
            l.shape(),
            l.dtype(),
            &td,
            t.dtype(),
            &cd,
            c.dtype(),
            donated,
        )
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        // Second derivatives of the loss are not supported; say so rather than return zeros.
        let _ = no_gradient(inputs);
        Err(crate::Error::invalid(
            "vjp",
            "cross_entropy_grad has no vector-Jacobian product (no second derivatives)",
        ))
    }
}
