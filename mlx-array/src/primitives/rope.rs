//! Rotary position embedding as one primitive (see [`crate::rope`]).

pub use crate::backend::common::rope::RopeSpec;
use crate::data::Operand;
use crate::{Array, ArrayData, Dtype, Primitive, Result};

/// Rotates the input's first features by position (see [`RopeSpec`]),
/// computing in f32 and storing the input's float dtype: a half input
/// needs no conversions around it (four kernels fewer per layer and step
/// on the GPU). The rotation is linear and orthogonal: its vector-Jacobian
/// product is the same primitive with the angle negated (the same
/// frequencies, explicit ones included).
#[derive(Debug, Clone)]
pub struct Rope {
    /// The rotation.
    pub spec: RopeSpec,
    /// On the GPU, store the output in its input's memory order where the
    /// input is a permutation of a dense block (the gradient's rotation:
    /// it reads the attention's gradients, stored `[B, L, H, d]` and viewed
    /// `[B, H, L, d]`, and the transpose back to `[B, L, H, d]` after it
    /// is then a view, not a copy). The values do not depend on it.
    pub keep_order: bool,
}

impl Primitive for Rope {
    fn name(&self) -> &'static str {
        "rope"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        crate::backend::gpu::rope(&inputs[0].operand()?, &self.spec, self.keep_order)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        use crate::backend::cpu::copy::copy_cast;
        let x = inputs[0].operand()?;
        if x.dtype == Dtype::F32 {
            return Ok(crate::backend::cpu::rope::rope(&x, &self.spec));
        }
        let xf = copy_cast(&x, Dtype::F32);
        let rotated =
            crate::backend::cpu::rope::rope(&Operand::new(xf, x.shape, Dtype::F32), &self.spec);
        Ok(copy_cast(
            &Operand::new(rotated, x.shape, Dtype::F32),
            x.dtype,
        ))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let inverse = RopeSpec {
            inverse: !self.spec.inverse,
            ..self.spec.clone()
        };
        let rope = Rope {
            spec: inverse,
            keep_order: true,
        };
        Ok(vec![Some(Array::from_primitive(
            rope,
            vec![ct.clone()],
            ct.shape().to_vec(),
            ct.dtype(),
        ))])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
