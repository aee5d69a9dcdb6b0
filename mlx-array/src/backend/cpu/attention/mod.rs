//! Fused scaled dot-product attention and its gradient, one block of query
//! rows at a time (the FlashAttention recipe on top of GEMM).
//!
//! The forward pass never holds more than a `64 x Lk` block of scores: per
//! block it multiplies the queries by the keys they may see, turns the
//! scores into probabilities in place, multiplies them by the values, and
//! keeps each row's logsumexp. With a causal mask a block stops at the last
//! key its last row sees, so about half of the products are never computed.
//! The gradient recomputes each block's probabilities from the logsumexp
//! instead of keeping `[B, H, Lq, Lk]` of them alive from the forward pass.
//!
//! Layouts: the output is written as `[B, Lq, H, dv]` (the order
//! `merge_heads` wants, so that it is a view) followed by the logsumexps
//! `[B, H, Lq]`; the gradients are `dq [B, Lq, H, d]`, `dk [B, Lk, H_kv, d]`,
//! `dv [B, Lk, H_kv, dv]` one after another (the order `split_heads` came
//! from).
//!
//! Grouped-query attention (`H_kv < H` key/value heads): query head `h`
//! reads the rows of key/value head `h / (H / H_kv)` in place, and the
//! gradients of a key/value head accumulate over its group's query heads
//! (the f32 kernels walk the heads in order; the bf16 ones give a task a
//! key/value head and its group).

#[cfg(target_arch = "x86_64")]
mod bf16;

use super::blas::{Mat, gemm};
use super::copy::copy_cast;
use super::loss::{exp_shifted_in_place, max_of, vectorised};
use crate::backend::common::attention::AttentionDims;
use crate::{ArrayData, Dtype, Operand};

/// Query rows per block.
pub(super) const BLOCK: usize = 64;

/// A `[B, H, L, w]` operand as GEMM reads it: row `i` of head `(b, h)`
/// starts at `b * sb + h * sh + i * si` elements (of type `T`) from `ptr`,
/// and its `w` elements are adjacent.
#[derive(Clone, Copy)]
pub(super) struct Rows<T = f32> {
    ptr: *mut T,
    sb: usize,
    sh: usize,
    /// Elements between rows.
    pub(super) si: usize,
}

// SAFETY: the rows are read, and written in disjoint parts, by tasks the
// kernels wait for.
unsafe impl<T> Send for Rows<T> {}
unsafe impl<T> Sync for Rows<T> {}

impl<T> Rows<T> {
    /// The rows of `data` (shape `[B, H, L, w]`, elements of `dtype`, whose
    /// size is `T`'s): the view itself when its rows are dense with
    /// non-negative strides, else a dense copy.
    pub(super) fn of_dtype(
        data: &ArrayData,
        shape: &[usize],
        dtype: Dtype,
    ) -> (ArrayData, Rows<T>) {
        debug_assert_eq!(dtype.size_of(), size_of::<T>());
        let s = data.strides();
        let fits = s.iter().all(|&x| x >= 0)
            && (s[3] == 1 || shape[3] <= 1)
            && (s[2] as usize >= shape[3] || shape[2] <= 1);
        let data = if fits {
            data.clone()
        } else {
            copy_cast(&Operand::new(data.clone(), shape, dtype), dtype)
        };
        let s = data.strides();
        let rows = Rows {
            ptr: data.ptr::<T>() as *mut T,
            sb: s[0] as usize,
            sh: s[1] as usize,
            si: (s[2] as usize).max(shape[3]),
        };
        (data, rows)
    }
    /// Dense rows of `w` laid out `[B, L, H, w]` at `ptr`.
    pub(super) fn interleaved(ptr: *mut T, l: usize, h: usize, w: usize) -> Rows<T> {
        Rows {
            ptr,
            sb: l * h * w,
            sh: w,
            si: h * w,
        }
    }
    /// Row `i` of head `(b, h)`.
    pub(super) fn at(&self, b: usize, h: usize, i: usize) -> *mut T {
        // SAFETY: callers stay inside the operand's `[B, H, L, w]` extent.
        unsafe { self.ptr.add(b * self.sb + h * self.sh + i * self.si) }
    }
    /// The first `len` elements of head `(b, h)`, read only (the
    /// logsumexps of [`saved_forward`], one to a query).
    pub(super) fn head(&self, b: usize, h: usize, len: usize) -> &[T] {
        // SAFETY: callers stay inside the head's extent, which nothing
        // writes while it is read.
        unsafe { std::slice::from_raw_parts(self.at(b, h, 0), len) }
    }
    /// [`Rows::head`] to be written (the logsumexps of [`forward_buffer`]).
    ///
    /// # Safety
    /// Nothing else reads or writes head `(b, h)`'s `len` elements while the
    /// slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn head_mut(&self, b: usize, h: usize, len: usize) -> &mut [T] {
        // SAFETY: within the head's extent; exclusive by the caller's promise.
        unsafe { std::slice::from_raw_parts_mut(self.at(b, h, 0), len) }
    }
}

