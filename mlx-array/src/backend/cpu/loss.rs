//! Row-wise softmax kernels: the softmax itself, and the fused softmax
//! cross-entropy (one pass per row for the loss, one for its gradient, with
//! no logits-sized temporaries).

use half::{bf16, f16};
use rayon::prelude::*;

use super::blas::{Mat, gemm};
use super::copy::{contiguous, copy_cast};

use super::math::{self, FloatLike};
use crate::shape::size_of_shape;
use crate::{ArrayData, Dtype, Error, Result};

fn targets(t: &ArrayData, shape: &[usize], dtype: Dtype, vocab: usize) -> Result<Vec<usize>> {
    let c = copy_cast(t, shape, dtype, Dtype::I64);
    c.as_slice::<i64>(size_of_shape(shape))
        .iter()
        .map(|&i| {
            if i < 0 || i as usize >= vocab {
                Err(Error::eval(
                    "cross_entropy",
                    format!("target {i} is out of range for {vocab} classes"),
                ))
            } else {
                Ok(i as usize)
            }
        })
        .collect()
}

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
pub fn softmax(x: ArrayData, shape: &[usize], dtype: Dtype, donated: bool) -> Result<ArrayData> {
    let width = shape.last().copied().unwrap_or(1);
    let n = size_of_shape(shape);
    let out = if donated {
        x
    } else {
        copy_cast(&x, shape, dtype, dtype)
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
pub fn cross_entropy(
    logits: &ArrayData,
    shape: &[usize],
    dtype: Dtype,
    t: &ArrayData,
    t_dtype: Dtype,
) -> Result<ArrayData> {
    let vocab = *shape.last().expect("logits have a class axis");
    let rows = &shape[..shape.len() - 1];
    let tg = targets(t, rows, t_dtype, vocab)?;
    let x = contiguous(logits, shape, dtype);
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
#[allow(clippy::too_many_arguments)]
pub fn cross_entropy_grad(
    logits: ArrayData,
    shape: &[usize],
    dtype: Dtype,
    t: &ArrayData,
    t_dtype: Dtype,
    ct: &ArrayData,
    ct_dtype: Dtype,
    donated: bool,
) -> Result<ArrayData> {
    let vocab = *shape.last().expect("logits have a class axis");
    let rows = &shape[..shape.len() - 1];
    let tg = targets(t, rows, t_dtype, vocab)?;
    let ctv = copy_cast(ct, rows, ct_dtype, Dtype::F32);
    let ctv = ctv.as_slice::<f32>(tg.len());
    let out = if donated {
        logits
    } else {
        copy_cast(&logits, shape, dtype, dtype)
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

// ------------------------------------------ output projection + cross-entropy

/// A target that contributes nothing (its row equals the ignore index).
pub(super) const IGNORED: usize = usize::MAX;

/// Bytes of logits computed at a time when the caller does not choose.
const CHUNK_BYTES: usize = 16 << 20;

/// Bytes of logits per row block of the one-pass loss and gradient: larger
/// blocks mean fewer passes of `dw` through memory. (256 rows of GPT-2's
/// vocabulary; at 1022 rows on one thread, 4 blocks of 256 instead of 8 of
/// 128 took 630-670 ms instead of 690-820.)
const BLOCK_BYTES: usize = 50 << 20;

/// Row blocks of the one-pass loss at most, when [`BLOCK_BYTES`] would make
/// more: each block has a fixed cost of the weight's size.
const MAX_BLOCKS: usize = 9;

/// Targets as class indices, with rows equal to `ignore` marked [`IGNORED`].
fn targets_ignoring(
    t: &ArrayData,
    shape: &[usize],
    dtype: Dtype,
    vocab: usize,
    ignore: Option<i64>,
) -> Result<Vec<usize>> {
    let c = copy_cast(t, shape, dtype, Dtype::I64);
    c.as_slice::<i64>(size_of_shape(shape))
        .iter()
        .map(|&i| {
            if Some(i) == ignore {
                Ok(IGNORED)
            } else if i < 0 || i as usize >= vocab {
                Err(Error::eval(
                    "linear_cross_entropy",
                    format!("target {i} is out of range for {vocab} classes"),
                ))
            } else {
                Ok(i as usize)
            }
        })
        .collect()
}

/// Vocabulary columns per chunk: `requested` when set, else about
/// [`CHUNK_BYTES`] of f32 logits for `rows` rows.
pub(crate) fn chunk_cols(rows: usize, vocab: usize, requested: usize) -> usize {
    let c = if requested > 0 {
        requested
    } else {
        (CHUNK_BYTES / 4 / rows.max(1)).max(256)
    };
    c.min(vocab).max(1)
}

/// The view as contiguous f32 (itself when it already is).
fn f32_dense(data: &ArrayData, shape: &[usize], dtype: Dtype) -> ArrayData {
    if dtype == Dtype::F32 {
        contiguous(data, shape, dtype)
    } else {
        copy_cast(data, shape, dtype, Dtype::F32)
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

/// Independent accumulators per reduction, so that the compiler vectorises
/// the loops below (f32 sums are not reassociated on their own).
const LANES: usize = 16;

/// `max(init, max(row))`.
#[inline]
pub(super) fn max_of(row: &[f32], init: f32) -> f32 {
    let mut acc = [init; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(c[i]);
        }
    }
    rest.iter().chain(&acc).fold(init, |m, &x| m.max(x))
}

/// `sum(exp(row - m))`.
#[inline]
fn sum_exp(row: &[f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += math::exp(c[i] - m);
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|&x| math::exp(x - m)).sum::<f32>()
}

/// `sum(row)`.
#[inline]
fn sum_of(row: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// Replaces every `x` of `row` by `exp(x - m)` and returns their sum, in
/// lanes (inlined so that it vectorises inside [`vectorised`]).
#[inline(always)]
pub(super) fn exp_shifted_in_place(row: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for ch in &mut chunks {
        for i in 0..LANES {
            ch[i] = math::exp(ch[i] - m);
            acc[i] += ch[i];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for x in chunks.into_remainder() {
        *x = math::exp(*x - m);
        sum += *x;
    }
    sum
}

/// Runs `f` compiled for AVX-512 (else AVX2 and FMA) when the CPU has it, so
/// that the `exp` loops inlined into it use 16- (else 8-) wide vectors.
///
/// Only code inlined into `f` gets the wider instructions, and LLVM does not
/// inline a large closure on its own: pass `#[inline(always)] || ...`, or
/// the body runs as plain SSE2 (the one-pass loss's row pass then took 2.6
/// times as long as with AVX-512). Every path does the same operations in
/// the same order, so the results do not depend on the path taken.
#[inline(always)]
pub(super) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { avx512(f) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { avx2(f) };
        }
    }
    f()
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

impl Lce<'_> {
    /// Rows per block of [`Self::value_and_grad`]: as asked, else at most
    /// [`BLOCK_BYTES`] of f32 logits over the whole vocabulary (at least 8
    /// rows) or a [`MAX_BLOCKS`]th of the rows, whichever is more, split
    /// evenly over the blocks that takes. Every block packs all of `w` twice
    /// and updates all of `dw` whatever its size (about 20 ms for a 50257 x
    /// 256 weight), so a thin last block (22 of 1022 rows at 125 per block)
    /// costs far more per row than a full one, and many blocks cost more
    /// than a few: with the bound on their number the buffer grows with the
    /// batch, as the activations do, while staying a ninth of what whole
    /// logits would take. (At 2044 rows of a 50257-class vocabulary on two
    /// threads, 9 blocks instead of 17 took 740-820 ms instead of 860-900.)
    fn block_rows(&self) -> usize {
        let rows = self.rows.max(1);
        if self.block_rows > 0 {
            return self.block_rows.min(rows);
        }
        let most = (BLOCK_BYTES / 4 / self.vocab.max(1))
            .max(8)
            .max(rows.div_ceil(MAX_BLOCKS));
        rows.div_ceil(rows.div_ceil(most))
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
        if super::lce_avx512::enabled(dims) {
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
    /// [`super::lce_avx512`], blocks rounded up to whole 32-row tiles.
    fn value_and_grad_avx512(&self, rw: &[f32], dh: &mut [f32], dw: &mut [f32]) -> f32 {
        use super::lce_avx512::{round_block, value_and_grad_block};
        let (rows, dims) = (self.rows, self.dims);
        let block = round_block(self.block_rows());
        let mut lt = ArrayData::alloc(&[self.vocab, block], Dtype::F32);
        let lt = lt.as_mut_slice::<f32>(self.vocab * block);
        let mut total = 0f64;
        for (b, r0) in (0..rows).step_by(block).enumerate() {
            let r1 = (r0 + block).min(rows);
            total += value_and_grad_block(
                &self.h[r0 * dims..r1 * dims],
                self.w,
                &self.tg[r0..r1],
                &rw[r0..r1],
                self.smoothing,
                dims,
                lt,
                &mut dh[r0 * dims..r1 * dims],
                dw,
                b == 0,
            );
        }
        total as f32
    }
}

/// Shapes and options of a fused output projection + cross-entropy.
pub struct LceArgs<'a> {
    /// Hidden states `[..., D]` and their dtype (also the weight's).
    pub h: (&'a ArrayData, &'a [usize]),
    /// The projection weight `[V, D]`.
    pub w: (&'a ArrayData, &'a [usize]),
    /// The float dtype of `h` and `w`.
    pub dtype: Dtype,
    /// Integer targets `[...]` and their dtype.
    pub t: (&'a ArrayData, Dtype),
    /// Rows with this target get no loss and no gradient.
    pub ignore_index: Option<i64>,
    /// Label smoothing in `[0, 1)`.
    pub label_smoothing: f32,
    /// Classes per chunk (0 = about 16 MiB of logits).
    pub chunk: usize,
    /// Rows per block of the one-pass loss and gradient (0 = equal blocks
    /// of at most 50 MiB of logits or a ninth of the rows, whichever is more;
    /// rounded up to a multiple of 32 on the AVX-512 path).
    pub block_rows: usize,
}

/// Runs `f` on the dense f32 view of the arguments.
fn with_lce<R>(a: &LceArgs<'_>, f: impl FnOnce(&Lce<'_>) -> R) -> Result<R> {
    let dims = *a.h.1.last().expect("hidden states have a feature axis");
    let rows_shape = &a.h.1[..a.h.1.len() - 1];
    let rows = size_of_shape(rows_shape);
    let vocab = a.w.1[0];
    let tg = targets_ignoring(a.t.0, rows_shape, a.t.1, vocab, a.ignore_index)?;
    let h = f32_dense(a.h.0, a.h.1, a.dtype);
    let w = f32_dense(a.w.0, a.w.1, a.dtype);
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
    let rows_shape = &a.h.1[..a.h.1.len() - 1];
    let mut out = ArrayData::alloc(rows_shape, Dtype::F32);
    let n = size_of_shape(rows_shape);
    with_lce(a, |l| l.forward(out.as_mut_slice(n)))?;
    Ok(out)
}

/// The gradients of [`linear_cross_entropy`] for row cotangents `ct` (any
/// float dtype) given its f32 `loss`: one flat buffer of `a.dtype` holding
/// `dh` (`h`'s shape) followed by `dw` (`[V, D]`).
pub fn linear_cross_entropy_grad(
    a: &LceArgs<'_>,
    ct: (&ArrayData, Dtype),
    loss: &ArrayData,
) -> Result<ArrayData> {
    let rows_shape = &a.h.1[..a.h.1.len() - 1];
    let (hn, wn) = (size_of_shape(a.h.1), size_of_shape(a.w.1));
    let ctv = copy_cast(ct.0, rows_shape, ct.1, Dtype::F32);
    let lossv = f32_dense(loss, rows_shape, Dtype::F32);
    let n = size_of_shape(rows_shape);
    let mut out = ArrayData::alloc(&[hn + wn], Dtype::F32);
    with_lce(a, |l| {
        let (dh, dw) = out.as_mut_slice::<f32>(hn + wn).split_at_mut(hn);
        l.backward(lossv.as_slice(n), ctv.as_slice(n), dh, dw)
    })?;
    Ok(if a.dtype == Dtype::F32 {
        out
    } else {
        copy_cast(&out, &[hn + wn], Dtype::F32, a.dtype)
    })
}

/// The weighted loss `sum_r rw[r] * loss_r` and its gradients in one pass
/// (see `Lce::value_and_grad`): one flat f32 buffer holding `dh` (`h`'s
/// shape), then `dw` (`[V, D]`), then the loss.
pub fn linear_cross_entropy_value_and_grad(
    a: &LceArgs<'_>,
    rw: (&ArrayData, Dtype),
) -> Result<ArrayData> {
    let rows_shape = &a.h.1[..a.h.1.len() - 1];
    let (hn, wn) = (size_of_shape(a.h.1), size_of_shape(a.w.1));
    let n = size_of_shape(rows_shape);
    let rwv = copy_cast(rw.0, rows_shape, rw.1, Dtype::F32);
    let mut out = ArrayData::alloc(&[hn + wn + 1], Dtype::F32);
    with_lce(a, |l| {
        let (dh, rest) = out.as_mut_slice::<f32>(hn + wn + 1).split_at_mut(hn);
        let (dw, total) = rest.split_at_mut(wn);
        total[0] = l.value_and_grad(rwv.as_slice(n), dh, dw);
    })?;
    Ok(out)
}
