//! The flash-attention gradient in FlashAttention-2 order: `delta`, then a
//! dK/dV pass over key blocks and a dQ pass over query blocks, each
//! recomputing the probabilities from the forward's logsumexps (see the
//! module above for the design and its figures). With grouped key/value
//! heads a dK/dV workgroup owns a block of a key/value head's keys and
//! walks the query blocks of every query head of its group in turn,
//! summing their contributions in its registers.

use super::staging::{InputRows, Loads};
use super::{SIDE, Tiles, header, quad_cols, quad_stride, stage, store_quad, unroll, unrolled};
use crate::Dtype;
use crate::backend::common::attention::AttentionDims;

/// WGSL: one score's probability and gradient, `p * (dp - delta)` (a template).
const BACKWARD_SCORE_GRADIENT_WGSL: &str = include_str!("backward_score_gradient.wgsl");

/// WGSL: which block of rows, head and batch a workgroup owns (a template).
const BACKWARD_BLOCK_PROLOGUE_WGSL: &str = include_str!("backward_block_prologue.wgsl");

/// WGSL: the gradient kernels' workgroup arrays (a template).
const BACKWARD_WORKGROUP_MEMORY_WGSL: &str = include_str!("backward_workgroup_memory.wgsl");

/// WGSL of `delta_source`.
const BACKWARD_DELTA_SOURCE_WGSL: &str = include_str!("backward_delta_source.wgsl");

/// WGSL: each query row's logsumexp and delta staged in workgroup memory.
const BACKWARD_STAGE_ROW_STATS_WGSL: &str = include_str!("backward_stage_row_stats.wgsl");

/// WGSL: the dQ pass: a workgroup per block of queries of one head (a template).
const BACKWARD_QUERY_PASS_WGSL: &str = include_str!("backward_query_pass.wgsl");

/// WGSL: the dK/dV pass: a workgroup per block of keys of one key/value head (a template).
const BACKWARD_KEY_VALUE_PASS_WGSL: &str = include_str!("backward_key_value_pass.wgsl");

/// The two passes over blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Pass {
    /// A workgroup per block of `BK` keys of a key/value head: `dk` and
    /// `dv`, summed over the head's group of query heads.
    KeyValue,
    /// A workgroup per block of `BQ` queries: `dq`.
    Query,
}

/// Row strides of the workgroup tiles: Q and K, dO and V in quads, P/dS
/// in words.
fn strides(dims: &AttentionDims, t: Tiles) -> (usize, usize, usize) {
    (quad_stride(dims.d), quad_stride(dims.dv), t.bk + 1)
}

/// Workgroup memory of either pass with tiles `t`, in bytes.
pub(super) fn bytes(dims: &AttentionDims, t: Tiles) -> usize {
    let (ds, vs, ps) = strides(dims, t);
    16 * ((t.bq + t.bk) * (ds + vs) + 4 * SIDE) + 4 * (2 * t.bq * ps + 2 * t.bq)
}

/// `delta = rowsum(dO o O)`, a thread per query row (inputs: the forward's
/// packed buffer, the cotangent of dtype `g`).
pub(super) fn delta_source(dims: &AttentionDims, g: Dtype) -> String {
    let t = Tiles { bq: SIDE, bk: SIDE };
    let mut s = header(
        dims,
        &[("packed", Dtype::F32), ("g", g)],
        t,
        Loads::Scalar,
        &[],
        Dtype::F32,
    );
    s.push_str(super::codegen::ENTRY);
    s.push_str(" {\n    ");
    s.push_str(super::codegen::THREAD_INDEX);
    s.push_str(BACKWARD_DELTA_SOURCE_WGSL);
    s
}

