//! Rotary position embedding as one primitive (see [`crate::rope`]).

pub use crate::backend::common::rope::RopeSpec;
use crate::{Array, ArrayData, Primitive, Result};

/// Rotates the f32 input's first features by position (see [`RopeSpec`]).
/// The rotation is linear and orthogonal: its vector-Jacobian product is
/// the same primitive with the angle negated.
#[derive(Debug, Clone, Copy)]
pub struct Rope(pub RopeSpec);

impl Primitive for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        crate::backend::gpu::rope(&inputs[0].operand()?, &self.0)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        Ok(crate::backend::cpu::rope::rope(
            &inputs[0].operand()?,
            &self.0,
        ))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let inverse = RopeSpec {
            inverse: !self.0.inverse,
            ..self.0
        };
        Ok(vec![Some(Array::from_primitive(
            Rope(inverse),
            vec![ct.astype(crate::Dtype::F32)?],
            ct.shape().to_vec(),
            crate::Dtype::F32,
        ))])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
