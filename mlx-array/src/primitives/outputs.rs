//! `Output`: one output of a primitive with several (see
//! [`Array::from_primitive_outputs`]), read from their shared node without
//! a copy.

use crate::{Array, ArrayData, Primitive, Result};

/// Output `index` of the multi-output node that is its one input. The
/// evaluator runs that node's primitive once for all its outputs; autodiff
/// hands this node's cotangent to that primitive's
/// [`Primitive::vjp_outputs`] together with its siblings' ones, so this
/// primitive has no `vjp` of its own.
#[derive(Debug, Clone, Copy)]
pub struct Output {
    /// Which output.
    pub index: usize,
}

impl Primitive for Output {
    fn name(&self) -> &'static str {
        "output"
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].output_data(self.index)
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].output_data(self.index)
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
