//! The output projection fused with the cross-entropy: the loss of the
//! logits `h @ w^T`, its gradients, and both in one pass, a chunk of classes
//! or a block of rows at a time, so that the logits are never whole in
//! memory.

use rayon::prelude::*;

use super::rows::{IGNORED, exp_shifted_in_place, max_of, sum_exp, sum_of, targets, vectorised};
use crate::backend::common::loss::{LceArgs, chunk_cols};
use crate::backend::cpu::blas::{Mat, gemm};
use crate::backend::cpu::copy::{contiguous, copy_cast};
use crate::backend::cpu::math;
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Dtype, Result};

/// Bytes of logits per row block of the one-pass loss and gradient: larger
/// blocks mean fewer passes of `dw` through memory. (256 rows of GPT-2's
/// vocabulary; at 1022 rows on one thread, 4 blocks of 256 instead of 8 of
/// 128 took 630-670 ms instead of 690-820.)
const BLOCK_BYTES: usize = 50 << 20;

/// Row blocks of the one-pass loss at most, when [`BLOCK_BYTES`] would make
/// more: each block has a fixed cost of the weight's size.
const MAX_BLOCKS: usize = 9;

/// The view as contiguous f32 (itself when it already is).
fn f32_dense(x: &Operand<'_>) -> ArrayData {
    if x.dtype == Dtype::F32 {
        contiguous(x)
    } else {
        copy_cast(x, Dtype::F32)
    }
}

/// `logits[r, j] = h[r] . w[c0 + j]` for one chunk of `cols` classes, into
/// the first `rows * cols` elements of `buf` (row stride `cols`).
fn chunk_logits(
    h: &[f32],
    w: &[f32],
    rows: usize,
    dims: usize,
    c0: usize,
    cols: usize,
    buf: &mut [f32],
) {
    debug_assert!(buf.len() >= rows * cols && w.len() >= (c0 + cols) * dims);
    // SAFETY: `h` is rows x dims, the chunk of `w` cols x dims (read transposed),
    // `buf` holds rows x cols; none overlap.
    unsafe {
        gemm(
            false,
            true,
            [rows, cols, dims],
            1.0,
            Mat::input(h.as_ptr(), dims),
            Mat::input(w.as_ptr().add(c0 * dims), dims),
            0.0,
            Mat(buf.as_mut_ptr(), cols),
        )
    }
}

/// Running per-row statistics of the logits seen so far.
#[derive(Clone, Copy)]
struct RowStats {
    max: f32,
    sum: f32,
    target: f32,
    total: f32,
}

/// The inputs of the fused kernels, as dense f32.
struct Lce<'a> {
    h: &'a [f32],
    w: &'a [f32],
    tg: Vec<usize>,
    rows: usize,
    dims: usize,
    vocab: usize,
    cols: usize,
    block_rows: usize,
    smoothing: f32,
}

