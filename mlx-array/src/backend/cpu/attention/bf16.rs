//! Fused attention on bfloat16 `q`, `k` and `v` with the products on AMX
//! tiles ([`amx`]): the blocks, layouts and float32 softmax of
//! [`super`] (the f32 kernel), with every product's operands in bfloat16 and its
//! sums in float32, as FlashAttention computes in bfloat16.
//!
//! Per head, the operands that every block reads are packed once into the
//! tiles' layouts: `k^T` and `v` (forward), and `v^T` and `k` (backward),
//! as panels of 32 columns of pairs. Per block of 64 query rows, the
//! probabilities and the score gradients are rounded to bfloat16 for the
//! products that read them (`p @ v`, `p^T @ d_out`, `ds @ k`, `ds^T @ q`);
//! the scores, the softmax statistics, the outputs and the gradients stay
//! float32. Key/value heads run in parallel, one per task with the query
//! heads of its group (one query head per task without grouping): `k` and
//! `v` are packed once for the group, and their gradients sum over the
//! group's heads and blocks in the task's own columns of the result.
//!
//! The scale multiplies the float32 scores (forward) and the float32 score
//! gradients before they are rounded (backward).

use rayon::prelude::*;

use super::{
    BLOCK, Rows, forward_buffer, grad_buffer, heads, operands, output_dots, probabilities,
    saved_forward, score_gradients,
};
use crate::backend::common::attention::AttentionDims;
use crate::backend::cpu::matmul::amx::{self, COLS, STEP};
use crate::backend::cpu::matmul::gemm_bf16::{Matrix, pack_a, pack_b, round_row};
use crate::{ArrayData, Dtype};

/// Whether bfloat16 attention of these sizes runs on the tiles: the
/// bfloat16 products run on AMX ([`crate::backend::cpu::bf16_products`]) and the head
/// widths are whole tile columns (32), so that the products write whole
/// blocks of the outputs' rows.
pub(super) fn applies(dims: &AttentionDims) -> bool {
    crate::backend::cpu::bf16_products() == crate::backend::cpu::Bf16Products::Amx
        && dims.d.is_multiple_of(COLS)
        && dims.dv.is_multiple_of(COLS)
}

/// A task's packed operands and block buffers, kept between its heads.
#[derive(Default)]
struct Scratch {
    /// `q`'s rows as words of pairs.
    q: Vec<u32>,
    /// `k^T` in panels (the scores).
    kt: Vec<u32>,
    /// `v` (forward) or `k` (backward) in panels, pairs along the keys.
    keys: Vec<u32>,
    /// `v^T` in panels (`d_out @ v^T`).
    vt: Vec<u32>,
    /// The head's `d_out` rounded, as words of pairs.
    d_out: Vec<u32>,
    /// Scores, then probabilities (float32).
    s: Vec<f32>,
    /// `d_out @ v^T`, then the score gradients (float32).
    ds: Vec<f32>,
    /// The probabilities rounded (pairs of bfloat16 in words).
    p16: Vec<u32>,
    /// The score gradients rounded.
    ds16: Vec<u32>,
    /// A transposed block (`p^T`, `ds^T`) as rows of pairs.
    at: Vec<u32>,
    /// A block of `d_out` or `q` in panels.
    bp: Vec<u32>,
}

/// Words of pairs along `k` for a `k`-wide operand: whole tile steps.
fn words(k: usize) -> usize {
    k.div_ceil(2).next_multiple_of(STEP)
}

/// The bfloat16 rows of head `(b, h)` as a [`Matrix`]: `transposed` reads
/// them as columns.
fn matrix(rows: &Rows<u16>, (b, h, i): (usize, usize, usize), transposed: bool) -> Matrix {
    let (rs, cs) = if transposed {
        (1, rows.si)
    } else {
        (rows.si, 1)
    };
    Matrix {
        ptr: rows.at(b, h, i),
        rs,
        cs,
    }
}

/// A dense `rows x width` bfloat16 block (pairs in words) as a [`Matrix`].
fn dense(words: &[u32], width: usize, transposed: bool) -> Matrix {
    let (rs, cs) = if transposed { (1, width) } else { (width, 1) };
    Matrix {
        ptr: words.as_ptr() as *const u16,
        rs,
        cs,
    }
}

