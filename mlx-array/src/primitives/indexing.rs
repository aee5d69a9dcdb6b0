//! Gathers and joins: `take`, `take_along_axis`, `concatenate`, `pad`.

use crate::backend::cpu::indexing as k;
use crate::shape::contiguous_strides;
use crate::{Array, ArrayData, Operand, Primitive, Result};

/// Selects entries along `axis` by an integer index array.
#[derive(Debug, Clone)]
pub struct Take(pub usize);

impl Primitive for Take {
    fn name(&self) -> &'static str {
        "take"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, i) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::take(&a, &i, self.0, out.shape())
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, i) = (inputs[0].operand()?, inputs[1].operand()?);
        k::take(&a, &i, self.0, out.shape())
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        ScatterAdd {
            axis: self.0,
            along_axis: false,
        }
        .gradient(inputs, ct)
    }
}

/// Picks, at every position, the entry along `axis` named by the index array.
#[derive(Debug, Clone)]
pub struct TakeAlongAxis(pub usize);

impl Primitive for TakeAlongAxis {
    fn name(&self) -> &'static str {
        "take_along_axis"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (a, i) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::take_along_axis(&a, &i, self.0)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (a, i) = (inputs[0].operand()?, inputs[1].operand()?);
        k::take_along_axis(&a, &i, self.0)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        ScatterAdd {
            axis: self.0,
            along_axis: true,
        }
        .gradient(inputs, ct)
    }
}

/// Joins inputs of one dtype along `axis`.
#[derive(Debug, Clone)]
pub struct Concatenate(pub usize);

impl Primitive for Concatenate {
    fn name(&self) -> &'static str {
        "concatenate"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let parts = inputs
            .iter()
            .map(Array::operand)
            .collect::<Result<Vec<_>>>()?;
        crate::backend::gpu::concatenate(&parts, out.dtype(), self.0, out.shape())
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        let stride = contiguous_strides(out.shape())[self.0] as usize;
        let mut at = 0;
        for x in inputs {
            k::copy_into(&mut data, out.shape(), at * stride, &x.operand()?);
            at += x.shape()[self.0];
        }
        Ok(data)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let mut at = 0;
        inputs
            .iter()
            .map(|x| {
                let n = x.shape()[self.0];
                at += n;
                Ok(Some(crate::slice_axis(
                    ct,
                    self.0 as i32,
                    (at - n) as i64,
                    at as i64,
                )?))
            })
            .collect()
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
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = inputs[0].operand()?;
        crate::backend::gpu::pad(&x, &self.low, self.value, out.shape())
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
            k::copy_into(&mut data, out.shape(), offset as usize, &x.operand()?);
        }
        Ok(data)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let args: Vec<crate::SliceArg> = self
            .low
            .iter()
            .zip(inputs[0].shape())
            .map(|(&l, &d)| crate::SliceArg::range(l as i64, (l + d) as i64))
            .collect();
        Ok(vec![Some(ct.slice(&args)?)])
    }
}

/// Adds a cotangent into zeros at indexed positions: the gradient of
/// [`Take`] (`along_axis` false) and [`TakeAlongAxis`] (true). Inputs: the
/// cotangent and the indices; the output has the gathered array's shape.
#[derive(Debug, Clone)]
pub struct ScatterAdd {
    /// The axis that was indexed.
    pub axis: usize,
    /// Whether the gather was `take_along_axis`.
    pub along_axis: bool,
}

impl ScatterAdd {
    /// The vjp of the gather it undoes: `ct` scattered back to the shape of
    /// the gathered array (`inputs[0]`) at the indices (`inputs[1]`).
    fn gradient(self, inputs: &[Array], ct: &Array) -> Result<Vec<Option<Array>>> {
        let g = Array::from_primitive(
            self,
            vec![ct.clone(), inputs[1].clone()],
            inputs[0].shape().to_vec(),
            ct.dtype(),
        );
        Ok(vec![Some(g), None])
    }
}

impl Primitive for ScatterAdd {
    fn name(&self) -> &'static str {
        "scatter_add"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (c, i) = (inputs[0].operand()?, inputs[1].operand()?);
        crate::backend::gpu::scatter_add(&c, &i, self.axis, self.along_axis, out.shape())
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (c, i) = (inputs[0].operand()?, inputs[1].operand()?);
        k::scatter_add(&c, &i, self.axis, self.along_axis, out.shape())
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let g = if self.along_axis {
            ct.take_along_axis(&inputs[1], self.axis as i32)?
        } else {
            ct.take(&inputs[1], self.axis as i32)?
        };
        Ok(vec![Some(g), None])
    }
}

/// A copy of the first input with a strided window replaced by the second.
#[derive(Debug, Clone)]
pub struct SliceUpdate {
    /// First index of the window on each axis.
    pub start: Vec<usize>,
    /// Step on each axis.
    pub step: Vec<isize>,
}

impl Primitive for SliceUpdate {
    fn name(&self) -> &'static str {
        "slice_update"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        // The base read as the output (the op gives both one shape and dtype).
        let base = Operand::new(inputs[0].data()?, out.shape(), out.dtype());
        let upd = inputs[1].operand()?;
        crate::backend::gpu::slice_update(&base, &upd, &self.start, &self.step)
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (base, upd) = (&inputs[0], &inputs[1]);
        let mut data = crate::backend::cpu::copy::copy_cast(
            &Operand::new(base.data()?, out.shape(), base.dtype()),
            out.dtype(),
        );
        let strides = contiguous_strides(out.shape());
        let offset: isize = self
            .start
            .iter()
            .zip(&strides)
            .map(|(&s, &st)| s as isize * st)
            .sum();
        let dst: Vec<isize> = strides
            .iter()
            .zip(&self.step)
            .map(|(&s, &st)| s * st)
            .collect();
        if upd.size() > 0 {
            k::copy_into_strided(&mut data, &dst, offset as usize, &upd.operand()?);
        }
        Ok(data)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let upd = &inputs[1];
        let zeros = crate::zeros(upd.shape(), ct.dtype());
        let g_base = Array::from_primitive(
            self.clone(),
            vec![ct.clone(), zeros],
            ct.shape().to_vec(),
            ct.dtype(),
        );
        let g_upd = Array::from_primitive(
            crate::primitives::view::Slice {
                start: self.start.clone(),
                step: self.step.clone(),
            },
            vec![ct.clone()],
            upd.shape().to_vec(),
            ct.dtype(),
        );
        Ok(vec![Some(g_base), Some(g_upd)])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
