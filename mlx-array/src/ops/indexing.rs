//! Indexing ops: `take`, `take_along_axis`, triangular masks.

use crate::primitives::indexing::{Take, TakeAlongAxis};
use crate::shape::{broadcast_shapes, normalize_axis};
use crate::{Array, Dtype, Error, Result, arange};

fn check_indices(op: &'static str, idx: &Array) -> Result<()> {
    if !idx.dtype().is_integer() {
        return Err(Error::dtype(op, idx.dtype(), "indices must be integers"));
    }
    Ok(())
}

/// Entries of `x` along `axis` at `indices` (negative indices count from the
/// end; out-of-range ones are an error at eval). The result has shape
/// `x.shape[..axis] + indices.shape + x.shape[axis+1..]`.
///
/// ```
/// use mlx_array::{Array, take};
/// let table = Array::from_slice(&[10.0f32, 11.0, 20.0, 21.0, 30.0, 31.0], &[3, 2]).unwrap();
/// let rows = take(&table, &Array::from_slice(&[2i32, 0], &[2]).unwrap(), 0).unwrap();
/// assert_eq!(rows.to_vec::<f32>().unwrap(), vec![30.0, 31.0, 10.0, 11.0]);
/// ```
pub fn take(x: &Array, indices: &Array, axis: i32) -> Result<Array> {
    check_indices("take", indices)?;
    let a = normalize_axis("take", axis, x.ndim())?;
    if x.shape()[a] == 0 && indices.size() > 0 {
        return Err(Error::shape(
            "take",
            format!("cannot take from empty axis {a} of shape {:?}", x.shape()),
        ));
    }
    // A gather from a pending cast is the cast of the gather: the same
    // elements, but only those taken are converted. (A mixed-precision step
    // casts every parameter to bf16; an embedding table so cast would be
    // converted whole, kept for the backward pass, and its gradient
    // scattered in bf16 and converted back whole.)
    if let Some(source) = super::pending_cast_source(x) {
        return take(&source, indices, axis)?.astype(x.dtype());
    }
    let mut shape = x.shape()[..a].to_vec();
    shape.extend_from_slice(indices.shape());
    shape.extend_from_slice(&x.shape()[a + 1..]);
    Ok(Array::from_primitive(
        Take(a),
        vec![x.clone(), indices.clone()],
        shape,
        x.dtype(),
    ))
}

/// At each position, the entry of `x` along `axis` named by `indices`, which
/// has `x`'s number of dimensions and broadcasts with it on the other axes.
pub fn take_along_axis(x: &Array, indices: &Array, axis: i32) -> Result<Array> {
    check_indices("take_along_axis", indices)?;
    if indices.ndim() != x.ndim() {
        return Err(Error::shape(
            "take_along_axis",
            format!(
                "indices of shape {:?} need as many dimensions as the array {:?}",
                indices.shape(),
                x.shape()
            ),
        ));
    }
    let a = normalize_axis("take_along_axis", axis, x.ndim())?;
    let mut xs = x.shape().to_vec();
    let mut is = indices.shape().to_vec();
    xs[a] = 1;
    is[a] = 1;
    let mut shape = broadcast_shapes("take_along_axis", &xs, &is)?;
    let mut x_shape = shape.clone();
    x_shape[a] = x.shape()[a];
    shape[a] = indices.shape()[a];
    let xb = x.broadcast_to(&x_shape)?;
    let ib = indices.broadcast_to(&shape)?;
    Ok(Array::from_primitive(
        TakeAlongAxis(a),
        vec![xb, ib],
        shape,
        x.dtype(),
    ))
}

fn triangle(x: &Array, k: i64, lower: bool) -> Result<Array> {
    if x.ndim() < 2 {
        return Err(Error::shape(
            if lower { "tril" } else { "triu" },
            format!("needs at least 2 dimensions, got {:?}", x.shape()),
        ));
    }
    let (n, m) = (x.shape()[x.ndim() - 2], x.shape()[x.ndim() - 1]);
    let rows = arange(0.0, n as f64, 1.0, Dtype::I64)?
        .reshape(&[n as i64, 1])?
        .add(&Array::scalar(k))?;
    let cols = arange(0.0, m as f64, 1.0, Dtype::I64)?.reshape(&[1, m as i64])?;
    let mask = if lower {
        cols.less_equal(&rows)?
    } else {
        cols.greater_equal(&rows)?
    };
    mask.where_(x, &x.scalar_like(0.0))
}

/// Zeros above the `k`-th diagonal of the last two axes.
pub fn tril(x: &Array, k: i64) -> Result<Array> {
    triangle(x, k, true)
}

/// Zeros below the `k`-th diagonal of the last two axes.
pub fn triu(x: &Array, k: i64) -> Result<Array> {
    triangle(x, k, false)
}

impl Array {
    /// See [`take`].
    pub fn take(&self, indices: &Array, axis: i32) -> Result<Array> {
        take(self, indices, axis)
    }
    /// See [`take_along_axis`].
    pub fn take_along_axis(&self, indices: &Array, axis: i32) -> Result<Array> {
        take_along_axis(self, indices, axis)
    }
    /// See [`tril`].
    pub fn tril(&self, k: i64) -> Result<Array> {
        tril(self, k)
    }
    /// See [`triu`].
    pub fn triu(&self, k: i64) -> Result<Array> {
        triu(self, k)
    }
}
