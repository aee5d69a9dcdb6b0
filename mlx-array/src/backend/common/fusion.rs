//! A fused chain of elementwise nodes, as the evaluator plans it
//! (`eval::fusion`) and a backend runs it (`backend::gpu::fusion`): plain
//! data, the nodes' expressions and where each operand comes from, so the
//! backend needs to know nothing of arrays or graphs.

use crate::{ArrayData, Dtype};

/// Inputs one fused kernel may read. The GPU binds them, `params` and the
/// output as storage buffers, and 8 per shader stage is the limit every
/// wgpu adapter guarantees; a wider chain is split by the planner.
pub const MAX_INPUTS: usize = 6;

/// Where a step reads one operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StepInput {
    /// An element of the chain's input `k` ([`FusedChain::inputs`]).
    Input(usize),
    /// The value of an earlier step (an intermediate no one else reads).
    Step(usize),
}

/// One elementwise node of a chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The node's expression over `a0`, `a1`, … (operand `n` is `a{n}`, in
    /// its dtype's compute type), as its primitive's
    /// `Primitive::gpu_expression` writes it.
    pub expression: String,
    /// Where each `a{n}` comes from.
    pub operands: Vec<StepInput>,
    /// The node's dtype: its value is rounded to it, as storing it would.
    pub dtype: Dtype,
}

/// Elementwise nodes computed by one kernel: every step after the steps it
/// reads, the last one the output (the only value stored), all of `shape`.
#[derive(Debug, Clone)]
pub struct FusedChain {
    /// The evaluated arrays the kernel reads, each a view of `shape`, with
    /// its dtype; at most [`MAX_INPUTS`].
    pub inputs: Vec<(ArrayData, Dtype)>,
    /// The nodes, in the order they are computed.
    pub steps: Vec<Step>,
    /// The shape of every node of the chain.
    pub shape: Vec<usize>,
}

impl FusedChain {
    /// The dtype of the output (the last step's); `None` without steps.
    pub fn dtype(&self) -> Option<Dtype> {
        self.steps.last().map(|s| s.dtype)
    }
}
