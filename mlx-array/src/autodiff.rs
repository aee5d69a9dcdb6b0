//! Reverse-mode differentiation over the lazy graph: `vjp`, `grad`,
//! `value_and_grad`, on arrays and on parameter trees.
//!
//! The function is run on *tracer* copies of the inputs; the backward pass
//! walks the recorded (still pending) graph from the outputs to the tracers,
//! calling each primitive's [`Primitive::vjp`]. The
//! gradients are themselves lazy arrays: evaluate them together with the
//! loss and the update.
//!
//! ```
//! use mlx_array::{autodiff::value_and_grad, Array};
//! let f = |x: &[Array]| x[0].square()?.sum_all();
//! let (loss, grads) = value_and_grad(f, &[0])(&[Array::from_slice(&[1.0f32, -3.0], &[2]).unwrap()]).unwrap();
//! assert_eq!(loss.item::<f32>().unwrap(), 10.0);
//! assert_eq!(grads[0].to_vec::<f32>().unwrap(), vec![2.0, -6.0]);
//! ```

use std::collections::{HashMap, HashSet};

use crate::array::NodeKind;
use crate::{Array, ArrayData, Error, Primitive, Result, Tree};

/// Marks a function input during tracing: the identity, and the point where
/// the backward pass stops.
#[derive(Debug)]
pub struct Tracer;

impl Primitive for Tracer {
    fn name(&self) -> &'static str {
        "tracer"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        // The identity: the same data on whichever device it lives.
        self.eval_cpu(inputs, out)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
    fn vjp(
        &self,
        _inputs: &[Array],
        _output: &Array,
        cotangent: &Array,
    ) -> Result<Vec<Option<Array>>> {
        Ok(vec![Some(cotangent.clone())])
    }
}

