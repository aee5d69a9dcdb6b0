//! The fused softmax cross-entropy and its gradient.

use crate::backend::common::loss::LceArgs;
use crate::backend::cpu::loss;
use crate::primitive::no_gradient;
use crate::primitives::elementwise::BinaryOp;
use crate::primitives::reduce::ReduceOp;
use crate::shape::contiguous_strides;
use crate::{Array, ArrayData, Dtype, Operand, OutputSpec, Primitive, Result};

/// Per-row `logsumexp(logits) - logits[target]` over the last axis, without
/// materialising a log-softmax. Inputs: logits `[..., V]`, integer targets `[...]`.
#[derive(Debug, Clone)]
pub struct CrossEntropy;

impl Primitive for CrossEntropy {
    fn name(&self) -> &'static str {
        "cross_entropy"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t) = (&inputs[0], &inputs[1]);
        crate::backend::gpu::cross_entropy(&l.operand()?, &t.operand()?)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t) = (&inputs[0], &inputs[1]);
        loss::cross_entropy(&l.operand()?, &t.operand()?)
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
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t, c) = (&inputs[0], &inputs[1], &inputs[2]);
        let (logits, t, c) = (l.operand()?, t.operand()?, c.operand()?);
        let donated = l.is_donatable(&logits.data);
        crate::backend::gpu::cross_entropy_grad(logits, &t, &c, donated)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (l, t, c) = (&inputs[0], &inputs[1], &inputs[2]);
        let (logits, t, c) = (l.operand()?, t.operand()?, c.operand()?);
        let donated = l.is_donatable(&logits.data);
        loss::cross_entropy_grad(logits, &t, &c, donated)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        // Second derivatives of the loss are not supported; say so rather than return zeros.
        let _ = no_gradient(inputs);
        Err(crate::primitive::no_second_derivatives(
            "cross_entropy_grad",
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
    /// Rows taken at a time by [`crate::linear_cross_entropy_sum`], whose
    /// blocks span every class; 0 picks equal blocks of at most 50 MiB of
    /// logits each, or a ninth of the rows when that is more. On a CPU with
    /// AVX-512 (and a feature axis a multiple of 32) blocks are rounded up
    /// to a multiple of 32 rows.
    pub block_rows: usize,
}

impl LinearCrossEntropyOptions {
    fn args<'a>(&self, h: &'a Array, w: &'a Array, t: &'a Array) -> Result<LceArgs<'a>> {
        Ok(LceArgs {
            h: h.operand()?,
            w: w.operand()?,
            t: t.operand()?,
            ignore_index: self.ignore_index,
            label_smoothing: self.label_smoothing,
            chunk: self.chunk,
            block_rows: self.block_rows,
        })
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
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (h, w, t) = (&inputs[0], &inputs[1], &inputs[2]);
        crate::backend::gpu::linear_cross_entropy(&self.0.args(h, w, t)?)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (h, w, t) = (&inputs[0], &inputs[1], &inputs[2]);
        loss::linear_cross_entropy(&self.0.args(h, w, t)?)
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let (h, w) = (&inputs[0], &inputs[1]);
        let [dh, dw]: [Array; 2] = LinearCrossEntropyGrad(self.0)
            .build(h, w, &inputs[2], ct, out)
            .try_into()
            .expect("two outputs");
        Ok(vec![Some(dh), Some(dw), None])
    }
}

/// The gradient of [`LinearCrossEntropy`]: recomputes the logits one chunk
/// at a time, turns each chunk into `ct * (softmax - target distribution)` in
/// place and accumulates `dh += g @ w` and `dw[chunk] = g^T @ h`. Inputs: `h`,
/// `w`, targets, the row cotangents and the forward losses (from which each
/// row's logsumexp is recovered); two outputs, `dh` and `dw`, in `h`'s
/// dtype (views of the one buffer the kernels write).
#[derive(Debug, Clone)]
pub struct LinearCrossEntropyGrad(pub LinearCrossEntropyOptions);

impl LinearCrossEntropyGrad {
    /// `dh` and `dw` for the row cotangents `ct` of the losses `loss` of
    /// `h`, `w` and `targets`.
    pub(crate) fn build(
        self,
        h: &Array,
        w: &Array,
        targets: &Array,
        ct: &Array,
        loss: &Array,
    ) -> Vec<Array> {
        let spec = |shape: &[usize]| OutputSpec {
            shape: shape.to_vec(),
            dtype: h.dtype(),
        };
        Array::from_primitive_outputs(
            self,
            vec![
                h.clone(),
                w.clone(),
                targets.clone(),
                ct.clone(),
                loss.clone(),
            ],
            vec![spec(h.shape()), spec(w.shape())],
        )
    }

    /// `dh` and `dw` as views of the kernels' flat buffer (`dh` first).
    fn outputs(packed: ArrayData, h: &Array, w: &Array) -> Vec<ArrayData> {
        let at = packed.offset();
        vec![
            packed.view(contiguous_strides(h.shape()), at),
            packed.view(contiguous_strides(w.shape()), at + h.size()),
        ]
    }
}

