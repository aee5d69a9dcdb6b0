//! Batched matrix products: a tiled kernel. Each workgroup of 256
//! invocations computes a 64 x 64 tile of one output matrix, staging 64 x 16
//! slices of `a` and 16 x 64 slices of `b` in workgroup memory; each
//! invocation accumulates a 4 x 4 block in f32 registers.
//!
//! Operands are read through their views (any row, column and batch
//! strides, broadcast batches included), so transposes and broadcasts cost
//! no copy; the staging loads follow whichever of an operand's strides is
//! 1 so neighbouring invocations read neighbouring values.

use super::codegen;
use super::{alloc, context, dispatch_groups, supported};
use crate::primitive::ArrayData;
use crate::shape::size_of_shape;
use crate::{Dtype, Error, Result};

const TILE: usize = 64;

/// `a @ b` for `a` of shape `[..., m, k]` and `b` of `[..., k, n]` (both of
/// `dtype`, batch dimensions already broadcast to `out_shape[..-2]`),
/// accumulating in f32. The output is contiguous.
pub fn matmul(
    a: &ArrayData,
    a_shape: &[usize],
    b: &ArrayData,
    b_shape: &[usize],
    dtype: Dtype,
    out_shape: &[usize],
) -> Result<ArrayData> {
    supported(dtype)?;
    if !dtype.is_float() {
        return Err(Error::eval("matmul", format!("no GPU kernel for {dtype}")));
    }
    let total = size_of_shape(out_shape);
    codegen::check_size("matmul", total, &[a, b])?;
    codegen::check_size("matmul", size_of_shape(a_shape), &[])?;
    codegen::check_size("matmul", size_of_shape(b_shape), &[])?;
    let out = alloc(out_shape, dtype)?;
    record(a, a_shape, b, dtype, out_shape, &out, 0, false)?;
    Ok(out)
}

/// Records `out[out_offset..] (+)= a @ b` (a dense `[..., m, n]` block of
/// `dtype` elements; with `accumulate`, added to what is there, which needs
/// an unpacked dtype) into `out`, reading `a` and `b` through their views.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record(
    a: &ArrayData,
    a_shape: &[usize],
    b: &ArrayData,
    dtype: Dtype,
    out_shape: &[usize],
    out: &ArrayData,
    out_offset: usize,
    accumulate: bool,
) -> Result<()> {
    // Packed outputs are cleared and OR-ed into from their first word.
    debug_assert!(!codegen::packed(dtype) || (out_offset == 0 && !accumulate));
    debug_assert!(!accumulate || dtype == Dtype::F32);
    let nd = out_shape.len();
    let (m, n, k) = (out_shape[nd - 2], out_shape[nd - 1], a_shape[nd - 1]);
    let total = size_of_shape(out_shape);
    if total == 0 {
        return Ok(());
    }
    let batch: usize = out_shape[..nd - 2].iter().product();
    let (tm, tn) = (m.div_ceil(TILE), n.div_ceil(TILE));
    let tiles = batch * tm * tn;
    let (sa, sb) = (a.strides(), b.strides());
    let mut meta = vec![
        m as u32,
        n as u32,
        k as u32,
        (nd - 2) as u32,
        tn as u32,
        tm as u32,
        tiles as u32,
        a.offset() as u32,
        sa[nd - 2] as i32 as u32,
        sa[nd - 1] as i32 as u32,
        b.offset() as u32,
        sb[nd - 2] as i32 as u32,
        sb[nd - 1] as i32 as u32,
        out_offset as u32,
    ];
    meta.extend(out_shape[..nd - 2].iter().map(|&d| d as u32));
    meta.extend(sa[..nd - 2].iter().map(|&s| s as i32 as u32));
    meta.extend(sb[..nd - 2].iter().map(|&s| s as i32 as u32));
    // Column-major staging when the row stride is the unit one.
    let a_cols = sa[nd - 2] == 1 && sa[nd - 1] != 1;
    let b_cols = sb[nd - 2] == 1 && sb[nd - 1] != 1;
    let key = format!("matmul:{dtype}:{a_cols}:{b_cols}:{accumulate}");
    let pipeline = context()?.pipeline(&key, || source(dtype, a_cols, b_cols, accumulate))?;
    dispatch_groups(
        &pipeline,
        &meta,
        &[a, b],
        out,
        total * dtype.size_of(),
        codegen::packed(dtype),
        tiles,
    )?;
    Ok(())
}

