//! Activation checkpointing (MLX's `mx.checkpoint`, PyTorch's
//! `torch.utils.checkpoint`): a function whose intermediate values the
//! backward pass does not keep, but computes again from the function's
//! inputs when it reaches them.
//!
//! [`checkpoint`] runs the function as usual (its outputs are the same
//! arrays, bit for bit) and wraps them in a [`Checkpointed`] node. Under
//! differentiation that node is all the backward pass sees of the
//! function: its vector-Jacobian product runs the function again, on its
//! inputs made to wait for the outputs' cotangents ([`Depend`]), and
//! differentiates that copy. So the forward pass's intermediates have only
//! forward readers and are freed as soon as those have run, and each
//! checkpointed function's intermediates are rebuilt only once the
//! backward pass has come back to it: a chain of checkpointed blocks keeps
//! the blocks' inputs and one block's intermediates at a time.

use std::sync::Arc;

use crate::array::OutputSpec;
use crate::{Array, ArrayData, Primitive, Result};

/// A function of arrays to arrays that can be run again for the backward
/// pass: it must compute the same values from the same inputs (random
/// draws from keys it is given, not from a global generator).
pub type Recompute = Arc<dyn Fn(&[Array]) -> Result<Vec<Array>> + Send + Sync>;

/// `f(inputs)`, with `f`'s intermediates recomputed in the backward pass
/// instead of kept (see the module documentation).
///
/// Gradients reach `inputs` only: every array `f` differentiates must be
/// one of them (parameters included); arrays the closure captures get none
/// (as frozen weights should). The first input's gradient is handed back
/// only once the others' are computed: pass the activation a chain of
/// blocks carries first, and each block's parameter gradients are computed
/// as the backward pass leaves the block. Outside differentiation this is
/// `f(inputs)` and nothing else.
///
/// ```
/// use std::sync::Arc;
/// use mlx_array::{autodiff::{checkpoint, value_and_grad}, Array};
/// let block = Arc::new(|x: &[Array]| Ok(vec![x[0].exp()?.multiply(&x[1])?.sin()?]));
/// let plain = |x: &[Array]| block(x)?.remove(0).sum_all();
/// let kept = |x: &[Array]| checkpoint(block.clone(), x)?.remove(0).sum_all();
/// let args = [Array::from_slice(&[0.5f32, -1.0], &[2]).unwrap(), Array::from_slice(&[2.0f32, 3.0], &[2]).unwrap()];
/// let (a, ga) = value_and_grad(plain, &[0, 1])(&args).unwrap();
/// let (b, gb) = value_and_grad(kept, &[0, 1])(&args).unwrap();
/// assert_eq!(a.item::<f32>().unwrap(), b.item::<f32>().unwrap());
/// for (x, y) in ga.iter().zip(&gb) {
///     assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
/// }
/// ```
pub fn checkpoint(f: Recompute, inputs: &[Array]) -> Result<Vec<Array>> {
    let outputs = f(inputs)?;
    if !super::is_tracing() {
        return Ok(outputs);
    }
    let specs: Vec<OutputSpec> = outputs
        .iter()
        .map(|o| OutputSpec {
            shape: o.shape().to_vec(),
            dtype: o.dtype(),
        })
        .collect();
    Ok(checkpointed(f, outputs, inputs, specs))
}

/// The [`Checkpointed`] node passing on `outputs`, computed by `f` from
/// `inputs`.
pub(crate) fn checkpointed(
    f: Recompute,
    outputs: Vec<Array>,
    inputs: &[Array],
    specs: Vec<OutputSpec>,
) -> Vec<Array> {
    let count = outputs.len();
    let mut node_inputs = outputs;
    node_inputs.extend(inputs.iter().cloned());
    Array::from_primitive_outputs(Checkpointed { f, outputs: count }, node_inputs, specs)
}

/// The outputs of a checkpointed function: its first `outputs` inputs
/// (the function's results, computed in the forward pass) passed on as
/// they are; the rest are the function's inputs, which its
/// vector-Jacobian product runs it again on.
pub struct Checkpointed {
    f: Recompute,
    outputs: usize,
}

impl std::fmt::Debug for Checkpointed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Checkpointed({} outputs)", self.outputs)
    }
}

impl Primitive for Checkpointed {
    fn name(&self) -> &'static str {
        "checkpoint"
    }
    fn eval_cpu_outputs(&self, inputs: &[Array], _: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        inputs[..self.outputs].iter().map(Array::data).collect()
    }
    fn eval_gpu_outputs(&self, inputs: &[Array], specs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        self.eval_cpu_outputs(inputs, specs)
    }
    fn vjp_outputs(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        let primals = &inputs[self.outputs..];
        let reached: Vec<Array> = cotangents.iter().flatten().cloned().collect();
        let cotangents: Vec<Array> = cotangents
            .iter()
            .zip(outputs)
            .map(|(c, o)| c.clone().unwrap_or_else(|| crate::zeros_like(o)))
            .collect();
        // The copy starts once the backward pass has reached the outputs.
        // An input recomputed for the backward pass (a gathered weight) is
        // read as recomputed.
        let gated: Vec<Array> = primals
            .iter()
            .map(|p| Ok(super::recomputed(p, &reached)?.unwrap_or_else(|| depend(p, &reached))))
            .collect::<Result<_>>()?;
        let f = self.f.clone();
        let (_, mut grads) = super::vjp_reached(|x| f(x), &gated, &cotangents)?;
        // The first input's gradient, which a chain of blocks passes on to
        // the block before, waits for the others: each block's parameter
        // gradients are then computed as the backward pass leaves it, not
        // at the end, which would keep every block's recomputed values.
        let rest: Vec<Array> = grads.iter().skip(1).flatten().cloned().collect();
        if let Some(first) = grads.first_mut().and_then(Option::as_mut) {
            *first = depend(first, &rest);
        }
        let mut out = vec![None; self.outputs];
        out.extend(grads);
        Ok(out)
    }
}

/// `x`, computed only after `after` (as MLX's `depends`): the evaluator
/// orders a graph by its inputs, so reading `x` through this node waits
/// for `after`.
pub fn depend(x: &Array, after: &[Array]) -> Array {
    if after.is_empty() {
        return x.clone();
    }
    let mut inputs = vec![x.clone()];
    inputs.extend(after.iter().cloned());
    let d = Array::from_primitive(Depend, inputs, x.shape().to_vec(), x.dtype());
    d.inherit_cast(x);
    d
}

/// The identity of its first input, evaluated after the others (see
/// [`depend`]).
#[derive(Debug)]
pub struct Depend;

impl Primitive for Depend {
    fn name(&self) -> &'static str {
        "depend"
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        self.eval_cpu(inputs, out)
    }
    fn vjp(&self, inputs: &[Array], _: &Array, cotangent: &Array) -> Result<Vec<Option<Array>>> {
        let mut grads = vec![None; inputs.len()];
        grads[0] = Some(cotangent.clone());
        Ok(grads)
    }
}
