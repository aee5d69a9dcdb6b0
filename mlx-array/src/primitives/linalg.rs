//! Matrix multiplication.

use crate::backend::cpu::matmul;
use crate::{Array, ArrayData, Primitive, Result};

/// `a @ b` over the last two axes, batch axes already broadcast.
#[derive(Debug, Clone)]
pub struct Matmul;

impl Primitive for Matmul {
    fn name(&self) -> &'static str {
        "matmul"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, b) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::matmul(&a, &b, out.shape())
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, b) = (inputs[0].operand()?, inputs[1].operand()?);
        Ok(matmul::matmul(&a, &b, out.shape()))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let ga = ct.matmul(&b.swapaxes(-1, -2)?)?;
        let gb = a.swapaxes(-1, -2)?.matmul(ct)?;
        Ok(vec![Some(ga), Some(gb)])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