impl Lce<'_> {
    /// Per-row `logsumexp(x) - (1 - s) x[t] - s mean(x)` where `x = h @ w^T`,
    /// one chunk of classes at a time with an online logsumexp.
    fn forward(&self, out: &mut [f32]) {
        let (rows, cols, s) = (self.rows, self.cols, self.smoothing);
        let mut buf = ArrayData::alloc(&[rows, cols], Dtype::F32);
        let buf = buf.as_mut_slice::<f32>(rows * cols);
        let mut stats = vec![
            RowStats {
                max: f32::NEG_INFINITY,
                sum: 0.0,
                target: 0.0,
                total: 0.0,
            };
            rows
        ];
        for c0 in (0..self.vocab).step_by(cols) {
            let n = cols.min(self.vocab - c0);
            chunk_logits(self.h, self.w, rows, self.dims, c0, n, buf);
            buf[..rows * n]
                .par_chunks(n)
                .zip(stats.par_iter_mut())
                .zip(self.tg.par_iter())
                .with_min_len(8)
                .for_each(|((row, st), &t)| {
                    vectorised(
                        #[inline(always)]
                        || {
                            if t == IGNORED {
                                return;
                            }
                            let m = max_of(row, st.max);
                            if m == f32::NEG_INFINITY {
                                return;
                            }
                            let carried = if st.max == f32::NEG_INFINITY {
                                0.0
                            } else {
                                st.sum * math::exp(st.max - m)
                            };
                            let fresh = sum_exp(row, m);
                            st.max = m;
                            st.sum = carried + fresh;
                            if (c0..c0 + n).contains(&t) {
                                st.target = row[t - c0];
                            }
                            if s > 0.0 {
                                st.total += sum_of(row);
                            }
                        },
                    )
                });
        }
        let v = self.vocab as f32;
        out.par_iter_mut()
            .zip(stats.par_iter())
            .zip(self.tg.par_iter())
            .for_each(|((o, st), &t)| {
                *o = if t == IGNORED {
                    0.0
                } else {
                    st.max + st.sum.ln() - (1.0 - s) * st.target - s * st.total / v
                };
            });
    }

    /// `dh = g @ w` and `dw = g^T @ h` for `g = ct * (softmax(x) - target
    /// distribution)`, recomputing `x = h @ w^T` one chunk of classes at a
    /// time. Each row's logsumexp comes back from its loss (`loss + (1 - s)
    /// x[t] + s mean(x)`, with `x[t]` and `mean(x)` as dot products), so no
    /// second pass over the logits is needed.
    fn backward(&self, loss: &[f32], ct: &[f32], dh: &mut [f32], dw: &mut [f32]) {
        let (rows, dims, vocab, cols, s) =
            (self.rows, self.dims, self.vocab, self.cols, self.smoothing);
        let v = vocab as f32;
        let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
        let w_mean: Vec<f32> = if s > 0.0 && dims > 0 {
            let total = self
                .w
                .par_chunks(dims)
                .fold(
                    || vec![0f32; dims],
                    |mut acc, r| {
                        acc.iter_mut().zip(r).for_each(|(a, x)| *a += x);
                        acc
                    },
                )
                .reduce(
                    || vec![0f32; dims],
                    |mut a, b| {
                        a.iter_mut().zip(&b).for_each(|(x, y)| *x += y);
                        a
                    },
                );
            total.into_iter().map(|x| x / v).collect()
        } else {
            vec![0f32; dims]
        };
        // Per row: its logsumexp and its cotangent (0 for ignored rows).
        let lse_ct: Vec<(f32, f32)> = (0..rows)
            .into_par_iter()
            .map(|r| {
                let t = self.tg[r];
                if t == IGNORED || ct[r] == 0.0 {
                    return (0.0, 0.0);
                }
                let hr = &self.h[r * dims..(r + 1) * dims];
                let xt = dot(hr, &self.w[t * dims..(t + 1) * dims]);
                let mean = if s > 0.0 { dot(hr, &w_mean) } else { 0.0 };
                (loss[r] + (1.0 - s) * xt + s * mean, ct[r])
            })
            .collect();
        if rows == 0 || dims == 0 {
            dw.fill(0.0);
            return;
        }
        let mut buf = ArrayData::alloc(&[rows, cols], Dtype::F32);
        let buf = buf.as_mut_slice::<f32>(rows * cols);
        for c0 in (0..vocab).step_by(cols) {
            let n = cols.min(vocab - c0);
            chunk_logits(self.h, self.w, rows, dims, c0, n, buf);
            buf[..rows * n]
                .par_chunks_mut(n)
                .zip(lse_ct.par_iter())
                .zip(self.tg.par_iter())
                .with_min_len(8)
                .for_each(|((row, &(lse, c)), &t)| {
                    if c == 0.0 {
                        row.fill(0.0);
                        return;
                    }
                    let uniform = c * s / v;
                    vectorised(
                        #[inline(always)]
                        || {
                            for x in row.iter_mut() {
                                *x = math::exp(*x - lse) * c - uniform;
                            }
                        },
                    );
                    if (c0..c0 + n).contains(&t) {
                        row[t - c0] -= c * (1.0 - s);
                    }
                });
            // SAFETY: `buf` is rows x n, the chunk of `w` n x dims, `h` rows x
            // dims, `dh` rows x dims and the chunk of `dw` n x dims; the
            // outputs overlap no input.
            unsafe {
                gemm(
                    false,
                    false,
                    [rows, dims, n],
                    1.0,
                    Mat::input(buf.as_ptr(), n),
                    Mat::input(self.w.as_ptr().add(c0 * dims), dims),
                    if c0 == 0 { 0.0 } else { 1.0 },
                    Mat(dh.as_mut_ptr(), dims),
                );
                gemm(
                    true,
                    false,
                    [n, dims, rows],
                    1.0,
                    Mat::input(buf.as_ptr(), n),
                    Mat::input(self.h.as_ptr(), dims),
                    0.0,
                    Mat(dw.as_mut_ptr().add(c0 * dims), dims),
                );
            }
        }
    }
}

