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
use super::fragments::{InputRows, Loads, declare, product, product_to_memory, stage};
use crate::backend::common::attention::AttentionDims;
use crate::backend::gpu::fragment::{Fragments, LANES, Layout};

use super::backward::Pass;

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
        s.push_str(&format!(
            r#"    {{
        let st0 = row0 * {ss}u;
        {store}    }}
    workgroupBarrier();
    for (var e = lane; e < 256u; e = e + 32u) {{
        let row = own0 + row0 + e / 16u;
        let col = {c}u + e % 16u;
        if (row < {rows} && col < {width}) {{
            store_out({index} * {width} + col, st[(row0 + e / 16u) * {ss}u + e % 16u] * {factor});
        }}
    }}
    workgroupBarrier();
"#,
            store = f.store(&format!("{acc}{j}"), "st", "st0", ss),
            c = 16 * j,
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
    s.push_str(&format!(
        r#"
var<workgroup> x_s: array<f16, {x_len}>;
var<workgroup> y_s: array<f16, {y_len}>;
var<workgroup> w1_s: array<f16, {w1_len}>;
var<workgroup> w2_s: array<f16, {w2_len}>;
var<workgroup> st: array<f32, {st_len}>;
var<workgroup> p_s: array<f16, {p_len}>;
var<workgroup> lse_s: array<f32, BQ>;
var<workgroup> dl_s: array<f32, BQ>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
    let wg = wid.x + wid.y * nw.x;
"#,
        x_len = own * ks,
        y_len = own * vs,
        w1_len = walk * ks,
        w2_len = walk * vs,
        st_len = own * ss,
        p_len = own * ps,
    ));
    let InputRows {
        q: q_rows,
        k: k_rows,
        v: v_rows,
        g: g_rows,
    } = InputRows::new(dims, t, 16);
    let rows_stage = format!(
        r#"    for (var i = lid; i < BQ; i = i + {inv}u) {{
        var lse = 0.0;
        var dl = 0.0;
        if (q0 + i < lq()) {{
            lse = packed[params[9] + b() * h() * lq() * DV + bh * lq() + q0 + i];
            dl = delta[params[11] + bh * lq() + q0 + i];
        }}
        lse_s[i] = lse;
        dl_s[i] = dl;
    }}
"#
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
        format!(
            r#"    for (var e = lane; e < {n}u; e = e + 32u) {{
        let r = e / {walk}u;
        let c = e % {walk}u;
        let at = (row0 + r) * {ss}u + c;
        let pt = (row0 + r) * {ps}u + c;
        let query = {query};
        let key = {key};
{body}
    }}
"#,
            n = 16 * walk
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
    s.push_str(&format!(
        r#"    let blocks = ({l} + {own}u - 1u) / {own}u;
    if (wg >= b() * {heads} * blocks) {{ return; }}
    let own0 = (wg % blocks) * {own}u;
    let hi = wg / blocks % {heads};
    let bi = wg / blocks / {heads};
    let sg = lid / 32u;
    let lane = lid % 32u;
    {LANES}
    // The subgroup's first row in the owned block.
    let row0 = sg * 16u;
"#,
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
            s.push_str(&format!(
                r#"    let k0 = own0;
    // Key/value head `hi`, read as its group's first query head's.
    let bh0 = bi * h() + hi * group();
    {{
        let bh = bh0;
{x}{y}    }}
{dk_decl}{dv_decl}
    // dK and dV sum over the group's query heads.
    for (var bh = bh0; bh < bh0 + group(); bh = bh + 1u) {{
    for (var q0 = first_query(k0) / BQ * BQ; q0 < lq(); q0 = q0 + BQ) {{
        workgroupBarrier();
{w1}{w2}{rows_stage}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{probs}
        workgroupBarrier();
{d_values}{d_probs}
        workgroupBarrier();
{d_scores}
        workgroupBarrier();
{d_keys}
    }}
    }}
    workgroupBarrier();
{out_k}{out_v}}}
"#
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
            s.push_str(&format!(
                r#"    let q0 = own0;
    let bh = bi * h() + hi;
{x}{y}{rows_stage}{dq_decl}
    // The keys the block's last row sees.
    let k_end = limit(min(q0 + BQ, lq()) - 1u);
    for (var k0 = 0u; k0 < k_end; k0 = k0 + BK) {{
        workgroupBarrier();
{w1}{w2}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{probs}
        workgroupBarrier();
{d_probs}
        workgroupBarrier();
{d_scores}
        workgroupBarrier();
{d_queries}
    }}
    workgroupBarrier();
{out_q}}}
"#
            ));
        }
    }
    s
}
