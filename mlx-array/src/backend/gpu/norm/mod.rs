//! RMS normalisation and its gradient on the GPU (see `backend::cpu::norm`).
//!
//! # Work per workgroup
//!
//! Row passes (the forward, and the gradient's `dx`): a workgroup of 256
//! invocations takes `256 / T` rows, `T` invocations per row (`T` a power
//! of two from 32 to 256, about a quarter of the width: 64 for the
//! reference model's width of 256, so 4 rows per workgroup and 4 elements
//! per invocation). Each invocation folds every `T`-th element of its row
//! (neighbouring invocations read neighbouring elements), the row's `T`
//! partials are merged by a tree in workgroup memory (1 KiB, or 2 KiB for
//! the gradient's two sums), and the row is written from registers' worth
//! of re-reads (L1/L2-resident). The old kernels ran a thread per row
//! (2,048 threads for [4, 512, 256]: 2% of an H100's 270,336 slots) and a
//! thread per column for `dw` (256 threads, each walking 2,048 rows).
//!
//! `dw[j] = sum_rows c * x * r` is a column sum: a first pass gives each
//! invocation one column of a chunk of [`CHUNK`] rows (neighbouring
//! invocations neighbouring columns, so reads coalesce) and writes the
//! chunk's partial sums; a second sums each column's partials in order. At
//! [4, 512, 256] that is 16,384 invocations for the first pass. Both walk
//! their rows or partials in rounds whose loads are all issued before any
//! is added (`codegen::row_walk`, in the same order as a plain loop): a
//! plain loop waits for each load in turn, and at the large model's 8,192
//! rows the second pass's 256 partials a column were 256 waits of
//! L2 latency one after another (~40 us; the whole gradient took 130 us a
//! call on an H200, 25 calls a step).
//!
//! Expected on an H100: each pass reads its operands once from HBM (the
//! row re-reads hit L2), so the gradient moves about 4 x 4 bytes per
//! element (x and c twice across the two passes, dx once) and should run
//! at >= 65% of the ~3.0 TB/s copy bandwidth for large inputs; the
//! reference shape (2 MiB per operand) is launch-bound at a few us.

use super::codegen;
use super::device::context;
use super::dispatch::{dispatch, dispatch_groups, dispatch_groups_with_half};
use super::elementwise::dense;
use super::pool::alloc;
use crate::data::{ArrayData, Operand};
use crate::{Dtype, Result};

/// WGSL: each invocation's part of its row's sum of squares.
const RMS_NORM_SUM_SQUARES_WGSL: &str = include_str!("rms_norm_sum_squares.wgsl");

/// WGSL: the end of the forward: each row scaled by its reciprocal root mean square and the weight.
const RMS_NORM_SCALE_ROWS_WGSL: &str = include_str!("rms_norm_scale_rows.wgsl");

/// WGSL of `row_header`.
const ROW_HEADER_WGSL: &str = include_str!("row_header.wgsl");

/// WGSL: the weight gradient: each column's chunk partials summed in order (a template).
const RMS_NORM_GRAD_WEIGHT_TOTAL_WGSL: &str = include_str!("rms_norm_grad_weight_total.wgsl");

/// WGSL: each invocation's part of its row's two sums, of `x * x` and of `x * c * w`.
const RMS_NORM_GRAD_ROW_SUMS_WGSL: &str = include_str!("rms_norm_grad_row_sums.wgsl");

/// WGSL: the end of the `dx` kernel (a template).
const RMS_NORM_GRAD_DX_END_WGSL: &str = include_str!("rms_norm_grad_dx_end.wgsl");

/// WGSL: the weight gradient's partial sums, one per chunk of rows (a template).
const RMS_NORM_GRAD_WEIGHT_CHUNKS_WGSL: &str = include_str!("rms_norm_grad_weight_chunks.wgsl");

/// Rows per column-sum chunk of the `dw` pass.
const CHUNK: usize = 32;

/// Rows of a chunk whose loads are in flight together in the `dw` pass
/// (three loads each).
const CHUNK_UNROLL: usize = 8;

/// Partial sums in flight together in the `dw` pass's second half.
const PARTIAL_UNROLL: usize = 16;

/// Invocations per row for rows of `width`.
fn per_row(width: usize) -> usize {
    width.div_ceil(4).next_power_of_two().clamp(32, 256)
}

/// Opens the gradient's `dx` as one rounded `f32` value, before an addend
/// is added to it: its bits XOR the meta word `params[9]`, which is zero
/// but unknown to the compiler. Without it a driver may contract or
/// reassociate `dx`'s multiply-subtract with the add (WGSL allows both;
/// lavapipe does), and the sum would differ in its last bit from the add
/// kernel's sum of the stored `dx`.
const OPAQUE_DX: &str = "bitcast<f32>(bitcast<u32>(";

