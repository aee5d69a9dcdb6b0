//! The register-blocked f32 kernel (every float dtype, f32 arithmetic).
//!
//! A workgroup of `ty x tx` invocations computes a `bm x bn` tile of one
//! output matrix ([`Tile`]: 64 x 64 or 128 x 128 on 16 x 16 invocations by
//! default). Each invocation accumulates `bm / ty` x `bn / tx` outputs (4
//! x 4 or 8 x 8) in registers, as blocks of 4 x 4 spaced `4 ty` rows and
//! `4 tx` columns apart, so that the invocations of one warp read
//! neighbouring `vec4`s of workgroup memory. The depth loop
//! stages `bm x 16` slices of `a` (depth-major) and `16 x bn` slices of `b`
//! in workgroup memory, double buffered: the loads of the next slice go to
//! registers before the products of the present one and to the other
//! buffer after them, so one barrier per slice suffices.
//!
//! **Large tiles to measure** (the tuning's `f32_tile`; designed, not
//! measured). The 128 x 128 kernel reached 28-29 TFLOP/s on an H200 (57% of
//! an H100's cuBLAS with TF32 off; the goal is 60%), the same with and
//! without wgpu's checks, so its instructions are not the bound; what is,
//! no profile of ours says. Each alternative tests one explanation:
//!
//! | `f32_tile` | invocations | outputs each | fmas : `vec4` reads a depth | registers (est.) | workgroup memory | workgroups per SM (est.) |
//! |---|---|---|---|---|---|---|
//! | `128x128` (default) | 256 | 8 x 8 | 64 : 4 | ~110-128 | 33,792 B | 2 if under 128 registers, else 1 |
//! | `128x64` | 256 | 8 x 4 | 32 : 3 | ~70 | 25,600 B | 3 (24 warps): more warps hide latency |
//! | `128x128/128` | 128 | 16 x 8 | 128 : 6 | ~170 | 33,792 B | 3 (12 warps): more independent fmas per warp |
//! | `256x128` | 256 | 16 x 8 | 128 : 6 | ~170 | 25,088 B (one buffer: two barriers a slice) | 1 (8 warps): half the staging per product |
//!
//! If registers hold the default to one workgroup per SM, `128x64` should
//! win; if latency within a warp does, `128x128/128`; if the staging does,
//! `256x128`. `bench/gpu_ab.sh` measures all four beside cuBLAS.
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
//! through the scalar path (one element per load). The choice is per operand and part
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
use super::loads::{Slice, VecLoads};
use super::{Epilogue, View};
use crate::Dtype;
use crate::settings::GpuF32Tile;

/// WGSL of `source` (a template).
const TILED_SOURCE_WGSL: &str = include_str!("tiled_source.wgsl");

/// Depth of one staged slice.
pub(super) const DEPTH: usize = 16;
/// Elements per vector staging load (a `vec4<f32>` of f32; 8 bytes of a
/// half dtype).
pub(super) const VEC: usize = 4;

/// A tiling of the kernel: `bm x bn` outputs per workgroup, computed by
/// `ty x tx` invocations, each owning `bm / ty` rows by `bn / tx` columns
/// as 4 x 4 blocks spaced `4 ty` rows and `4 tx` columns apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tile {
    /// Output rows per workgroup.
    pub bm: usize,
    /// Output columns per workgroup.
    pub bn: usize,
    /// Invocations along the rows.
    pub ty: usize,
    /// Invocations along the columns.
    pub tx: usize,
}

impl Tile {
    /// 64 x 64 on 16 x 16 invocations (4 x 4 outputs each).
    pub const T64: Tile = Tile {
        bm: 64,
        bn: 64,
        ty: 16,
        tx: 16,
    };
    /// 128 x 128 on 16 x 16 invocations (8 x 8 outputs each): the default
    /// large tile.
    pub const T128: Tile = Tile {
        bm: 128,
        bn: 128,
        ty: 16,
        tx: 16,
    };

    /// Invocations per workgroup.
    pub fn invocations(self) -> usize {
        self.ty * self.tx
    }

    /// 4 x 4 blocks per invocation along the rows.
    fn gm(self) -> usize {
        self.bm / (4 * self.ty)
    }

