//! Staging the attention kernels' input tiles into workgroup memory, what
//! the f16 fragment kernels and the f32 kernels share: the tiles
//! ([`Rows`], [`InputRows`]), how inputs are read ([`Loads`]), and the
//! unrolled staging by quads ([`stage_quads`]) into a workgroup [`Tile`].
//! Each family's own staging loop is in its file (`fragments::stage`,
//! `text::stage`).

use super::Tiles;
use crate::backend::common::attention::AttentionDims;

/// One tile to stage: `rows` rows of `width` adjacent elements, the first
/// at element `base` of an input and each `step` elements after the one
/// before, zeros from row `valid` on and past `width` up to `padded` (a
/// multiple of 16 for fragments, of 4 for quads).
pub(super) struct Rows<'a> {
    /// Rows of the tile (its block size).
    pub rows: usize,
    /// Elements of a row in the input (the head width).
    pub width: usize,
    /// Elements of a row in the tile.
    pub padded: usize,
    /// WGSL: the rows that exist (rows from it on are zeros).
    pub valid: &'a str,
    /// WGSL: the input element of the tile's first.
    pub base: &'a str,
    /// WGSL: the elements from one row's first to the next's (the input's
    /// row stride).
    pub step: &'a str,
}

/// The tiles the attention kernels stage, with tiles `t`: the query and
/// cotangent blocks from row `q0`, the key and value blocks from `k0`
/// (their inputs' offsets in `params[6]`, `[10]`, `[7]`, `[8]`, their
/// heads' strides read by `row_of` and `row_step`, see `HEAD_STRIDES`),
/// rows padded with zeros to multiples of `pad` (16 for the fragment
/// kernels, 4 for the f32 kernels' quad tiles).
pub(super) struct InputRows {
    /// The query block.
    pub q: Rows<'static>,
    /// The key block.
    pub k: Rows<'static>,
    /// The value block.
    pub v: Rows<'static>,
    /// The cotangent's block (the gradients).
    pub g: Rows<'static>,
}

impl InputRows {
    /// The staged tiles of the problem `dims` with tiles `t`.
    pub(super) fn new(dims: &AttentionDims, t: Tiles, pad: usize) -> InputRows {
        let padded = |w: usize| w.next_multiple_of(pad);
        let rows = |rows, width, valid, (base, step)| Rows {
            rows,
            width,
            padded: padded(width),
            valid,
            base,
            step,
        };
        InputRows {
            q: rows(
                t.bq,
                dims.d,
                "lq() - q0",
                ("row_of(0u, params[6], bh, q0)", "row_step(0u)"),
            ),
            k: rows(
                t.bk,
                dims.d,
                "lk() - k0",
                ("row_of(1u, params[7], bh, k0)", "row_step(1u)"),
            ),
            v: rows(
                t.bk,
                dims.dv,
                "lk() - k0",
                ("row_of(2u, params[8], bh, k0)", "row_step(2u)"),
            ),
            g: rows(
                t.bq,
                dims.dv,
                "lq() - q0",
                ("row_of(3u, params[10], bh, q0)", "row_step(3u)"),
            ),
        }
    }
}

/// How the fragment kernels read their inputs while staging tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Loads {
    /// One element per load, in a loop.
    Scalar,
    /// Four adjacent elements per load (`vec4<f16>`, or `vec4<f32>` for
    /// converted f32 inputs), unrolled so that an invocation's loads are
    /// all issued before its stores: needs head widths that are multiples
    /// of 4, and inputs whose first elements and strides are multiples of
    /// 4 ([`Loads::for_inputs`]).
    Quads,
}

impl Loads {
    /// Quads where the head widths and every input's first element and
    /// stride (`places`) allow them, else scalars.
    pub(crate) fn for_inputs(d: usize, dv: usize, places: &[usize]) -> Loads {
        if d.is_multiple_of(4) && dv.is_multiple_of(4) && places.iter().all(|o| o.is_multiple_of(4))
        {
            Loads::Quads
        } else {
            Loads::Scalar
        }
    }

    /// The storage declaration of input `name` at `binding`, of `scalar`
    /// elements (`f16` or `f32`).
    pub(crate) fn binding(self, binding: usize, name: &str, scalar: &str) -> String {
        let ty = match self {
            Loads::Scalar => scalar.to_string(),
            Loads::Quads => format!("vec4<{scalar}>"),
        };
        format!("@group(0) @binding({binding}) var<storage, read> {name}: array<{ty}>;\n")
    }
}

/// A workgroup tile that staging fills: `Elements(name, stride)` holds one
/// element per array entry, rows `stride` elements apart; `Quads(name,
/// stride)` holds four adjacent elements per `vec4` entry, rows `stride`
/// quads apart.
#[derive(Clone, Copy)]
pub(super) enum Tile<'a> {
    /// One element per entry.
    Elements(&'a str, usize),
    /// A quad per entry.
    Quads(&'a str, usize),
}

/// WGSL in which `inv` invocations stage the tile `r` by quads into the
/// workgroup `tile`: each invocation loads its `rows x padded / 4 / inv`
/// quads into `vec4<ty>` registers, all before it stores them (element by
/// element, or whole into a [`Tile::Quads`]). `read(i)` is the WGSL of the
/// input's quad `i` as a `vec4<ty>` (the input's first element is a
/// multiple of 4).
pub(super) fn stage_quads(
    inv: usize,
    tile: Tile<'_>,
    r: &Rows<'_>,
    ty: &str,
    read: &dyn Fn(&str) -> String,
) -> String {
    let (per_row, in_row) = (r.padded / 4, r.width / 4);
    let total = r.rows * per_row;
    let (valid, base, step) = (r.valid, r.base, r.step);
    let mut loads = format!("    {{\n        let quad_step = {step} / 4u;\n");
    let mut stores = String::new();
    for q in 0..total.div_ceil(inv) {
        // Only the last round can run past the tile, and only padded rows
        // have columns past the input's.
        let mut guard = String::new();
        if (q + 1) * inv > total {
            guard.push_str(&format!("e{q} < {total}u && "));
        }
        if per_row > in_row {
            guard.push_str(&format!("c{q} < {in_row}u && "));
        }
        let x = read(&format!("({base}) / 4u + r{q} * quad_step + c{q}"));
        loads.push_str(&format!(
            "        let e{q} = lid + {off}u;\n        let r{q} = e{q} / {per_row}u;\n        let c{q} = e{q} % {per_row}u;\n        var x{q} = vec4<{ty}>();\n        if ({guard}r{q} < {valid}) {{ x{q} = {x}; }}\n",
            off = q * inv
        ));
        if (q + 1) * inv > total {
            stores.push_str(&format!("        if (e{q} < {total}u) {{\n"));
        } else {
            stores.push_str("        {\n");
        }
        match tile {
            Tile::Elements(name, stride) => {
                for i in 0..4 {
                    stores.push_str(&format!(
                        "            {name}[r{q} * {stride}u + c{q} * 4u + {i}u] = x{q}[{i}];\n"
                    ));
                }
            }
            Tile::Quads(name, stride) => {
                stores.push_str(&format!(
                    "            {name}[r{q} * {stride}u + c{q}] = x{q};\n"
                ));
            }
        }
        stores.push_str("        }\n");
    }
    loads.push_str(&stores);
    loads.push_str("    }\n");
    loads
}
