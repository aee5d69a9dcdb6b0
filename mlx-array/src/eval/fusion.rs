//! Fusion planning: which elementwise GPU nodes of one eval are computed
//! inline by their reader, and the chains the GPU backend runs for them.
//!
//! An elementwise node (one whose primitive has a
//! [`Primitive::gpu_expression`]) whose only reader is another elementwise
//! node of the same shape on the GPU, and that nobody else holds, is not
//! computed on its own: its reader's kernel computes it inline, so the
//! chain `exp(x * y) + z` runs as one dispatch with no intermediate
//! buffers. The plan handed to the backend is a
//! [`FusedChain`](crate::backend::common::fusion::FusedChain): the nodes'
//! expressions, the evaluated arrays they read, the shape; what the kernel
//! promises about its results is written in `backend::gpu::fusion`.
//!
//! Likewise a product whose one reader is an add on the GPU (through
//! reshapes and a widening cast from a half dtype to f32, each read by
//! nothing else), and that nobody else holds, is not computed on its own:
//! the add runs the product's kernel with its other term as an addend
//! ([`Primitive::eval_gpu_adding`]), so a residual `x + h @ w` (in f32, or
//! a half-precision product added to an f32 stream) or a gradient's `a @ b + c @ d`
//! stores its sum from the product's epilogue, equal bit for bit, without
//! an add kernel or the product's buffer.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::array::State;
use crate::backend::common::fusion::{FusedChain, MAX_INPUTS, Step, StepInput};
use crate::primitive::Primitive;
use crate::shape::contiguous_strides;
use crate::{Array, ArrayData, Device, Dtype, Result};

/// Which nodes of one eval are left for their reader to compute inline.
#[derive(Default)]
pub(crate) struct Fusion {
    /// Node id → for each pending node that reads it: whether that reader
    /// could compute it inline (a fusible GPU node of the same shape).
    readers: HashMap<u64, Vec<bool>>,
    /// Ids of the fusible GPU nodes.
    fusible: HashSet<u64>,
    /// Ids of the GPU adds with a term that a product's kernel could add
    /// in (a product, maybe under reshapes and a widening cast).
    sums: HashSet<u64>,
    /// Ids of those products, reshapes and casts: deferred to the add when
    /// each has one reader and nobody else holds it.
    into_sum: HashSet<u64>,
    deferred: HashSet<u64>,
}

fn pending(a: &Array) -> Option<(Arc<dyn Primitive>, Vec<Array>)> {
    a.lock()
        .pending()
        .map(|(primitive, inputs)| (primitive.clone(), inputs.clone()))
}

/// A pending elementwise GPU node's expression and inputs.
fn expression(a: &Array) -> Option<(String, Vec<Array>)> {
    if a.device() != Device::Gpu {
        return None;
    }
    let (p, inputs) = pending(a)?;
    p.gpu_expression(&inputs, a).map(|e| (e, inputs))
}

impl Fusion {
    /// Plans for the nodes of `order` (each after its inputs).
    pub(crate) fn new(order: &[Array]) -> Fusion {
        // Ids and flags only: holding the arrays would defeat the
        // reference count that proves nobody else sees a node.
        let mut readers: HashMap<u64, Vec<bool>> = HashMap::new();
        let mut fusible = HashSet::new();
        let (mut sums, mut into_sum) = (HashSet::new(), HashSet::new());
        if order.iter().all(|a| a.device() == Device::Cpu) {
            return Fusion::default(); // nothing to fuse on a CPU-only graph
        }
        for a in order {
            let Some((primitive, inputs)) = pending(a) else {
                continue;
            };
            let is_fusible = expression(a).is_some();
            if is_fusible {
                fusible.insert(a.id());
                if is_sum(&*primitive, &inputs, a) {
                    for i in &inputs {
                        if let Some(chain) = product_chain(i) {
                            sums.insert(a.id());
                            into_sum.extend(chain);
                        }
                    }
                }
            }
            for i in inputs {
                let inline = is_fusible && i.shape() == a.shape();
                readers.entry(i.id()).or_default().push(inline);
            }
        }
        Fusion {
            readers,
            fusible,
            sums,
            into_sum,
            deferred: HashSet::new(),
        }
    }

