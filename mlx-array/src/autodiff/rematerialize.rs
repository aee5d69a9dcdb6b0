//! Rematerialization: a value the backward pass computes again instead of
//! keeping it from the forward pass, while the forward pass's activations
//! are kept as usual (where [`super::checkpoint`] recomputes a whole
//! function). Made for fully sharded data parallelism: a weight gathered
//! from every rank's shard for the forward pass is freed after its forward
//! readers and gathered again when the backward pass reaches them.
//!
//! The readers' vector-Jacobian products are handed the recomputation
//! ([`Primitive::recompute_for_backward`]), built once, made to wait for
//! the cotangent of the first reader the backward pass reaches (the last
//! in the forward pass). Gradients flow to the inputs through the
//! recomputation's own vector-Jacobian product: a gather's is a
//! reduce-scatter, which reads no value of the forward pass.

use std::sync::Mutex;

use super::checkpoint::depend;
use super::{Recompute, vjp_reached};
use crate::{Array, ArrayData, Primitive, Result};

/// `f(inputs)`'s one output, recomputed for the backward pass instead of
/// kept (see the module documentation). Gradients reach `inputs` only.
/// Outside differentiation this is `f(inputs)`.
///
/// ```
/// use std::sync::Arc;
/// use mlx_array::{autodiff::{rematerialize, value_and_grad}, Array};
/// // A weight computed from a parameter, recomputed for the backward pass.
/// let weight = Arc::new(|p: &[Array]| Ok(vec![p[0].exp()?]));
/// let loss = |x: &[Array]| {
///     let w = rematerialize(weight.clone(), &x[1..])?;
///     x[0].multiply(&w)?.sin()?.sum_all()
/// };
/// let args = [Array::from_slice(&[0.5f32, 2.0], &[2]).unwrap(), Array::from_slice(&[0.1f32, -0.3], &[2]).unwrap()];
/// let (_, g) = value_and_grad(loss, &[0, 1])(&args).unwrap();
/// let (x, p) = ([0.5f32, 2.0], [0.1f32, -0.3]);
/// let want: Vec<f32> = (0..2).map(|i| (x[i] * p[i].exp()).cos() * x[i] * p[i].exp()).collect();
/// let got = g[1].to_vec::<f32>().unwrap();
/// assert!((got[0] - want[0]).abs() < 1e-6 && (got[1] - want[1]).abs() < 1e-6);
/// ```
pub fn rematerialize(f: Recompute, inputs: &[Array]) -> Result<Array> {
    let value = first(f(inputs)?)?;
    rematerialize_with(value, f, inputs)
}

/// [`rematerialize`] of a value the caller computed: `value` must equal
/// `f(inputs)`, computed as the forward pass should (made to wait for
/// something with [`super::depend`], say: a weight gathered one block
/// ahead of its use); the backward pass recomputes it as `f(inputs)`.
/// Outside differentiation this is `value`.
pub fn rematerialize_with(value: Array, f: Recompute, inputs: &[Array]) -> Result<Array> {
    if !super::is_tracing() {
        return Ok(value);
    }
    let (shape, dtype) = (value.shape().to_vec(), value.dtype());
    let mut node_inputs = vec![value];
    node_inputs.extend(inputs.iter().cloned());
    let primitive = Rematerialized {
        f,
        recomputed: Mutex::new(None),
    };
    Ok(Array::from_primitive(primitive, node_inputs, shape, dtype))
}

/// The node's primitive around `f`, for the conformance suite.
#[cfg(feature = "conformance")]
pub(crate) fn for_spec(f: Recompute) -> Rematerialized {
    Rematerialized {
        f,
        recomputed: Mutex::new(None),
    }
}

/// [`Rematerialized`]'s primitive name.
pub(crate) const NAME: &str = "rematerialize";

fn first(outputs: Vec<Array>) -> Result<Array> {
    match <[Array; 1]>::try_from(outputs) {
        Ok([x]) => Ok(x),
        Err(v) => Err(crate::Error::invalid(
            "rematerialize",
            format!("the function must return one array, not {}", v.len()),
        )),
    }
}

/// A value recomputed for the backward pass: its first input (the value,
/// computed in the forward pass) passed on; the rest are the inputs it is
/// recomputed from.
pub struct Rematerialized {
    f: Recompute,
    recomputed: Mutex<Option<Array>>,
}

impl std::fmt::Debug for Rematerialized {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Rematerialized")
    }
}

impl Primitive for Rematerialized {
    fn name(&self) -> &'static str {
        NAME
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        self.eval_cpu(inputs, out)
    }
    fn vjp(&self, inputs: &[Array], _: &Array, cotangent: &Array) -> Result<Vec<Option<Array>>> {
        let f = self.f.clone();
        let (_, grads) = vjp_reached(|x| f(x), &inputs[1..], std::slice::from_ref(cotangent))?;
        let mut out = vec![None];
        out.extend(grads);
        Ok(out)
    }
    fn recompute_for_backward(&self, inputs: &[Array], after: &[Array]) -> Option<Result<Array>> {
        let mut kept = self.recomputed.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(x) = &*kept {
            return Some(Ok(x.clone()));
        }
        let gated: Vec<Array> = inputs[1..].iter().map(|p| depend(p, after)).collect();
        let x = match (self.f)(&gated).and_then(first) {
            Ok(x) => x,
            Err(e) => return Some(Err(e)),
        };
        *kept = Some(x.clone());
        Some(Ok(x))
    }
}