    /// 4 x 4 blocks per invocation along the columns.
    fn gn(self) -> usize {
        self.bn / (4 * self.tx)
    }

    /// Whether the kernel can run it: whole 4 x 4 blocks per invocation,
    /// and staging loads that divide among the invocations.
    pub fn valid(self) -> bool {
        let inv = self.invocations();
        self.ty > 0
            && self.tx > 0
            && self.bm.is_multiple_of(4 * self.ty)
            && self.bn.is_multiple_of(4 * self.tx)
            && (self.bm * DEPTH).is_multiple_of(inv * VEC)
            && (self.bn * DEPTH).is_multiple_of(inv * VEC)
            && inv <= 1024
    }
}

/// The tiling of the large tile `choice` (the tuning's `f32_tile`).
pub(super) fn large_tile(choice: GpuF32Tile) -> Tile {
    let tile = |bm, bn, ty, tx| Tile { bm, bn, ty, tx };
    match choice {
        GpuF32Tile::Square => Tile::T128,
        GpuF32Tile::Half => tile(128, 64, 16, 16),
        GpuF32Tile::Narrow => tile(128, 128, 8, 16),
        GpuF32Tile::Tall => tile(256, 128, 16, 16),
    }
}

/// Workgroup memory of the kernel with tiling `tile` and `buffers` (1 or
/// 2) staged slices per operand, in bytes.
pub(super) fn shared_bytes(tile: Tile, buffers: usize) -> usize {
    buffers * DEPTH * (tile.bm + 4 + tile.bn + 4) * 4
}