/// Rows per block of the one-pass loss and gradient: `requested` when
/// non-zero, else at most [`BLOCK_BYTES`] of f32 logits over the whole
/// vocabulary (at least 8 rows) or a [`MAX_BLOCKS`]th of the rows,
/// whichever is more, split evenly over the blocks that takes. Every block
/// packs all of `w` twice and updates all of `dw` whatever its size (about
/// 20 ms for a 50257 x 256 weight), so a thin last block (22 of 1022 rows
/// at 125 per block) costs far more per row than a full one, and many
/// blocks cost more than a few: with the bound on their number the buffer
/// grows with the batch, as the activations do, while staying a ninth of
/// what whole logits would take. (At 2044 rows of a 50257-class vocabulary
/// on two threads, 9 blocks instead of 17 took 740-820 ms instead of
/// 860-900.)
fn block_rows(rows: usize, vocab: usize, requested: usize) -> usize {
    let rows = rows.max(1);
    if requested > 0 {
        return requested.min(rows);
    }
    let most = (BLOCK_BYTES / 4 / vocab.max(1))
        .max(8)
        .max(rows.div_ceil(MAX_BLOCKS));
    rows.div_ceil(rows.div_ceil(most))
}

impl Lce<'_> {
    /// Rows per block of [`Self::value_and_grad`] ([`block_rows`]).
    fn block_rows(&self) -> usize {
        block_rows(self.rows, self.vocab, self.block_rows)
    }

    /// The weighted loss `sum_r rw[r] * loss_r` and its gradients `dh`, `dw`
    /// in one pass, for a caller that knows it will differentiate. Rows are
    /// taken a block at a time: the block's logits over every class (one
    /// GEMM), each row's logsumexp, loss and `rw[r] * (softmax - target
    /// distribution)` in place, then `dh[block] = g @ w` and `dw += g^T @
    /// h[block]`: three GEMMs in all, against four for the forward and the
    /// backward of [`Self::forward`] and [`Self::backward`], and each
    /// exponential computed once.
    fn value_and_grad(&self, rw: &[f32], dh: &mut [f32], dw: &mut [f32]) -> f32 {
        let (rows, dims, vocab, s) = (self.rows, self.dims, self.vocab, self.smoothing);
        let v = vocab as f32;
        if rows == 0 {
            dw.fill(0.0);
            return 0.0;
        }
        #[cfg(target_arch = "x86_64")]
        if super::avx512::enabled(dims) {
            return self.value_and_grad_avx512(rw, dh, dw);
        }
        let block = self.block_rows();
        let mut buf = ArrayData::alloc(&[block, vocab], Dtype::F32);
        let buf = buf.as_mut_slice::<f32>(block * vocab);
        let mut total = 0f64;
        for (b, r0) in (0..rows).step_by(block).enumerate() {
            let n = block.min(rows - r0);
            let h = &self.h[r0 * dims..(r0 + n) * dims];
            if dims > 0 {
                chunk_logits(h, self.w, n, dims, 0, vocab, buf);
            } else {
                buf[..n * vocab].fill(0.0);
            }
            let losses: Vec<f32> = buf[..n * vocab]
                .par_chunks_mut(vocab)
                .zip(&self.tg[r0..r0 + n])
                .zip(&rw[r0..r0 + n])
                .with_min_len(4)
                .map(|((row, &t), &c)| {
                    if t == IGNORED || c == 0.0 {
                        row.fill(0.0);
                        return 0.0;
                    }
                    vectorised(
                        #[inline(always)]
                        || {
                            let target = row[t];
                            let mean = if s > 0.0 { sum_of(row) / v } else { 0.0 };
                            let m = max_of(row, f32::NEG_INFINITY);
                            let sum = exp_shifted_in_place(row, m);
                            let scale = c / sum;
                            let uniform = c * s / v;
                            for x in row.iter_mut() {
                                *x = *x * scale - uniform;
                            }
                            row[t] -= c * (1.0 - s);
                            c * (m + sum.ln() - (1.0 - s) * target - s * mean)
                        },
                    )
                })
                .collect();
            total += losses.iter().map(|&l| l as f64).sum::<f64>();
            if dims == 0 {
                continue;
            }
            // SAFETY: `buf` holds n x vocab gradients, `w` is vocab x dims,
            // `h` n x dims; `dh[r0..]` (n x dims) and `dw` (vocab x dims) are
            // outputs that overlap no input.
            unsafe {
                gemm(
                    false,
                    false,
                    [n, dims, vocab],
                    1.0,
                    Mat::input(buf.as_ptr(), vocab),
                    Mat::input(self.w.as_ptr(), dims),
                    0.0,
                    Mat(dh.as_mut_ptr().add(r0 * dims), dims),
                );
                gemm(
                    true,
                    false,
                    [vocab, dims, n],
                    1.0,
                    Mat::input(buf.as_ptr(), vocab),
                    Mat::input(h.as_ptr(), dims),
                    if b == 0 { 0.0 } else { 1.0 },
                    Mat(dw.as_mut_ptr(), dims),
                );
            }
        }
        total as f32
    }
}

