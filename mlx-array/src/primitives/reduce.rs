//! Reductions, arg-reductions and scans.

pub use crate::backend::common::reduce::ReduceOp;
use crate::backend::cpu::{reduce, scan};
use crate::{Array, ArrayData, Primitive, Result};

/// Reduces over `axes` (sorted); the output drops those axes.
#[derive(Debug, Clone)]
pub struct Reduce {
    /// The combining operation.
    pub op: ReduceOp,
    /// Axes reduced, sorted and distinct.
    pub axes: Vec<usize>,
}

impl Primitive for Reduce {
    fn name(&self) -> &'static str {
        match self.op {
            ReduceOp::Sum => "sum",
            ReduceOp::Prod => "prod",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        crate::backend::gpu::reduce(self.op, &inputs[0].operand()?, &self.axes)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        Ok(reduce::reduce(self.op, &inputs[0].operand()?, &self.axes))
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let x = &inputs[0];
        if !x.dtype().is_float() {
            return crate::primitive::no_gradient(inputs);
        }
        let kept: Vec<usize> = (0..x.ndim())
            .map(|a| {
                if self.axes.contains(&a) {
                    1
                } else {
                    x.shape()[a]
                }
            })
            .collect();
        let ct_b = crate::reshape_to(ct, &kept)?.broadcast_to(x.shape())?;
        let out_b = crate::reshape_to(out, &kept)?.broadcast_to(x.shape())?;
        let g = match self.op {
            ReduceOp::Sum => ct_b,
            // Valid where x != 0 (the usual closed form).
            ReduceOp::Prod => ct_b.multiply(&out_b)?.divide(x)?,
            ReduceOp::Max | ReduceOp::Min => {
                // Split equally between tied extremes.
                let hit = x.equal(&out_b)?.astype(x.dtype())?;
                let axes: Vec<i32> = self.axes.iter().map(|&a| a as i32).collect();
                let count = hit.sum(&axes, true)?;
                ct_b.multiply(&hit)?.divide(&count)?
            }
        };
        Ok(vec![Some(g)])
    }
}

/// Index of the maximum (or minimum) along one axis, as uint32; the axis is dropped.
#[derive(Debug, Clone)]
pub struct ArgReduce {
    /// Argmax when true, argmin otherwise.
    pub is_max: bool,
    /// The axis searched.
    pub axis: usize,
}

impl Primitive for ArgReduce {
    fn name(&self) -> &'static str {
        if self.is_max { "argmax" } else { "argmin" }
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        crate::backend::gpu::arg_reduce(self.is_max, &inputs[0].operand()?, self.axis)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        Ok(reduce::arg_reduce(
            self.is_max,
            &inputs[0].operand()?,
            self.axis,
        ))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        crate::primitive::no_gradient(inputs)
    }
}

/// Cumulative sum along one axis.
#[derive(Debug, Clone)]
pub struct CumSum {
    /// The axis scanned.
    pub axis: usize,
    /// Scan from the end.
    pub reverse: bool,
    /// Include the current element (exclusive otherwise).
    pub inclusive: bool,
}

impl Primitive for CumSum {
    fn name(&self) -> &'static str {
        "cumsum"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = inputs[0].operand()?;
        crate::backend::gpu::cumsum(&x, self.axis, self.reverse, self.inclusive)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = inputs[0].operand()?;
        Ok(scan::cumsum(&x, self.axis, self.reverse, self.inclusive))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        if !inputs[0].dtype().is_float() {
            return crate::primitive::no_gradient(inputs);
        }
        Ok(vec![Some(ct.cumsum(
            self.axis as i32,
            !self.reverse,
            self.inclusive,
        )?)])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