/// Rounds `src` to bfloat16 into `dst`, as pairs in words.
fn round_into(src: &[f32], dst: &mut Vec<u32>) {
    dst.clear();
    dst.resize(src.len().div_ceil(2), 0);
    // SAFETY: AMX implies AVX512_BF16 ([`applies`]); `dst` holds `src`'s
    // values.
    unsafe { round_row(src, &mut bytemuck::cast_slice_mut(dst)[..src.len()]) };
}

/// `softmax(scale * q @ k^T [causal]) @ v` for bfloat16 `q`, `k`, `v`, as
/// [`super::attention`] packs it (float32 output and
/// logsumexps).
///
/// Requires [`applies`].
pub(super) fn attention(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
) -> ArrayData {
    debug_assert!(applies(dims));
    let AttentionDims {
        b, lq, lk, d, dv, ..
    } = *dims;
    let (packed, out, lses) = forward_buffer(dims);
    let (_qkv, [qr, kr, vr]) = operands::<u16>([q, k, v], dims, Dtype::BF16);
    let (kp_d, kp_l) = (words(d), words(lk));
    let group = dims.group();
    let all: Vec<(usize, usize)> = heads(b, dims.hkv).collect();
    all.par_iter()
        .for_each_init(Scratch::default, |sc, &(bi, kh)| {
            // SAFETY (packing and every product below): the operands are this
            // group's rows, in bounds for the shapes given; AMX is available;
            // `kp_d` and the keys' words are whole steps and the widths whole
            // panels; the output rows of a block are this task's.
            unsafe {
                pack_b(&matrix(&kr, (bi, kh, 0), true), d, lk, kp_d, &mut sc.kt);
                pack_b(&matrix(&vr, (bi, kh, 0), false), lk, dv, kp_l, &mut sc.keys);
            }
            for hi in kh * group..(kh + 1) * group {
                // SAFETY: head (bi, hi)'s logsumexps are written by this task only.
                let lse = unsafe { lses.head_mut(bi, hi, lq) };
                // SAFETY: as above, for this query head's rows.
                unsafe { pack_a(&matrix(&qr, (bi, hi, 0), false), lq, d, kp_d, &mut sc.q) };
                for i0 in (0..lq).step_by(BLOCK) {
                    let rows = BLOCK.min(lq - i0);
                    let width = dims.limit(i0 + rows - 1).next_multiple_of(COLS);
                    sc.s.resize(rows * width, 0.0);
                    let s = &mut sc.s[..rows * width];
                    unsafe {
                        amx::gemm(
                            rows,
                            width,
                            kp_d,
                            sc.q[i0 * kp_d..].as_ptr(),
                            kp_d,
                            sc.kt.as_ptr(),
                            s.as_mut_ptr(),
                            width,
                            false,
                        )
                    };
                    probabilities(s, width, i0, dims, dims.scale, lse);
                    round_into(s, &mut sc.p16);
                    for g in 0..dv / COLS {
                        unsafe {
                            amx::gemm(
                                rows,
                                COLS,
                                width / 2,
                                sc.p16.as_ptr(),
                                width / 2,
                                sc.keys[g * kp_l * COLS..].as_ptr(),
                                out.at(bi, hi, i0).add(g * COLS),
                                out.si,
                                false,
                            )
                        };
                    }
                }
            }
        });
    packed
}

