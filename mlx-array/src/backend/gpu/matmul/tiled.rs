//! The register-blocked f32 kernel (every float dtype, f32 arithmetic).
//!
//! A workgroup of 256 invocations (16 x 16) computes a `T x T` tile of one
//! output matrix (`T` = 64 or 128). Each invocation accumulates `R x R`
//! outputs (`R = T / 16`: 4 or 8) in registers, as `R / 4` x `R / 4` blocks
//! of 4 x 4 spaced 64 rows and 64 columns apart, so that the invocations of
//! one warp read neighbouring `vec4`s of workgroup memory. The depth loop
//! stages `T x 16` slices of `a` (depth-major) and `16 x T` slices of `b`
//! in workgroup memory, double buffered: the loads of the next slice go to
//! registers before the products of the present one and to the other
//! buffer after them, so one barrier per slice suffices.
//!
//! Global loads follow whichever stride of an operand is 1: for `a` stored
//! by rows (depth contiguous) consecutive invocations read consecutive
//! depths, for `a` stored by columns (a transposed view) consecutive rows;
//! likewise for `b`. The workgroup arrays' rows are padded by 4 floats so
//! the depth-major stores of a row-major operand spread over the banks.

use super::super::codegen;
use super::View;
use crate::Dtype;

/// Depth of one staged slice.
pub(super) const DEPTH: usize = 16;

/// Workgroup memory of the kernel with tile `t` and `buffers` (1 or 2)
/// staged slices per operand, in bytes.
pub(super) fn shared_bytes(t: usize, buffers: usize) -> usize {
    buffers * 2 * DEPTH * (t + 4) * 4
}

