//! Copies: strided views to contiguous buffers, with dtype conversion (`astype`).

use super::dispatch;
use super::strided::map1;
use crate::dtype::cast;
use crate::{ArrayData, Dtype};

/// A contiguous copy of the view `data` of `shape`, converted from `from` to `to`.
pub fn copy_cast(data: &ArrayData, shape: &[usize], from: Dtype, to: Dtype) -> ArrayData {
    dispatch!(from, A => dispatch!(to, B => map1::<A, B>(shape, data, cast::<A, B>)))
}

/// The view itself if it is already contiguous, else a contiguous copy.
pub fn contiguous(data: &ArrayData, shape: &[usize], dtype: Dtype) -> ArrayData {
    if data.is_contiguous(shape) {
        data.clone()
    } else {
        copy_cast(data, shape, dtype, dtype)
    }
}
