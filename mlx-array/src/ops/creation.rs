//! Creating arrays: constants, ranges, identity matrices.

use std::sync::Arc;

use crate::backend::cpu::dispatch;
use crate::memory::Storage;
use crate::primitives::creation::Arange;
use crate::{Array, ArrayData, Dtype, Element, Error, Result};

/// An array of `shape` whose every element is `value` (cast to `dtype`).
///
/// Costs one element of memory: the value is broadcast with zero strides.
pub fn full(shape: &[usize], value: f64, dtype: Dtype) -> Array {
    let storage = Arc::new(Storage::new(dtype.size_of()));
    let mut one = ArrayData::new(storage, vec![], 0);
    dispatch!(dtype, T => one.as_mut_slice::<T>(1)[0] = T::from_f64(value));
    let data = one.view(vec![0; shape.len()], 0);
    Array::from_data(data, shape.to_vec(), dtype)
}

/// Zeros.
pub fn zeros(shape: &[usize], dtype: Dtype) -> Array {
    full(shape, 0.0, dtype)
}

/// Ones.
pub fn ones(shape: &[usize], dtype: Dtype) -> Array {
    full(shape, 1.0, dtype)
}

/// Zeros with the shape and dtype of `x`.
pub fn zeros_like(x: &Array) -> Array {
    zeros(x.shape(), x.dtype())
}

/// Ones with the shape and dtype of `x`.
pub fn ones_like(x: &Array) -> Array {
    ones(x.shape(), x.dtype())
}

/// `value` with the shape and dtype of `x`.
pub fn full_like(x: &Array, value: f64) -> Array {
    full(x.shape(), value, x.dtype())
}

/// A 0-d array of `x`'s dtype holding `value` (MLX's "weak" scalar: it does
/// not change the dtype of the array it is combined with).
pub fn scalar_like(x: &Array, value: f64) -> Array {
    let dtype = if !x.dtype().is_float() && value.fract() != 0.0 {
        Dtype::F32
    } else {
        x.dtype()
    };
    full(&[], value, dtype)
}

/// `start, start + step, ...` up to but excluding `stop`.
///
/// ```
/// use mlx_array::{arange, Dtype};
/// let r = arange(0.0, 5.0, 2.0, Dtype::I32).unwrap();
/// assert_eq!(r.to_vec::<i32>().unwrap(), vec![0, 2, 4]);
/// ```
pub fn arange(start: f64, stop: f64, step: f64, dtype: Dtype) -> Result<Array> {
    if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
        return Err(Error::invalid(
            "arange",
            format!(
                "start {start}, stop {stop} and step {step} must be finite with a non-zero step"
            ),
        ));
    }
    let n = ((stop - start) / step).ceil().max(0.0) as usize;
    Ok(Array::from_primitive(
        Arange { start, step },
        vec![],
        vec![n],
        dtype,
    ))
}

/// `num` evenly spaced values from `start` to `stop`, both included.
pub fn linspace(start: f64, stop: f64, num: usize, dtype: Dtype) -> Result<Array> {
    if !start.is_finite() || !stop.is_finite() {
        return Err(Error::invalid(
            "linspace",
            format!("start {start} and stop {stop} must be finite"),
        ));
    }
    let step = if num > 1 {
        (stop - start) / (num - 1) as f64
    } else {
        0.0
    };
    Ok(Array::from_primitive(
        Arange { start, step },
        vec![],
        vec![num],
        dtype,
    ))
}

/// An `n x m` matrix with ones on the `k`-th diagonal (0 is the main one).
pub fn eye(n: usize, m: usize, k: i64, dtype: Dtype) -> Result<Array> {
    let rows = arange(0.0, n as f64, 1.0, Dtype::I64)?.reshape(&[n as i64, 1])?;
    let cols = arange(0.0, m as f64, 1.0, Dtype::I64)?.reshape(&[1, m as i64])?;
    rows.add(&Array::scalar(k))?.equal(&cols)?.astype(dtype)
}

impl Array {
    /// See [`full`].
    pub fn full(shape: &[usize], value: f64, dtype: Dtype) -> Array {
        full(shape, value, dtype)
    }
    /// See [`zeros`].
    pub fn zeros(shape: &[usize], dtype: Dtype) -> Array {
        zeros(shape, dtype)
    }
    /// See [`ones`].
    pub fn ones(shape: &[usize], dtype: Dtype) -> Array {
        ones(shape, dtype)
    }
    /// A scalar of this array's dtype; see [`scalar_like`].
    pub fn scalar_like(&self, value: f64) -> Array {
        scalar_like(self, value)
    }
    /// A 1-element array of a Rust value, as a scalar (0-d) array.
    pub fn from_scalar<T: Element>(value: T) -> Array {
        Array::scalar(value)
    }
}
