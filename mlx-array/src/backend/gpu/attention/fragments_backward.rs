//! The f16 flash-attention gradient on 16 x 16 x 16 fragments, in
//! FlashAttention-2 order as the f32 kernels ([`super::backward`]): after
//! `delta = rowsum(dO o O)` (the f32 kernels' pre-pass), a dK/dV pass with
//! a workgroup per (batch, key/value head, block of `BK` keys) walking the
//! query blocks that see them, of each query head of its group in turn, and a dQ pass with a workgroup per (batch, head,
//! block of `BQ` queries) walking their key blocks. Each subgroup of 32
//! owns 16 rows of the workgroup's block (keys, or queries), holds its
//! gradient rows in f32 fragments across the whole walk (no rescaling:
//! the logsumexps are final), and per walked block computes
//!
//! - dK/dV: `S^T = K Q^T`, `P^T = exp(scale S^T - lse)` (f32, stored as
//!   f16), `dV += P^T dO`, `dP^T = V dO^T`, `dS^T = P^T o (dP^T - delta)`
//!   (f16, over `P^T` in place), `dK += dS^T Q`;
//! - dQ: `S = Q K^T`, `P`, `dP = dO V^T`, `dS`, `dQ += dS K`;
//!
//! the elementwise steps in f32 on all 32 lanes through workgroup memory.
//! The cotangent `dO` (f32) is staged as f16. Widths are zero-padded to 16;
//! masked and out-of-range entries get `P = 0`.

use super::Tiles;
use super::fragments::{declare, product, product_to_memory, stage};
use super::staging::{InputRows, Loads};
use crate::backend::common::attention::AttentionDims;
use crate::backend::gpu::fragment::{Fragments, LANES, Layout};

use super::backward::Pass;

/// WGSL: a loop over one subgroup's 16-row block, element by element (a template).
const FRAGMENTS_BACKWARD_EACH_ELEMENT_WGSL: &str =
    include_str!("fragments_backward_each_element.wgsl");

/// WGSL: which block of rows, head and batch a workgroup owns (a template).
const FRAGMENTS_BACKWARD_BLOCK_PROLOGUE_WGSL: &str =
    include_str!("fragments_backward_block_prologue.wgsl");

/// WGSL: each query row's logsumexp and delta staged in workgroup memory (a template).
const FRAGMENTS_BACKWARD_STAGE_ROW_STATS_WGSL: &str =
    include_str!("fragments_backward_stage_row_stats.wgsl");

/// WGSL: the fragment gradient kernels' workgroup arrays (a template).
const FRAGMENTS_BACKWARD_WORKGROUP_MEMORY_WGSL: &str =
    include_str!("fragments_backward_workgroup_memory.wgsl");

/// WGSL of `write_out` (a template).
const FRAGMENTS_BACKWARD_WRITE_OUT_WGSL: &str = include_str!("fragments_backward_write_out.wgsl");

/// WGSL: the dQ pass on fragments (a template).
const FRAGMENTS_BACKWARD_QUERY_PASS_WGSL: &str = include_str!("fragments_backward_query_pass.wgsl");

/// WGSL: the dK/dV pass on fragments (a template).
const FRAGMENTS_BACKWARD_KEY_VALUE_PASS_WGSL: &str =
    include_str!("fragments_backward_key_value_pass.wgsl");

/// Candidate tiles `(bq, bk)` per pass, best first: the dK/dV pass owns
/// `bk` keys (16 per subgroup) and walks `bq` queries; the dQ pass owns
/// `bq` queries and walks `bk` keys.
pub(super) fn candidates(pass: Pass) -> &'static [(usize, usize)] {
    match pass {
        Pass::KeyValue => &[(64, 64), (32, 64), (32, 32), (16, 32), (16, 16)],
        Pass::Query => &[(64, 64), (64, 32), (32, 32), (32, 16), (16, 16)],
    }
}

/// Padding of every staged f16 row, in halves.
const PAD: usize = 8;

/// Row strides (elements) with `own` rows owned and `walk` walked: Q/K
/// and dO/V tiles (f16), S/dP (f32), P/dS (f16).
struct Strides {
    dp: usize,
    dvp: usize,
    ks: usize,
    vs: usize,
    ss: usize,
    ps: usize,
}

fn strides(dims: &AttentionDims, walk: usize) -> Strides {
    let (dp, dvp) = (dims.d.next_multiple_of(16), dims.dv.next_multiple_of(16));
    Strides {
        dp,
        dvp,
        ks: dp + PAD,
        vs: dvp + PAD,
        ss: walk.max(16) + 4,
        ps: walk + PAD,
    }
}

/// The rows a pass owns and walks with tiles `t`.
fn roles(t: Tiles, pass: Pass) -> (usize, usize) {
    match pass {
        Pass::KeyValue => (t.bk, t.bq),
        Pass::Query => (t.bq, t.bk),
    }
}

/// Workgroup memory of `pass` with tiles `t`, in bytes.
pub(super) fn bytes(dims: &AttentionDims, t: Tiles, pass: Pass) -> usize {
    let (own, walk) = roles(t, pass);
    let s = strides(dims, walk);
    2 * ((own + walk) * (s.ks + s.vs) + own * s.ps) + 4 * (own * s.ss + 2 * t.bq)
}