/// The packed gradients of `dims` as the gradient kernels return them
/// (`dk` and `dv` zeroed: they accumulate over the query blocks), and the
/// rows of `dq`, `dk` and `dv` in them.
pub(super) fn grad_buffer(dims: &AttentionDims) -> (ArrayData, [Rows; 3]) {
    let AttentionDims {
        h,
        hkv,
        lq,
        lk,
        d,
        dv,
        ..
    } = *dims;
    let (nq, nk, nv) = dims.grad_len();
    let mut grads = ArrayData::alloc(&[nq + nk + nv], Dtype::F32);
    let all = grads.as_mut_slice::<f32>(nq + nk + nv);
    all[nq..].fill(0.0);
    let buf = all.as_mut_ptr();
    // SAFETY: dk and dv follow dq in the same allocation.
    let rows = unsafe {
        [
            Rows::interleaved(buf, lq, h, d),
            Rows::interleaved(buf.add(nq), lk, hkv, d),
            Rows::interleaved(buf.add(nq + nk), lk, hkv, dv),
        ]
    };
    (grads, rows)
}

/// The forward pass's result as [`attention`] returns it, to be written:
/// the data, the output's rows, and the logsumexps, `lq` to a head
/// ([`Rows::head_mut`]).
pub(super) fn forward_buffer(dims: &AttentionDims) -> (ArrayData, Rows, Rows) {
    let (n_out, n_lse) = dims.packed_len();
    let mut packed = ArrayData::alloc(&[n_out + n_lse], Dtype::F32);
    let base = packed.as_mut_slice::<f32>(n_out + n_lse).as_mut_ptr();
    let [out, lse] = forward_rows(base, dims);
    (packed, out, lse)
}

/// The forward pass's result `packed` as the gradient kernels read it: the
/// data (which must outlive the rows), the output's rows, and the
/// logsumexps, `lq` to a head ([`Rows::head`]).
pub(super) fn saved_forward(packed: &ArrayData, dims: &AttentionDims) -> (ArrayData, Rows, Rows) {
    let (n_out, n_lse) = dims.packed_len();
    let packed =
        super::copy::contiguous(&Operand::new(packed.clone(), &[n_out + n_lse], Dtype::F32));
    let [out, lse] = forward_rows(packed.ptr::<f32>() as *mut f32, dims);
    (packed, out, lse)
}

/// The output's rows (`[B, Lq, H, dv]`) and the logsumexps (`[B, H, Lq]`,
/// after the output) of the forward pass's packed result at `base`.
fn forward_rows(base: *mut f32, dims: &AttentionDims) -> [Rows; 2] {
    let AttentionDims { h, lq, dv, .. } = *dims;
    let lse = Rows {
        // SAFETY: the logsumexps follow the output in the same allocation.
        ptr: unsafe { base.add(dims.packed_len().0) },
        sb: h * lq,
        sh: lq,
        si: 1,
    };
    [Rows::interleaved(base, lq, h, dv), lse]
}

