//! The tensor-core kernel's template: f16 operands, f32 accumulation, in
//! 16 x 16 x 16 fragments.
//!
//! A workgroup of `32 x subgroups` invocations computes a `bm x bn` output
//! tile; its subgroups (of 32, laid out `sg_rows x sg_cols`) each own
//! `fm x fn` fragments of 16 x 16 (a `16 fm x 16 fn` block) held as f32
//! accumulators. The depth loop stages a `bm x 32` slice of `a` and a
//! `32 x bn` slice of `b` in workgroup memory as f16 (rows padded by 8
//! halves, 16 bytes, to spread the fragment loads over the banks); the
//! next slice's global loads go to registers while the present slice's
//! fragments multiply. Where the workgroup memory holds two slices of
//! each operand ([`Staging`]), the registers go to the other buffer right
//! after the products, so one barrier a slice suffices (the f32 kernel's
//! double buffering); else the one buffer costs two barriers a slice (one
//! before its products, one before it is overwritten). The output leaves through 16 x 16 f32 staging
//! fragments, up to 4 per subgroup at a time ([`staged_per_round`]), from
//! which the 32 invocations write 8 values each per fragment,
//! bounds-checked, converted to the output dtype (or added into it): edges
//! and dtypes cost nothing inside the loop. Each round costs two barriers
//! (the last one): at the 4-subgroup tiling, 8 a tile instead of the 32 of
//! one fragment at a time, as many as a 512-deep product's main loop has.
//! The products at the reference model's 256-deep widths run 8 slices
//! (16 barriers), so the epilogue was a large part of each tile's time;
//! every f16 product of float16 training leaves this way. An f32 output
//! that is written, not added into (split-K's partial sums, and the fused
//! loss's f16 products that write an f32 result), skips the staging on
//! tiles wholly inside the product where its rows start on 16 bytes (see
//! [`epilogue`]): each fragment is stored straight into it (`coopStoreT`
//! with the output's row stride).
//!
//! The fragment operations (load from workgroup memory, multiply-add,
//! store to workgroup memory) have two implementations, [`Fragments`]
//! (`backend::gpu::fragment`): WGSL's cooperative matrices
//! (`coop_mat16x16`, tensor cores where the adapter has them), and plain
//! WGSL over workgroup memory. Everything else (tiling, staging, edges,
//! output) is one text, so the plain variant, which runs on any adapter
//! (lavapipe in CI), tests what the tensor-core variant does around its
//! intrinsics.
//!
//! **Staging loads** (`super::loads`). An operand whose offset, leading
//! dimension and batch strides are multiples of 8 halves, with a unit
//! stride along a contiguous extent (`k`, or `m` / `n` for the
//! transposed views) that is a multiple of 8 too, is read 8 halves (16
//! bytes) at a time, as two `vec4<f16>` from one 16-byte-aligned address,
//! with one bounds check and one address per 8 halves; any other operand
//! goes through the scalar path (one half per load, each with its own
//! check and address). The choice
//! is per operand and part of the pipeline key. Per invocation and 32-deep
//! slice, for the 64 x 64 and the 8-subgroup 128 x 128 tilings (16 halves
//! of each operand per invocation; the 4-subgroup 128 x 128 tiling, with
//! half the invocations, stages twice each figure):
//!
//! | per invocation, slice | scalar | vector |
//! |---|---|---|
//! | global loads, `a` + `b` | 16 + 16 of 2 B | 4 + 4 of 8 B (in 16-byte aligned pairs) |
//! | bounds checks and 32-bit address computations | 32 | 4 |
//! | workgroup stores | 32 halves | 32 halves (8 consecutive ones per vector where it lands along a staged row) |
//!
//! The stores stay single halves: `coopLoad` reads the staged slices as
//! arrays of `f16`, and WGSL cannot view them as vectors; where a vector
//! lands along a staged row (`a` by rows, `b` by rows) its 8 halves are
//! adjacent and 16-byte aligned, which a compiler may merge into one
//! store. Expected effect on the H100 (reasoned, not measured): a warp
//! issues 32 HMMAs (16 fragment products) per slice; the scalar staging
//! costs it some 350 issued instructions per slice (32 loads, 32 stores,
//! and 8-10 integer operations of index arithmetic and checks per
//! element), the vector staging about 100, so a kernel limited by
//! instruction issue around its tensor cores (82-90 TFLOP/s measured,
//! 12-13% of cuBLAS) should gain most of that difference, towards the
//! 150-250 TFLOP/s of the design table in `super`; what remains is the
//! synchronous (register-staged) global loads and the two barriers per
//! slice.