/// Shader source of a row pass: bindings for `inputs` (each of its dtype)
/// and the output of `out`, `T`, the declarations `decls`, and the entry
/// point with the row `row`, its start `x0`, the lane `t` and `live` in
/// scope.
fn row_header(inputs: &[(&str, Dtype)], out: Dtype, t: usize, sums: &str, decls: &str) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    for (i, (name, d)) in inputs.iter().enumerate() {
        s.push_str(&codegen::input(name, i as u32 + 1, *d));
    }
    s.push_str(&codegen::output(inputs.len() as u32 + 1, out));
    s.push_str(&format!(
        "const T: u32 = {t}u;\nvar<workgroup> part: array<{sums}, 256>;\n"
    ));
    s.push_str(decls);
    s.push_str(codegen::GROUP_ENTRY);
    s.push_str(" {\n    ");
    s.push_str(codegen::GROUP_INDEX);
    s.push_str(ROW_HEADER_WGSL);
    s
}

/// The tree that merges each row's `T` partials in `part` (every
/// invocation of the workgroup reaches it: barriers are uniform).
const ROW_TREE: &str = include_str!("row_tree.wgsl");

/// `x * w / sqrt(mean(x^2) + eps)` over rows, computed in f32 from `x`
/// and `w` as stored, written in `dtype` (rounded as a cast rounds; a
/// packed dtype's words are cleared first and stored with atomic ORs).
pub fn rms_norm(x: &Operand<'_>, w: &Operand<'_>, eps: f32, dtype: Dtype) -> Result<ArrayData> {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let width = shape.last().copied().unwrap_or(1);
    let out = alloc(shape, dtype)?;
    if n == 0 || width == 0 {
        return Ok(out);
    }
    let (xd, wd) = (x.dtype, w.dtype);
    let (x, w) = (dense(x)?, dense(w)?);
    codegen::check_size("rms_norm", n, &[&x, &w])?;
    let rows = n / width;
    let meta = [
        rows as u32,
        width as u32,
        eps.to_bits(),
        x.offset() as u32,
        w.offset() as u32,
    ];
    let t = per_row(width);
    let key = format!("rms_norm:{t}:{xd}:{wd}:{dtype}");
    let pipeline = context()?.pipeline(&key, || {
        row_header(&[("x", xd), ("w", wd)], dtype, t, "f32", "")
            + RMS_NORM_SUM_SQUARES_WGSL
            + ROW_TREE
            + RMS_NORM_SCALE_ROWS_WGSL
    })?;
    let groups = rows.div_ceil(256 / t);
    let packed = codegen::packed(dtype);
    let bytes = n * dtype.size_of();
    dispatch_groups(&pipeline, &meta, &[&x, &w], &out, bytes, packed, groups)?;
    Ok(out)
}

