//! Row-wise softmax kernels: the softmax, and the fused softmax
//! cross-entropy and its gradient. The cross-entropy kernels take one
//! workgroup per row, max and sum reduced in workgroup memory. Targets out
//! of range (which the CPU rejects at eval) give a NaN loss and a NaN
//! gradient row.
//!
//! The softmax ([`softmax`]) takes a team of `T` invocations per row (a
//! power of two, 8 to 256, about one per 16 of the row's loads) and
//! `256 / T` rows a workgroup; rows whose length and start are multiples
//! of 4 are read and written as quads (`vec4`, 16 bytes a load in f32 and
//! 8 in f16 or bf16, whole words a store). One pass keeps each
//! invocation's running maximum and sum of exponentials (rescaled when the
//! maximum grows: an online softmax; each pass in rounds of up to 16
//! loads, unrolled so that all are issued before the first is used,
//! `codegen::row_walk`), the team merges them in `log2 T`
//! workgroup-memory steps, and a second pass writes `exp(x - max) / sum`:
//! two reads of the row (the second from cache for rows up to a few
//! hundred KiB) and one write, where the previous kernel read it three
//! times, and a whole workgroup per row however short.
//!
//! Design figures for an H100 (the loop form measured 946-957 GB/s,
//! 32%, on 2026-11-27; the unrolled rounds not yet), at `gpu_bench`'s
//! `[16384, 4096]` f32 softmax: teams of 64, 4
//! rows (64 KiB) a workgroup, each invocation 16 `vec4` loads a pass, 2 KiB
//! of workgroup memory, 8 workgroups resident per SM (the invocation
//! limit), 4096 workgroups in 3.9 waves; the second read comes from the
//! SM's L1 or L2 (512 KiB of rows resident per SM). Expected 60-75% of the
//! device copy's bandwidth (counting one read and one write) against 31-32%
//! measured before.

use super::super::codegen;
use super::super::device::context;
use super::super::dispatch::dispatch;
use super::super::elementwise::dense;
use super::super::elementwise::{input4, output4};
use super::super::indexing::{Meta, index_input};
use super::super::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Dtype, Error, Result};

/// WGSL of `cross_entropy`.
const ROWS_CROSS_ENTROPY_WGSL: &str = include_str!("rows_cross_entropy.wgsl");

/// WGSL of `cross_entropy_grad`.
const ROWS_CROSS_ENTROPY_GRAD_WGSL: &str = include_str!("rows_cross_entropy_grad.wgsl");

/// WGSL of `lse_prologue` (a template).
const ROWS_LSE_PROLOGUE_WGSL: &str = include_str!("rows_lse_prologue.wgsl");

/// WGSL of `softmax_source` (a template).
const ROWS_SOFTMAX_SOURCE_WGSL: &str = include_str!("rows_softmax_source.wgsl");

fn check_float(op: &'static str, dtype: Dtype) -> Result<()> {
    if !dtype.is_float() {
        return Err(Error::eval(
            op,
            format!("logits must be floating point, got {dtype}"),
        ));
    }
    Ok(())
}

/// Rounds an f32 to the precision of `d` (as storing and reloading would).
fn round_fn(d: Dtype) -> &'static str {
    match d {
        Dtype::F16 => "fn rnd(v: f32) -> f32 { return round_f16(v); }\n",
        Dtype::BF16 => "fn rnd(v: f32) -> f32 { return bitcast<f32>(bf16_bits(v) << 16u); }\n",
        _ => "fn rnd(v: f32) -> f32 { return v; }\n",
    }
}

/// The shared first half: row `row`, its target `t` (-1 when out of range)
/// and `lse = logsumexp(row)` (every thread of the workgroup holds it).
fn row_prologue(x_at: &str) -> String {
    lse_prologue(x_at) + "    let t = resolve_target(idx_at(vloc(row, params[3])), vocab);\n"
}

/// Row `row` (of `params[1]` elements from `params[2]`), its maximum `m`
/// and `lse = logsumexp(row)`, held by every thread of the workgroup.
fn lse_prologue(x_at: &str) -> String {
    crate::backend::gpu::codegen::fill(ROWS_LSE_PROLOGUE_WGSL, &[("x_at", x_at)])
}

/// `resolve_target(v, vocab)`: a target id, or -1 when out of range (the
/// kernels take `vloc` from indexing's helpers).
const RESOLVE_TARGET: &str = include_str!("resolve_target.wgsl");