impl Primitive for LinearCrossEntropyGrad {
    fn name(&self) -> &'static str {
        "linear_cross_entropy_grad"
    }
    fn eval_gpu_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[OutputSpec],
    ) -> Result<Vec<ArrayData>> {
        let (h, w, t, c, l) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4]);
        let packed = crate::backend::gpu::linear_cross_entropy_grad(
            &self.0.args(h, w, t)?,
            &c.operand()?,
            &l.operand()?,
        )?;
        Ok(Self::outputs(packed, h, w))
    }
    fn eval_cpu_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[OutputSpec],
    ) -> Result<Vec<ArrayData>> {
        let (h, w, t, c, l) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3], &inputs[4]);
        let packed =
            loss::linear_cross_entropy_grad(&self.0.args(h, w, t)?, &c.operand()?, &l.operand()?)?;
        Ok(Self::outputs(packed, h, w))
    }
    fn vjp_outputs(
        &self,
        _inputs: &[Array],
        _outputs: &[Array],
        _cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        Err(crate::primitive::no_second_derivatives(
            "linear_cross_entropy_grad",
        ))
    }
}

/// The weighted fused loss and its gradients computed together (see
/// [`crate::linear_cross_entropy_sum`]): three f32 outputs, the summed loss,
/// `dh` and `dw`, from one pass. Inputs: `h`, `w`, targets, the f32 row
/// weights. Differentiated through its loss output: the vector-Jacobian
/// product hands out the other two, scaled by the cotangent unless that is
/// the constant 1 (as `value_and_grad` seeds it), in which case they are
/// the outputs themselves, not copies.
#[derive(Debug, Clone)]
pub struct LinearCrossEntropyValueAndGrad(pub LinearCrossEntropyOptions);

impl LinearCrossEntropyValueAndGrad {
    /// The loss, `dh` and `dw` of `h`, `w`, `targets` and f32 `row_weights`.
    pub(crate) fn build(
        self,
        h: &Array,
        w: &Array,
        targets: &Array,
        row_weights: Array,
    ) -> Vec<Array> {
        let f32 = |shape: &[usize]| OutputSpec {
            shape: shape.to_vec(),
            dtype: Dtype::F32,
        };
        Array::from_primitive_outputs(
            self,
            vec![h.clone(), w.clone(), targets.clone(), row_weights],
            vec![f32(&[]), f32(h.shape()), f32(w.shape())],
        )
    }

    /// The three outputs as views of the kernels' flat buffer (`dh`, `dw`,
    /// then the loss).
    fn outputs(packed: ArrayData, h: &Array, w: &Array) -> Vec<ArrayData> {
        let (hn, wn) = (h.size(), w.size());
        let at = packed.offset();
        vec![
            packed.view(vec![], at + hn + wn),
            packed.view(contiguous_strides(h.shape()), at),
            packed.view(contiguous_strides(w.shape()), at + hn),
        ]
    }
}

impl Primitive for LinearCrossEntropyValueAndGrad {
    fn name(&self) -> &'static str {
        "linear_cross_entropy_value_and_grad"
    }
    /// On the GPU one pass over blocks of rows computes the losses and
    /// the gradients with the row weights as cotangents (three GEMMs of the
    /// projection's size), packed as on the CPU.
    fn eval_gpu_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[OutputSpec],
    ) -> Result<Vec<ArrayData>> {
        use crate::backend::gpu;
        let (h, w, t, rw) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
        let rw = rw.operand()?;
        let (loss, mut grads) =
            gpu::linear_cross_entropy_value_and_grad(&self.0.args(h, w, t)?, &rw)?;
        let n = h.size() + w.size();
        if h.dtype() != Dtype::F32 {
            grads = gpu::astype(&Operand::new(grads, &[n], h.dtype()), Dtype::F32)?;
        }
        let rows = t.shape();
        // The row weights are read as f32, as the loss is.
        let weighted = gpu::binary(
            BinaryOp::Multiply,
            &Operand::new(loss, rows, Dtype::F32),
            &Operand::new(rw.data, rows, Dtype::F32),
        )?;
        let axes: Vec<usize> = (0..rows.len()).collect();
        let total = gpu::reduce(
            ReduceOp::Sum,
            &Operand::new(weighted, rows, Dtype::F32),
            &axes,
        )?;
        let packed = gpu::concatenate(
            &[
                Operand::new(grads, &[n], Dtype::F32),
                Operand::new(total.view(vec![0], total.offset()), &[1], Dtype::F32),
            ],
            Dtype::F32,
            0,
            &[n + 1],
        )?;
        Ok(Self::outputs(packed, h, w))
    }
    fn eval_cpu_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[OutputSpec],
    ) -> Result<Vec<ArrayData>> {
        let (h, w, t, rw) = (&inputs[0], &inputs[1], &inputs[2], &inputs[3]);
        let packed =
            loss::linear_cross_entropy_value_and_grad(&self.0.args(h, w, t)?, &rw.operand()?)?;
        Ok(Self::outputs(packed, h, w))
    }
    fn vjp_outputs(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        if cotangents[1..].iter().any(Option::is_some) {
            return Err(crate::Error::invalid(
                "vjp",
                "linear_cross_entropy_value_and_grad's gradients have no vector-Jacobian product (no second derivatives)",
            ));
        }
        let Some(ct) = &cotangents[0] else {
            return no_gradient(inputs);
        };
        let (h, w) = (&inputs[0], &inputs[1]);
        let unit =
            ct.is_evaluated() && ct.device() == crate::Device::Cpu && ct.to_vec::<f32>()? == [1.0];
        let finish = |g: &Array, like: &Array| -> Result<Array> {
            let g = if unit {
                g.clone()
            } else {
                g.multiply(&ct.astype(Dtype::F32)?)?
            };
            g.astype(like.dtype())
        };
        Ok(vec![
            Some(finish(&outputs[1], h)?),
            Some(finish(&outputs[2], w)?),
            None,
            None,
        ])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
