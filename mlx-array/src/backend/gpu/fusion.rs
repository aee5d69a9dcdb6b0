//! Fusing chains of elementwise GPU nodes into one kernel.
//!
//! An elementwise node whose only reader is another elementwise node of the
//! same shape on the GPU, and that nobody else holds, is not computed on
//! its own: its reader's kernel computes it inline, so the chain
//! `exp(x * y) + z` runs as one dispatch with no intermediate buffers.
//!
//! # What fusion promises
//!
//! A fused kernel evaluates every node with the same WGSL expression the
//! node's own kernel uses, in the same compute type, and rounds every
//! intermediate of a half dtype (`f16`, `bf16`) to that dtype exactly as
//! storing it would ([`super::codegen::round_to`]: round to nearest even in
//! integer arithmetic, the very function the stores use, so no driver's
//! choice of conversion rounding can split the two). Hence:
//!
//! - Half dtypes: fused and unfused results are equal bit for bit wherever
//!   each op is deterministic. A rounded intermediate is also a barrier to
//!   contraction, so no multiply-add can straddle it.
//! - `f32`: intermediates are the exact `f32` values the unfused kernels
//!   would store, so results are equal bit for bit except where a multiply
//!   feeds an add or subtract: WGSL lets an implementation contract
//!   `a * b + c` into one FMA, which inside a fused kernel can span what
//!   would be two kernels. There the fused result is the better rounded one and
//!   differs by at most one rounding of the product.
//!
//! `gpu_conformance`'s elementwise specs assert exactly this (bit equality
//! for half dtypes and for `f32` chains without a multiply-add, one rounding
//! of the product otherwise), plus agreement with the CPU backend.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use super::codegen::{compute_type, round_to};
use super::elementwise::map_with;
use crate::array::State;
use crate::data::ArrayData;
use crate::primitive::Primitive;
use crate::{Array, Device, Dtype, Result};

/// Inputs a fused kernel may read (storage bindings: these, `params` and `out`).
const MAX_LEAVES: usize = 6;

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
        let mut k = Kernel::default();
        let result = match k.node(self, out) {
            Some(v) if k.leaves.len() <= MAX_LEAVES => v,
            _ => {
                // Too wide for one kernel: compute the deferred inputs on their own.
                for i in &inputs {
                    self.materialize(i)?;
                }
                return Ok(None);
            }
        };
        let leaves: Vec<ArrayData> = k.leaves.iter().map(|a| a.data()).collect::<Result<_>>()?;
        let typed: Vec<(&ArrayData, Dtype)> = leaves
            .iter()
            .zip(&k.leaves)
            .map(|(d, a)| (d, a.dtype()))
            .collect();
        let key = format!("fused:{}=>{}", k.statements, result);
        map_with(
            &key,
            &k.statements,
            &result,
            out.shape(),
            &typed,
            out.dtype(),
        )
        .map(Some)
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

/// A fused kernel under construction.
#[derive(Default)]
struct Kernel {
    leaves: Vec<Array>,
    statements: String,
    temps: usize,
}

impl Kernel {
    /// The WGSL value of `a`: a leaf load, or (for deferred nodes) a temporary
    /// computed from its inputs. `None` when an input cannot be read here.
    fn node(&mut self, f: &Fusion, a: &Array) -> Option<String> {
        let (expr, inputs) = expression(a)?;
        let operands: Vec<String> = inputs
            .iter()
            .map(|i| self.operand(f, i))
            .collect::<Option<_>>()?;
        // Through placeholders, so a substituted leaf name is never replaced again.
        let mut e = expr;
        for n in 0..operands.len() {
            e = e.replace(&format!("a{n}"), &format!("@{n}@"));
        }
        for (n, v) in operands.iter().enumerate() {
            e = e.replace(&format!("@{n}@"), v);
        }
        let t = format!("t{}", self.temps);
        self.temps += 1;
        let rounded = round_to(a.dtype(), &e);
        self.statements.push_str(&format!(
            "    let {t}: {} = {rounded};\n",
            compute_type(a.dtype())
        ));
        Some(t)
    }

    fn operand(&mut self, f: &Fusion, i: &Array) -> Option<String> {
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
        Some(format!("a{k}"))
    }
}