thread_local! {
    /// How many functions this thread is tracing for differentiation.
    static TRACING: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Counts a function being traced while it lives.
struct Tracing;

impl Tracing {
    fn start() -> Tracing {
        TRACING.with(|t| t.set(t.get() + 1));
        Tracing
    }
}

impl Drop for Tracing {
    fn drop(&mut self) {
        TRACING.with(|t| t.set(t.get().saturating_sub(1)));
    }
}

/// True while this thread runs a function that [`vjp`] (and so `grad`,
/// `value_and_grad`) is about to differentiate: fused ops use it to choose
/// between a kernel that computes their gradient in the forward pass and
/// their plain forward (as MLX's `fast` ops carry a fallback).
pub fn is_tracing() -> bool {
    TRACING.with(|t| t.get() > 0)
}

/// A stand-in for `x`, remembering `x`'s cast if it has one (a cast of
/// the stand-in then reads the copy, and differentiates as a cast).
fn tracer(x: &Array) -> Array {
    let t = Array::from_primitive(Tracer, vec![x.clone()], x.shape().to_vec(), x.dtype());
    t.inherit_cast(x);
    t
}

/// The pending nodes between `outputs` and the tracers, inputs before users.
fn backward_order(
    outputs: &[Array],
    tracers: &HashSet<u64>,
) -> Vec<(Array, std::sync::Arc<dyn Primitive>, Vec<Array>)> {
    let mut order = Vec::new();
    let mut seen = HashSet::new();
    let mut stack: Vec<(Array, bool)> = outputs.iter().rev().map(|o| (o.clone(), false)).collect();
    let mut info: HashMap<u64, (std::sync::Arc<dyn Primitive>, Vec<Array>)> = HashMap::new();
    while let Some((a, expanded)) = stack.pop() {
        if expanded {
            if let Some((p, i)) = info.remove(&a.id()) {
                order.push((a, p, i));
            }
            continue;
        }
        if !seen.insert(a.id()) {
            continue;
        }
        let (p, inputs) = match a.lock().pending() {
            None => continue,
            Some((primitive, inputs)) => (primitive.clone(), inputs.clone()),
        };
        let stop = tracers.contains(&a.id());
        info.insert(a.id(), (p, if stop { vec![] } else { inputs.clone() }));
        stack.push((a, true));
        if !stop {
            for i in inputs.into_iter().rev() {
                if !seen.contains(&i.id()) {
                    stack.push((i, false));
                }
            }
        }
    }
    order
}

fn accumulate(cots: &mut HashMap<u64, Array>, target: &Array, g: Array) -> Result<()> {
    if g.shape() != target.shape() {
        return Err(Error::eval(
            "vjp",
            format!(
                "a gradient of shape {:?} reached an input of shape {:?}",
                g.shape(),
                target.shape()
            ),
        ));
    }
    let g = if g.dtype() != target.dtype() && target.dtype().is_float() {
        g.astype(target.dtype())?
    } else {
        g
    };
    let sum = match cots.remove(&target.id()) {
        Some(prev) => prev.add(&g)?,
        None => g,
    };
    cots.insert(target.id(), sum);
    Ok(())
}

/// What a walk back has learnt of its nodes: each one's recomputation for
/// the backward pass, or that it has none.
type Recomputed = HashMap<u64, Option<Array>>;

/// `inputs` as a vector-Jacobian product reads them: each one recomputed
/// for the backward pass ([`derived_recomputation`]) replaced by its
/// recomputation, started after `after` (the cotangents at hand).
fn for_backward(inputs: &[Array], after: &[Array], known: &mut Recomputed) -> Result<Vec<Array>> {
    inputs
        .iter()
        .map(|x| Ok(derived_recomputation(x, after, known, 3)?.unwrap_or_else(|| x.clone())))
        .collect()
}

/// `x`'s recomputation for the backward pass: its primitive's own
/// ([`Primitive::recompute_for_backward`]: a rematerialized value), or,
/// for a node computed by a compute primitive from recomputed values and
/// evaluated arrays only (a view or a cast of a gathered weight, which
/// shares or copies its buffer), the same primitive on their
/// recomputations: the forward pass's node is then read by forward nodes
/// only, and freed after them. `depth` bounds how far back the second kind
/// looks.
fn derived_recomputation(
    x: &Array,
    after: &[Array],
    known: &mut Recomputed,
    depth: usize,
) -> Result<Option<Array>> {
    if let Some(r) = known.get(&x.id()) {
        return Ok(r.clone());
    }
    let (primitive, inputs) = match x.lock().pending() {
        Some((p, i)) => (p.clone(), i.clone()),
        None => return Ok(None),
    };
    let found = match primitive
        .recompute_for_backward(&inputs, after)
        .transpose()?
    {
        Some(r) => Some(r),
        None if depth == 0
            || !matches!(x.node.kind, NodeKind::Single)
            || primitive.stream() != crate::Stream::Compute =>
        {
            None
        }
        None => {
            let mut read = Vec::with_capacity(inputs.len());
            let mut any = false;
            for i in &inputs {
                match derived_recomputation(i, after, known, depth - 1)? {
                    Some(r) => {
                        any = true;
                        read.push(r);
                    }
                    None if i.is_evaluated() => read.push(i.clone()),
                    None => {
                        any = false;
                        break;
                    }
                }
            }
            (any && read.len() == inputs.len()).then(|| {
                Array::with_state(
                    x.shape().to_vec(),
                    x.dtype(),
                    x.device(),
                    crate::array::State::Pending {
                        primitive,
                        inputs: read,
                    },
                )
            })
        }
    };
    known.insert(x.id(), found.clone());
    Ok(found)
}

/// `x`'s recomputation for the backward pass, if its primitive makes one
/// (see [`Primitive::recompute_for_backward`]).
pub(crate) fn recomputed(x: &Array, after: &[Array]) -> Result<Option<Array>> {
    derived_recomputation(x, after, &mut Recomputed::new(), 3)
}

/// Runs `f` on `primals` and returns its outputs and the vector-Jacobian
/// products of `cotangents` (one per output) with respect to each primal.
/// Integer and boolean primals get zero gradients.
pub fn vjp(
    f: impl FnOnce(&[Array]) -> Result<Vec<Array>>,
    primals: &[Array],
    cotangents: &[Array],
) -> Result<(Vec<Array>, Vec<Array>)> {
    let (outputs, grads) = vjp_reached(f, primals, cotangents)?;
    let grads = grads
        .into_iter()
        .zip(primals)
        .map(|(g, p)| g.unwrap_or_else(|| crate::zeros_like(p)))
        .collect();
    Ok((outputs, grads))
}

/// [`vjp`] with `None` for the primals no gradient reaches (and those that
/// are not floats), instead of zeros.
fn vjp_reached(
    f: impl FnOnce(&[Array]) -> Result<Vec<Array>>,
    primals: &[Array],
    cotangents: &[Array],
) -> Result<(Vec<Array>, Vec<Option<Array>>)> {
    let tracers: Vec<Array> = primals.iter().map(tracer).collect();
    let outputs = {
        let _tracing = Tracing::start();
        f(&tracers)?
    };
    if outputs.len() != cotangents.len() {
        return Err(Error::invalid(
            "vjp",
            format!(
                "{} outputs but {} cotangents",
                outputs.len(),
                cotangents.len()
            ),
        ));
    }
    let tracer_ids: HashSet<u64> = tracers.iter().map(Array::id).collect();
    let order = backward_order(&outputs, &tracer_ids);
    // Only nodes that depend on a tracer need a backward step.
    let mut active: HashSet<u64> = tracer_ids.clone();
    for (a, _, inputs) in &order {
        if inputs.iter().any(|i| active.contains(&i.id())) {
            active.insert(a.id());
        }
    }
    let mut cots: HashMap<u64, Array> = HashMap::new();
    for (o, c) in outputs.iter().zip(cotangents) {
        if c.shape() != o.shape() {
            return Err(Error::shape(
                "vjp",
                format!(
                    "cotangent of shape {:?} for an output of shape {:?}",
                    c.shape(),
                    o.shape()
                ),
            ));
        }
        if active.contains(&o.id()) {
            accumulate(&mut cots, o, c.astype(o.dtype())?)?;
        }
    }
    // The cotangents of a multi-output node's outputs, gathered from its
    // output nodes (which come after it in the order, so the walk back
    // reaches all of them before the node itself).
    let mut output_cots: HashMap<u64, Vec<Option<Array>>> = HashMap::new();
    let mut known = Recomputed::new();
    // Readers' inputs are looked at for recomputation only in a graph that
    // holds a rematerialized value: a plain training step's walk is as
    // before.
    let rematerialized = order
        .iter()
        .any(|(_, p, _)| p.name() == rematerialize::NAME);
    for (a, primitive, inputs) in order.iter().rev() {
        if tracer_ids.contains(&a.id()) || !active.contains(&a.id()) {
            continue;
        }
        let grads = match &a.node.kind {
            NodeKind::Output(index) => {
                if let Some(ct) = cots.remove(&a.id()) {
                    let node = &inputs[0];
                    let n = node.output_specs().map_or(0, <[_]>::len);
                    let slots = output_cots
                        .entry(node.id())
                        .or_insert_with(|| vec![None; n]);
                    slots[*index] = Some(match slots[*index].take() {
                        Some(prev) => prev.add(&ct)?,
                        None => ct,
                    });
                }
                continue;
            }
            NodeKind::Outputs(specs) => {
                let Some(cts) = output_cots.remove(&a.id()) else {
                    continue;
                };
                let outputs: Vec<Array> = (0..specs.len()).map(|i| a.output(i)).collect();
                let reached: Vec<Array> = cts.iter().flatten().cloned().collect();
                let recomputed;
                let read: &[Array] = if rematerialized {
                    recomputed = for_backward(inputs, &reached, &mut known)?;
                    &recomputed
                } else {
                    inputs
                };
                primitive.vjp_outputs(read, &outputs, &cts)?
            }
            NodeKind::Single => {
                let Some(ct) = cots.remove(&a.id()) else {
                    continue;
                };
                // Each input's cotangent so far, once per distinct input,
                // for the primitive to add in its own kernel; what it does
                // not take goes back, to be added to its gradient below.
                let mut gathered: Vec<Option<Array>> = inputs
                    .iter()
                    .enumerate()
                    .map(|(i, input)| {
                        let first = inputs[..i].iter().all(|o| o.id() != input.id());
                        first.then(|| cots.remove(&input.id())).flatten()
                    })
                    .collect();
                let recomputed;
                let read: &[Array] = if rematerialized {
                    recomputed = for_backward(inputs, std::slice::from_ref(&ct), &mut known)?;
                    &recomputed
                } else {
                    inputs
                };
                let grads = primitive.vjp_accumulating(read, a, &ct, &mut gathered)?;
                for (input, left) in inputs.iter().zip(gathered) {
                    if let Some(left) = left {
                        cots.insert(input.id(), left);
                    }
                }
                grads
            }
        };
        for (input, g) in inputs.iter().zip(grads) {
            if let Some(g) = g
                && active.contains(&input.id())
            {
                accumulate(&mut cots, input, g)?;
            }
        }
    }
    let grads = tracers
        .iter()
        .zip(primals)
        .map(|(t, p)| cots.remove(&t.id()).filter(|_| p.dtype().is_float()))
        .collect();
    Ok((outputs, grads))
}

/// `f`'s scalar value and its gradients with respect to the inputs at `argnums`.
pub fn value_and_grad<F>(
    f: F,
    argnums: &[usize],
) -> impl Fn(&[Array]) -> Result<(Array, Vec<Array>)>
where
    F: Fn(&[Array]) -> Result<Array>,
{
    let argnums = argnums.to_vec();
    move |args: &[Array]| {
        if let Some(&bad) = argnums.iter().find(|&&i| i >= args.len()) {
            return Err(Error::invalid(
                "value_and_grad",
                format!("argnum {bad} is out of range for {} arguments", args.len()),
            ));
        }
        let primals: Vec<Array> = argnums.iter().map(|&i| args[i].clone()).collect();
        scalar_vjp(
            |traced| {
                let mut full = args.to_vec();
                for (k, &i) in argnums.iter().enumerate() {
                    full[i] = traced[k].clone();
                }
                f(&full)
            },
            &primals,
        )
    }
}

/// Checks that `o` holds one element and returns it as a 0-d array, with the
/// shape to give the value back afterwards.
fn as_scalar(o: &Array) -> Result<(Array, Vec<usize>)> {
    if o.size() != 1 {
        return Err(Error::shape(
            "value_and_grad",
            format!(
                "the function must return a scalar, got shape {:?}",
                o.shape()
            ),
        ));
    }
    // A 0-d output is used as it is, so that its vjp sees the seed itself
    // (a constant 1 that fused losses can recognise) rather than a reshape.
    let scalar = if o.ndim() == 0 {
        o.clone()
    } else {
        o.reshape(&[])?
    };
    Ok((scalar, o.shape().to_vec()))
}

/// Runs `f` (returning one scalar) under [`vjp`] with a seed of 1 and gives
/// the value back in its original shape.
fn scalar_vjp(
    f: impl FnOnce(&[Array]) -> Result<Array>,
    primals: &[Array],
) -> Result<(Array, Vec<Array>)> {
    let mut out_shape = Vec::new();
    let (outs, grads) = vjp(
        |t| {
            let (o, shape) = as_scalar(&f(t)?)?;
            out_shape = shape;
            Ok(vec![o])
        },
        primals,
        &[Array::ones(&[], crate::Dtype::F32)],
    )?;
    let value = outs.into_iter().next().expect("one output");
    Ok((crate::reshape_to(&value, &out_shape)?, grads))
}

/// The gradients of `f`'s scalar value with respect to the inputs at `argnums`.
pub fn grad<F>(f: F, argnums: &[usize]) -> impl Fn(&[Array]) -> Result<Vec<Array>>
where
    F: Fn(&[Array]) -> Result<Array>,
{
    let vg = value_and_grad(f, argnums);
    move |args| Ok(vg(args)?.1)
}

/// `f`'s scalar value at `params` and its gradient as a tree of the same
/// structure (zeros for integer leaves).
pub fn value_and_grad_tree(
    f: impl FnOnce(&Tree) -> Result<Array>,
    params: &Tree,
) -> Result<(Array, Tree)> {
    let flat = params.flatten();
    let names: Vec<String> = flat.iter().map(|(n, _)| n.clone()).collect();
    let primals: Vec<Array> = flat.into_iter().map(|(_, a)| a).collect();
    let (value, grads) = scalar_vjp(
        |traced| {
            let tree = Tree::unflatten(names.iter().cloned().zip(traced.iter().cloned()))?;
            f(&restructure(params, &tree)?)
        },
        &primals,
    )?;
    let grads = restructure(params, &Tree::unflatten(names.into_iter().zip(grads))?)?;
    Ok((value, grads))
}

/// `values` (rebuilt from dotted names) in exactly the structure of `like`,
/// so that maps with numeric keys stay maps and empty subtrees survive.
fn restructure(like: &Tree, values: &Tree) -> Result<Tree> {
    let flat: HashMap<String, Array> = values.flatten().into_iter().collect();
    like.map(|path, _| {
        flat.get(path)
            .cloned()
            .ok_or_else(|| Error::invalid("value_and_grad", format!("no value for `{path}`")))
    })
}

mod checkpoint;
mod rematerialize;
pub use checkpoint::{Checkpointed, Depend, Recompute, checkpoint, depend};
pub use rematerialize::{Rematerialized, rematerialize, rematerialize_with};

#[cfg(feature = "conformance")]
pub(crate) mod spec;
