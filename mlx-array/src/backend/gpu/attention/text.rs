//! The WGSL text the attention kernels share: the header (bindings,
//! constants, sizes), the query block's opening, unrolled loops, staging
//! into workgroup memory and quad stores.

use super::super::codegen;
use super::staging::{Rows, Tile, stage_quads};
use super::{Loads, SIDE, Tiles};
use crate::Dtype;
use crate::backend::common::attention::AttentionDims;

/// The scalar staging loop of [`stage`] (a template).
const STAGE: &str = include_str!("stage.wgsl");

/// The WGSL shared by the kernels: constants, the bindings of `inputs`
/// (name and dtype; those named in `staged` read by quads, `load4_<name>`,
/// when `loads` says so, the others element by element, `load_<name>`),
/// an output of dtype `out`, and the sizes read from `params`.
pub(super) fn header(
    dims: &AttentionDims,
    inputs: &[(&str, Dtype)],
    tiles: Tiles,
    loads: Loads,
    staged: &[&str],
    out: Dtype,
) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    for (i, (name, dtype)) in inputs.iter().enumerate() {
        let binding = i as u32 + 1;
        if loads == Loads::Quads && staged.contains(name) {
            s.push_str(&super::super::elementwise::input4(name, binding, *dtype));
        } else {
            s.push_str(&codegen::input(name, binding, *dtype));
        }
    }
    s.push_str(&codegen::output(inputs.len() as u32 + 1, out));
    s.push_str(&format!(
        "const D: u32 = {}u;\nconst DV: u32 = {}u;\nconst BQ: u32 = {}u;\nconst BK: u32 = {}u;\n",
        dims.d, dims.dv, tiles.bq, tiles.bk
    ));
    s.push_str(SIZES);
    s
}

/// WGSL every attention kernel shares: the sizes read from `params`, and
/// which keys a query sees (`limit`) and which queries see a key
/// (`first_query`) under the causal mask (queries are the last positions).
/// WGSL opening a kernel with a workgroup per (batch, head, block of `BQ`
/// query rows): its flat index `g` (returning past the last), `bh`, the
/// first query row `q0`, the head `hi` and the batch `bi`.
pub(super) const QUERY_BLOCK: &str = include_str!("query_block.wgsl");

pub(super) const SIZES: &str = include_str!("sizes.wgsl");

/// WGSL of a loop of `n` steps over `var`, unrolled: `body` once per
/// step, in a block where `var` is the step's constant. The kernels'
/// inner products and softmax walks are unrolled so, not left to the
/// driver: in kernels compiled with wgpu's runtime checks each loop
/// carries a guard counter that hides its trip count, and straight-line
/// code lets the driver issue the steps' workgroup-memory loads ahead of
/// their FMAs whatever the checks.
pub(super) fn unrolled(var: &str, n: usize, body: &str) -> String {
    (0..n)
        .map(|k| format!("        {{ let {var} = {k}u;\n{body}\n        }}\n"))
        .collect()
}

/// WGSL statements, unrolled: `f(i, j)` for `i < n`, `j < m`.
pub(super) fn unroll(n: usize, m: usize, f: impl Fn(usize, usize) -> String) -> String {
    let mut s = String::new();
    for i in 0..n {
        for j in 0..m {
            s.push_str(&f(i, j));
            s.push('\n');
        }
    }
    s
}

/// WGSL in which the 256 invocations stage the tile `r` of input `name`
/// (rows of `r.width` adjacent elements from `r.base`, zeros from row
/// `r.valid` on and past the width up to `r.padded`) into the workgroup
/// array of `vec4<f32>` quads `tile`, rows `stride` quads apart: element
/// by element in a loop, or with [`Loads::Quads`] by `load4_` quads,
/// unrolled, each invocation's loads all issued before its stores.
pub(super) fn stage(tile: &str, name: &str, loads: Loads, r: &Rows<'_>, stride: usize) -> String {
    let Rows {
        rows,
        width,
        padded,
        valid,
        base,
        step,
    } = *r;
    if loads == Loads::Scalar {
        return codegen::fill(
            STAGE,
            &[
                ("rows", &rows.to_string()),
                ("padded", &padded.to_string()),
                ("valid", valid),
                ("width", &width.to_string()),
                ("name", name),
                ("base", base),
                ("step", step),
                ("tile", tile),
                ("stride", &stride.to_string()),
            ],
        );
    }
    stage_quads(256, Tile::Quads(tile, stride), r, "f32", &|i: &str| {
        format!("load4_{name}({i})")
    })
}

/// Quads per row of an f32 kernel's tile of rows `w` elements wide: an odd
/// count, so that the 16-byte reads of 8 rows at one column fall in 8
/// different groups of 4 banks (no conflicts).
pub(super) fn quad_stride(w: usize) -> usize {
    w.div_ceil(4) | 1
}

/// Quads an invocation owns in a row of `w` elements (`tx + 16 j` for
/// `j < quad_cols(w)`).
pub(super) fn quad_cols(w: usize) -> usize {
    w.div_ceil(4).div_ceil(SIDE)
}

/// WGSL storing the quad `v` (columns `4 (tx + 16 j)` on) of a row that
/// starts at output element `at`, each of its columns below `width`, with
/// the WGSL function `store`; `scale` multiplies it (WGSL, may be empty).
pub(super) fn store_quad(
    store: &str,
    v: &str,
    j: usize,
    at: &str,
    width: &str,
    scale: &str,
) -> String {
    let mut s = format!("{{ let c = 4u * (tx + {}u); let o = {v}{scale};", SIDE * j);
    for e in 0..4 {
        s.push_str(&format!(
            " if (c + {e}u < {width}) {{ {store}({at} + c + {e}u, o[{e}]); }}"
        ));
    }
    s.push_str(" }");
    s
}

/// WGSL of the forward kernels' `store_o(i, v)`, which stores an element
/// of the attention's output into the packed f32 buffer and, with a `half`
/// dtype, into the half-precision output at binding 5.
pub(super) fn output_store(half: Option<Dtype>) -> String {
    codegen::store_with_half("store_o", 5, half)
}