use super::loads::{Slice, VecLoads};
use super::{Epilogue, View};
use crate::Dtype;
use crate::backend::gpu::codegen;
pub(super) use crate::backend::gpu::fragment::Fragments;
use crate::backend::gpu::fragment::{LANES, Layout, Operand};
use crate::settings::GpuCoopTile;

/// The kernel (a template).
const PRODUCT: &str = include_str!("product.wgsl");

/// The single-buffered main loop (a template).
const MAIN_LOOP: &str = include_str!("main_loop.wgsl");

/// The double-buffered main loop (a template).
const MAIN_LOOP_DOUBLE: &str = include_str!("main_loop_double.wgsl");

/// Depth of one staged slice (two fragment steps).
pub(super) const DEPTH: usize = 32;
/// Padding of each staged row, in halves.
const PAD: usize = 8;
/// Elements per vector staging load: two `vec4<f16>`, 16 bytes.
pub(super) const VEC: usize = 8;

/// A tiling of the template.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Tiling {
    /// Subgroups along the output's rows.
    pub sg_rows: usize,
    /// Subgroups along its columns.
    pub sg_cols: usize,
    /// Fragments per subgroup along the rows.
    pub fm: usize,
    /// Fragments per subgroup along the columns.
    pub fn_: usize,
}

impl Tiling {
    /// 128 x 128 tiles: 4 subgroups (2 x 2) of 4 x 4 fragments (64 x 64).
    pub const LARGE_4: Tiling = Tiling {
        sg_rows: 2,
        sg_cols: 2,
        fm: 4,
        fn_: 4,
    };
    /// 128 x 128 tiles: 8 subgroups (4 x 2) of 2 x 4 fragments (32 x 64).
    pub const LARGE_8: Tiling = Tiling {
        sg_rows: 4,
        sg_cols: 2,
        fm: 2,
        fn_: 4,
    };
    /// 64 x 64 tiles: 4 subgroups (2 x 2) of 2 x 2 fragments (32 x 32).
    pub const SMALL: Tiling = Tiling {
        sg_rows: 2,
        sg_cols: 2,
        fm: 2,
        fn_: 2,
    };

    /// 256 x 128 tiles: 8 subgroups (4 x 2) of 4 x 4 fragments (64 x 64),
    /// `MLX_GPU_TUNING=coop_tile=256x128`: per product, a quarter fewer staged
    /// halves than [`Tiling::LARGE_4`] (each `b` slice serves twice the
    /// rows); one buffer (two would need 58,368 bytes with a staging
    /// fragment), 256 invocations of ~210 registers: one workgroup per SM
    /// (8 warps, as two of `LARGE_4`).
    pub const TALL: Tiling = Tiling {
        sg_rows: 4,
        sg_cols: 2,
        fm: 4,
        fn_: 4,
    };

    /// The tilings every adapter that runs the template must fit (the
    /// least of [`Tiling::TALL`] needs 37,376 bytes, more than lavapipe's
    /// 32 KiB: where it does not fit, the default large tiling runs).
    pub const ALL: [Tiling; 3] = [Tiling::LARGE_4, Tiling::LARGE_8, Tiling::SMALL];

    /// The large tiling `choice` names, with `subgroups` subgroups for
    /// the 128 x 128 one (8: [`Tiling::LARGE_8`], else
    /// [`Tiling::LARGE_4`]; `settings::gpu_coop_subgroups`).
    pub fn large(choice: GpuCoopTile, subgroups: usize) -> Tiling {
        match choice {
            GpuCoopTile::Tall => Tiling::TALL,
            GpuCoopTile::Square if subgroups == 8 => Tiling::LARGE_8,
            GpuCoopTile::Square => Tiling::LARGE_4,
        }
    }