/// `dx`, `dw` and each row's inverse RMS, packed in f32, of [`rms_norm`]
/// for the cotangent `ct` (`x`, `w` and `ct` read as stored; with no rows,
/// `dw` is zero: the column pass sums nothing). An `addend` of `x`'s shape
/// (read as stored) is added to `dx` in the row pass, as `dx` is stored.
/// With a `half` dtype the row pass also stores `dx` rounded to it, as a
/// cast rounds, into a buffer of its own (`x`'s shape), returned second.
pub fn rms_norm_grad(
    x: &Operand<'_>,
    w: &Operand<'_>,
    ct: &Operand<'_>,
    addend: Option<&Operand<'_>>,
    eps: f32,
    half: Option<Dtype>,
) -> Result<(ArrayData, Option<ArrayData>)> {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let width = shape.last().copied().unwrap_or(1);
    let rows = n.checked_div(width).unwrap_or(0);
    let total = n + width + rows;
    let out = alloc(&[total], Dtype::F32)?;
    let half_out = half.map(|d| alloc(shape, d)).transpose()?;
    if total == 0 {
        return Ok((out, half_out));
    }
    let (xd, wd, cd) = (x.dtype, w.dtype, ct.dtype);
    let (x, w, ct) = (dense(x)?, dense(w)?, dense(ct)?);
    let addend = addend
        .map(|a| Ok::<_, crate::Error>((a.dtype, dense(a)?)))
        .transpose()?;
    // The row pass's inputs (the addend last, where there is one).
    let mut row_inputs = vec![&x, &w, &ct];
    row_inputs.extend(addend.as_ref().map(|(_, a)| a));
    codegen::check_size("rms_norm_grad", total, &row_inputs)?;
    let chunks = rows.div_ceil(CHUNK);
    let meta = [
        rows as u32,
        width as u32,
        eps.to_bits(),
        x.offset() as u32,
        w.offset() as u32,
        ct.offset() as u32,
        n as u32,
        chunks as u32,
        addend.as_ref().map_or(0, |(_, a)| a.offset() as u32),
        // Zero, which the shader compiler cannot see (`OPAQUE_DX`).
        0,
    ];
    let t = per_row(width);
    let ad = addend.as_ref().map(|(d, _)| *d);
    let mut dx_key = format!("rms_norm_dx:{t}:{xd}:{wd}:{cd}");
    if let Some(ad) = ad {
        dx_key.push_str(&format!(":+{ad}"));
    }
    if let Some(half) = half {
        dx_key.push_str(&format!(":>{half}"));
    }
    let dx = context()?.pipeline(&dx_key, || {
        let mut inputs = vec![("x", xd), ("w", wd), ("c", cd)];
        inputs.extend(ad.map(|ad| ("a", ad)));
        // `store_dx`: the f32 `dx`, and its rounding to `half` beside it.
        let store_dx = codegen::store_with_half("store_dx", inputs.len() as u32 + 2, half);
        // The addend, added to each `dx` as it is stored.
        let (open, plus) = if ad.is_some() {
            (
                OPAQUE_DX,
                ") ^ params[9]) + load_a(params[8] + row * width + j)",
            )
        } else {
            ("", "")
        };
        row_header(&inputs, Dtype::F32, t, "vec2<f32>", &store_dx)
            + RMS_NORM_GRAD_ROW_SUMS_WGSL
            + ROW_TREE
            + codegen::fill(RMS_NORM_GRAD_DX_END_WGSL, &[("open", open), ("plus", plus)]).as_str()
    })?;
    // Pass 1 of dw: partial column sums over chunks of CHUNK rows, read
    // with the rows' r from the row pass's output.
    let dw_part = context()?.pipeline(&format!("rms_norm_dw_part:{xd}:{cd}"), || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(&codegen::input("x", 1, xd));
        s.push_str(&codegen::input("c", 2, cd));
        s.push_str(&codegen::input("inv", 3, Dtype::F32));
        s.push_str(&codegen::output(4, Dtype::F32));
        s.push_str(codegen::ENTRY);
        // The chunk's rows in rounds of loads all in flight together (a
        // plain loop waited for each row's three loads in turn).
        let walk = codegen::row_walk(
            "rows",
            (1, CHUNK_UNROLL),
            "f32",
            &|r| {
                format!(
                    "load_c(params[5] + (first + {r}) * width + j) * load_x(params[3] + (first + {r}) * width + j) * load_inv(params[6] + width + first + {r})"
                )
            },
            &|x, _| format!("acc = acc + {x};"),
        );
        s.push_str(&crate::backend::gpu::codegen::fill(RMS_NORM_GRAD_WEIGHT_CHUNKS_WGSL, &[("index", codegen::THREAD_INDEX), ("CHUNK", &CHUNK.to_string()), ("walk", &walk)]));
        s
    })?;
    // Pass 2: each column's partials, summed in chunk order.
    let dw = context()?.pipeline("rms_norm_dw", || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(&codegen::input("p", 1, Dtype::F32));
        s.push_str(&codegen::output(2, Dtype::F32));
        s.push_str(codegen::ENTRY);
        // Each column's partials in chunk order, in rounds of loads all in
        // flight together (a plain loop waited for each: 256 of them, one
        // after another, for 8,192 rows).
        let walk = codegen::row_walk(
            "params[7]",
            (1, PARTIAL_UNROLL),
            "f32",
            &|c| format!("load_p({c} * width + i)"),
            &|x, _| format!("acc = acc + {x};"),
        );
        s.push_str(&crate::backend::gpu::codegen::fill(
            RMS_NORM_GRAD_WEIGHT_TOTAL_WGSL,
            &[("index", codegen::THREAD_INDEX), ("walk", &walk)],
        ));
        s
    })?;
    if rows > 0 {
        let copy = half_out.as_ref().zip(half).map(|(h, d)| (h, d, n));
        let groups = rows.div_ceil(256 / t);
        dispatch_groups_with_half(&dx, &meta, &row_inputs, &out, total * 4, copy, groups)?;
        let part = alloc(&[chunks * width], Dtype::F32)?;
        dispatch(
            &dw_part,
            &meta,
            &[&x, &ct, &out],
            &part,
            chunks * width * 4,
            false,
            chunks * width,
        )?;
        dispatch(&dw, &meta, &[&part], &out, total * 4, false, width)?;
    } else {
        let zeros = context()?.pipeline("rms_norm_dw_zero", || {
            let mut s = String::from(codegen::PRELUDE);
            s.push_str(codegen::META);
            s.push_str(&codegen::output(1, Dtype::F32));
            s.push_str(codegen::ENTRY);
            s.push_str(&format!(
                " {{\n    {}\n    if (i >= params[1]) {{ return; }}\n    store_out(params[6] + i, 0.0);\n}}\n",
                codegen::THREAD_INDEX
            ));
            s
        })?;
        dispatch(&zeros, &meta, &[], &out, total * 4, false, width)?;
    }
    Ok((out, half_out))
}
