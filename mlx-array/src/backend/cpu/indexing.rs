//! Gathers (`take`, `take_along_axis`) and placing views into larger buffers
//! (`concatenate`, `pad`). These only move elements, so they work on raw
//! element bytes of any dtype.

use rayon::prelude::*;

use super::copy::{contiguous, copy_cast};
use super::strided::{Layout, for_each_run};
use crate::data::{ArrayData, Operand};
use crate::shape::{contiguous_strides, size_of_shape};
use crate::{Dtype, Error, Result};

/// Reads an index array (any integer dtype) as i64, contiguous.
fn indices_i64(idx: &Operand<'_>) -> Vec<i64> {
    let c = copy_cast(idx, Dtype::I64);
    c.as_slice::<i64>(idx.size()).to_vec()
}

/// Wraps negative indices and checks the range.
fn resolve(op: &str, i: i64, len: usize) -> Result<usize> {
    let j = if i < 0 { i + len as i64 } else { i };
    if j < 0 || j >= len as i64 {
        return Err(Error::eval(
            op,
            format!("index {i} is out of range for an axis of size {len}"),
        ));
    }
    Ok(j as usize)
}

/// `take` along `axis`: output shape `a[..axis] + idx + a[axis+1..]`.
pub fn take(
    a: &Operand<'_>,
    idx: &Operand<'_>,
    axis: usize,
    out_shape: &[usize],
) -> Result<ArrayData> {
    let (a_shape, dtype) = (a.shape, a.dtype);
    let a = contiguous(a);
    let es = dtype.size_of();
    let pre: usize = a_shape[..axis].iter().product();
    let len = a_shape[axis];
    let post: usize = a_shape[axis + 1..].iter().product();
    let ids = indices_i64(idx)
        .into_iter()
        .map(|i| resolve("take", i, len))
        .collect::<Result<Vec<_>>>()?;
    let mut out = ArrayData::alloc(out_shape, dtype);
    let row = post * es;
    if row == 0 || ids.is_empty() || pre == 0 {
        return Ok(out);
    }
    let src = a.as_bytes(dtype, size_of_shape(a_shape));
    let dst = out.as_mut_slice::<u8>(size_of_shape(out_shape) * es);
    let n_ids = ids.len();
    dst.par_chunks_mut(row)
        .enumerate()
        .with_min_len(64)
        .for_each(|(r, chunk)| {
            let (p, j) = (r / n_ids, ids[r % n_ids]);
            let start = (p * len + j) * row;
            chunk.copy_from_slice(&src[start..start + row]);
        });
    Ok(out)
}

/// `take_along_axis`: `a` and `idx` already broadcast to `out_shape` (the
/// shape of `idx`) except along `axis`, where `a` has its own length.
pub fn take_along_axis(a: &Operand<'_>, idx: &Operand<'_>, axis: usize) -> Result<ArrayData> {
    let (a_len, dtype, out_shape) = (a.shape[axis], a.dtype, idx.shape);
    let ids = indices_i64(idx);
    let a = &a.data;
    let mut a_strides = a.strides().to_vec();
    let axis_stride = a_strides[axis];
    a_strides[axis] = 0;
    let n = size_of_shape(out_shape);
    let out = ArrayData::alloc(out_shape, dtype);
    let layout = Layout::<1>::new(out_shape, [&a_strides], [a.offset()]);
    let es = dtype.size_of() as isize;
    let src = a.storage().as_ptr() as *const u8;
    let dst = out.storage().as_ptr();
    let mut k = 0usize;
    let mut err = None;
    for_each_run(&layout, |[off], run, [s]| {
        for r in 0..run as isize {
            match resolve("take_along_axis", ids[k], a_len) {
                Ok(j) => {
                    let from = (off + r * s + j as isize * axis_stride) * es;
                    // SAFETY: `from` addresses an element of `a`'s view; `k < n` slots in `out`.
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            src.offset(from),
                            dst.add(k * es as usize),
                            es as usize,
                        )
                    };
                }
                Err(e) => err = Some(e),
            }
            k += 1;
        }
    });
    debug_assert!(k == n || n == 0);
    match err {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// Copies `src` into `dst` (contiguous, of `dst_shape`) starting at
/// element `dst_offset`.
pub fn copy_into(dst: &mut ArrayData, dst_shape: &[usize], dst_offset: usize, src: &Operand<'_>) {
    copy_into_strided(dst, &contiguous_strides(dst_shape), dst_offset, src)
}

/// Copies `src` into a fresh buffer `dst` at the element positions
/// `dst_offset + sum(i_k * dst_strides[k])`.
pub fn copy_into_strided(
    dst: &mut ArrayData,
    dst_strides: &[isize],
    dst_offset: usize,
    src: &Operand<'_>,
) {
    let (shape, dtype, src) = (src.shape, src.dtype, &src.data);
    let es = dtype.size_of() as isize;
    let layout = Layout::<2>::new(
        shape,
        [dst_strides, src.strides()],
        [dst_offset, src.offset()],
    );
    let sp = src.storage().as_ptr() as *const u8;
    let dp = dst.storage().as_ptr();
    assert_eq!(
        std::sync::Arc::strong_count(dst.storage()),
        1,
        "copy_into writes to a fresh buffer"
    );
    for_each_run(&layout, |[d, s], run, [ds, ss]| {
        if ds == 1 && ss == 1 {
            // SAFETY: as below, for a whole contiguous run.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    sp.offset(s * es),
                    dp.offset(d * es),
                    run * es as usize,
                )
            };
            return;
        }
        for r in 0..run as isize {
            // SAFETY: both offsets address elements inside their buffers; the
            // destination is exclusively ours (asserted above).
            unsafe {
                std::ptr::copy_nonoverlapping(
                    sp.offset((s + r * ss) * es),
                    dp.offset((d + r * ds) * es),
                    es as usize,
                )
            };
        }
    });
}

