//! Rotary position embedding as one primitive (see [`crate::rope`]).

pub use crate::backend::common::rope::RopeSpec;
use crate::data::Operand;
use crate::{Array, ArrayData, Dtype, Primitive, Result};

/// Rotates the input's first features by position (see [`RopeSpec`]),
/// computing in f32 and storing the input's float dtype: a half input
/// needs no conversions around it (four kernels fewer per layer and step
/// on the GPU). The rotation is linear and orthogonal: its vector-Jacobian
/// product is the same primitive with the angle negated.
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
        use crate::backend::cpu::copy::copy_cast;
        let x = inputs[0].operand()?;
        if x.dtype == Dtype::F32 {
            return Ok(crate::backend::cpu::rope::rope(&x, &self.0));
        }
        let xf = copy_cast(&x, Dtype::F32);
        let rotated =
            crate::backend::cpu::rope::rope(&Operand::new(xf, x.shape, Dtype::F32), &self.0);
        Ok(copy_cast(
            &Operand::new(rotated, x.shape, Dtype::F32),
            x.dtype,
        ))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let inverse = RopeSpec {
            inverse: !self.0.inverse,
            ..self.0
        };
        Ok(vec![Some(Array::from_primitive(
            Rope(inverse),
            vec![ct.clone()],
            ct.shape().to_vec(),
            ct.dtype(),
        ))])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