#[cfg(target_arch = "x86_64")]
impl Lce<'_> {
    /// [`Self::value_and_grad`] a block at a time through
    /// [`super::avx512`], blocks rounded up to whole 32-row tiles.
    fn value_and_grad_avx512(&self, rw: &[f32], dh: &mut [f32], dw: &mut [f32]) -> f32 {
        use super::avx512::{round_block, value_and_grad_block};
        let (rows, dims) = (self.rows, self.dims);
        let block = round_block(self.block_rows());
        let mut lt = ArrayData::alloc(&[self.vocab, block], Dtype::F32);
        let lt = lt.as_mut_slice::<f32>(self.vocab * block);
        sum_over_blocks(rows, dims, block, dh, |r, dh, first| {
            value_and_grad_block(
                &self.h[r.start * dims..r.end * dims],
                self.w,
                &self.tg[r.clone()],
                &rw[r],
                self.smoothing,
                dims,
                lt,
                dh,
                dw,
                first,
            )
        })
    }
}

/// Rows, features and classes of the arguments.
struct Sizes {
    rows: usize,
    dims: usize,
    vocab: usize,
}

impl Sizes {
    fn of(a: &LceArgs<'_>) -> Sizes {
        let (&dims, rows_shape) =
            a.h.shape
                .split_last()
                .expect("hidden states have a feature axis");
        Sizes {
            rows: size_of_shape(rows_shape),
            dims,
            vocab: a.w.shape[0],
        }
    }
}

/// Each row's target class, or [`IGNORED`].
fn row_targets(a: &LceArgs<'_>) -> Result<Vec<usize>> {
    targets(
        "linear_cross_entropy",
        &a.t.with_shape(&a.h.shape[..a.h.shape.len() - 1]),
        a.w.shape[0],
        a.ignore_index,
    )
}

/// `sum_r rw[r] * loss_r` over blocks of `block` rows: `f(rows, dh of those
/// rows, first)` runs one block (the first writes `dw`, the others add).
#[cfg(target_arch = "x86_64")]
fn sum_over_blocks(
    rows: usize,
    dims: usize,
    block: usize,
    dh: &mut [f32],
    mut f: impl FnMut(std::ops::Range<usize>, &mut [f32], bool) -> f64,
) -> f32 {
    let mut total = 0f64;
    for (b, r0) in (0..rows).step_by(block).enumerate() {
        let r1 = (r0 + block).min(rows);
        total += f(r0..r1, &mut dh[r0 * dims..r1 * dims], b == 0);
    }
    total as f32
}

/// Runs `f` on the dense f32 view of the arguments.
fn with_lce<R>(a: &LceArgs<'_>, f: impl FnOnce(&Lce<'_>) -> R) -> Result<R> {
    let Sizes { rows, dims, vocab } = Sizes::of(a);
    let tg = row_targets(a)?;
    let h = f32_dense(&a.h);
    let w = f32_dense(&a.w);
    let lce = Lce {
        h: h.as_slice(rows * dims),
        w: w.as_slice(vocab * dims),
        tg,
        rows,
        dims,
        vocab,
        cols: chunk_cols(rows, vocab, a.chunk),
        block_rows: a.block_rows,
        smoothing: a.label_smoothing,
    };
    Ok(f(&lce))
}

/// Per-row cross-entropy of the logits `h @ w^T` without materialising
/// them: f32 losses of shape `h.shape[..-1]`.
pub fn linear_cross_entropy(a: &LceArgs<'_>) -> Result<ArrayData> {
    let rows_shape = &a.h.shape[..a.h.shape.len() - 1];
    let mut out = ArrayData::alloc(rows_shape, Dtype::F32);
    let n = size_of_shape(rows_shape);
    with_lce(a, |l| l.forward(out.as_mut_slice(n)))?;
    Ok(out)
}

