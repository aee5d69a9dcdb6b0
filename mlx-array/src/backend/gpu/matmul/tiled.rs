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
//!
//! **Vector staging loads** (`super::loads`). An operand whose offset,
//! leading dimension and batch strides are multiples of 4 elements, with
//! a unit stride along a contiguous extent (`k`, or `m` / `n` for the
//! transposed views) that is a multiple of 4 too, is read 4 elements at a
//! time: a `vec4<f32>` (16 bytes) of f32, a `vec4<f16>` or two packed
//! words (8 bytes) of f16 and bf16 (`elementwise::input4`), with one
//! bounds check and one address per vector. Where the vector lands along
//! a staged depth row (`a` by columns, `b` by rows) it is one `vec4`
//! store; along the depth (`a` by rows, `b` by columns: the forward `x @
//! w^T`), four float stores a row apart, with neighbouring invocations
//! two vectors (32 bytes) along the operand and then across it, which
//! puts a warp's stores in 32 different banks. Any other operand goes
//! through the scalar path (one element per load), which
//! `MLX_GPU_VEC_LOADS=0` also forces. The choice is per operand and part
//! of the pipeline key. Per invocation and 16-deep slice:
//!
//! | per invocation, slice, each operand | scalar | vector |
//! |---|---|---|
//! | `T` = 128: global loads | 8 of 4 B | 2 of 16 B (f32) |
//! | `T` = 128: bounds checks and 32-bit address computations | 8 | 2 |
//! | `T` = 128: workgroup stores | 8 floats | 2 `vec4`s, or 8 floats along the depth |
//! | `T` = 64: loads, checks and addresses / stores | 4 / 4 floats | 1 / 1 `vec4` or 4 floats |
//!
//! Expected effect on the H100 (reasoned, not measured): at `T` = 128 an
//! invocation issues 1,024 fmas and 64 `vec4` workgroup reads per slice;
//! the scalar staging adds some 160-200 instructions (16 loads, 16
//! stores, 6-8 integer operations each for the index and checks), the
//! vector staging some 40-60, so about 10% of the issue slots come back
//! to the fmas, and the load/store unit sees a quarter of the requests:
//! from 28 TFLOP/s (55% of cuBLAS with TF32 off) towards 31 (60%).

use super::super::codegen;
use super::super::elementwise::input4;
use super::View;
use super::loads::{Slice, VecLoads};
use crate::Dtype;

/// Depth of one staged slice.
pub(super) const DEPTH: usize = 16;
/// Elements per vector staging load (a `vec4<f32>` of f32; 8 bytes of a
/// half dtype).
pub(super) const VEC: usize = 4;

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
/// slice is overwritten), staging the operands `loads` names [`VEC`]
/// elements a load and the others one.
pub(super) fn source(
    t: usize,
    buffers: usize,
    dtype: Dtype,
    out_dtype: Dtype,
    view: View,
    accumulate: bool,
    loads: VecLoads,
) -> String {
    debug_assert!(t == 64 || t == 128);
    let r = t / 16;
    let blocks = r / 4;
    let stride = t + 4; // floats per staged depth row
    let stride4 = stride / 4;
    let mut src = String::from(codegen::PRELUDE);
    src.push_str(codegen::META);
    for (name, binding, vector) in [("a", 1, loads.a), ("b", 2, loads.b)] {
        src.push_str(&if vector {
            input4(name, binding, dtype)
        } else {
            codegen::input(name, binding, dtype)
        });
    }
    src.push_str(&super::output_decl(3, out_dtype, accumulate));
    let width = |vector: bool| if vector { VEC } else { 1 };
    // Both slices are staged depth-major: element (place p, depth kk) at
    // `nbuf + kk * stride + p` of `sa4` (places: rows of `a`) or `sb4`
    // (columns of `b`), as floats.
    let slice = |vector: bool,
                 along_places: bool,
                 [limit, base, offset, ps, ks]: [&'static str; 5]| Slice {
        extent: t,
        depth: DEPTH,
        width: width(vector),
        invocations: 256,
        along_places,
        limit,
        base,
        offset,
        place_stride: ps,
        depth_stride: ks,
        shared_base: "nbuf + ",
        shared_place: 1,
        shared_depth: stride,
    };
    let a_slice = slice(loads.a, view.a_cols, ["m", "row_base", "ao", "ars", "acs"]);
    let b_slice = slice(loads.b, !view.b_cols, ["n", "col_base", "bo", "bcs", "brs"]);
    let decl: String = (0..r * r)
        .map(|q| format!("    var c{}_{}: f32 = 0.0;\n", q / r, q % r))
        .collect();
    let (mut regs, mut fetch, mut put) = (String::new(), String::new(), String::new());
    for (name, shared, slice) in [("a", "sa4", &a_slice), ("b", "sb4", &b_slice)] {
        stage(name, shared, slice, [&mut regs, &mut fetch, &mut put]);
    }
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

/// Appends operand `name`'s staging to `[regs, fetch, put]`: its
/// registers (f32, or `vec4<f32>` for vector loads), the loads of the
/// slice at depth `kf` into them (zeros outside the product) and their
/// stores into the workgroup array `shared` (of `vec4<f32>`, at `nbuf`):
/// a vector along the slice's places is one `vec4` store, one along its
/// depth four scalar stores a staged row apart.
fn stage(name: &str, shared: &str, slice: &Slice<'_>, [regs, fetch, put]: [&mut String; 3]) {
    let r = format!("l{name}");
    let (global, shared_at) = (slice.global(), slice.shared());
    for q in 0..slice.loads() {
        let at = slice.locate(q);
        let put_at = format!("{at} {shared_at}");
        if slice.width == 1 {
            regs.push_str(&format!("    var {r}{q}: f32;\n"));
            fetch.push_str(&format!(
                "        {{ {at} {global} {r}{q} = 0.0; if (inb) {{ {r}{q} = load_{name}(gi); }} }}\n"
            ));
            put.push_str(&format!(
                "        {{ {put_at} {shared}[sh >> 2u][sh & 3u] = {r}{q}; }}\n"
            ));
            continue;
        }
        debug_assert_eq!(slice.width, 4);
        regs.push_str(&format!("    var {r}{q}: vec4<f32>;\n"));
        fetch.push_str(&format!(
            "        {{ {at} {global} {r}{q} = vec4<f32>(); if (inb) {{ {r}{q} = load4_{name}(gi >> 2u); }} }}\n"
        ));
        let step = slice.shared_step();
        if step == 1 {
            // `sh` is a multiple of 4: the staged row's stride, `nbuf` and
            // the place are.
            put.push_str(&format!(
                "        {{ {put_at} {shared}[sh >> 2u] = {r}{q}; }}\n"
            ));
        } else {
            debug_assert!(step.is_multiple_of(4));
            put.push_str(&format!("        {{ {put_at}"));
            for i in 0..4 {
                put.push_str(&format!(
                    " {shared}[(sh >> 2u) + {o}u][sh & 3u] = {r}{q}[{i}];",
                    o = i * step / 4
                ));
            }
            put.push_str(" }\n");
        }
    }
}
