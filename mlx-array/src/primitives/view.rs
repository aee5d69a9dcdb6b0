//! Primitives that change how data is viewed: most return views of their
//! input's buffer instead of copying.

use crate::backend::cpu::copy::{contiguous, copy_cast};
use crate::shape::contiguous_strides;
use crate::{Array, ArrayData, Operand, Primitive, Result};

/// New shape, same elements in row-major order (a view when the input is contiguous).
#[derive(Debug, Clone)]
pub struct Reshape;

impl Primitive for Reshape {
    fn name(&self) -> &'static str {
        "reshape"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = inputs[0].operand()?;
        let data = if x.is_contiguous() {
            x.data
        } else {
            crate::backend::gpu::copy_contiguous(&x)?
        };
        Ok(data.view(contiguous_strides(out.shape()), data.offset()))
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let data = contiguous(&inputs[0].operand()?);
        Ok(data.view(contiguous_strides(out.shape()), data.offset()))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        Ok(vec![Some(crate::reshape_to(ct, inputs[0].shape())?)])
    }
}

/// Permutes the dimensions (a view).
#[derive(Debug, Clone)]
pub struct Transpose(pub Vec<usize>);

impl Primitive for Transpose {
    fn name(&self) -> &'static str {
        "transpose"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        // Metadata only: the same view of the same (device) buffer.
        self.eval_cpu(inputs, out)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let d = inputs[0].data()?;
        let strides = self.0.iter().map(|&p| d.strides()[p]).collect();
        Ok(d.view(strides, d.offset()))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let mut inverse = vec![0i32; self.0.len()];
        for (i, &p) in self.0.iter().enumerate() {
            inverse[p] = i as i32;
        }
        Ok(vec![Some(ct.transpose(&inverse)?)])
    }
}

/// Broadcasts to a larger shape with stride-0 dimensions (a view).
#[derive(Debug, Clone)]
pub struct BroadcastTo;

impl Primitive for BroadcastTo {
    fn name(&self) -> &'static str {
        "broadcast_to"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        // Metadata only: the same view of the same (device) buffer.
        self.eval_cpu(inputs, out)
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let d = x.data()?;
        let lead = out.ndim() - x.ndim();
        let strides = (0..out.ndim())
            .map(|i| {
                if i < lead || x.shape()[i - lead] == 1 {
                    0
                } else {
                    d.strides()[i - lead]
                }
            })
            .collect();
        Ok(d.view(strides, d.offset()))
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        // Sum over the axes that broadcasting added or stretched.
        let x = &inputs[0];
        let lead = out.ndim() - x.ndim();
        let axes: Vec<i32> = (0..out.ndim())
            .filter(|&i| i < lead || (x.shape()[i - lead] == 1 && out.shape()[i] != 1))
            .map(|i| i as i32)
            .collect();
        let summed = if axes.is_empty() {
            ct.clone()
        } else {
            ct.sum(&axes, true)?
        };
        Ok(vec![Some(crate::reshape_to(&summed, x.shape())?)])
    }
}

/// A strided window: `start` and `step` per axis, output shape chosen by the op (a view).
#[derive(Debug, Clone)]
pub struct Slice {
    /// First index taken on each axis.
    pub start: Vec<usize>,
    /// Step on each axis (non-zero, may be negative).
    pub step: Vec<isize>,
}

impl Primitive for Slice {
    fn name(&self) -> &'static str {
        "slice"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        // Metadata only: the same view of the same (device) buffer.
        self.eval_cpu(inputs, out)
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let d = inputs[0].data()?;
        if out.size() == 0 {
            return Ok(d.view(contiguous_strides(out.shape()), d.offset()));
        }
        let mut offset = d.offset() as isize;
        let mut strides = Vec::with_capacity(self.start.len());
        for ((&s, &st), &ds) in self.start.iter().zip(&self.step).zip(d.strides()) {
            offset += s as isize * ds;
            strides.push(ds * st);
        }
        Ok(d.view(strides, offset as usize))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let zeros = crate::zeros(inputs[0].shape(), ct.dtype());
        Ok(vec![Some(crate::ops::slice_update_raw(
            &zeros,
            ct,
            &self.start,
            &self.step,
        )?)])
    }
}

/// A dense row-major copy (the identity on values).
#[derive(Debug, Clone)]
pub struct Contiguous;

impl Primitive for Contiguous {
    fn name(&self) -> &'static str {
        "contiguous"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let d = x.data()?;
        if d.is_contiguous(x.shape()) && d.storage().capacity() > 0 {
            Ok(d)
        } else {
            crate::backend::gpu::copy_contiguous(&Operand::new(d, out.shape(), x.dtype()))
        }
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let d = x.data()?;
        Ok(
            if d.is_contiguous(x.shape()) && d.storage().capacity() > 0 {
                d
            } else {
                copy_cast(&Operand::new(d, out.shape(), x.dtype()), x.dtype())
            },
        )
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        Ok(vec![Some(ct.clone())])
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