/// Per-row `logsumexp(logits) - logits[target]` over the last axis.
pub fn cross_entropy(logits: &Operand<'_>, t: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, t_dtype, t) = (logits.shape, logits.dtype, t.dtype, &t.data);
    check_float("cross_entropy", dtype)?;
    let vocab = *shape.last().expect("logits have a class axis");
    let rows_shape = &shape[..shape.len() - 1];
    let rows = size_of_shape(rows_shape);
    codegen::check_size("cross_entropy", size_of_shape(shape), &[&logits.data, t])?;
    let x = dense(logits)?;
    let mut m = Meta(vec![rows as u32, vocab as u32, x.offset() as u32, 0]);
    m.0[3] = m.view(t, rows_shape);
    let idx_src = index_input(2, t_dtype)?;
    let key = format!("cross_entropy:{dtype}:{t_dtype}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(crate::backend::gpu::indexing::VLOC);
        s.push_str(RESOLVE_TARGET);
        s.push_str(&codegen::input("x", 1, dtype));
        s.push_str(&idx_src);
        s.push_str(&codegen::output(3, dtype));
        s.push_str(&row_prologue("return load_x(j);"));
        s.push_str(ROWS_CROSS_ENTROPY_WGSL);
        s
    })?;
    let out = alloc(rows_shape, dtype)?;
    dispatch(
        &pipeline,
        &m.0,
        &[&x, t],
        &out,
        rows * dtype.size_of(),
        codegen::packed(dtype),
        rows * codegen::WORKGROUP as usize,
    )?;
    Ok(out)
}

/// Softmax over the last axis: `exp(x - max) / sum(exp(x - max))` per row
/// (a row of `-inf` gives NaN, as on the CPU).
pub fn softmax(x: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype) = (x.shape, x.dtype);
    check_float("softmax", dtype)?;
    let width = shape.last().copied().unwrap_or(1);
    let n = size_of_shape(shape);
    let rows = n.checked_div(width).unwrap_or(0);
    codegen::check_size("softmax", n, &[&x.data])?;
    let out = alloc(shape, dtype)?;
    if rows == 0 {
        return Ok(out);
    }
    let x = dense(x)?;
    let m = Meta(vec![rows as u32, width as u32, x.offset() as u32]);
    // Quads of any float dtype (8 bytes a load for the half ones, whole
    // words a store, so packed halves need no atomics).
    let vec4 = width.is_multiple_of(4) && x.offset().is_multiple_of(4);
    let loads = if vec4 { width / 4 } else { width };
    let team = codegen::row_team(loads);
    let unroll = codegen::row_unroll(loads, team);
    let key = format!("softmax:{dtype}:{team}:{unroll}:{vec4}");
    let pipeline = context()?.pipeline(&key, || softmax_source(dtype, (team, unroll), vec4))?;
    super::super::dispatch::dispatch_groups(
        &pipeline,
        &m.0,
        &[&x],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        rows.div_ceil(256 / team),
    )?;
    Ok(out)
}

/// WGSL of [`softmax`]'s kernel: `256 / team` rows a workgroup, `team`
/// invocations a row (see the module docs), each pass over the row in
/// unrolled rounds of `unroll` loads ([`codegen::row_walk`]); quads of
/// four elements loaded and stored at once with `vec4`.
fn softmax_source(dtype: Dtype, (team, unroll): (usize, usize), vec4: bool) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    let shape = (team, unroll);
    let (io, fold, write) = if vec4 {
        let loads = "params[1] / 4u";
        let read = |i: &str| format!("load4_x(base / 4u + {i})");
        (
            input4("x", 1, dtype) + &output4(2, dtype),
            codegen::row_walk(loads, shape, "vec4<f32>", &read, &|v, _| {
                format!(
                    "let mv = max(max({v}.x, {v}.y), max({v}.z, {v}.w)); \
                     if (mv > m) {{ sum = sum * exp(m - mv); m = mv; }} \
                     if (m != NINF) {{ sum = sum + (exp({v}.x - m) + exp({v}.y - m)) + (exp({v}.z - m) + exp({v}.w - m)); }}"
                )
            }),
            codegen::row_walk(loads, shape, "vec4<f32>", &read, &|v, i| {
                format!("store4(row * params[1] / 4u + {i}, exp({v} - m) / sum);")
            }),
        )
    } else {
        let loads = "params[1]";
        let read = |i: &str| format!("load_x(base + {i})");
        (
            codegen::input("x", 1, dtype) + &codegen::output(2, dtype),
            codegen::row_walk(loads, shape, "f32", &read, &|v, _| {
                format!(
                    "if ({v} > m) {{ sum = sum * exp(m - {v}); m = {v}; }} \
                     if (m != NINF) {{ sum = sum + exp({v} - m); }}"
                )
            }),
            codegen::row_walk(loads, shape, "f32", &read, &|v, i| {
                format!("store_out(row * params[1] + {i}, exp({v} - m) / sum);")
            }),
        )
    };
    s.push_str(&io);
    s.push_str(&crate::backend::gpu::codegen::fill(
        ROWS_SOFTMAX_SOURCE_WGSL,
        &[
            ("entry", codegen::GROUP_ENTRY),
            ("index", codegen::GROUP_INDEX),
            ("rows", &(256 / team).to_string()),
            ("team", &team.to_string()),
            ("fold", &fold),
            ("half", &(team / 2).to_string()),
            ("write", &write),
        ],
    ));
    s
}

