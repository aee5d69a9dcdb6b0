//! The flash-attention forward kernel: a workgroup per (batch, head, block
//! of `BQ` query rows), online softmax over blocks of `BK` keys (see the
//! module above for the design and its figures).

use super::staging::{InputRows, Loads};
use super::{
    QUERY_BLOCK, SIDE, Tiles, header, output_store, quad_cols, quad_stride, stage, store_quad,
    unroll, unrolled,
};
use crate::Dtype;
use crate::backend::common::attention::AttentionDims;

/// WGSL: the forward kernel's workgroup arrays (a template).
const FORWARD_WORKGROUP_MEMORY_WGSL: &str = include_str!("forward_workgroup_memory.wgsl");

/// WGSL: the forward kernel's body: stage Q, walk the key blocks, online softmax, store O and the logsumexps (a template).
const FORWARD_MAIN_WGSL: &str = include_str!("forward_main.wgsl");

/// Row strides of the workgroup tiles: Q and K/V in quads, S in words.
fn strides(dims: &AttentionDims, t: Tiles) -> (usize, usize, usize) {
    (
        quad_stride(dims.d),
        quad_stride(dims.d.max(dims.dv)),
        t.bk + 1,
    )
}

/// Invocations of the workgroup (`SIDE x SIDE`).
const INVOCATIONS: usize = SIDE * SIDE;

/// Workgroup memory of the kernel with tiles `t`, in bytes: the Q and K/V
/// tiles, S, the rows' max, sum and rescale, and the softmax's partial
/// maxima and sums (one per invocation).
pub(super) fn bytes(dims: &AttentionDims, t: Tiles) -> usize {
    let (qs, ks, ss) = strides(dims, t);
    16 * (t.bq * qs + t.bk * ks + SIDE) + 4 * (t.bq * ss + 3 * t.bq + INVOCATIONS)
}

/// Invocations that share a row's softmax (every invocation takes part:
/// `256 / BQ`, each over `BK / parts` keys).
fn softmax_parts(t: Tiles) -> usize {
    INVOCATIONS / t.bq
}

