//! Gathers and joins: `take`, `take_along_axis`, `concatenate`, `pad`.

use crate::backend::cpu::indexing as k;
use crate::shape::contiguous_strides;
use crate::{Array, ArrayData, Primitive, Result};

/// Selects entries along `axis` by an integer index array.
#[derive(Debug, Clone)]
pub struct Take(pub usize);

impl Primitive for Take {
    fn name(&self) -> &'static str {
        "take"
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, i) = (&inputs[0], &inputs[1]);
        k::take(
            &a.data()?,
            a.shape(),
            a.dtype(),
            &i.data()?,
            i.shape(),
            i.dtype(),
            self.0,
            out.shape(),
        )
    }
}

/// Picks, at every position, the entry along `axis` named by the index array.
#[derive(Debug, Clone)]
pub struct TakeAlongAxis(pub usize);

impl Primitive for TakeAlongAxis {
    fn name(&self) -> &'static str {
        "take_along_axis"
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, i) = (&inputs[0], &inputs[1]);
        k::take_along_axis(
            &a.data()?,
            a.shape()[self.0],
            a.dtype(),
            &i.data()?,
            i.dtype(),
            self.0,
            out.shape(),
        )
    }
}

/// Joins inputs of one dtype along `axis`.
#[derive(Debug, Clone)]
pub struct Concatenate(pub usize);

impl Primitive for Concatenate {
    fn name(&self) -> &'static str {
        "concatenate"
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        let stride = contiguous_strides(out.shape())[self.0] as usize;
        let mut at = 0;
        for x in inputs {
            k::copy_into(
                &mut data,
                out.shape(),
                at * stride,
                &x.data()?,
                x.shape(),
                x.dtype(),
            );
            at += x.shape()[self.0];
        }
        Ok(data)
    }
}

/// Surrounds the input with a constant: `low[i]` before and the rest after on axis `i`.
#[derive(Debug, Clone)]
pub struct Pad {
    /// Elements added before each axis.
    pub low: Vec<usize>,
    /// The fill value (cast to the dtype).
    pub value: f64,
}

impl Primitive for Pad {
    fn name(&self) -> &'static str {
        "pad"
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let mut data = k::filled(out.shape(), out.dtype(), self.value);
        let strides = contiguous_strides(out.shape());
        let offset: isize = self
            .low
            .iter()
            .zip(&strides)
            .map(|(&l, &s)| l as isize * s)
            .sum();
        if x.size() > 0 {
            k::copy_into(
                &mut data,
                out.shape(),
                offset as usize,
                &x.data()?,
                x.shape(),
                x.dtype(),
            );
        }
        Ok(data)
    }
}
