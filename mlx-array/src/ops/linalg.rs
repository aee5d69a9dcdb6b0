//! Matrix multiplication.

use crate::primitives::linalg::Matmul;
use crate::shape::broadcast_shapes;
use crate::{Array, Dtype, Error, Result};

/// Matrix product with NumPy semantics: batch axes broadcast, and a 1-d
/// operand is a row (left) or column (right) vector whose axis is dropped.
///
/// ```
/// use mlx_array::{Array, matmul};
/// let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
/// let v = Array::from_slice(&[1.0f32, 1.0], &[2]).unwrap();
/// assert_eq!(matmul(&a, &v).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 7.0]);
/// ```
pub fn matmul(a: &Array, b: &Array) -> Result<Array> {
    if a.ndim() == 0 || b.ndim() == 0 {
        return Err(Error::shape(
            "matmul",
            format!(
                "operands must have at least 1 dimension, got {:?} and {:?}",
                a.shape(),
                b.shape()
            ),
        ));
    }
    let dtype = Dtype::promote(a.dtype(), b.dtype());
    if !dtype.is_float() {
        return Err(Error::dtype(
            "matmul",
            dtype,
            "only floating point types are supported",
        ));
    }
    // A batched left operand times a plain matrix is one GEMM over all rows:
    // no broadcast of the matrix, and its gradient needs no sum over batches.
    if b.ndim() == 2 && a.ndim() > 2 && a.size() > 0 && a.shape()[a.ndim() - 1] == b.shape()[0] {
        let k = b.shape()[0] as i64;
        let mut shape: Vec<i64> = a.shape().iter().map(|&d| d as i64).collect();
        *shape.last_mut().expect("ndim > 2") = b.shape()[1] as i64;
        return matmul(&a.reshape(&[-1, k])?, b)?.reshape(&shape);
    }
    let a2 = if a.ndim() == 1 {
        a.reshape(&[1, a.shape()[0] as i64])?
    } else {
        a.clone()
    };
    let b2 = if b.ndim() == 1 {
        b.reshape(&[b.shape()[0] as i64, 1])?
    } else {
        b.clone()
    };
    let (an, bn) = (a2.ndim(), b2.ndim());
    let (m, k) = (a2.shape()[an - 2], a2.shape()[an - 1]);
    let (k2, n) = (b2.shape()[bn - 2], b2.shape()[bn - 1]);
    if k != k2 {
        return Err(Error::shape(
            "matmul",
            format!("inner dimensions differ: {:?} @ {:?}", a.shape(), b.shape()),
        ));
    }
    let batch = broadcast_shapes("matmul", &a2.shape()[..an - 2], &b2.shape()[..bn - 2])?;
    let with = |mut s: Vec<usize>, r: usize, c: usize| {
        s.push(r);
        s.push(c);
        s
    };
    let a3 = a2.astype(dtype)?.broadcast_to(&with(batch.clone(), m, k))?;
    let b3 = b2.astype(dtype)?.broadcast_to(&with(batch.clone(), k, n))?;
    let out = Array::from_primitive(Matmul, vec![a3, b3], with(batch.clone(), m, n), dtype);
    match (a.ndim() == 1, b.ndim() == 1) {
        (false, false) => Ok(out),
        (true, false) => out.squeeze(&[-2]),
        (false, true) => out.squeeze(&[-1]),
        (true, true) => out.squeeze(&[-1, -2]),
    }
}

impl Array {
    /// See [`matmul`].
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        matmul(self, other)
    }
}
