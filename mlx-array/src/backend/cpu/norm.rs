//! RMS normalisation and its gradient, a row at a time.

use rayon::prelude::*;

use super::copy::{contiguous, copy_cast};
use super::loss::vectorised;
use crate::Dtype;
use crate::data::{ArrayData, Operand};

/// Rows per task of the gradient (each task sums its own part of `dw`;
/// the parts are added in order, so the result does not depend on the
/// number of threads).
const ROWS_PER_TASK: usize = 64;

/// `1 / sqrt(mean(x^2) + eps)` of one row.
#[inline(always)]
fn inv_rms(x: &[f32], eps: f32) -> f32 {
    let ss: f32 = x.iter().map(|v| v * v).sum();
    1.0 / (ss / x.len() as f32 + eps).sqrt()
}

/// `x`'s values as a dense f32 buffer (itself when it already is one).
fn dense_f32(x: &Operand<'_>) -> ArrayData {
    if x.dtype == Dtype::F32 {
        contiguous(x)
    } else {
        copy_cast(x, Dtype::F32)
    }
}

/// `x * w / sqrt(mean(x^2) + eps)` over rows of `width` for float `x`
/// (`n` elements, any view) and `w` (`[width]`), computed in f32; a new
/// contiguous buffer of `out` (rounded once, as a cast rounds).
pub fn rms_norm(x: &Operand<'_>, w: &Operand<'_>, eps: f32, out: Dtype) -> ArrayData {
    let result = rms_norm_f32(x, w, eps);
    if out == Dtype::F32 {
        return result;
    }
    copy_cast(&Operand::new(result, x.shape, Dtype::F32), out)
}

/// [`rms_norm`] in f32.
fn rms_norm_f32(x: &Operand<'_>, w: &Operand<'_>, eps: f32) -> ArrayData {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let width = shape.last().copied().unwrap_or(1);
    let mut out = ArrayData::alloc(shape, Dtype::F32);
    if n == 0 || width == 0 {
        return out;
    }
    let (x, w) = (dense_f32(x), dense_f32(w));
    let (x, w) = (x.as_slice::<f32>(n), w.as_slice::<f32>(width));
    out.as_mut_slice::<f32>(n)
        .par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .with_min_len(16)
        .for_each(|(o, x)| {
            vectorised(
                #[inline(always)]
                || {
                    let r = inv_rms(x, eps);
                    for ((o, &x), &w) in o.iter_mut().zip(x).zip(w) {
                        *o = x * r * w;
                    }
                },
            )
        });
    out
}

/// The gradients of [`rms_norm`] for the cotangent `ct` of its output (all
/// three read in f32 whatever their dtypes):
/// one buffer, `dx` (`shape`), `dw` (`[width]`), then each row's `r`
/// (which the GPU's column pass reads). With `r` a row's
/// inverse RMS and `g = w * ct`: `dx = r * g - x * r^3 * mean(x * g)`,
/// `dw = sum over rows of ct * x * r`. An `addend` of `x`'s shape (read
/// in f32) is added to `dx` as it is stored.
pub fn rms_norm_grad(
    x: &Operand<'_>,
    w: &Operand<'_>,
    ct: &Operand<'_>,
    addend: Option<&Operand<'_>>,
    eps: f32,
) -> ArrayData {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let width = shape.last().copied().unwrap_or(1);
    let rows = n.checked_div(width).unwrap_or(0);
    let mut out = ArrayData::alloc(&[n + width + rows], Dtype::F32);
    let buf = out.as_mut_slice::<f32>(n + width + rows);
    let (dx, rest) = buf.split_at_mut(n);
    let (dw, rs) = rest.split_at_mut(width);
    dw.fill(0.0);
    if n == 0 || width == 0 {
        return out;
    }
    let (x, w, ct) = (dense_f32(x), dense_f32(w), dense_f32(ct));
    let (x, w, ct) = (
        x.as_slice::<f32>(n),
        w.as_slice::<f32>(width),
        ct.as_slice::<f32>(n),
    );
    let task = ROWS_PER_TASK * width;
    let addend = addend.map(dense_f32);
    let addend = addend.as_ref().map(|a| a.as_slice::<f32>(n));
    let parts: Vec<Vec<f32>> = dx
        .par_chunks_mut(task)
        .zip(rs.par_chunks_mut(ROWS_PER_TASK))
        .zip(x.par_chunks(task).zip(ct.par_chunks(task)))
        .enumerate()
        .map(|(t, ((dx, rs), (x, ct)))| {
            let addend = addend.map(|a| &a[t * task..t * task + dx.len()]);
            vectorised(
                #[inline(always)]
                || {
                    let mut part = vec![0f32; width];
                    for (row, (((dx, x), ct), r_out)) in dx
                        .chunks_exact_mut(width)
                        .zip(x.chunks_exact(width))
                        .zip(ct.chunks_exact(width))
                        .zip(rs.iter_mut())
                        .enumerate()
                    {
                        let r = inv_rms(x, eps);
                        *r_out = r;
                        let mut xg = 0f32;
                        for ((&x, &c), &w) in x.iter().zip(ct).zip(w) {
                            xg += x * c * w;
                        }
                        let k = xg / width as f32 * r * r * r;
                        for (((d, &x), &c), (&w, p)) in
                            dx.iter_mut().zip(x).zip(ct).zip(w.iter().zip(&mut part))
                        {
                            *d = r * w * c - x * k;
                            *p += c * x * r;
                        }
                        if let Some(a) = addend {
                            let a = &a[row * width..(row + 1) * width];
                            dx.iter_mut().zip(a).for_each(|(d, a)| *d += a);
                        }
                    }
                    part
                },
            )
        })
        .collect();
    for part in parts {
        for (d, p) in dw.iter_mut().zip(part) {
            *d += p;
        }
    }
    out
}
