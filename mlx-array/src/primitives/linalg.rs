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
    fn gpu_adds_in_kernel(&self, inputs: &[Array], out: &Array) -> bool {
        let dtype = out.dtype();
        inputs.iter().all(|x| x.dtype() == dtype)
            && crate::backend::gpu::product_adds_in_kernel(dtype)
    }
    fn eval_gpu_adding(
        &self,
        inputs: &[Array],
        out: &Array,
        addend: &crate::Operand<'_>,
    ) -> Result<ArrayData> {
        let (a, b) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::matmul_adding(&a, &b, out.shape(), addend)
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, b) = (inputs[0].operand()?, inputs[1].operand()?);
        Ok(matmul::matmul(&a, &b, out.shape()))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let ga = ct.matmul(&b.swapaxes(-1, -2)?)?;
        // A matrix used transposed (`x @ w^T`, as linear layers use their
        // weights) gets its gradient as `(ct^T @ a)^T`: the same products,
        // stored in the matrix's own layout, so that the transpose's
        // gradient (the weight's) is dense and the optimizer copies nothing
        // before its update.
        let gb = if a.ndim() == 2 && ct.ndim() == 2 && is_transposed_matrix(b) {
            ct.swapaxes(-1, -2)?.matmul(a)?.swapaxes(-1, -2)?
        } else {
            a.swapaxes(-1, -2)?.matmul(ct)?
        };
        Ok(vec![Some(ga), Some(gb)])
    }
}

/// Whether `b` is a matrix read transposed: computed by a transpose, or
/// (already evaluated) a column-major view.
fn is_transposed_matrix(b: &Array) -> bool {
    if b.ndim() != 2 {
        return false;
    }
    match b.primitive_name() {
        Some(name) => name == "transpose",
        None => b.data().is_ok_and(|d| {
            let s = d.strides();
            s[0] == 1 && s[1] != 1
        }),
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