/// The WGSL of one pass for `q`, `k`, `v` of `dtype` and a cotangent of
/// dtype `g`, the tiles staged as `loads` says, the gradients stored as
/// `dtype`.
pub(super) fn source(
    dims: &AttentionDims,
    (dtype, g): (Dtype, Dtype),
    t: Tiles,
    pass: Pass,
    loads: Loads,
) -> String {
    let (qs, vs, ps) = strides(dims, t);
    let (ri, rj) = (t.bq / SIDE, t.bk / SIDE);
    let (cd, cv) = (quad_cols(dims.d), quad_cols(dims.dv));
    let inputs = [
        ("q", dtype),
        ("k", dtype),
        ("v", dtype),
        ("packed", Dtype::F32),
        ("g", g),
        ("delta", Dtype::F32),
    ];
    let mut s = header(dims, &inputs, t, loads, &["q", "k", "v", "g"], dtype);
    s.push_str(&crate::backend::gpu::codegen::fill(
        BACKWARD_WORKGROUP_MEMORY_WGSL,
        &[
            ("q_len", &(t.bq * qs + SIDE).to_string()),
            ("g_len", &(t.bq * vs + SIDE).to_string()),
            ("k_len", &(t.bk * qs + SIDE).to_string()),
            ("v_len", &(t.bk * vs + SIDE).to_string()),
            ("p_len", &(t.bq * ps).to_string()),
        ],
    ));
    s.push_str(super::codegen::GROUP_ENTRY);

    // P and dS for the block at (q0, k0): rows ty + 16 i, keys tx + 16 j.
    let s_decl = unroll(ri, rj, |i, j| {
        format!("        var s{i}_{j} = 0.0;\n        var dp{i}_{j} = 0.0;")
    });
    let lets = |what: &str, n: usize, f: &dyn Fn(usize) -> String| {
        unroll(n, 1, |i, _| {
            format!("            let {what}{i} = {};", f(i))
        })
    };
    // `a_i . b_j` over one quad, left to right as the element loop was.
    let dot = |i: usize, j: usize| {
        ["x", "y", "z", "w"]
            .map(|e| format!("a{i}.{e} * b{j}.{e}"))
            .join(" + ")
    };
    let qk = format!(
        "{}\n{}\n{}",
        lets("a", ri, &|i| format!(
            "q_s[(ty + {}u) * {qs}u + c]",
            SIDE * i
        )),
        lets("b", rj, &|j| format!(
            "k_s[(tx + {}u) * {qs}u + c]",
            SIDE * j
        )),
        unroll(ri, rj, |i, j| format!(
            "            s{i}_{j} = s{i}_{j} + {};",
            dot(i, j)
        ))
    );
    let gv = format!(
        "{}\n{}\n{}",
        lets("a", ri, &|i| format!(
            "g_s[(ty + {}u) * {vs}u + c]",
            SIDE * i
        )),
        lets("b", rj, &|j| format!(
            "v_s[(tx + {}u) * {vs}u + c]",
            SIDE * j
        )),
        unroll(ri, rj, |i, j| format!(
            "            dp{i}_{j} = dp{i}_{j} + {};",
            dot(i, j)
        ))
    );
    let store_p = pass == Pass::KeyValue;
    let p_store = unroll(ri, rj, |i, j| {
        let (r, c) = (SIDE * i, SIDE * j);
        let at = format!("(ty + {r}u) * {ps}u + tx + {c}u");
        let keep = if store_p {
            format!("\n            p_s[{at}] = p;")
        } else {
            String::new()
        };
        crate::backend::gpu::codegen::fill(
            BACKWARD_SCORE_GRADIENT_WGSL,
            &[
                ("r", &r.to_string()),
                ("c", &c.to_string()),
                ("i", &i.to_string()),
                ("j", &j.to_string()),
                ("keep", &keep),
                ("at", &at),
            ],
        )
    });
    let scores = format!(
        "{s_decl}\n{}{}{p_store}\n",
        unrolled("c", dims.d.div_ceil(4), &qk),
        unrolled("c", dims.dv.div_ceil(4), &gv),
    );
    let r = InputRows::new(dims, t, 4);
    let q_stage = stage("q_s", "q", loads, &r.q, qs);
    let g_stage = stage("g_s", "g", loads, &r.g, vs);
    let k_stage = stage("k_s", "k", loads, &r.k, qs);
    let v_stage = stage("v_s", "v", loads, &r.v, vs);
    let rows_stage = BACKWARD_STAGE_ROW_STATS_WGSL;
    // A workgroup per block of `block` rows of `l` of head `hi` of `heads`
    // (`h()` or `hkv()`) in batch `bi`.
    let prologue = |l: &str, block: &str, heads: &str| {
        crate::backend::gpu::codegen::fill(
            BACKWARD_BLOCK_PROLOGUE_WGSL,
            &[
                ("l", l),
                ("block", block),
                ("heads", heads),
                ("SIDE", &SIDE.to_string()),
            ],
        )
    };
    match pass {
        Pass::KeyValue => {
            let (rk, ck) = (t.bk / SIDE, cd.max(cv));
            let acc_decl = unroll(rk, ck, |i, j| {
                let mut d = String::new();
                if j < cd {
                    d.push_str(&format!("    var dk{i}_{j} = vec4<f32>();"));
                }
                if j < cv {
                    d.push_str(&format!("    var dv{i}_{j} = vec4<f32>();"));
                }
                d
            });
            let acc = format!(
                "{}\n{}\n{}\n{}\n{}\n{}",
                lets("p", rk, &|i| format!("p_s[r * {ps}u + ty + {}u]", SIDE * i)),
                lets("ds", rk, &|i| format!(
                    "ds_s[r * {ps}u + ty + {}u]",
                    SIDE * i
                )),
                lets("gc", cv, &|j| format!(
                    "g_s[r * {vs}u + tx + {}u]",
                    SIDE * j
                )),
                lets("qc", cd, &|j| format!(
                    "q_s[r * {qs}u + tx + {}u]",
                    SIDE * j
                )),
                unroll(rk, cv, |i, j| format!(
                    "            dv{i}_{j} = dv{i}_{j} + p{i} * gc{j};"
                )),
                unroll(rk, cd, |i, j| format!(
                    "            dk{i}_{j} = dk{i}_{j} + ds{i} * qc{j};"
                )),
            );
            let store = unroll(rk, ck, |i, j| {
                let r = SIDE * i;
                let row = format!("((bi * lk() + k0 + ty + {r}u) * hkv() + hi)");
                let mut st = format!("    if (k0 + ty + {r}u < lk()) {{");
                if j < cd {
                    st.push_str(&format!(
                        "\n        {}",
                        store_quad(
                            "store_out",
                            &format!("dk{i}_{j}"),
                            j,
                            &format!("params[12] + {row} * D"),
                            "D",
                            " * scale()"
                        )
                    ));
                }
                if j < cv {
                    st.push_str(&format!(
                        "\n        {}",
                        store_quad(
                            "store_out",
                            &format!("dv{i}_{j}"),
                            j,
                            &format!("params[13] + {row} * DV"),
                            "DV",
                            ""
                        )
                    ));
                }
                st.push_str("\n    }");
                st
            });
            let acc_steps = unrolled("r", t.bq, &acc);
            s.push_str(&prologue("lk()", "BK", "hkv()"));
            s.push_str(&crate::backend::gpu::codegen::fill(
                BACKWARD_KEY_VALUE_PASS_WGSL,
                &[
                    ("k_stage", &k_stage),
                    ("v_stage", &v_stage),
                    ("acc_decl", &acc_decl),
                    ("q_stage", &q_stage),
                    ("g_stage", &g_stage),
                    ("rows_stage", rows_stage),
                    ("scores", &scores),
                    ("acc_steps", &acc_steps),
                    ("store", &store),
                ],
            ));
        }
        Pass::Query => {
            let acc_decl = unroll(ri, cd, |i, j| format!("    var dq{i}_{j} = vec4<f32>();"));
            let acc = format!(
                "{}\n{}\n{}",
                lets("ds", ri, &|i| format!(
                    "ds_s[(ty + {}u) * {ps}u + j]",
                    SIDE * i
                )),
                lets("kc", cd, &|j| format!(
                    "k_s[j * {qs}u + tx + {}u]",
                    SIDE * j
                )),
                unroll(ri, cd, |i, j| format!(
                    "            dq{i}_{j} = dq{i}_{j} + ds{i} * kc{j};"
                )),
            );
            let store = unroll(ri, cd, |i, j| {
                let r = SIDE * i;
                format!(
                    "    if (q0 + ty + {r}u < lq()) {}",
                    store_quad(
                        "store_out",
                        &format!("dq{i}_{j}"),
                        j,
                        &format!("((bi * lq() + q0 + ty + {r}u) * h() + hi) * D"),
                        "D",
                        " * scale()"
                    )
                )
            });
            let acc_steps = unrolled("j", t.bk, &acc);
            s.push_str(&prologue("lq()", "BQ", "h()"));
            s.push_str(&crate::backend::gpu::codegen::fill(
                BACKWARD_QUERY_PASS_WGSL,
                &[
                    ("q_stage", &q_stage),
                    ("g_stage", &g_stage),
                    ("rows_stage", rows_stage),
                    ("acc_decl", &acc_decl),
                    ("k_stage", &k_stage),
                    ("v_stage", &v_stage),
                    ("scores", &scores),
                    ("acc_steps", &acc_steps),
                    ("store", &store),
                ],
            ));
        }
    }
    s
}