/// The kernel's WGSL for inputs of `dtype`, staged as `loads` says, the
/// output also stored in `half` if given.
pub(super) fn source(
    dims: &AttentionDims,
    (dtype, half): (Dtype, Option<Dtype>),
    t: Tiles,
    loads: Loads,
) -> String {
    let (qs, ks, ss) = strides(dims, t);
    let (ri, rj, co) = (t.bq / SIDE, t.bk / SIDE, quad_cols(dims.dv));
    let mut s = header(
        dims,
        &[("q", dtype), ("k", dtype), ("v", dtype)],
        t,
        loads,
        &["q", "k", "v"],
        Dtype::F32,
    );
    s.push_str(&output_store(half));
    s.push_str(&crate::backend::gpu::codegen::fill(
        FORWARD_WORKGROUP_MEMORY_WGSL,
        &[
            ("q_len", &(t.bq * qs).to_string()),
            ("kv_len", &(t.bk * ks + SIDE).to_string()),
            ("s_len", &(t.bq * ss).to_string()),
            ("INVOCATIONS", &INVOCATIONS.to_string()),
        ],
    ));
    s.push_str(super::codegen::GROUP_ENTRY);
    let o_decl = unroll(ri, co, |i, j| format!("    var o{i}_{j} = vec4<f32>();"));
    let s_decl = unroll(ri, rj, |i, j| format!("        var s{i}_{j} = 0.0;"));
    let a_load = unroll(ri, 1, |i, _| {
        format!(
            "            let a{i} = q_s[(ty + {}u) * {qs}u + c];",
            SIDE * i
        )
    });
    let b_load = unroll(rj, 1, |j, _| {
        format!(
            "            let b{j} = kv_s[(tx + {}u) * {ks}u + c];",
            SIDE * j
        )
    });
    let s_fma = unroll(ri, rj, |i, j| {
        format!(
            "            s{i}_{j} = s{i}_{j} + a{i}.x * b{j}.x + a{i}.y * b{j}.y + a{i}.z * b{j}.z + a{i}.w * b{j}.w;"
        )
    });
    let s_store = unroll(ri, rj, |i, j| {
        let (r, c) = (SIDE * i, SIDE * j);
        format!(
            "        if (k0 + tx + {c}u < limit(q0 + ty + {r}u)) {{ s_s[(ty + {r}u) * {ss}u + tx + {c}u] = s{i}_{j} * scale(); }} else {{ s_s[(ty + {r}u) * {ss}u + tx + {c}u] = neg_inf(); }}"
        )
    });
    let o_rescale = unroll(ri, co, |i, j| {
        format!("        o{i}_{j} = o{i}_{j} * a_s[ty + {}u];", SIDE * i)
    });
    let p_load = unroll(ri, 1, |i, _| {
        format!(
            "            let p{i} = s_s[(ty + {}u) * {ss}u + j];",
            SIDE * i
        )
    });
    let v_load = unroll(co, 1, |j, _| {
        format!(
            "            let v{j} = kv_s[j * {ks}u + tx + {}u];",
            SIDE * j
        )
    });
    let o_fma = unroll(ri, co, |i, j| {
        format!("            o{i}_{j} = o{i}_{j} + p{i} * v{j};")
    });
    let o_store = unroll(ri, co, |i, j| {
        let r = SIDE * i;
        let at = format!("((bi * lq() + q0 + ty + {r}u) * h() + hi) * DV");
        format!(
            "    if (q0 + ty + {r}u < lq()) {}",
            store_quad(
                "store_o",
                &format!("o{i}_{j}"),
                j,
                &at,
                "DV",
                &format!(" / l_s[ty + {r}u]")
            )
        )
    });
    let s_steps = unrolled(
        "c",
        dims.d.div_ceil(4),
        &format!("{a_load}\n{b_load}\n{s_fma}"),
    );
    // The row's softmax shared by `parts` invocations, each over `kp`
    // adjacent keys: partial maxima, then their max, then the partial
    // sums of the exponentials, merged in the order of the parts.
    let parts = softmax_parts(t);
    debug_assert!(t.bk.is_multiple_of(parts) && parts * t.bq == INVOCATIONS);
    let kp = t.bk / parts;
    let max_steps = unrolled("j", kp, "            mx = max(mx, s_s[at + j]);");
    let exp_steps = unrolled(
        "j",
        kp,
        "            let p = exp(s_s[at + j] - mx);\n            s_s[at + j] = p;\n            sum = sum + p;",
    );
    let merge_max = unrolled("j", parts, "            mx = max(mx, red_s[first + j]);");
    let merge_sum = unrolled("j", parts, "            total = total + red_s[first + j];");
    let pv_steps = unrolled("j", t.bk, &format!("{p_load}\n{v_load}\n{o_fma}"));
    let r = InputRows::new(dims, t, 4);
    let q_stage = stage("q_s", "q", loads, &r.q, qs);
    let k_stage = stage("kv_s", "k", loads, &r.k, ks);
    let v_stage = stage("kv_s", "v", loads, &r.v, ks);
    s.push_str(&crate::backend::gpu::codegen::fill(
        FORWARD_MAIN_WGSL,
        &[
            ("QUERY_BLOCK", QUERY_BLOCK),
            ("SIDE", &SIDE.to_string()),
            ("q_stage", &q_stage),
            ("o_decl", &o_decl),
            ("k_stage", &k_stage),
            ("s_decl", &s_decl),
            ("s_steps", &s_steps),
            ("s_store", &s_store),
            ("v_stage", &v_stage),
            ("kp", &kp.to_string()),
            ("parts", &parts.to_string()),
            ("ss", &ss.to_string()),
            ("max_steps", &max_steps),
            ("merge_max", &merge_max),
            ("exp_steps", &exp_steps),
            ("merge_sum", &merge_sum),
            ("o_rescale", &o_rescale),
            ("pv_steps", &pv_steps),
            ("o_store", &o_store),
        ],
    ));
    s
}