/// WGSL writing the gradient accumulators `acc0..` (`n` fragments of the
/// subgroup's 16 rows) through `st`: row `row` (the owned block's first
/// row plus the row in it) of width `width`, valid below `rows`, to
/// `store_out(index(row) * width + col, v * factor)`.
fn write_out(
    f: Fragments,
    (acc, n, ss): (&str, usize, usize),
    (rows, width, index, factor): (&str, &str, &str, &str),
) -> String {
    let mut s = String::new();
    for j in 0..n {
        s.push_str(&crate::backend::gpu::codegen::fill(
            FRAGMENTS_BACKWARD_WRITE_OUT_WGSL,
            &[
                ("ss", &ss.to_string()),
                (
                    "store",
                    &(f.store(&format!("{acc}{j}"), "st", "st0", ss)).to_string(),
                ),
                ("c", &(16 * j).to_string()),
                ("rows", rows),
                ("width", width),
                ("index", index),
                ("factor", factor),
            ],
        ));
    }
    s
}

/// The WGSL of `pass` (without the leading `enable f16;`) for f16 `q`,
/// `k`, `v`, the forward's packed f32 buffer, the cotangent (f16 where
/// `g16`, else f32) and `delta`, `q`, `k`, `v` and the cotangent read as
/// `loads` says; the output the f16 gradients.
pub(super) fn source(
    dims: &AttentionDims,
    t: Tiles,
    pass: Pass,
    f: Fragments,
    (loads, g16): (Loads, bool),
) -> String {
    let (own, walk) = roles(t, pass);
    let Strides {
        dp,
        dvp,
        ks,
        vs,
        ss,
        ps,
    } = strides(dims, walk);
    let inv = own * 2;
    let mut s = String::from(f.enable());
    s.push_str(super::codegen::PRELUDE);
    s.push_str(super::codegen::META);
    for (i, name) in ["q", "k", "v"].iter().enumerate() {
        s.push_str(&loads.binding(i + 1, name, "f16"));
    }
    s.push_str(&Loads::Scalar.binding(4, "packed", "f32"));
    s.push_str(&loads.binding(5, "g", if g16 { "f16" } else { "f32" }));
    s.push_str(&Loads::Scalar.binding(6, "delta", "f32"));
    // The gradients are stored in f16, the inputs' dtype.
    s.push_str(&super::codegen::output(7, crate::Dtype::F16));
    s.push_str(&format!(
        "const D: u32 = {}u;\nconst DV: u32 = {}u;\nconst BQ: u32 = {}u;\nconst BK: u32 = {}u;\n",
        dims.d, dims.dv, t.bq, t.bk
    ));
    s.push_str(super::SIZES);
    s.push_str(&crate::backend::gpu::codegen::fill(
        FRAGMENTS_BACKWARD_WORKGROUP_MEMORY_WGSL,
        &[
            ("x_len", &(own * ks).to_string()),
            ("y_len", &(own * vs).to_string()),
            ("w1_len", &(walk * ks).to_string()),
            ("w2_len", &(walk * vs).to_string()),
            ("st_len", &(own * ss).to_string()),
            ("p_len", &(own * ps).to_string()),
            ("inv", &inv.to_string()),
        ],
    ));
    let InputRows {
        q: q_rows,
        k: k_rows,
        v: v_rows,
        g: g_rows,
    } = InputRows::new(dims, t, 16);
    let rows_stage = crate::backend::gpu::codegen::fill(
        FRAGMENTS_BACKWARD_STAGE_ROW_STATS_WGSL,
        &[("inv", &inv.to_string())],
    );
    // The products, with the owned tiles x_s (K or Q), y_s (V or dO) and
    // the walked ones w1_s (Q or K), w2_s (dO or V).
    let (nw, nd, ndv) = (walk / 16, dp / 16, dvp / 16);
    let x_rows = |c: usize| format!("row0 * {ks}u + {}u", 16 * c);
    let y_rows = |c: usize| format!("row0 * {vs}u + {}u", 16 * c);
    let p_rows = |c: usize| format!("row0 * {ps}u + {}u", 16 * c);
    let scores = product_to_memory(
        f,
        "sc",
        nw,
        nd,
        ("x_s", ks, &x_rows),
        ("w1_s", ks, Layout::ColMajor, &|c, j| {
            format!("{}u", 16 * j * ks + 16 * c)
        }),
        ("st", ss),
    );
    let d_probs = product_to_memory(
        f,
        "dp",
        nw,
        ndv,
        ("y_s", vs, &y_rows),
        ("w2_s", vs, Layout::ColMajor, &|c, j| {
            format!("{}u", 16 * j * vs + 16 * c)
        }),
        ("st", ss),
    );
    // `acc += (P or dS) @ w`, the walked tile `w` read by rows.
    let accumulate = |acc: &str, n: usize, w: &str, stride: usize| {
        product(
            f,
            acc,
            n,
            nw,
            ("p_s", ps, &p_rows),
            (w, stride, Layout::RowMajor, &|c, j| {
                format!("{}u", 16 * c * stride + 16 * j)
            }),
        )
    };
    // Elementwise over the subgroup's 16 x `walk` block: `r` its row,
    // `c` the walked column; `query`, `key`, and `qr` (the query's row in
    // lse_s and dl_s) as the pass names them.
    let (query, key, qr) = match pass {
        Pass::KeyValue => ("q0 + c", "own0 + row0 + r", "c"),
        Pass::Query => ("own0 + row0 + r", "k0 + c", "row0 + r"),
    };
    let each = |body: &str| {
        crate::backend::gpu::codegen::fill(
            FRAGMENTS_BACKWARD_EACH_ELEMENT_WGSL,
            &[
                ("n", &(16 * walk).to_string()),
                ("walk", &walk.to_string()),
                ("ss", &ss.to_string()),
                ("ps", &ps.to_string()),
                ("query", query),
                ("key", key),
                ("body", body),
            ],
        )
    };
    let probs = each(&format!(
        "        var p = 0.0h;\n        if (query < lq() && key < limit(query)) {{ p = f16(exp(st[at] * scale() - lse_s[{qr}])); }}\n        p_s[pt] = p;"
    ));
    let d_scores = each(&format!(
        "        p_s[pt] = f16(f32(p_s[pt]) * (st[at] - dl_s[{qr}]));"
    ));
    // dK/dV: a key/value head's block of keys; dQ: a query head's block
    // of queries.
    let (l, heads) = match pass {
        Pass::KeyValue => ("lk()", "hkv()"),
        Pass::Query => ("lq()", "h()"),
    };
    s.push_str(&crate::backend::gpu::codegen::fill(
        FRAGMENTS_BACKWARD_BLOCK_PROLOGUE_WGSL,
        &[
            ("l", l),
            ("own", &own.to_string()),
            ("heads", heads),
            ("LANES", LANES),
        ],
    ));
    match pass {
        Pass::KeyValue => {
            let x = stage(inv, ("x_s", ks), ("k", false), loads, &k_rows);
            let y = stage(inv, ("y_s", vs), ("v", false), loads, &v_rows);
            let w1 = stage(inv, ("w1_s", ks), ("q", false), loads, &q_rows);
            let w2 = stage(inv, ("w2_s", vs), ("g", !g16), loads, &g_rows);
            let d_values = accumulate("dv", ndv, "w2_s", vs);
            let d_keys = accumulate("dk", nd, "w1_s", ks);
            let out_k = write_out(
                f,
                ("dk", nd, ss),
                (
                    "lk()",
                    "D",
                    "params[12] + ((bi * lk() + row) * hkv() + hi)",
                    "scale()",
                ),
            );
            let out_v = write_out(
                f,
                ("dv", ndv, ss),
                (
                    "lk()",
                    "DV",
                    "params[13] + ((bi * lk() + row) * hkv() + hi)",
                    "1.0",
                ),
            );
            let (dk_decl, dv_decl) = (declare(f, "dk", nd), declare(f, "dv", ndv));
            s.push_str(&crate::backend::gpu::codegen::fill(
                FRAGMENTS_BACKWARD_KEY_VALUE_PASS_WGSL,
                &[
                    ("x", &x),
                    ("y", &y),
                    ("dk_decl", &dk_decl),
                    ("dv_decl", &dv_decl),
                    ("w1", &w1),
                    ("w2", &w2),
                    ("rows_stage", &rows_stage),
                    ("scores", &scores),
                    ("probs", &probs),
                    ("d_values", &d_values),
                    ("d_probs", &d_probs),
                    ("d_scores", &d_scores),
                    ("d_keys", &d_keys),
                    ("out_k", &out_k),
                    ("out_v", &out_v),
                ],
            ));
        }
        Pass::Query => {
            let x = stage(inv, ("x_s", ks), ("q", false), loads, &q_rows);
            let y = stage(inv, ("y_s", vs), ("g", !g16), loads, &g_rows);
            let w1 = stage(inv, ("w1_s", ks), ("k", false), loads, &k_rows);
            let w2 = stage(inv, ("w2_s", vs), ("v", false), loads, &v_rows);
            let d_queries = accumulate("dq", nd, "w1_s", ks);
            let out_q = write_out(
                f,
                ("dq", nd, ss),
                ("lq()", "D", "((bi * lq() + row) * h() + hi)", "scale()"),
            );
            let dq_decl = declare(f, "dq", nd);
            s.push_str(&crate::backend::gpu::codegen::fill(
                FRAGMENTS_BACKWARD_QUERY_PASS_WGSL,
                &[
                    ("x", &x),
                    ("y", &y),
                    ("rows_stage", &rows_stage),
                    ("dq_decl", &dq_decl),
                    ("w1", &w1),
                    ("w2", &w2),
                    ("scores", &scores),
                    ("probs", &probs),
                    ("d_probs", &d_probs),
                    ("d_scores", &d_scores),
                    ("d_queries", &d_queries),
                    ("out_q", &out_q),
                ],
            ));
        }
    }
    s
}
