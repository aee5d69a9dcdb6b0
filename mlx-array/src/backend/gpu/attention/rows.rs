//! The fallback for heads too wide for the adapter's workgroup memory (the
//! flash kernels' smallest tiles at `d = dv = 128` need 35 KiB; lavapipe
//! has 32): no workgroup memory, same packed layouts.
//!
//! One thread per query row walks the keys it sees with an online softmax
//! (running maximum and sum), so no `[B, H, Lq, Lk]` buffer exists. The
//! gradient takes two dispatches into one buffer: a thread per query row
//! for `dq`, then a thread per key row (of a key/value head, summing over
//! the query heads of its group) for `dk` and `dv`, each recomputing the
//! probabilities it needs from the forward's logsumexps.

use super::super::device::context;
use super::super::dispatch::dispatch;
use super::super::elementwise::dense;
use super::super::pool::alloc;
use super::codegen;
use super::{Forward, heads, heads_qkv, meta, output_store};
use crate::backend::common::attention::AttentionDims;
use crate::data::{ArrayData, Operand};
use crate::{Dtype, Result};

/// WGSL of `attention_grad` (a template).
const ROWS_GRAD_DQ_WGSL: &str = include_str!("rows_grad_dq.wgsl");

/// WGSL of `attention_grad` (a template).
const ROWS_GRAD_DKV_WGSL: &str = include_str!("rows_grad_dkv.wgsl");

/// WGSL of `attention`.
const ROWS_ATTENTION_WGSL: &str = include_str!("rows_attention.wgsl");

/// The WGSL shared by the kernels: constants, the bindings of `inputs`
/// (name and dtype), an output of dtype `out`, and the sizes read from
/// `params`.
fn header(dims: &AttentionDims, inputs: &[(&str, Dtype)], out: Dtype) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    for (i, (name, t)) in inputs.iter().enumerate() {
        s.push_str(&codegen::input(name, i as u32 + 1, *t));
    }
    s.push_str(&codegen::output(inputs.len() as u32 + 1, out));
    s.push_str(&format!(
        "const D: u32 = {}u;\nconst DV: u32 = {}u;\n",
        dims.d, dims.dv
    ));
    s.push_str(super::SIZES);
    s
}

/// `softmax(scale * q @ k^T [causal]) @ v`, packed as on the CPU.
pub(super) fn attention(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
    dtype: Dtype,
    half: Option<Dtype>,
) -> Result<Forward> {
    let (d, dv) = (dims.d, dims.dv);
    let (n_out, n_lse) = dims.packed_len();
    let ([q, k, v], strides) = heads_qkv(q, k, v, dims, dtype)?;
    codegen::check_size("attention", n_out + n_lse, &[&q, &k, &v])?;
    let out = Forward::alloc(dims, half)?;
    if n_lse == 0 {
        return Ok(out);
    }
    let key = format!("attention_rows:{d}:{dv}:{dtype}:{half:?}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header(
            dims,
            &[("q", dtype), ("k", dtype), ("v", dtype)],
            Dtype::F32,
        );
        s.push_str(&output_store(half));
        s.push_str(codegen::ENTRY);
        s.push_str(" {\n    ");
        s.push_str(codegen::THREAD_INDEX);
        s.push_str(ROWS_ATTENTION_WGSL);
        s
    })?;
    out.dispatch(
        &pipeline,
        &meta(dims, &[&q, &k, &v], &[], &strides),
        &[&q, &k, &v],
        dims,
        n_lse.div_ceil(codegen::WORKGROUP as usize),
    )?;
    Ok(out)
}

/// The WGSL that recomputes, for query `qi` of head `bh` against key `j`,
/// `p` (the probability) and `ds = p * (d_out . v_j - delta)`, with
/// `delta = d_out_i . o_i` already in scope, `q0`, `g0` the query's and
/// its cotangent's first elements and `lse0h` the head's first logsumexp.
const PROBABILITY: &str = include_str!("rows_probability.wgsl");

/// `delta = d_out_i . o_i` for query `qi` of head `bh` (the output read
/// from its `[B, Lq, H, dv]` place in the packed buffer).
const DELTA: &str = r#"
        let o0 = params[9] + ((bh / h() * lq() + qi) * h() + bh % h()) * DV;
        var delta = 0.0;
        for (var c = 0u; c < DV; c = c + 1u) { delta = delta + load_g(g0 + c) * load_packed(o0 + c); }
"#;

/// The gradients of [`attention`] for the cotangent `d_out` of its output
/// (of any float dtype), packed as on the CPU.
pub(super) fn attention_grad(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    packed: &ArrayData,
    d_out: &Operand<'_>,
    dims: &AttentionDims,
    dtype: Dtype,
) -> Result<ArrayData> {
    let AttentionDims {
        b,
        h,
        lq,
        lk,
        d,
        dv,
        ..
    } = *dims;
    let (n_out, n_lse) = dims.packed_len();
    let (nq, nk, nv) = dims.grad_len();
    let ([q, k, v], mut strides) = heads_qkv(q, k, v, dims, dtype)?;
    let packed = dense(&Operand::new(packed.clone(), &[n_out + n_lse], Dtype::F32))?;
    let gd = d_out.dtype;
    let (g, sg) = heads(&d_out.data, [b, h, lq, dv], gd)?;
    strides[3] = sg;
    let inputs = [&q, &k, &v, &packed, &g];
    codegen::check_size("attention_grad", nq + nk + nv, &inputs)?;
    let out = alloc(&[nq + nk + nv], dtype)?;
    if nq + nk + nv == 0 {
        return Ok(out);
    }
    let meta = meta(dims, &inputs, &[nq as u32, (nq + nk) as u32], &strides);
    let names = [
        ("q", dtype),
        ("k", dtype),
        ("v", dtype),
        ("packed", Dtype::F32),
        ("g", gd),
    ];
    let prologue = |body: &str| {
        let mut s = header(dims, &names, dtype);
        s.push_str(codegen::ENTRY);
        s.push_str(" {\n    ");
        s.push_str(codegen::THREAD_INDEX);
        s.push_str("\n    let lse0 = params[9] + b() * h() * lq() * DV;\n");
        s.push_str(body);
        s
    };
    let dq = context()?.pipeline(&format!("attention_rows_dq:{d}:{dv}:{dtype}:{gd}"), || {
        prologue(&crate::backend::gpu::codegen::fill(
            ROWS_GRAD_DQ_WGSL,
            &[("DELTA", DELTA), ("PROBABILITY", PROBABILITY)],
        ))
    })?;
    let dkv = context()?.pipeline(&format!("attention_rows_dkv:{d}:{dv}:{dtype}:{gd}"), || {
        prologue(&crate::backend::gpu::codegen::fill(
            ROWS_GRAD_DKV_WGSL,
            &[("DELTA", DELTA), ("PROBABILITY", PROBABILITY)],
        ))
    })?;
    // A packed dtype's words are OR-ed into: the first pass clears them.
    let bytes = (nq + nk + nv) * dtype.size_of();
    dispatch(
        &dq,
        &meta,
        &inputs,
        &out,
        bytes,
        codegen::packed(dtype),
        b * h * lq,
    )?;
    dispatch(&dkv, &meta, &inputs, &out, bytes, false, b * dims.hkv * lk)?;
    Ok(out)
}
