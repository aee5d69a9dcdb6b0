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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use crate::array::State;
use crate::backend::common::fusion::{FusedChain, MAX_INPUTS, Step, StepInput};
use crate::primitive::Primitive;
use crate::{Array, ArrayData, Device, Result};

/// Which nodes of one eval are left for their reader to compute inline.
#[derive(Default)]
pub(crate) struct Fusion {
    /// Node id → for each pending node that reads it: whether that reader
    /// could compute it inline (a fusible GPU node of the same shape).
    readers: HashMap<u64, Vec<bool>>,
    /// Ids of the fusible GPU nodes.
    fusible: HashSet<u64>,
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
        if order.iter().all(|a| a.device() == Device::Cpu) {
            return Fusion::default(); // nothing to fuse on a CPU-only graph
        }
        for a in order {
            let Some((_, inputs)) = pending(a) else {
                continue;
            };
            let is_fusible = expression(a).is_some();
            if is_fusible {
                fusible.insert(a.id());
            }
            for i in inputs {
                let inline = is_fusible && i.shape() == a.shape();
                readers.entry(i.id()).or_default().push(inline);
            }
        }
        Fusion {
            readers,
            fusible,
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
        let ok =
            readers == &[true] && self.fusible.contains(&a.id()) && Arc::strong_count(&a.node) == 2;
        if ok {
            self.deferred.insert(a.id());
        }
        ok
    }

    /// Computes `out` (an elementwise GPU node) with its deferred inputs
    /// inlined; `None` when nothing was deferred into it.
    pub(crate) fn run(&mut self, out: &Array) -> Result<Option<ArrayData>> {
        if self.deferred.is_empty() {
            return Ok(None);
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