    /// Output rows per workgroup.
    pub fn bm(self) -> usize {
        self.sg_rows * self.fm * 16
    }

    /// Output columns per workgroup.
    pub fn bn(self) -> usize {
        self.sg_cols * self.fn_ * 16
    }

    /// Invocations per workgroup.
    pub fn invocations(self) -> usize {
        self.sg_rows * self.sg_cols * 32
    }

    /// Workgroup memory in bytes of the least the kernel runs with: one
    /// buffer per operand and one staging fragment per subgroup.
    pub fn shared_bytes(self) -> usize {
        self.shared_bytes_for(Staging::LEAST)
    }

    /// Halves of one staged slice of `a` (`bm` rows of 32 depths, padded).
    fn a_slice_len(self) -> usize {
        self.bm() * (DEPTH + PAD)
    }

    /// Halves of one staged slice of `b` (32 depths of `bn` columns, padded).
    fn b_slice_len(self) -> usize {
        DEPTH * (self.bn() + PAD)
    }

    /// Workgroup memory in bytes with `staging`: its buffers of staged
    /// slices (f16) and its staging fragments (f32).
    pub fn shared_bytes_for(self, staging: Staging) -> usize {
        2 * staging.buffers * (self.a_slice_len() + self.b_slice_len())
            + 4 * 256 * staging.staged * self.sg_rows * self.sg_cols
    }
}

/// How the template uses its workgroup memory: `buffers` (1 or 2) staged
/// slices of each operand, and `staged` output fragments per subgroup
/// passed through the f32 staging fragments a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Staging {
    /// Staged depth slices per operand: 2, one barrier a slice; 1, two.
    pub buffers: usize,
    /// Output fragments per subgroup a round of the staged epilogue.
    pub staged: usize,
}

impl Staging {
    /// One buffer, one fragment a round: what any adapter that runs the
    /// template has room for.
    pub const LEAST: Staging = Staging {
        buffers: 1,
        staged: 1,
    };

    /// The staging of `tiling` within `limit` bytes: two buffers where
    /// `double` allows and they fit beside one staging fragment, then
    /// [`staged_per_round`]. With 48 KiB: the 4-subgroup 128 x 128 tiling
    /// takes 2 buffers and 2 fragments a round (46,080 B; one buffer would
    /// leave room for 4: 35,328 B), the 8-subgroup one 2 and 1 (46,080 B),
    /// the 64 x 64 one 2 and 4 (35,840 B).
    pub fn choose(tiling: Tiling, limit: usize, double: bool) -> Staging {
        let two = Staging {
            buffers: 2,
            staged: 1,
        };
        let buffers = if double && tiling.shared_bytes_for(two) <= limit {
            2
        } else {
            1
        };
        Staging {
            buffers,
            staged: staged_per_round(tiling, buffers, limit),
        }
    }
}

/// How many of a subgroup's output fragments the staged epilogue passes
/// through workgroup memory at a time, beside `buffers` staged slices per
/// operand: the most of 4, 2 and 1 that divides its fragments and keeps
/// the kernel within `limit` bytes of workgroup memory. Each round costs
/// two barriers (the last one), so the 4-subgroup 128 x 128 tiling's 16
/// fragments leave in 4 rounds with one buffer (8 barriers, against 32 a
/// fragment at a time: as many as a 512-deep product's main loop has;
/// 35,328 bytes), in 8 with two; the 8-subgroup one's 8 in 4 rounds of 2
/// with one buffer (its 8 subgroups would need 51,712 bytes for 4); the
/// 64 x 64 tiling's 4 in one round.
pub(super) fn staged_per_round(tiling: Tiling, buffers: usize, limit: usize) -> usize {
    [4, 2, 1]
        .into_iter()
        .find(|&staged| {
            (tiling.fm * tiling.fn_).is_multiple_of(staged)
                && tiling.shared_bytes_for(Staging { buffers, staged }) <= limit
        })
        .unwrap_or(1)
}

