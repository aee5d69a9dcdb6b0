//! Reductions, arg-reductions and scans.

use crate::backend::cpu::{reduce, scan};
use crate::{Array, ArrayData, Primitive, Result};

/// How values combine in a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

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
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        Ok(reduce::reduce(
            self.op,
            &x.data()?,
            x.shape(),
            x.dtype(),
            &self.axes,
        ))
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
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        Ok(reduce::arg_reduce(
            self.is_max,
            &x.data()?,
            x.shape(),
            x.dtype(),
            self.axis,
        ))
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
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        Ok(scan::cumsum(
            &x.data()?,
            x.shape(),
            x.dtype(),
            self.axis,
            self.reverse,
            self.inclusive,
        ))
    }
}