    /// True (and remembered) when `a` should be computed by its reader.
    /// `a` is the evaluator's own handle, so two references mean: the
    /// evaluator and the one pending reader; nobody else can see it.
    pub(crate) fn defer(&mut self, a: &Array) -> bool {
        let Some(readers) = self.readers.get(&a.id()) else {
            return false;
        };
        let alone = Arc::strong_count(&a.node) == 2;
        let inline = readers == &[true] && self.fusible.contains(&a.id());
        let ok = alone && (inline || (readers.len() == 1 && self.into_sum.contains(&a.id())));
        if ok {
            self.deferred.insert(a.id());
        }
        ok
    }

    /// Computes the GPU node `out` with its deferred inputs inlined (an
    /// elementwise chain, or an add in a product's kernel); `None` when
    /// nothing was deferred into it.
    pub(crate) fn run(&mut self, out: &Array) -> Result<Option<ArrayData>> {
        if self.deferred.is_empty() {
            return Ok(None);
        }
        if self.sums.contains(&out.id())
            && let Some(data) = self.product_sum(out)?
        {
            return Ok(Some(data));
        }
        // A product deferred to an add that does not take it after all
        // (`out` reads it through a reshape that runs on its own, or the
        // add's other term does not suit the kernel): computed now.
        if !self.into_sum.is_empty()
            && let Some((_, inputs)) = pending(out)
        {
            for i in &inputs {
                if self.into_sum.contains(&i.id()) {
                    self.materialize(i)?;
                }
            }
        }
        let Some((_, inputs)) = expression(out) else {
            return Ok(None);
        };
        if !inputs.iter().any(|i| self.deferred.contains(&i.id())) {
            return Ok(None);
        }
        let mut chain = Chain::default();
        if chain.node(self, out).is_none() || chain.leaves.len() > MAX_INPUTS {
            // Too wide for one kernel: compute the deferred inputs on their own.
            for i in &inputs {
                self.materialize(i)?;
            }
            return Ok(None);
        }
        let plan = FusedChain {
            inputs: chain
                .leaves
                .iter()
                .map(|a| Ok((a.data()?, a.dtype())))
                .collect::<Result<_>>()?,
            steps: chain.steps,
            shape: out.shape().to_vec(),
        };
        crate::backend::gpu::fusion::run(&plan).map(Some)
    }

    /// Computes the add `out` in the kernel of a product deferred into it
    /// (the last such term), its other term evaluated first and read as
    /// the addend; `None` when no term is such a product or the other
    /// term is not a dense array of `out`'s shape and dtype (the product
    /// is then computed on its own).
    fn product_sum(&mut self, out: &Array) -> Result<Option<ArrayData>> {
        let Some((_, inputs)) = pending(out) else {
            return Ok(None);
        };
        let Some((k, product)) = (0..inputs.len())
            .rev()
            .find_map(|k| Some((k, self.deferred_product(&inputs[k])?)))
        else {
            return Ok(None);
        };
        let other = &inputs[1 - k];
        self.materialize(other)?;
        let addend = other.operand()?;
        if other.dtype() != out.dtype() || other.shape() != out.shape() || !addend.is_contiguous() {
            self.materialize(&inputs[k])?;
            return Ok(None);
        }
        let (primitive, operands) = pending(&product).expect("deferred nodes are pending");
        let data = primitive.eval_gpu_adding(&operands, &product, &addend)?;
        // The term's reshapes, cast and product are computed by this kernel.
        let mut node = inputs[k].clone();
        while self.deferred.remove(&node.id()) && node.id() != product.id() {
            let (_, ins) = pending(&node).expect("deferred nodes are pending");
            node = ins[0].clone();
        }
        Ok(Some(
            data.view(contiguous_strides(out.shape()), data.offset()),
        ))
    }