/// WGSL (without the leading `enable f16;` that the pipeline cache adds)
/// of `a @ b` for f16 operands laid out as `view`, written as `out_dtype`
/// (f16 or f32) as `epilogue` says (f32 for [`Epilogue::Accumulate`]), staging the operands
/// `loads` names [`VEC`] halves a load and the others one, in
/// `staging.buffers` slices each, and the output `staging.staged`
/// fragments per subgroup at a time ([`Staging::choose`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn source(
    tiling: Tiling,
    staging: Staging,
    fragments: Fragments,
    view: View,
    out_dtype: Dtype,
    epilogue: Epilogue,
    loads: VecLoads,
) -> String {
    let (bm, bn, inv) = (tiling.bm(), tiling.bn(), tiling.invocations());
    let Staging { buffers, staged } = staging;
    let double = buffers == 2;
    debug_assert!(buffers == 1 || double);
    let (fm, fnn) = (tiling.fm, tiling.fn_);
    let sa_stride = DEPTH + PAD;
    let sb_stride = bn + PAD;
    let mut src = String::from(fragments.enable());
    src.push_str(crate::backend::gpu::codegen::PRELUDE);
    src.push_str(crate::backend::gpu::codegen::META);
    for (name, binding, vector) in [("a", 1, loads.a), ("b", 2, loads.b)] {
        let ty = if vector { "vec4<f16>" } else { "f16" };
        src.push_str(&format!(
            "@group(0) @binding({binding}) var<storage, read> {name}: array<{ty}>;\n"
        ));
    }
    src.push_str(&match epilogue {
        Epilogue::Store if out_dtype == Dtype::F16 => {
            crate::backend::gpu::codegen::native_f16_output(3)
        }
        Epilogue::Addend(_) => {
            super::output_decl(3, out_dtype, epilogue, super::PRODUCT_ADDEND_SHIFT)
        }
        Epilogue::Store | Epilogue::Accumulate => super::output_decl(3, Dtype::F32, epilogue, ""),
    });
    let width = |vector: bool| if vector { VEC } else { 1 };
    // `a`'s slice: `bm` rows by the depth, staged row-major in `sa`.
    let a_slice = Slice {
        extent: bm,
        depth: DEPTH,
        width: width(loads.a),
        invocations: inv,
        along_places: view.a_cols,
        limit: "m",
        base: "row_base",
        offset: "ao",
        place_stride: "ars",
        depth_stride: "acs",
        shared_base: if double { "pa + " } else { "" },
        shared_place: sa_stride,
        shared_depth: 1,
    };
    // `b`'s: the depth by `bn` columns, staged row-major in `sb`.
    let b_slice = Slice {
        extent: bn,
        depth: DEPTH,
        width: width(loads.b),
        invocations: inv,
        along_places: !view.b_cols,
        limit: "n",
        base: "col_base",
        offset: "bo",
        place_stride: "bcs",
        depth_stride: "brs",
        shared_base: if double { "pb + " } else { "" },
        shared_place: 1,
        shared_depth: sb_stride,
    };
    let (mut regs, mut fetch, mut put) = (String::new(), String::new(), String::new());
    for (name, shared, slice) in [("a", "sa", &a_slice), ("b", "sb", &b_slice)] {
        stage(name, shared, slice, [&mut regs, &mut fetch, &mut put]);
    }
    // Accumulators.
    let mut decl = String::new();
    for i in 0..fm {
        for j in 0..fnn {
            decl.push_str("    ");
            decl.push_str(&fragments.declare(&format!("acc{i}_{j}")));
        }
    }
    // One fragment step (depth 16) at depth `ks` of the slice.
    let names = |p: &str, n: usize| (0..n).map(|x| format!("{p}{x}")).collect::<Vec<_>>();
    let (fa, ia, fb, ib) = (
        names("fa", fm),
        names("ia", fm),
        names("fb", fnn),
        names("ib", fnn),
    );
    let a_ops: Vec<Operand> = (0..fm)
        .map(|i| Operand {
            name: &fa[i],
            array: "sa",
            index: &ia[i],
            stride: sa_stride,
            layout: Layout::RowMajor,
        })
        .collect();
    let b_ops: Vec<Operand> = (0..fnn)
        .map(|j| Operand {
            name: &fb[j],
            array: "sb",
            index: &ib[j],
            stride: sb_stride,
            layout: Layout::RowMajor,
        })
        .collect();
    let mut step = String::new();
    for s in 0..DEPTH / 16 {
        step.push_str("        {\n");
        for (i, a) in a_ops.iter().enumerate() {
            step.push_str(&format!(
                "            let ia{i} = {base}(wr + {r}u) * {sa_stride}u + {ks}u;\n",
                base = if double { "abuf + " } else { "" },
                r = i * 16,
                ks = s * 16
            ));
            step.push_str(&fragments.load_a(a));
        }
        for (j, b) in b_ops.iter().enumerate() {
            step.push_str(&format!(
                "            let ib{j} = {base}{ks}u * {sb_stride}u + wc + {c}u;\n",
                base = if double { "bbuf + " } else { "" },
                ks = s * 16,
                c = j * 16
            ));
            step.push_str(&fragments.load_b(b));
        }
        for (i, a) in a_ops.iter().enumerate() {
            for (j, b) in b_ops.iter().enumerate() {
                step.push_str(&fragments.multiply_add(&format!("acc{i}_{j}"), a, b));
            }
        }
        step.push_str("        }\n");
    }
    // The output through the staging fragments, `staged` of each
    // subgroup's fragments a round: stored, one barrier, read back and
    // written (bounds-checked, converted or added into `out`), and one
    // more barrier before the next round reuses them. Straight into `out`
    // (f32, written, not added into) where the whole workgroup tile lies
    // inside the product: no staging, no barriers.
    debug_assert!((fm * fnn).is_multiple_of(staged));
    let mut direct = String::new();
    for i in 0..fm {
        for j in 0..fnn {
            direct.push_str(&format!(
                "        {{ let st = ob + (row_base + wr + {r}u) * n + col_base + wc + {c}u; {} }}\n",
                fragments.store_strided(&format!("acc{i}_{j}"), "out", "st", "n"),
                r = i * 16,
                c = j * 16
            ));
        }
    }
    let rounds = fm * fnn / staged;
    let mut store = String::new();
    for round in 0..rounds {
        let fragment = |k: usize| ((round * staged + k) / fnn, (round * staged + k) % fnn);
        for k in 0..staged {
            let (i, j) = fragment(k);
            store.push_str(&format!(
                "    {{ let st = (sg * {staged}u + {k}u) * 256u; {} }}\n",
                fragments.store(&format!("acc{i}_{j}"), "stage", "st", 16)
            ));
        }
        store.push_str("    workgroupBarrier();\n");
        for k in 0..staged {
            let (i, j) = fragment(k);
            store.push_str(&format!(
                "    for (var q = 0u; q < 8u; q = q + 1u) {{
        let e = lane + q * 32u;
        let rr = row_base + wr + {r}u + e / 16u;
        let cc = col_base + wc + {c}u + e % 16u;
        if (rr < m && cc < n) {{ store_out(ob + rr * n + cc, stage[(sg * {staged}u + {k}u) * 256u + e]); }}
    }}
",
                r = i * 16,
                c = j * 16
            ));
        }
        // Nothing reuses the staging fragments after the last round.
        if round + 1 < rounds {
            store.push_str("    workgroupBarrier();\n");
        }
    }
    let direct_allowed = out_dtype == Dtype::F32 && epilogue == Epilogue::Store;
    let epilogue = stores(&direct, &store, direct_allowed, tiling);
    let (a_len, b_len) = (tiling.a_slice_len(), tiling.b_slice_len());
    let main_loop = if double {
        // Slice `s` in buffer `s % 2`: the next slice's registers go to
        // the other buffer after the present one's products; every
        // invocation finished reading that buffer before the last
        // barrier, and one barrier makes the new slice visible.
        codegen::fill(
            MAIN_LOOP_DOUBLE,
            &[
                ("fetch", &fetch),
                ("put", &put),
                ("DEPTH", &DEPTH.to_string()),
                ("a_len", &a_len.to_string()),
                ("b_len", &b_len.to_string()),
                ("step", &step),
            ],
        )
    } else {
        codegen::fill(
            MAIN_LOOP,
            &[
                ("fetch", &fetch),
                ("put", &put),
                ("DEPTH", &DEPTH.to_string()),
                ("step", &step),
            ],
        )
    };
    src.push_str(&codegen::fill(
        PRODUCT,
        &[
            ("sa_len", &(buffers * a_len).to_string()),
            ("sb_len", &(buffers * b_len).to_string()),
            (
                "stage_len",
                &(256 * staged * tiling.sg_rows * tiling.sg_cols).to_string(),
            ),
            ("inv", &inv.to_string()),
            ("prologue", super::PROLOGUE),
            ("lanes", LANES),
            ("sg_cols", &(tiling.sg_cols).to_string()),
            ("wm", &(fm * 16).to_string()),
            ("wn", &(fnn * 16).to_string()),
            ("bm", &bm.to_string()),
            ("bn", &bn.to_string()),
            ("decl", &decl),
            ("regs", &regs),
            ("main_loop", &main_loop),
            ("epilogue", &epilogue),
        ],
    ));
    src
}