/// WGSL of the kernel with tiling `tile` for operands of `dtype`
/// laid out as `view`, storing `out_dtype` (`dtype`, or f32 for split-K
/// partial sums) as `epilogue` says, with
/// `buffers` slices per operand: 2 (one barrier per slice), or 1 for
/// devices with less workgroup memory (a second barrier before each
/// slice is overwritten), staging the operands `loads` names [`VEC`]
/// elements a load and the others one.
pub(super) fn source(
    tile: Tile,
    buffers: usize,
    dtype: Dtype,
    out_dtype: Dtype,
    view: View,
    epilogue: Epilogue,
    loads: VecLoads,
) -> String {
    debug_assert!(tile.valid());
    let (gm, gn, inv) = (tile.gm(), tile.gn(), tile.invocations());
    let (rm, rn) = (4 * gm, 4 * gn);
    // Floats per staged depth row of each operand.
    let (stride_a, stride_b) = (tile.bm + 4, tile.bn + 4);
    let mut src = String::from(codegen::PRELUDE);
    src.push_str(codegen::META);
    for (name, binding, vector) in [("a", 1, loads.a), ("b", 2, loads.b)] {
        src.push_str(&if vector {
            input4(name, binding, dtype)
        } else {
            codegen::input(name, binding, dtype)
        });
    }
    src.push_str(&super::output_decl(
        3,
        out_dtype,
        epilogue,
        super::PRODUCT_ADDEND_SHIFT,
    ));
    let width = |vector: bool| if vector { VEC } else { 1 };
    // Both slices are staged depth-major: element (place p, depth kk) at
    // `nbuf + kk * stride + p` of `sa4` (places: rows of `a`) or `sb4`
    // (columns of `b`), as floats.
    let slice =
        |vector: bool,
         along_places: bool,
         extent: usize,
         stride: usize,
         [limit, base, offset, ps, ks, shared_base]: [&'static str; 6]| Slice {
            extent,
            depth: DEPTH,
            width: width(vector),
            invocations: inv,
            along_places,
            limit,
            base,
            offset,
            place_stride: ps,
            depth_stride: ks,
            shared_base,
            shared_place: 1,
            shared_depth: stride,
        };
    let a_slice = slice(
        loads.a,
        view.a_cols,
        tile.bm,
        stride_a,
        ["m", "row_base", "ao", "ars", "acs", "nbuf_a + "],
    );
    let b_slice = slice(
        loads.b,
        !view.b_cols,
        tile.bn,
        stride_b,
        ["n", "col_base", "bo", "bcs", "brs", "nbuf_b + "],
    );
    let decl: String = (0..rm * rn)
        .map(|q| format!("    var c{}_{}: f32 = 0.0;\n", q / rn, q % rn))
        .collect();
    let (mut regs, mut fetch, mut put) = (String::new(), String::new(), String::new());
    for (name, shared, slice) in [("a", "sa4", &a_slice), ("b", "sb4", &b_slice)] {
        stage(name, shared, slice, [&mut regs, &mut fetch, &mut put]);
    }
    // The products of the slice, unrolled: per depth, vec4 reads, then
    // rm x rn fmas.
    let mut fma = String::new();
    for kk in 0..DEPTH {
        fma.push_str("        {\n");
        for g in 0..gm {
            fma.push_str(&format!(
                "            let a{g} = sa4[abase + {off}u + ty];\n",
                off = kk * stride_a / 4 + g * tile.ty
            ));
        }
        for g in 0..gn {
            fma.push_str(&format!(
                "            let b{g} = sb4[bbase + {off}u + tx];\n",
                off = kk * stride_b / 4 + g * tile.tx
            ));
        }
        for i in 0..rm {
            for j in 0..rn {
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
    for i in 0..rm {
        for j in 0..rn {
            let row = format!(
                "row_base + {}u + ty * 4u + {}u",
                (i / 4) * 4 * tile.ty,
                i % 4
            );
            let col = format!(
                "col_base + {}u + tx * 4u + {}u",
                (j / 4) * 4 * tile.tx,
                j % 4
            );
            store.push_str(&format!(
                "    {{ let rr = {row}; let cc = {col}; if (rr < m && cc < n) {{ store_out(ob + rr * n + cc, c{i}_{j}); }} }}\n"
            ));
        }
    }
    // Floats per buffer of each operand.
    let (words_a, words_b) = (DEPTH * stride_a, DEPTH * stride_b);
    let entry = codegen::GROUP_ENTRY.replace("256", &inv.to_string());
    debug_assert!(entry.contains(&format!("({inv}")), "{entry}");
    src.push_str(&crate::backend::gpu::codegen::fill(
        TILED_SOURCE_WGSL,
        &[
            ("total_a", &(buffers * words_a / 4).to_string()),
            ("total_b", &(buffers * words_b / 4).to_string()),
            ("entry", &entry),
            ("index", codegen::GROUP_INDEX),
            ("prologue", (super::PROLOGUE)),
            ("tx", &tile.tx.to_string()),
            ("bm", &tile.bm.to_string()),
            ("bn", &tile.bn.to_string()),
            ("decl", &decl),
            ("regs", &regs),
            ("fetch", &fetch),
            ("put", &put),
            ("wa4", &(words_a / 4).to_string()),
            ("wb4", &(words_b / 4).to_string()),
            ("fma", &fma),
            ("flip", (if buffers == 2 { "1u - buf" } else { "0u" })),
            ("words_a", &words_a.to_string()),
            ("words_b", &words_b.to_string()),
            (
                "wait",
                (if buffers == 2 {
                    ""
                } else {
                    "        workgroupBarrier();\n"
                }),
            ),
            ("store", &store),
        ],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_large_tile_is_valid_and_sized_as_documented() {
        let bytes = |choice, buffers| shared_bytes(large_tile(choice), buffers);
        for (choice, name) in GpuF32Tile::ALL {
            assert!(large_tile(choice).valid(), "{name}");
        }
        assert!(Tile::T64.valid());
        // The default, as before the tilings were named: 33,792 B.
        assert_eq!(bytes(GpuF32Tile::Square, 2), 2 * 2 * DEPTH * 132 * 4);
        assert_eq!(bytes(GpuF32Tile::Half, 2), 25_600);
        assert_eq!(bytes(GpuF32Tile::Narrow, 2), 33_792);
        // Two buffers of 256 x 128 would pass 48 KiB; one fits.
        assert_eq!(bytes(GpuF32Tile::Tall, 2), 50_176);
        assert_eq!(bytes(GpuF32Tile::Tall, 1), 25_088);
        let t = large_tile(GpuF32Tile::Narrow);
        assert_eq!((t.invocations(), t.gm(), t.gn()), (128, 4, 2));
        assert!(
            !Tile {
                bm: 128,
                bn: 96,
                ty: 16,
                tx: 16
            }
            .valid()
        );
    }
}