/// The gradients `dq`, `dk`, `dv` of [`attention`] for the float32
/// cotangent `d_out` of its output, from `packed`, its result, as
/// [`super::attention_grad`] packs them (float32).
///
/// Requires [`applies`].
pub(super) fn attention_grad(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    packed: &ArrayData,
    d_out: &ArrayData,
    dims: &AttentionDims,
) -> ArrayData {
    debug_assert!(applies(dims));
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
    let (_qkv, [qr, kr, vr]) = operands::<u16>([q, k, v], dims, Dtype::BF16);
    let (_g, gr) = Rows::<f32>::of_dtype(d_out, &[b, h, lq, dv], Dtype::F32);
    let (_packed, out, lses) = saved_forward(packed, dims);
    let (kp_d, kp_dv, kp_l) = (words(d), words(dv), words(lk));
    let group = dims.group();
    let kv_heads: Vec<(usize, usize)> = heads(b, dims.hkv).collect();
    kv_heads
        .par_iter()
        .for_each_init(Scratch::default, |sc, &(bi, kh)| {
            // SAFETY (packing and every product below): as in `attention`; the
            // rows of dq written are this group's heads', those of dk and dv
            // this key/value head's.
            unsafe {
                pack_b(&matrix(&kr, (bi, kh, 0), true), d, lk, kp_d, &mut sc.kt);
                pack_b(&matrix(&vr, (bi, kh, 0), true), dv, lk, kp_dv, &mut sc.vt);
                pack_b(&matrix(&kr, (bi, kh, 0), false), lk, d, kp_l, &mut sc.keys);
            }
            for hi in kh * group..(kh + 1) * group {
                let lse = lses.head(bi, hi, lq);
                // SAFETY: as above, for this query head's rows.
                unsafe { pack_a(&matrix(&qr, (bi, hi, 0), false), lq, d, kp_d, &mut sc.q) };
                sc.ds.resize(lq * dv, 0.0);
                for i in 0..lq {
                    // SAFETY: row i of this head's cotangent has dv floats.
                    let row = unsafe { std::slice::from_raw_parts(gr.at(bi, hi, i), dv) };
                    sc.ds[i * dv..(i + 1) * dv].copy_from_slice(row);
                }
                round_into(&sc.ds[..lq * dv], &mut sc.d_out);
                let mut dots = [0f32; BLOCK];
                for i0 in (0..lq).step_by(BLOCK) {
                    let rows = BLOCK.min(lq - i0);
                    let keys = dims.limit(i0 + rows - 1);
                    let width = keys.next_multiple_of(COLS);
                    sc.s.resize(rows * width, 0.0);
                    sc.ds.resize(rows * width, 0.0);
                    let (p, ds) = (&mut sc.s[..rows * width], &mut sc.ds[..rows * width]);
                    unsafe {
                        // The scores, as in the forward pass, and d_out @ v^T.
                        amx::gemm(
                            rows,
                            width,
                            kp_d,
                            sc.q[i0 * kp_d..].as_ptr(),
                            kp_d,
                            sc.kt.as_ptr(),
                            p.as_mut_ptr(),
                            width,
                            false,
                        );
                        amx::gemm(
                            rows,
                            width,
                            kp_dv,
                            sc.d_out[i0 * dv / 2..].as_ptr(),
                            dv / 2,
                            sc.vt.as_ptr(),
                            ds.as_mut_ptr(),
                            width,
                            false,
                        );
                    }
                    output_dots(&out, &gr, (bi, hi, i0), dv, &mut dots[..rows]);
                    let scale = dims.scale;
                    score_gradients(p, ds, width, i0, dims, lse, &dots[..rows], [scale, scale]);
                    round_into(p, &mut sc.p16);
                    round_into(ds, &mut sc.ds16);
                    let kp_r = words(rows);
                    unsafe {
                        // dv[..keys] += p^T @ d_out[block]
                        pack_a(&dense(&sc.p16, width, true), width, rows, kp_r, &mut sc.at);
                        let g_blk = dense(&sc.d_out[i0 * dv / 2..], dv, false);
                        pack_b(&g_blk, rows, dv, kp_r, &mut sc.bp);
                        let dv_rows = dvr.at(bi, kh, 0);
                        amx::gemm(
                            keys,
                            dv,
                            kp_r,
                            sc.at.as_ptr(),
                            kp_r,
                            sc.bp.as_ptr(),
                            dv_rows,
                            dvr.si,
                            true,
                        );
                        // dq[block] = ds @ k[..keys], a panel of k at a time (the
                        // panels hold all the keys' pairs, the block reads its own).
                        for g in 0..d / COLS {
                            amx::gemm(
                                rows,
                                COLS,
                                width / 2,
                                sc.ds16.as_ptr(),
                                width / 2,
                                sc.keys[g * kp_l * COLS..].as_ptr(),
                                dq.at(bi, hi, i0).add(g * COLS),
                                dq.si,
                                false,
                            );
                        }
                        // dk[..keys] += ds^T @ q[block]
                        pack_a(&dense(&sc.ds16, width, true), width, rows, kp_r, &mut sc.at);
                        pack_b(&matrix(&qr, (bi, hi, i0), false), rows, d, kp_r, &mut sc.bp);
                        let dk_rows = dk.at(bi, kh, 0);
                        amx::gemm(
                            keys,
                            d,
                            kp_r,
                            sc.at.as_ptr(),
                            kp_r,
                            sc.bp.as_ptr(),
                            dk_rows,
                            dk.si,
                            true,
                        );
                    }
                }
            }
        });
    grads
}