fn source(dtype: Dtype, a_cols: bool, b_cols: bool, accumulate: bool) -> String {
    let mut src = String::from(codegen::PRELUDE);
    src.push_str(codegen::META);
    src.push_str(&codegen::input("a", 1, dtype));
    src.push_str(&codegen::input("b", 2, dtype));
    if accumulate {
        src.push_str(
            "@group(0) @binding(3) var<storage, read_write> out: array<f32>;\n\
             fn store_out(i: u32, v: f32) { out[i] = out[i] + v; }\n",
        );
    } else {
        src.push_str(&codegen::output(3, dtype));
    }
    // Staging element e (of 1024) of the a tile: row (of 64) and depth (of 16).
    let (a_row, a_k) = if a_cols {
        ("e & 63u", "e >> 6u")
    } else {
        ("e >> 4u", "e & 15u")
    };
    // Of the b tile: depth (of 16) and column (of 64).
    let (b_k, b_col) = if b_cols {
        ("e & 15u", "e >> 4u")
    } else {
        ("e >> 6u", "e & 63u")
    };
    let mut fma = String::new();
    for i in 0..4 {
        fma.push_str(&format!(
            "            let a{i} = tile_a[kk * 64u + ty * 4u + {i}u];\n"
        ));
    }
    for j in 0..4 {
        fma.push_str(&format!(
            "            let b{j} = tile_b[kk * 64u + tx * 4u + {j}u];\n"
        ));
    }
    for i in 0..4 {
        for j in 0..4 {
            fma.push_str(&format!(
                "            c{i}{j} = fma(a{i}, b{j}, c{i}{j});\n"
            ));
        }
    }
    let decl: String = (0..16)
        .map(|q| format!("    var c{}{}: f32 = 0.0;\n", q / 4, q % 4))
        .collect();
    let mut store = String::new();
    for i in 0..4 {
        for j in 0..4 {
            store.push_str(&format!(
                "        if (row0 + {i}u < m && col0 + {j}u < n) {{ store_out(ob + (row0 + {i}u) * n + col0 + {j}u, c{i}{j}); }}\n"
            ));
        }
    }
    src.push_str(&format!(
        r#"
var<workgroup> tile_a: array<f32, 1024>;
var<workgroup> tile_b: array<f32, 1024>;
{entry} {{
    {index}
    let live = g < params[6];
    let m = params[0];
    let n = params[1];
    let k = params[2];
    let nb = params[3];
    let per = params[4] * params[5];
    let bi = g / per;
    let tm = (g % per) / params[4];
    let tn = (g % per) % params[4];
    var ao = bitcast<i32>(params[7]);
    var bo = bitcast<i32>(params[10]);
    var rem = bi;
    for (var d = i32(nb) - 1; d >= 0; d = d - 1) {{
        let s = params[14u + u32(d)];
        let c = i32(rem % s);
        ao = ao + c * bitcast<i32>(params[14u + nb + u32(d)]);
        bo = bo + c * bitcast<i32>(params[14u + 2u * nb + u32(d)]);
        rem = rem / s;
    }}
    let ars = bitcast<i32>(params[8]);
    let acs = bitcast<i32>(params[9]);
    let brs = bitcast<i32>(params[11]);
    let bcs = bitcast<i32>(params[12]);
    let tx = lid % 16u;
    let ty = lid / 16u;
{decl}
    for (var k0 = 0u; k0 < k; k0 = k0 + 16u) {{
        for (var q = 0u; q < 4u; q = q + 1u) {{
            let e = lid + q * 256u;
            let r = {a_row};
            let kk = {a_k};
            let gr = tm * 64u + r;
            let gk = k0 + kk;
            var v = 0.0;
            if (live && gr < m && gk < k) {{ v = load_a(u32(ao + i32(gr) * ars + i32(gk) * acs)); }}
            tile_a[kk * 64u + r] = v;
        }}
        for (var q = 0u; q < 4u; q = q + 1u) {{
            let e = lid + q * 256u;
            let kk = {b_k};
            let c = {b_col};
            let gk = k0 + kk;
            let gc = tn * 64u + c;
            var v = 0.0;
            if (live && gk < k && gc < n) {{ v = load_b(u32(bo + i32(gk) * brs + i32(gc) * bcs)); }}
            tile_b[kk * 64u + c] = v;
        }}
        workgroupBarrier();
        for (var kk = 0u; kk < 16u; kk = kk + 1u) {{
{fma}        }}
        workgroupBarrier();
    }}
    if (live) {{
        let ob = params[13] + bi * m * n;
        let row0 = tm * 64u + ty * 4u;
        let col0 = tn * 64u + tx * 4u;
{store}    }}
}}
"#,
        entry = codegen::GROUP_ENTRY,
        index = codegen::GROUP_INDEX,
    ));
    src
}