/// The rows of `q`, `k` and `v` (elements of `dtype`, whose size is
/// `T`'s), with the data they point into (a copy where one was needed),
/// which must outlive them.
pub(super) fn operands<T>(
    qkv: [&ArrayData; 3],
    dims: &AttentionDims,
    dtype: Dtype,
) -> ([ArrayData; 3], [Rows<T>; 3]) {
    let shapes = dims.shapes();
    let [(q, qr), (k, kr), (v, vr)] =
        std::array::from_fn(|i| Rows::of_dtype(qkv[i], &shapes[i], dtype));
    ([q, k, v], [qr, kr, vr])
}

impl Rows<f32> {
    /// The f32 rows of `data` ([`Rows::of_dtype`]).
    fn of(data: &ArrayData, shape: &[usize]) -> (ArrayData, Rows) {
        Self::of_dtype(data, shape, Dtype::F32)
    }
    /// The matrix of head `(b, h)` from row `i` on, as GEMM reads it.
    fn mat(&self, b: usize, h: usize, i: usize) -> Mat {
        Mat(self.at(b, h, i), self.si)
    }
}

/// The three operands converted to f32 (dense) when they are of another
/// dtype.
fn as_f32(qkv: [&ArrayData; 3], dims: &AttentionDims, dtype: Dtype) -> [ArrayData; 3] {
    let shapes = dims.shapes();
    std::array::from_fn(|i| copy_cast(&Operand::new(qkv[i].clone(), &shapes[i], dtype), Dtype::F32))
}

/// `softmax(scale * q @ k^T [causal]) @ v` for `q`, `k`, `v` of `dtype`
/// shaped as `dims` says, packed as the module doc describes (f32). f32
/// operands go to the GEMM blocks below; bfloat16 ones to the AMX tiles
/// ([`bf16`]) where they apply, and any other dtype is
/// converted to f32 first.
pub fn attention(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
    dtype: Dtype,
) -> ArrayData {
    #[cfg(target_arch = "x86_64")]
    if dtype == Dtype::BF16 && bf16::applies(dims) {
        return bf16::attention(q, k, v, dims);
    }
    if dtype != Dtype::F32 {
        let [q, k, v] = as_f32([q, k, v], dims, dtype);
        return attention_f32(&q, &k, &v, dims);
    }
    attention_f32(q, k, v, dims)
}

/// [`attention`] of f32 operands.
fn attention_f32(q: &ArrayData, k: &ArrayData, v: &ArrayData, dims: &AttentionDims) -> ArrayData {
    let AttentionDims {
        b,
        h,
        lq,
        lk,
        d,
        dv,
        ..
    } = *dims;
    let (packed, out, lses) = forward_buffer(dims);
    let (_qkv, [qr, kr, vr]) = operands::<f32>([q, k, v], dims, Dtype::F32);
    let mut scores = vec![0f32; BLOCK * lk];
    for (bi, hi) in heads(b, h) {
        // SAFETY: only this iteration holds head (bi, hi)'s logsumexps.
        let lse = unsafe { lses.head_mut(bi, hi, lq) };
        for i0 in (0..lq).step_by(BLOCK) {
            let rows = BLOCK.min(lq - i0);
            let keys = dims.limit(i0 + rows - 1);
            let s = &mut scores[..rows * keys];
            let (q_blk, k_all) = (qr.mat(bi, hi, i0), kr.mat(bi, dims.kv_head(hi), 0));
            // SAFETY: every operand addresses rows of its own buffer, sized above.
            unsafe {
                gemm(
                    false,
                    true,
                    [rows, keys, d],
                    dims.scale,
                    q_blk,
                    k_all,
                    0.0,
                    Mat::dense(s, keys),
                )
            };
            probabilities(s, keys, i0, dims, 1.0, lse);
            // SAFETY: as above; the output rows of this block are written once.
            unsafe {
                let o_blk = out.mat(bi, hi, i0);
                gemm(
                    false,
                    false,
                    [rows, dv, keys],
                    1.0,
                    Mat::dense(s, keys),
                    vr.mat(bi, dims.kv_head(hi), 0),
                    0.0,
                    o_blk,
                )
            };
        }
    }
    packed
}

