//! Copies: strided views to contiguous buffers, with dtype conversion (`astype`).

use super::dispatch;
use super::strided::map1;
use crate::dtype::cast;
use crate::{ArrayData, Dtype, Operand};

/// The first `n` f32 elements of `packed` (a kernel's packed result)
/// converted to `to`, contiguous: a result's cast, stored beside it.
pub fn cast_f32_prefix(packed: &ArrayData, n: usize, to: Dtype) -> ArrayData {
    copy_cast(&Operand::new(packed.clone(), &[n], Dtype::F32), to)
}

/// A contiguous copy of the view `x`, converted from its dtype to `to`.
pub fn copy_cast(x: &Operand<'_>, to: Dtype) -> ArrayData {
    let (shape, data) = (x.shape, &x.data);
    dispatch!(x.dtype, A => dispatch!(to, B => map1::<A, B>(shape, data, cast::<A, B>)))
}

/// The view itself if it is already contiguous, else a contiguous copy.
pub fn contiguous(x: &Operand<'_>) -> ArrayData {
    if x.is_contiguous() {
        x.data.clone()
    } else {
        copy_cast(x, x.dtype)
    }
}