/// Adds the rows of `ct` into a zero buffer of `out_shape` at the positions
/// named by `idx` along `axis`: the gradient of `take` (`along_axis` false:
/// `ct` has `idx`'s dimensions in place of `axis`) or of `take_along_axis`
/// (`along_axis` true: `ct` and `idx` have the same shape).
pub fn scatter_add(
    ct: &Operand<'_>,
    idx: &Operand<'_>,
    axis: usize,
    along_axis: bool,
    out_shape: &[usize],
) -> Result<ArrayData> {
    let (ct_shape, dtype) = (ct.shape, ct.dtype);
    let len = out_shape[axis];
    let ids = indices_i64(idx)
        .into_iter()
        .map(|i| resolve("scatter_add", i, len))
        .collect::<Result<Vec<_>>>()?;
    let pre: usize = out_shape[..axis].iter().product();
    let post: usize = out_shape[axis + 1..].iter().product();
    let n = if along_axis {
        ct_shape[axis]
    } else {
        ids.len()
    };
    let c = copy_cast(ct, Dtype::F32);
    let cv = c.as_slice::<f32>(size_of_shape(ct_shape));
    // Accumulated in f32 straight into the result's buffer (cast afterwards
    // only for narrower dtypes): an embedding-sized gradient is allocated once.
    let total = size_of_shape(out_shape);
    let mut sum = ArrayData::alloc(out_shape, Dtype::F32);
    let acc = sum.as_mut_slice::<f32>(total);
    acc.par_iter_mut()
        .with_min_len(1 << 14)
        .for_each(|x| *x = 0.0);
    if post > 0 {
        for p in 0..pre {
            for j in 0..n {
                let row = (p * n + j) * post;
                if along_axis {
                    for q in 0..post {
                        let t = ids[row + q];
                        acc[(p * len + t) * post + q] += cv[row + q];
                    }
                } else {
                    let t = ids[j];
                    let dst = &mut acc[(p * len + t) * post..(p * len + t + 1) * post];
                    for (d, &v) in dst.iter_mut().zip(&cv[row..row + post]) {
                        *d += v;
                    }
                }
            }
        }
    }
    if dtype == Dtype::F32 {
        return Ok(sum);
    }
    Ok(copy_cast(&Operand::new(sum, out_shape, Dtype::F32), dtype))
}

/// A contiguous buffer of `shape` filled with `value` (given as f64, cast to `dtype`).
pub fn filled(shape: &[usize], dtype: Dtype, value: f64) -> ArrayData {
    let n = size_of_shape(shape);
    let mut out = ArrayData::alloc(shape, dtype);
    super::dispatch!(dtype, T => {
        let v = <T as crate::Element>::from_f64(value);
        out.as_mut_slice::<T>(n).par_iter_mut().with_min_len(1 << 14).for_each(|x| *x = v);
    });
    out
}
