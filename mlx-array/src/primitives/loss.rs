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

/// Options of the fused output projection and cross-entropy
/// ([`crate::linear_cross_entropy`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LinearCrossEntropyOptions {
    /// Rows whose target equals this get a zero loss and no gradient (the
    /// value may lie outside the vocabulary, like PyTorch's -100).
    pub ignore_index: Option<i64>,
    /// Label smoothing in `[0, 1)`: the target distribution puts `1 - s` on
    /// the target class and `s / V` on every class.
    pub label_smoothing: f32,
    /// Classes whose logits are computed at a time; 0 picks about 16 MiB of
    /// logits per chunk.
    pub chunk: usize,
}

impl LinearCrossEntropyOptions {
    fn args<'a>(
        &self,
        h: (&'a ArrayData, &'a Array),
        w: (&'a ArrayData, &'a Array),
        t: (&'a ArrayData, &'a Array),
    ) -> loss::LceArgs<'a> {
        loss::LceArgs {
            h: (h.0, h.1.shape()),
            w: (w.0, w.1.shape()),
            dtype: h.1.dtype(),
            t: (t.0, t.1.dtype()),
            ignore_index: self.ignore_index,
            label_smoothing: self.label_smoothing,
            chunk: self.chunk,
        }
    }
}

/// Per-row softmax cross-entropy of the logits `h @ w^T` that never holds
/// more than one chunk of them: the output projection of a language model
/// fused with its loss. Inputs: hidden states `[..., D]`, the weight `[V, D]`,
/// integer targets `[...]`; output: f32 losses `[...]`.
#[derive(Debug, Clone)]
pub struct LinearCrossEntropy(pub LinearCrossEntropyOptions);

impl Primitive for LinearCrossEntropy {
    fn name(&self) -> &'static str {
        "linear_cross_entropy"
    }
    #[cfg(feature = "gpu")]
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (h, w, t) = (&inputs[0], &inputs[1], &inputs[2]);
        let (hd, wd, td) = (h.data()?, w.data()?, t.data()?);
        crate::backend::gpu::linear_cross_entropy(&self.0.args((&hd, h), (&wd, w), (&td, t)))
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (h, w, t) = (&inputs[0], &inputs[1], &inputs[2]);
        let (hd, wd, td) = (h.data()?, w.data()?, t.data()?);
        loss::linear_cross_entropy(&self.0.args((&hd, h), (&wd, w), (&td, t)))
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let (h, w) = (&inputs[0], &inputs[1]);
        let (hn, wn) = (h.size(), w.size());
        let packed = Array::from_primitive(
            LinearCrossEntropyGrad(self.0),
            vec![
                h.clone(),
                w.clone(),
                inputs[2].clone(),
                ct.clone(),
                out.clone(),
            ],
            vec![hn + wn],
            h.dtype(),
        );
        let dh = crate::reshape_to(&packed.slice_axis(0, 0, hn as i64)?, h.shape())?;
        let dw = crate::reshape_to(
            &packed.slice_axis(0, hn as i64, (hn + wn) as i64)?,
            w.shape(),
        )?;
        Ok(vec![Some(dh), Some(dw), None])
    }
}

/// The gradient of [`LinearCrossEntropy`]: recomputes the logits one chunk
/// at a time, turns each chunk into `ct * (softmax - target distribution)` in
/// place and accumulates `dh += g @ w` and `dw[chunk] = g^T @ h`. Inputs: `h`,
/// `w`, targets, the row cotangents and the forward losses (from which each
/// row's logsumexp is recovered); output: one flat buffer, `dh` then `dw`,
/// which the vjp hands out as two views.
#[derive(Debug, Clone)]
pub struct LinearCrossEntropyGrad(pub LinearCrossEntropyOptions);

impl Primitive for LinearCrossEntropyGrad {
    fn name(&self) -> &'static str {
        "linear_cross_entropy_grad"
    }
    #[cfg(feature = "gpu")]
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (h, w, t, c, l) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4]);
        let (hd, wd, td, cd, ld) = (h.data()?, w.data()?, t.data()?, c.data()?, l.data()?);
        crate::backend::gpu::linear_cross_entropy_grad(
            &self.0.args((&hd, h), (&wd, w), (&td, t)),
            (&cd, c.dtype()),
            &ld,
        )
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (h, w, t, c, l) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4]);
        let (hd, wd, td, cd, ld) = (h.data()?, w.data()?, t.data()?, c.data()?, l.data()?);
        loss::linear_cross_entropy_grad(
            &self.0.args((&hd, h), (&wd, w), (&td, t)),
            (&cd, c.dtype()),
            &ld,
        )
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        Err(crate::Error::invalid(
            "vjp",
            "linear_cross_entropy_grad has no vector-Jacobian product (no second derivatives)",
        ))
    }
}