/// `(softmax(logits) - onehot(target)) * ct[row]`. With `donated` (and f32
/// logits, dense from offset 0), written over the logits' own buffer as on
/// the CPU; otherwise into a new one.
pub fn cross_entropy_grad(
    logits: Operand<'_>,
    t: &Operand<'_>,
    ct: &Operand<'_>,
    donated: bool,
) -> Result<ArrayData> {
    let (shape, dtype) = (logits.shape, logits.dtype);
    let (t_dtype, t, ct_dtype, ct) = (t.dtype, &t.data, ct.dtype, &ct.data);
    check_float("cross_entropy_grad", dtype)?;
    supported(ct_dtype)?;
    let vocab = *shape.last().expect("logits have a class axis");
    let rows_shape = &shape[..shape.len() - 1];
    let rows = size_of_shape(rows_shape);
    let n = size_of_shape(shape);
    codegen::check_size("cross_entropy_grad", n, &[&logits.data, t, ct])?;
    // In place only where each element is its own word: packed dtypes
    // would race on shared words without atomics.
    let in_place = donated
        && dtype == Dtype::F32
        && logits.data.offset() == 0
        && codegen::is_dense(&logits.data, shape);
    let x = if in_place {
        logits.data
    } else {
        dense(&logits)?
    };
    let mut m = Meta(vec![rows as u32, vocab as u32, x.offset() as u32, 0, 0]);
    m.0[3] = m.view(t, rows_shape);
    m.0[4] = m.view(ct, rows_shape);
    let idx_src = index_input(2, t_dtype)?;
    let key = format!("cross_entropy_grad:{dtype}:{t_dtype}:{ct_dtype}:{in_place}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(crate::backend::gpu::indexing::VLOC);
        s.push_str(RESOLVE_TARGET);
        s.push_str(round_fn(dtype));
        // Bindings: 1 is the logits (or the cotangent when in place), 2 the
        // targets, 3 the cotangent (or the output), 4 the output.
        if in_place {
            s.push_str(&codegen::input("c", 1, ct_dtype));
            s.push_str(&idx_src);
            s.push_str("@group(0) @binding(3) var<storage, read_write> out: array<f32>;\n");
            s.push_str("fn store_out(i: u32, v: f32) { out[i] = v; }\n");
            s.push_str(&row_prologue("return out[j];"));
        } else {
            s.push_str(&codegen::input("x", 1, dtype));
            s.push_str(&idx_src);
            s.push_str(&codegen::input("c", 3, ct_dtype));
            s.push_str(&codegen::output(4, dtype));
            s.push_str(&row_prologue("return load_x(j);"));
        }
        s.push_str(ROWS_CROSS_ENTROPY_GRAD_WGSL);
        s
    })?;
    if in_place {
        dispatch(
            &pipeline,
            &m.0,
            &[ct, t],
            &x,
            n * 4,
            false,
            rows * codegen::WORKGROUP as usize,
        )?;
        return Ok(x);
    }
    let out = alloc(shape, dtype)?;
    dispatch(
        &pipeline,
        &m.0,
        &[&x, t, ct],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        rows * codegen::WORKGROUP as usize,
    )?;
    Ok(out)
}