    /// The product at the bottom of `x` when `x` is a product, reshape or
    /// cast deferred to the add that reads it.
    fn deferred_product(&self, x: &Array) -> Option<Array> {
        let mut node = x.clone();
        loop {
            if !(self.deferred.contains(&node.id()) && self.into_sum.contains(&node.id())) {
                return None;
            }
            let (primitive, inputs) = pending(&node)?;
            if primitive.gpu_adds_in_kernel(&inputs, &node) {
                return Some(node);
            }
            node = inputs.into_iter().next()?;
        }
    }

    /// The profile's name for `out`'s run when an add computes it in a
    /// product's kernel (`matmul_add`), else `None`.
    pub(crate) fn label(&self, out: &Array) -> Option<&'static str> {
        if !self.sums.contains(&out.id()) {
            return None;
        }
        let (_, inputs) = pending(out)?;
        inputs
            .iter()
            .any(|i| self.deferred_product(i).is_some())
            .then_some("matmul_add")
    }

    /// Evaluates a deferred node on its own (fusing what was deferred into it).
    fn materialize(&mut self, a: &Array) -> Result<()> {
        if !self.deferred.remove(&a.id()) {
            return Ok(());
        }
        let data = match self.run(a)? {
            Some(d) => d,
            None => {
                let (p, inputs) = pending(a).expect("deferred nodes are pending");
                for i in &inputs {
                    self.materialize(i)?;
                }
                p.eval_gpu(&inputs, a)?
            }
        };
        *a.lock() = State::Ready(data);
        Ok(())
    }
}

/// Whether `primitive` is a float add on the GPU of two terms of
/// `out`'s shape and dtype, which [`Fusion::product_sum`] may compute in a
/// product's kernel.
fn is_sum(primitive: &dyn Primitive, inputs: &[Array], out: &Array) -> bool {
    primitive.name() == "add"
        && matches!(out.dtype(), Dtype::F32 | Dtype::F16 | Dtype::BF16)
        && inputs.len() == 2
        && inputs
            .iter()
            .all(|i| i.dtype() == out.dtype() && i.shape() == out.shape())
}

/// The ids of `x` and of the reshapes and widening cast (a half dtype to
/// f32, exact)
/// under it down to a pending GPU node whose kernel can add a term in
/// ([`Primitive::gpu_adds_in_kernel`]), when there is one.
fn product_chain(x: &Array) -> Option<Vec<u64>> {
    let mut chain = Vec::new();
    let mut node = x.clone();
    loop {
        if node.device() != Device::Gpu {
            return None;
        }
        let (primitive, inputs) = pending(&node)?;
        chain.push(node.id());
        if primitive.gpu_adds_in_kernel(&inputs, &node) {
            return Some(chain);
        }
        let widening = primitive.name() == "astype"
            && node.dtype() == Dtype::F32
            && matches!(inputs[0].dtype(), Dtype::F16 | Dtype::BF16);
        if primitive.name() != "reshape" && !widening {
            return None;
        }
        node = inputs.into_iter().next()?;
    }
}

/// A fused chain under construction: the evaluated arrays it reads, and
/// its steps, each after the steps it reads.
#[derive(Default)]
struct Chain {
    leaves: Vec<Array>,
    steps: Vec<Step>,
}

impl Chain {
    /// Adds `a`'s step (after the steps of the deferred nodes it reads).
    /// `None` when an input cannot be read here.
    fn node(&mut self, f: &Fusion, a: &Array) -> Option<StepInput> {
        let (expression, inputs) = expression(a)?;
        let operands: Vec<StepInput> = inputs
            .iter()
            .map(|i| self.operand(f, i))
            .collect::<Option<_>>()?;
        self.steps.push(Step {
            expression,
            operands,
            dtype: a.dtype(),
        });
        Some(StepInput::Step(self.steps.len() - 1))
    }

    /// A deferred input's step, or an evaluated input read by the kernel.
    fn operand(&mut self, f: &Fusion, i: &Array) -> Option<StepInput> {
        if f.deferred.contains(&i.id()) {
            return self.node(f, i);
        }
        let k = match self.leaves.iter().position(|l| l.id() == i.id()) {
            Some(k) => k,
            None => {
                if !i.is_evaluated() {
                    return None;
                }
                self.leaves.push(i.clone());
                self.leaves.len() - 1
            }
        };
        Some(StepInput::Input(k))
    }
}
