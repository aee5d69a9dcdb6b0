//! Softmax over the last axis as one primitive.
//!
//! The composite graph (`exp(x - max)` then a divide by its sum) keeps both
//! the exponentials and the result alive for its gradient; this primitive
//! keeps only the result, writes it over its input when nobody else reads
//! that, and makes one pass per row. In attention that is one scores-sized
//! buffer per layer less for the backward pass.

use crate::backend::cpu::loss;
use crate::{Array, ArrayData, Primitive, Result};

/// `exp(x - max) / sum(exp(x - max))` along the last axis.
#[derive(Debug, Clone)]
pub struct Softmax;

impl Primitive for Softmax {
    fn name(&self) -> &'static str {
        "softmax"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        crate::backend::gpu::softmax(&inputs[0].operand()?)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let operand = x.operand()?;
        let donated = x.is_donatable(&operand.data);
        loss::softmax(operand, donated)
    }
    fn vjp(&self, _inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        // d x = p * (ct - sum(ct * p)) per row, with p the softmax.
        let dot = ct.multiply(out)?.sum(&[-1], true)?;
        Ok(vec![Some(out.multiply(&ct.subtract(&dot)?)?)])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
