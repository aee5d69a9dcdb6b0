//! Row-wise softmax kernels on materialised logits: the softmax itself, and
//! the fused softmax cross-entropy (one pass per row for the loss, one for
//! its gradient, with no logits-sized temporaries).

use half::{bf16, f16};
use rayon::prelude::*;

use super::rows::{exp_shifted_in_place, max_of, targets, vectorised};
use crate::backend::cpu::copy::{contiguous, copy_cast};
use crate::backend::cpu::math::{self, FloatLike};
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Dtype, Error, Result};

/// `logsumexp(row)` in f32 over a row of any float storage type.
#[inline]
fn row_lse<T: FloatLike>(row: &[T]) -> f32 {
    let m = row
        .iter()
        .fold(f32::NEG_INFINITY, |m, &x| m.max(x.to_f32()));
    if m == f32::NEG_INFINITY {
        return m;
    }
    let s: f32 = row.iter().map(|&x| math::exp(x.to_f32() - m)).sum();
    m + s.ln()
}

fn forward<T: FloatLike>(logits: &[T], tg: &[usize], vocab: usize, out: &mut [T]) {
    out.par_iter_mut()
        .enumerate()
        .with_min_len(8)
        .for_each(|(r, o)| {
            let row = &logits[r * vocab..(r + 1) * vocab];
            *o = T::from_f32(row_lse(row) - row[tg[r]].to_f32());
        });
}

/// Overwrites every row with `exp(x - max) / sum(exp(x - max))`, computed in
/// f32 (a row of `-inf` gives NaN, as the composite graph does).
fn softmax_rows<T: FloatLike>(rows: &mut [T], width: usize) {
    rows.par_chunks_mut(width).with_min_len(8).for_each(|row| {
        let m = row
            .iter()
            .fold(f32::NEG_INFINITY, |m, &x| m.max(x.to_f32()));
        let s: f32 = row.iter().map(|&x| math::exp(x.to_f32() - m)).sum();
        for x in row.iter_mut() {
            *x = T::from_f32(math::exp(x.to_f32() - m) / s);
        }
    });
}

/// [`softmax_rows`] for f32, in lanes the compiler turns into vector code,
/// each exponential kept where it is until the division.
fn softmax_rows_f32(rows: &mut [f32], width: usize) {
    rows.par_chunks_mut(width).with_min_len(8).for_each(|row| {
        vectorised(
            #[inline(always)]
            || {
                let s = exp_shifted_in_place(row, max_of(row, f32::NEG_INFINITY));
                for x in row.iter_mut() {
                    *x /= s;
                }
            },
        )
    });
}

/// Softmax over the last axis. With `donated`, written over the input's own
/// buffer (which the caller has proven nobody else reads again); otherwise
/// into a contiguous copy.
pub fn softmax(x: Operand<'_>, donated: bool) -> Result<ArrayData> {
    let (shape, dtype) = (x.shape, x.dtype);
    let width = shape.last().copied().unwrap_or(1);
    let n = size_of_shape(shape);
    let out = if donated {
        x.data
    } else {
        copy_cast(&x, dtype)
    };
    if n == 0 || width == 0 {
        return Ok(out);
    }
    // SAFETY: either donated (no other reader) or a fresh copy of our own.
    match dtype {
        Dtype::F32 => softmax_rows_f32(unsafe { out.as_mut_slice_unchecked(n) }, width),
        Dtype::F16 => softmax_rows::<f16>(unsafe { out.as_mut_slice_unchecked(n) }, width),
        Dtype::BF16 => softmax_rows::<bf16>(unsafe { out.as_mut_slice_unchecked(n) }, width),
        d => {
            return Err(Error::eval(
                "softmax",
                format!("the input must be floating point, got {d}"),
            ));
        }
    }
    Ok(out)
}

/// Per-row `logsumexp(logits) - logits[target]` over the last axis.
pub fn cross_entropy(logits: &Operand<'_>, t: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype) = (logits.shape, logits.dtype);
    let vocab = *shape.last().expect("logits have a class axis");
    let rows = &shape[..shape.len() - 1];
    let tg = targets("cross_entropy", &t.with_shape(rows), vocab, None)?;
    let x = contiguous(logits);
    let n = size_of_shape(shape);
    let mut out = ArrayData::alloc(rows, dtype);
    let m = tg.len();
    match dtype {
        Dtype::F32 => forward::<f32>(x.as_slice(n), &tg, vocab, out.as_mut_slice(m)),
        Dtype::F16 => forward::<f16>(x.as_slice(n), &tg, vocab, out.as_mut_slice(m)),
        Dtype::BF16 => forward::<bf16>(x.as_slice(n), &tg, vocab, out.as_mut_slice(m)),
        d => {
            return Err(Error::eval(
                "cross_entropy",
                format!("logits must be floating point, got {d}"),
            ));
        }
    }
    Ok(out)
}

/// Overwrites `rows` (logits) with `(softmax(row) - onehot(target)) * ct[row]`.
fn backward_in_place<T: FloatLike>(rows: &mut [T], tg: &[usize], ct: &[f32], vocab: usize) {
    rows.par_chunks_mut(vocab).enumerate().for_each(|(r, row)| {
        let lse = row_lse(row);
        let c = ct[r];
        for g in row.iter_mut() {
            *g = T::from_f32(math::exp(g.to_f32() - lse) * c);
        }
        row[tg[r]] = T::from_f32(row[tg[r]].to_f32() - c);
    });
}

/// `(softmax(logits) - onehot(target)) * ct[row]`: the gradient of
/// [`cross_entropy`] with respect to the logits. With `donated`, it is
/// written over the logits' own buffer, which the caller has proven nobody
/// else can read again, so the whole step holds one logits-sized buffer;
/// otherwise into a contiguous copy.
pub fn cross_entropy_grad(
    logits: Operand<'_>,
    t: &Operand<'_>,
    ct: &Operand<'_>,
    donated: bool,
) -> Result<ArrayData> {
    let (shape, dtype) = (logits.shape, logits.dtype);
    let vocab = *shape.last().expect("logits have a class axis");
    let rows = &shape[..shape.len() - 1];
    let tg = targets("cross_entropy", &t.with_shape(rows), vocab, None)?;
    let ctv = copy_cast(&ct.with_shape(rows), Dtype::F32);
    let ctv = ctv.as_slice::<f32>(tg.len());
    let out = if donated {
        logits.data
    } else {
        copy_cast(&logits, dtype)
    };
    let n = size_of_shape(shape);
    // SAFETY: `out` is either a fresh copy or a donated buffer no one else reads.
    unsafe {
        match dtype {
            Dtype::F32 => backward_in_place::<f32>(out.as_mut_slice_unchecked(n), &tg, ctv, vocab),
            Dtype::F16 => backward_in_place::<f16>(out.as_mut_slice_unchecked(n), &tg, ctv, vocab),
            Dtype::BF16 => {
                backward_in_place::<bf16>(out.as_mut_slice_unchecked(n), &tg, ctv, vocab)
            }
            d => {
                return Err(Error::eval(
                    "cross_entropy_grad",
                    format!("logits must be floating point, got {d}"),
                ));
            }
        }
    }
    Ok(out)
}