/// The gradients `dq`, `dk`, `dv` (f32) of [`attention`] of `q`, `k`, `v`
/// of `dtype` for the f32 cotangent `d_out` of its output (`[B, H, Lq,
/// dv]`, any strides), from `packed`, its result; the products run where
/// [`attention`]'s did.
pub fn attention_grad(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    packed: &ArrayData,
    d_out: &ArrayData,
    dims: &AttentionDims,
    dtype: Dtype,
) -> ArrayData {
    #[cfg(target_arch = "x86_64")]
    if dtype == Dtype::BF16 && bf16::applies(dims) {
        return bf16::attention_grad(q, k, v, packed, d_out, dims);
    }
    if dtype != Dtype::F32 {
        let [q, k, v] = as_f32([q, k, v], dims, dtype);
        return attention_grad_f32(&q, &k, &v, packed, d_out, dims);
    }
    attention_grad_f32(q, k, v, packed, d_out, dims)
}

/// [`attention_grad`] of f32 operands.
fn attention_grad_f32(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    packed: &ArrayData,
    d_out: &ArrayData,
    dims: &AttentionDims,
) -> ArrayData {
    let AttentionDims {
        b,
        h,
        lq,
        lk,
        d,
        dv,
        ..
    } = *dims;
    let (grads, [dq, dk, dvr]) = grad_buffer(dims);
    let (_qkv, [qr, kr, vr]) = operands::<f32>([q, k, v], dims, Dtype::F32);
    let (_g, gr) = Rows::of(d_out, &[b, h, lq, dv]);
    let (_packed, out, lses) = saved_forward(packed, dims);
    let mut probs = vec![0f32; BLOCK * lk];
    let mut dprobs = vec![0f32; BLOCK * lk];
    let mut dots = [0f32; BLOCK];
    for (bi, hi) in heads(b, h) {
        let lse = lses.head(bi, hi, lq);
        // The key/value head this query head reads, whose gradients sum
        // over its group (the heads run in order: no two write at once).
        let kh = dims.kv_head(hi);
        for i0 in (0..lq).step_by(BLOCK) {
            let rows = BLOCK.min(lq - i0);
            let keys = dims.limit(i0 + rows - 1);
            let (p, dp) = (&mut probs[..rows * keys], &mut dprobs[..rows * keys]);
            let (q_blk, g_blk) = (qr.mat(bi, hi, i0), gr.mat(bi, hi, i0));
            let (k_all, v_all) = (kr.mat(bi, kh, 0), vr.mat(bi, kh, 0));
            // SAFETY (every GEMM below): the operands address rows of their
            // own buffers within the extents set above; dk and dv are
            // accumulated (beta 1) into its key/value head's rows.
            unsafe {
                // The scores, as in the forward pass, and d_out @ v^T.
                gemm(
                    false,
                    true,
                    [rows, keys, d],
                    dims.scale,
                    q_blk,
                    k_all,
                    0.0,
                    Mat::dense(p, keys),
                );
                gemm(
                    false,
                    true,
                    [rows, keys, dv],
                    1.0,
                    g_blk,
                    v_all,
                    0.0,
                    Mat::dense(dp, keys),
                );
            }
            output_dots(&out, &gr, (bi, hi, i0), dv, &mut dots[..rows]);
            score_gradients(p, dp, keys, i0, dims, lse, &dots[..rows], [1.0, 1.0]);
            let (p, ds) = (Mat::dense(p, keys), Mat::dense(dp, keys));
            unsafe {
                // dv[..keys] += p^T @ d_out[block]
                gemm(
                    true,
                    false,
                    [keys, dv, rows],
                    1.0,
                    p,
                    g_blk,
                    1.0,
                    dvr.mat(bi, kh, 0),
                );
                // dq[block] = scale * ds @ k[..keys]
                gemm(
                    false,
                    false,
                    [rows, d, keys],
                    dims.scale,
                    ds,
                    k_all,
                    0.0,
                    dq.mat(bi, hi, i0),
                );
                // dk[..keys] += scale * ds^T @ q[block]
                gemm(
                    true,
                    false,
                    [keys, d, rows],
                    dims.scale,
                    ds,
                    q_blk,
                    1.0,
                    dk.mat(bi, kh, 0),
                );
            }
        }
    }
    grads
}