/// WGSL of the kernel with tile `t` (64 or 128) for operands of `dtype`
/// laid out as `view`, storing `out_dtype` (`dtype`, or f32 for split-K
/// partial sums), adding into `out` with `accumulate`, with
/// `buffers` slices per operand: 2 (one barrier per slice), or 1 for
/// devices with less workgroup memory (a second barrier before each
/// slice is overwritten).
pub(super) fn source(
    t: usize,
    buffers: usize,
    dtype: Dtype,
    out_dtype: Dtype,
    view: View,
    accumulate: bool,
) -> String {
    debug_assert!(t == 64 || t == 128);
    let r = t / 16;
    let blocks = r / 4;
    let stride = t + 4; // floats per staged depth row
    let stride4 = stride / 4;
    let per = t * DEPTH / 256; // staged elements per invocation and operand
    let mut src = String::from(codegen::PRELUDE);
    src.push_str(codegen::META);
    src.push_str(&codegen::input("a", 1, dtype));
    src.push_str(&codegen::input("b", 2, dtype));
    src.push_str(&super::output_decl(3, out_dtype, accumulate));
    // Staged element e of the a slice: its row (of t) and depth (of 16).
    let (a_row, a_k) = if view.a_cols {
        (format!("e % {t}u"), format!("e / {t}u"))
    } else {
        ("e / 16u".to_string(), "e % 16u".to_string())
    };
    // Of the b slice: its depth and column.
    let (b_k, b_col) = if view.b_cols {
        ("e % 16u".to_string(), "e / 16u".to_string())
    } else {
        (format!("e / {t}u"), format!("e % {t}u"))
    };
    let decl: String = (0..r * r)
        .map(|q| format!("    var c{}_{}: f32 = 0.0;\n", q / r, q % r))
        .collect();
    // Loads of slice k0 into registers la*/lb*.
    let mut fetch = String::new();
    for q in 0..per {
        fetch.push_str(&format!(
            "        {{
            let e = lid + {off}u;
            let gr = row_base + {a_row};
            let gk = kf + {a_k};
            la{q} = 0.0;
            if (gr < m && gk < k) {{ la{q} = load_a(u32(ao + i32(gr) * ars + i32(gk) * acs)); }}
        }}
        {{
            let e = lid + {off}u;
            let gk = kf + {b_k};
            let gc = col_base + {b_col};
            lb{q} = 0.0;
            if (gk < k && gc < n) {{ lb{q} = load_b(u32(bo + i32(gk) * brs + i32(gc) * bcs)); }}
        }}
",
            off = q * 256
        ));
    }
    let mut put = String::new();
    for q in 0..per {
        put.push_str(&format!(
            "        {{
            let e = lid + {off}u;
            let ia = nbuf + ({a_k}) * {stride}u + {a_row};
            let ib = nbuf + ({b_k}) * {stride}u + {b_col};
            sa4[ia >> 2u][ia & 3u] = la{q};
            sb4[ib >> 2u][ib & 3u] = lb{q};
        }}
",
            off = q * 256
        ));
    }
    let regs: String = (0..per)
        .map(|q| format!("    var la{q}: f32;\n    var lb{q}: f32;\n"))
        .collect();
    // The products of the slice, unrolled: per depth, vec4 reads, then
    // R x R fmas.
    let mut fma = String::new();
    for kk in 0..DEPTH {
        fma.push_str("        {\n");
        for g in 0..blocks {
            fma.push_str(&format!(
                "            let a{g} = sa4[abase + {off}u + ty];\n",
                off = kk * stride4 + g * 16
            ));
            fma.push_str(&format!(
                "            let b{g} = sb4[abase + {off}u + tx];\n",
                off = kk * stride4 + g * 16
            ));
        }
        for i in 0..r {
            for j in 0..r {
                fma.push_str(&format!(
                    "            c{i}_{j} = fma(a{}[{}], b{}[{}], c{i}_{j});\n",
                    i / 4,
                    i % 4,
                    j / 4,
                    j % 4
                ));
            }
        }
        fma.push_str("        }\n");
    }
    let mut store = String::new();
    for i in 0..r {
        for j in 0..r {
            let row = format!("row_base + {}u + ty * 4u + {}u", (i / 4) * 64, i % 4);
            let col = format!("col_base + {}u + tx * 4u + {}u", (j / 4) * 64, j % 4);
            store.push_str(&format!(
                "    {{ let rr = {row}; let cc = {col}; if (rr < m && cc < n) {{ store_out(ob + rr * n + cc, c{i}_{j}); }} }}\n"
            ));
        }
    }
    let words = DEPTH * stride; // floats per buffer
    src.push_str(&format!(
        r#"
var<workgroup> sa4: array<vec4<f32>, {total4}>;
var<workgroup> sb4: array<vec4<f32>, {total4}>;
{entry} {{
    {index}
    if (g >= params[6]) {{ return; }}
{prologue}
    let tx = lid % 16u;
    let ty = lid / 16u;
    let row_base = tm * {t}u;
    let col_base = tn * {t}u;
{decl}{regs}
    var k0 = 0u;
    var buf = 0u;
    {{
        let kf = 0u;
        let nbuf = 0u;
{fetch}{put}    }}
    workgroupBarrier();
    loop {{
        if (k0 >= k) {{ break; }}
        let abase = buf / 4u;
        let kf = k0 + 16u;
        let next = kf < k;
        if (next) {{
{fetch}        }}
{fma}        let nbuf = {flip};
{wait}        if (next) {{
{put}        }}
        buf = nbuf;
        k0 = kf;
        workgroupBarrier();
    }}
    let ob = params[13] + bi * m * n;
{store}}}
"#,
        total4 = buffers * words / 4,
        flip = if buffers == 2 {
            format!("{words}u - buf")
        } else {
            "0u".to_string()
        },
        wait = if buffers == 2 {
            ""
        } else {
            "        workgroupBarrier();\n"
        },
        entry = codegen::GROUP_ENTRY,
        index = codegen::GROUP_INDEX,
        prologue = super::PROLOGUE,
    ));
    src
}
