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
//! fragments multiply. The output leaves through a 16 x 16 f32 staging
//! fragment per subgroup, from which the 32 invocations write 8 values
//! each, bounds-checked, converted to the output dtype (or added into it):
//! edges and dtypes cost nothing inside the loop.
//!
//! The fragment operations (load from workgroup memory, multiply-add,
//! store to workgroup memory) have two implementations, [`Fragments`]
//! (`backend::gpu::fragment`): WGSL's cooperative matrices
//! (`coop_mat16x16`, tensor cores where the adapter has them), and plain
//! WGSL over workgroup memory. Everything else (tiling, staging, edges,
//! output) is one text, so the plain variant, which runs on any adapter
//! (lavapipe in CI), tests what the tensor-core variant does around its
//! intrinsics.

use super::View;
use crate::Dtype;
pub(super) use crate::backend::gpu::fragment::Fragments;
use crate::backend::gpu::fragment::{LANES, Layout, Operand};

/// Depth of one staged slice (two fragment steps).
pub(super) const DEPTH: usize = 32;
/// Padding of each staged row, in halves.
const PAD: usize = 8;

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
    /// 128 x 128 tiles: 8 subgroups (4 x 2) of 2 x 4 fragments (32 x 64).
    pub const LARGE: Tiling = Tiling {
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

    /// Workgroup memory in bytes: the staged slices (f16) and the staging
    /// fragments (f32).
    pub fn shared_bytes(self) -> usize {
        2 * (self.bm() * (DEPTH + PAD) + DEPTH * (self.bn() + PAD))
            + 4 * 256 * self.sg_rows * self.sg_cols
    }
}

/// WGSL (without the leading `enable f16;` that the pipeline cache adds)
/// of `a @ b` for f16 operands laid out as `view`, written as `out_dtype`
/// (f16, or f32 added into `out` with `accumulate`).
pub(super) fn source(
    tiling: Tiling,
    fragments: Fragments,
    view: View,
    out_dtype: Dtype,
    accumulate: bool,
) -> String {
    let (bm, bn, inv) = (tiling.bm(), tiling.bn(), tiling.invocations());
    let (fm, fnn) = (tiling.fm, tiling.fn_);
    let sa_stride = DEPTH + PAD;
    let sb_stride = bn + PAD;
    let per_a = bm * DEPTH / inv;
    let per_b = DEPTH * bn / inv;
    let mut src = String::from(fragments.enable());
    src.push_str(super::super::codegen::PRELUDE);
    src.push_str(super::super::codegen::META);
    src.push_str(
        "@group(0) @binding(1) var<storage, read> a: array<f16>;\n\
         @group(0) @binding(2) var<storage, read> b: array<f16>;\n",
    );
    if accumulate || out_dtype == Dtype::F32 {
        src.push_str(&super::output_decl(3, Dtype::F32, accumulate));
    } else {
        debug_assert_eq!(out_dtype, Dtype::F16);
        src.push_str(&super::super::codegen::native_f16_output(3));
    }
    let (a_row, a_k) = if view.a_cols {
        (format!("e % {bm}u"), format!("e / {bm}u"))
    } else {
        (format!("e / {DEPTH}u"), format!("e % {DEPTH}u"))
    };
    let (b_k, b_col) = if view.b_cols {
        (format!("e % {DEPTH}u"), format!("e / {DEPTH}u"))
    } else {
        (format!("e / {bn}u"), format!("e % {bn}u"))
    };
    let mut regs = String::new();
    for q in 0..per_a {
        regs.push_str(&format!("    var la{q}: f16;\n"));
    }
    for q in 0..per_b {
        regs.push_str(&format!("    var lb{q}: f16;\n"));
    }
    let mut fetch = String::new();
    for q in 0..per_a {
        fetch.push_str(&format!(
            "        {{ let e = lid + {off}u; let gr = row_base + {a_row}; let gk = kf + {a_k}; la{q} = 0.0h; if (gr < m && gk < k) {{ la{q} = a[u32(ao + i32(gr) * ars + i32(gk) * acs)]; }} }}\n",
            off = q * inv
        ));
    }
    for q in 0..per_b {
        fetch.push_str(&format!(
            "        {{ let e = lid + {off}u; let gk = kf + {b_k}; let gc = col_base + {b_col}; lb{q} = 0.0h; if (gk < k && gc < n) {{ lb{q} = b[u32(bo + i32(gk) * brs + i32(gc) * bcs)]; }} }}\n",
            off = q * inv
        ));
    }
    let mut put = String::new();
    for q in 0..per_a {
        put.push_str(&format!(
            "        {{ let e = lid + {off}u; sa[({a_row}) * {sa_stride}u + {a_k}] = la{q}; }}\n",
            off = q * inv
        ));
    }
    for q in 0..per_b {
        put.push_str(&format!(
            "        {{ let e = lid + {off}u; sb[({b_k}) * {sb_stride}u + {b_col}] = lb{q}; }}\n",
            off = q * inv
        ));
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
                "            let ia{i} = (wr + {r}u) * {sa_stride}u + {ks}u;\n",
                r = i * 16,
                ks = s * 16
            ));
            step.push_str(&fragments.load_a(a));
        }
        for (j, b) in b_ops.iter().enumerate() {
            step.push_str(&format!(
                "            let ib{j} = {ks}u * {sb_stride}u + wc + {c}u;\n",
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
    // The output, one fragment at a time through the staging fragment.
    let mut store = String::new();
    for i in 0..fm {
        for j in 0..fnn {
            store.push_str(&format!(
                "    {{ let st = sg * 256u; {} }}\n",
                fragments.store(&format!("acc{i}_{j}"), "stage", "st", 16)
            ));
            store.push_str(&format!(
                "    workgroupBarrier();
    for (var q = 0u; q < 8u; q = q + 1u) {{
        let e = lane + q * 32u;
        let rr = row_base + wr + {r}u + e / 16u;
        let cc = col_base + wc + {c}u + e % 16u;
        if (rr < m && cc < n) {{ store_out(ob + rr * n + cc, stage[sg * 256u + e]); }}
    }}
    workgroupBarrier();
",
                r = i * 16,
                c = j * 16
            ));
        }
    }
    src.push_str(&format!(
        r#"
var<workgroup> sa: array<f16, {sa_len}>;
var<workgroup> sb: array<f16, {sb_len}>;
var<workgroup> stage: array<f32, {stage_len}>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let g = wid.x + wid.y * nw.x;
    if (g >= params[6]) {{ return; }}
{prologue}
    let sg = lid / 32u;
    let lane = lid % 32u;
    {lanes}    let wr = (sg / {sg_cols}u) * {wm}u;
    let wc = (sg % {sg_cols}u) * {wn}u;
    let row_base = tm * {bm}u;
    let col_base = tn * {bn}u;
{decl}{regs}
    var k0 = 0u;
    {{
        let kf = 0u;
{fetch}    }}
    loop {{
        if (k0 >= k) {{ break; }}
{put}        workgroupBarrier();
        let kf = k0 + {DEPTH}u;
        if (kf < k) {{
{fetch}        }}
{step}        workgroupBarrier();
        k0 = kf;
    }}
    let ob = params[13] + bi * m * n;
{store}}}
"#,
        sa_len = bm * sa_stride,
        sb_len = DEPTH * sb_stride,
        stage_len = 256 * tiling.sg_rows * tiling.sg_cols,
        sg_cols = tiling.sg_cols,
        wm = fm * 16,
        wn = fnn * 16,
        prologue = super::PROLOGUE,
        lanes = LANES,
    ));
    src
}
