//! Primitives that create values: ranges and random bits.

use crate::backend::cpu::dispatch;
use crate::backend::cpu::random::random_bits;
use crate::{Array, ArrayData, Element, Error, Primitive, Result};

/// `start, start + step, ...` for the output's length.
#[derive(Debug, Clone)]
pub struct Arange {
    /// First value.
    pub start: f64,
    /// Increment.
    pub step: f64,
}

impl Primitive for Arange {
    fn name(&self) -> &'static str {
        "arange"
    }
    fn eval_gpu(&self, _inputs: &[Array], out: &Array) -> Result<ArrayData> {
        crate::backend::gpu::arange(self.start, self.step, out.size(), out.dtype())
    }
    fn eval_cpu(&self, _inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let n = out.size();
        let mut data = ArrayData::alloc(out.shape(), out.dtype());
        dispatch!(out.dtype(), T => {
            for (i, v) in data.as_mut_slice::<T>(n).iter_mut().enumerate() {
                *v = T::from_f64(self.start + i as f64 * self.step);
            }
        });
        Ok(data)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        crate::primitive::no_gradient(inputs)
    }
}

/// Uniformly random 32-bit words from a `[2]` uint32 key.
#[derive(Debug, Clone)]
pub struct RandomBits;

impl Primitive for RandomBits {
    fn name(&self) -> &'static str {
        "random_bits"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let k = &inputs[0];
        if k.size() != 2 || k.dtype() != crate::Dtype::U32 {
            return Err(Error::eval(
                "random_bits",
                "the key must hold exactly two uint32 values",
            ));
        }
        crate::backend::gpu::random_bits(&k.operand()?, out.shape())
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let k = &inputs[0];
        if k.size() != 2 || k.dtype() != crate::Dtype::U32 {
            return Err(Error::eval(
                "random_bits",
                "the key must hold exactly two uint32 values",
            ));
        }
        let d = crate::backend::cpu::copy::contiguous(&k.operand()?);
        let key = [d.as_slice::<u32>(2)[0], d.as_slice::<u32>(2)[1]];
        Ok(random_bits(key, out.size(), out.shape()))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        crate::primitive::no_gradient(inputs)
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