/// The gradients of [`linear_cross_entropy`] for row cotangents `ct` (any
/// float dtype) given its f32 `loss`: one flat buffer of `a.h.dtype` holding
/// `dh` (`h`'s shape) followed by `dw` (`[V, D]`).
pub fn linear_cross_entropy_grad(
    a: &LceArgs<'_>,
    ct: &Operand<'_>,
    loss: &Operand<'_>,
) -> Result<ArrayData> {
    let rows_shape = &a.h.shape[..a.h.shape.len() - 1];
    let (hn, wn) = (size_of_shape(a.h.shape), size_of_shape(a.w.shape));
    let ctv = copy_cast(&ct.with_shape(rows_shape), Dtype::F32);
    let lossv = f32_dense(&loss.with_shape(rows_shape));
    let n = size_of_shape(rows_shape);
    let mut out = ArrayData::alloc(&[hn + wn], Dtype::F32);
    with_lce(a, |l| {
        let (dh, dw) = out.as_mut_slice::<f32>(hn + wn).split_at_mut(hn);
        l.backward(lossv.as_slice(n), ctv.as_slice(n), dh, dw)
    })?;
    Ok(if a.h.dtype == Dtype::F32 {
        out
    } else {
        copy_cast(&Operand::new(out, &[hn + wn], Dtype::F32), a.h.dtype)
    })
}

/// The weighted loss `sum_r rw[r] * loss_r` and its gradients in one pass
/// (see `Lce::value_and_grad`): one flat f32 buffer holding `dh` (`h`'s
/// shape), then `dw` (`[V, D]`), then the loss.
pub fn linear_cross_entropy_value_and_grad(a: &LceArgs<'_>, rw: &Operand<'_>) -> Result<ArrayData> {
    let rows_shape = &a.h.shape[..a.h.shape.len() - 1];
    let (hn, wn) = (size_of_shape(a.h.shape), size_of_shape(a.w.shape));
    let n = size_of_shape(rows_shape);
    let rwv = copy_cast(&rw.with_shape(rows_shape), Dtype::F32);
    let mut out = ArrayData::alloc(&[hn + wn + 1], Dtype::F32);
    let (dh, rest) = out.as_mut_slice::<f32>(hn + wn + 1).split_at_mut(hn);
    let (dw, total) = rest.split_at_mut(wn);
    #[cfg(target_arch = "x86_64")]
    if a.h.dtype == Dtype::BF16 && n > 0 && super::bf16::enabled(Sizes::of(a).dims) {
        total[0] = value_and_grad_bf16(a, rwv.as_slice(n), dh, dw)?;
        return Ok(out);
    }
    with_lce(a, |l| total[0] = l.value_and_grad(rwv.as_slice(n), dh, dw))?;
    Ok(out)
}

/// The one-pass loss and gradients of bfloat16 `h` and `w` through
/// [`super::bf16`] (bfloat16 products, f32 statistics and
/// results), a block of rows at a time as `Lce::value_and_grad_avx512`.
#[cfg(target_arch = "x86_64")]
fn value_and_grad_bf16(a: &LceArgs<'_>, rw: &[f32], dh: &mut [f32], dw: &mut [f32]) -> Result<f32> {
    use super::avx512::round_block;
    use super::bf16::{keeps_logits, recomputing_block, value_and_grad_block};
    let Sizes { rows, dims, vocab } = Sizes::of(a);
    let tg = row_targets(a)?;
    let h = contiguous(&a.h);
    let mut w = contiguous(&a.w);
    if !(w.ptr::<u16>() as usize).is_multiple_of(4) {
        // The kernel reads two neighbouring features as one word.
        w = copy_cast(&a.w, Dtype::BF16);
    }
    let (h, w) = (
        h.as_slice::<u16>(rows * dims),
        w.as_slice::<u16>(vocab * dims),
    );
    let keep = keeps_logits();
    let block = if keep || a.block_rows > 0 {
        round_block(block_rows(rows, vocab, a.block_rows))
    } else {
        round_block(rows.min(recomputing_block(dims)))
    };
    let mut lt = keep.then(|| ArrayData::alloc(&[vocab, block], Dtype::F32));
    let mut lt = lt.as_mut().map(|l| l.as_mut_slice::<f32>(vocab * block));
    Ok(sum_over_blocks(rows, dims, block, dh, |r, dh, first| {
        value_and_grad_block(
            &h[r.start * dims..r.end * dims],
            w,
            &tg[r.clone()],
            &rw[r],
            a.label_smoothing,
            dims,
            lt.as_deref_mut(),
            dh,
            dw,
            first,
        )
    }))
}