/// Turns a block of scores (`rows x width`, row `r` the query `i0 + r`)
/// into probabilities in place: each row's scores are multiplied by `scale`
/// and soft-maxed over the keys the row sees, the rest of the row set to
/// zero, and the row's logsumexp stored in `lse[i0 + r]`.
pub(super) fn probabilities(
    s: &mut [f32],
    width: usize,
    i0: usize,
    dims: &AttentionDims,
    scale: f32,
    lse: &mut [f32],
) {
    vectorised(
        #[inline(always)]
        || {
            for (r, row) in s.chunks_exact_mut(width).enumerate() {
                let (seen, masked) = row.split_at_mut(dims.limit(i0 + r));
                if scale != 1.0 {
                    seen.iter_mut().for_each(|x| *x *= scale);
                }
                let m = max_of(seen, f32::NEG_INFINITY);
                let total = exp_shifted_in_place(seen, m);
                let inv = 1.0 / total;
                seen.iter_mut().for_each(|p| *p *= inv);
                masked.fill(0.0);
                lse[i0 + r] = m + total.ln();
            }
        },
    );
}

/// The backward pass's block of probabilities and score gradients, in
/// place: from the scores `p` (`rows x width`) and `dp = d_out @ v^T`, `p =
/// exp(scale_in * p - lse)` and `dp = scale_out * p * (dp - dot)` over the
/// keys each row sees, zero past them; `dots[r]` is row `r`'s `o . d_out`.
#[allow(clippy::too_many_arguments)]
pub(super) fn score_gradients(
    p: &mut [f32],
    dp: &mut [f32],
    width: usize,
    i0: usize,
    dims: &AttentionDims,
    lse: &[f32],
    dots: &[f32],
    [scale_in, scale_out]: [f32; 2],
) {
    vectorised(
        #[inline(always)]
        || {
            for (r, (pr, dr)) in p
                .chunks_exact_mut(width)
                .zip(dp.chunks_exact_mut(width))
                .enumerate()
            {
                let seen = dims.limit(i0 + r);
                let (l, dot) = (lse[i0 + r], dots[r]);
                for (x, g) in pr[..seen].iter_mut().zip(&mut dr[..seen]) {
                    *x = super::math::exp(*x * scale_in - l);
                    *g = *x * (*g - dot) * scale_out;
                }
                pr[seen..].fill(0.0);
                dr[seen..].fill(0.0);
            }
        },
    );
}

/// `dots[r] = o[i0 + r] . d_out[i0 + r]` for the rows of one block of head
/// `(b, h)`: the softmax gradient's row term.
pub(super) fn output_dots(
    out: &Rows,
    d_out: &Rows,
    (b, h, i0): (usize, usize, usize),
    dv: usize,
    dots: &mut [f32],
) {
    for (r, dot) in dots.iter_mut().enumerate() {
        // SAFETY: row i0 + r of the output and of its cotangent (the
        // caller's rows).
        let (o, g) = unsafe {
            (
                std::slice::from_raw_parts(out.at(b, h, i0 + r), dv),
                std::slice::from_raw_parts(d_out.at(b, h, i0 + r), dv),
            )
        };
        *dot = o.iter().zip(g).map(|(a, b)| a * b).sum();
    }
}

/// Every head `(b, h)` in order.
pub(super) fn heads(b: usize, h: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..b).flat_map(move |bi| (0..h).map(move |hi| (bi, hi)))
}
