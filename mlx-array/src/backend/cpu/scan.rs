//! Cumulative sums along one axis.

use half::{bf16, f16};

use super::math::FloatLike;
use super::strided::{Layout, base_ptr, for_each_run};
use crate::data::{ArrayData, Operand};
use crate::shape::{contiguous_strides, size_of_shape};
use crate::{Dtype, Element};

/// Inclusive or exclusive cumulative sum of `data` along `axis`, optionally
/// from the end. The output is contiguous with the input's shape and dtype
/// (bool counts in int32).
pub fn cumsum(x: &Operand<'_>, axis: usize, reverse: bool, inclusive: bool) -> ArrayData {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    match dtype {
        Dtype::F32 => scan_float::<f32>(data, shape, axis, reverse, inclusive),
        Dtype::F16 => scan_float::<f16>(data, shape, axis, reverse, inclusive),
        Dtype::BF16 => scan_float::<bf16>(data, shape, axis, reverse, inclusive),
        Dtype::I32 => scan::<i32, i32>(
            data,
            shape,
            axis,
            reverse,
            inclusive,
            |a, x| a.wrapping_add(x),
            |a| a,
        ),
        Dtype::I64 => scan::<i64, i64>(
            data,
            shape,
            axis,
            reverse,
            inclusive,
            |a, x| a.wrapping_add(x),
            |a| a,
        ),
        Dtype::U32 => scan::<u32, u32>(
            data,
            shape,
            axis,
            reverse,
            inclusive,
            |a, x| a.wrapping_add(x),
            |a| a,
        ),
        Dtype::Bool => scan::<crate::Bool8, i32>(
            data,
            shape,
            axis,
            reverse,
            inclusive,
            |a, x| a + x.0 as i32,
            |a| a,
        ),
    }
}

fn scan_float<T: FloatLike>(
    data: &ArrayData,
    shape: &[usize],
    axis: usize,
    reverse: bool,
    inclusive: bool,
) -> ArrayData {
    scan::<T, T>(
        data,
        shape,
        axis,
        reverse,
        inclusive,
        |a: T, x: T| T::from_f32(a.to_f32() + x.to_f32()),
        |a| a,
    )
}

fn scan<T: Element, O: Element + Default>(
    data: &ArrayData,
    shape: &[usize],
    axis: usize,
    reverse: bool,
    inclusive: bool,
    add: impl Fn(O, T) -> O,
    fin: impl Fn(O) -> O,
) -> ArrayData {
    let n = size_of_shape(shape);
    let mut out = ArrayData::alloc(shape, O::DTYPE);
    let ostrides = contiguous_strides(shape);
    let len = shape[axis];
    let (sa, so) = (data.strides()[axis], ostrides[axis]);
    let mut oshape = shape.to_vec();
    oshape[axis] = 1;
    let layout = Layout::<2>::new(&oshape, [data.strides(), &ostrides], [data.offset(), 0]);
    let src = base_ptr::<T>(data);
    let o = out.as_mut_slice::<O>(n);
    if len == 0 {
        return out;
    }
    for_each_run(&layout, |[ia, io], run, [ra, ro]| {
        for r in 0..run as isize {
            let (ia, io) = (ia + r * ra, io + r * ro);
            let mut acc = O::default();
            for k in 0..len as isize {
                let j = if reverse { len as isize - 1 - k } else { k };
                // SAFETY: indices stay inside the input view and the output buffer.
                let x = unsafe { *src.at(ia + j * sa) };
                let slot = &mut o[(io + j * so) as usize];
                if inclusive {
                    acc = add(acc, x);
                    *slot = fin(acc);
                } else {
                    *slot = fin(acc);
                    acc = add(acc, x);
                }
            }
        }
    });
    out
}
