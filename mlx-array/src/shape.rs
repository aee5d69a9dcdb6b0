//! Shape arithmetic: sizes, strides, axes and NumPy broadcasting.

use crate::{Error, Result};

/// Number of elements of a shape (1 for a scalar).
///
/// # Panics
/// When the product overflows a `usize`, in every build (it never wraps
/// to a smaller count); [`checked_size_of_shape`] says so as an error.
pub fn size_of_shape(shape: &[usize]) -> usize {
    checked_size_of_shape(shape).unwrap_or_else(|e| panic!("{e}"))
}

/// Number of elements of a shape (1 for a scalar, 0 when a dimension is
/// 0), or an error naming the shape when the product overflows a `usize`.
pub fn checked_size_of_shape(shape: &[usize]) -> Result<usize> {
    if shape.contains(&0) {
        return Ok(0);
    }
    shape
        .iter()
        .try_fold(1usize, |n, &d| n.checked_mul(d))
        .ok_or_else(|| {
            Error::shape(
                "shape",
                format!("{shape:?} has more elements than a usize counts (overflow)"),
            )
        })
}

/// Bytes of a dense array of `shape` with elements of `element_bytes`, or
/// an error naming the shape when the count or the bytes overflow a `usize`.
pub fn checked_bytes_of_shape(shape: &[usize], element_bytes: usize) -> Result<usize> {
    checked_size_of_shape(shape)?
        .checked_mul(element_bytes)
        .ok_or_else(|| {
            Error::shape(
                "shape",
                format!(
                    "{shape:?} of {element_bytes}-byte elements has more bytes than a usize counts (overflow)"
                ),
            )
        })
}

/// Row-major strides (in elements) of a contiguous array of this shape.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut strides = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for (s, &d) in strides.iter_mut().zip(shape).rev() {
        *s = acc;
        acc *= d.max(1) as isize;
    }
    strides
}

/// True when `strides` describe a dense row-major layout of `shape`
/// (dimensions of size 1 may have any stride).
pub fn is_row_contiguous(shape: &[usize], strides: &[isize]) -> bool {
    let mut expected = 1isize;
    for (&d, &s) in shape.iter().zip(strides).rev() {
        if d == 0 {
            return true;
        }
        if d != 1 && s != expected {
            return false;
        }
        expected *= d as isize;
    }
    true
}

/// True when a view of `shape` with `strides` covers a dense block of
/// its buffer in some order of its axes (its strides, sorted, are a
/// row-major layout's: a transpose of a contiguous array, say), so that
/// its elements are the block's in a permuted order.
pub fn is_permuted_dense(shape: &[usize], strides: &[isize]) -> bool {
    let mut axes: Vec<(isize, usize)> = strides
        .iter()
        .zip(shape)
        .filter(|(_, n)| **n != 1)
        .map(|(&s, &n)| (s, n))
        .collect();
    axes.sort_by_key(|&(s, _)| std::cmp::Reverse(s));
    let mut expected = 1isize;
    for &(s, n) in axes.iter().rev() {
        if s != expected {
            return false;
        }
        expected *= n as isize;
    }
    true
}

/// Maps a possibly negative axis into `0..ndim`.
pub fn normalize_axis(op: &'static str, axis: i32, ndim: usize) -> Result<usize> {
    let a = axis as i64;
    let n = ndim as i64;
    if a < -n || a >= n {
        return Err(Error::Axis { op, axis: a, ndim });
    }
    Ok(if a < 0 { (a + n) as usize } else { a as usize })
}

/// Normalises a list of axes, rejecting out-of-range and repeated ones. Sorted.
pub fn normalize_axes(op: &'static str, axes: &[i32], ndim: usize) -> Result<Vec<usize>> {
    let mut out = Vec::with_capacity(axes.len());
    for &a in axes {
        let a = normalize_axis(op, a, ndim)?;
        if out.contains(&a) {
            return Err(Error::invalid(
                op,
                format!("axis {a} is repeated in {axes:?}"),
            ));
        }
        out.push(a);
    }
    out.sort_unstable();
    Ok(out)
}

/// The broadcast of two shapes under NumPy rules.
///
/// ```
/// use mlx_array::shape::broadcast_shapes;
/// assert_eq!(broadcast_shapes("add", &[4, 1, 3], &[5, 1]).unwrap(), vec![4, 5, 3]);
/// assert!(broadcast_shapes("add", &[2, 3], &[4]).is_err());
/// ```
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n {
            a[i + a.len() - n]
        } else {
            1
        };
        let db = if i + b.len() >= n {
            b[i + b.len() - n]
        } else {
            1
        };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(Error::shape(
                op,
                format!("shapes {a:?} and {b:?} cannot be broadcast together"),
            ));
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strides_and_contiguity() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert!(is_row_contiguous(&[2, 3], &[3, 1]));
        assert!(!is_row_contiguous(&[2, 3], &[1, 2]));
        assert!(is_row_contiguous(&[2, 1, 3], &[3, 99, 1]));
    }

    #[test]
    fn axes() {
        assert_eq!(normalize_axis("t", -1, 3).unwrap(), 2);
        assert!(normalize_axis("t", 3, 3).is_err());
        assert!(normalize_axes("t", &[0, -3], 3).is_err());
        assert_eq!(normalize_axes("t", &[-1, 0], 3).unwrap(), vec![0, 2]);
    }
}