/// The output stage of [`source`]: `staged` (each fragment through the
/// subgroup's f32 staging fragment, bounds-checked, converted or added
/// into `out`), and where `direct_allowed` (an f32 output written, not
/// accumulated nor added to an addend) `direct`
/// (each fragment stored straight into `out`) on tiles wholly inside the
/// product whose rows start on 16 bytes: Vulkan wants a cooperative
/// store's pointer and row stride aligned to 16 bytes (or a row's size),
/// so `n` and the output's offset must be multiples of 4 floats (the
/// reference model's 50,257-class logits take the staged path). The
/// condition is uniform across the workgroup, as the cooperative stores
/// and the staged path's barriers need.
fn stores(direct: &str, staged: &str, direct_allowed: bool, tiling: Tiling) -> String {
    if !direct_allowed {
        return staged.to_string();
    }
    format!(
        "    if (row_base + {bm}u <= m && col_base + {bn}u <= n && (n & 3u) == 0u && (ob & 3u) == 0u) {{\n{direct}    }} else {{\n{staged}    }}\n",
        bm = tiling.bm(),
        bn = tiling.bn(),
    )
}

/// Appends operand `name`'s staging to `[regs, fetch, put]`: its
/// registers, the loads of the slice at depth `kf` into them (zeros
/// outside the product) and their stores into the workgroup array
/// `shared`. Vector loads read [`VEC`] halves as two `vec4<f16>` (the
/// 16-byte load of CUDA's kernels; WGSL has no wider f16 type, and
/// naga's `bitcast` cannot turn a `u32` into two halves) and store them
/// one half at a time (`coopLoad` reads the staged slices as arrays of
/// `f16`).
fn stage(name: &str, shared: &str, slice: &Slice<'_>, [regs, fetch, put]: [&mut String; 3]) {
    let r = format!("l{name}");
    let (global, shared_at) = (slice.global(), slice.shared());
    for q in 0..slice.loads() {
        let at = slice.locate(q);
        let put_at = format!("{at} {shared_at}");
        if slice.width == 1 {
            regs.push_str(&format!("    var {r}{q}: f16;\n"));
            fetch.push_str(&format!(
                "        {{ {at} {global} {r}{q} = 0.0h; if (inb) {{ {r}{q} = {name}[gi]; }} }}\n"
            ));
            put.push_str(&format!("        {{ {put_at} {shared}[sh] = {r}{q}; }}\n"));
            continue;
        }
        debug_assert_eq!(slice.width, 8);
        regs.push_str(&format!(
            "    var {r}{q}_0: vec4<f16>;\n    var {r}{q}_1: vec4<f16>;\n"
        ));
        fetch.push_str(&format!(
            "        {{ {at} {global} {r}{q}_0 = vec4<f16>(); {r}{q}_1 = vec4<f16>(); \
             if (inb) {{ let j = gi >> 2u; {r}{q}_0 = {name}[j]; {r}{q}_1 = {name}[j + 1u]; }} }}\n"
        ));
        put.push_str(&format!("        {{ {put_at}"));
        let step = slice.shared_step();
        for i in 0..8 {
            put.push_str(&format!(
                " {shared}[sh + {o}u] = {r}{q}_{h}[{c}];",
                o = i * step,
                h = i / 4,
                c = i % 4
            ));
        }
        put.push_str(" }\n");
    }
}

#[cfg(test)]
mod tests;
