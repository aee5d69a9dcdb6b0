//! The f16 flash-attention forward on 16 x 16 x 16 fragments (tensor cores
//! through cooperative matrices, or their plain-WGSL implementation; see
//! `backend::gpu::fragment`): a workgroup of `BQ / 16` subgroups per
//! (batch, head, block of `BQ` query rows), each subgroup owning 16 of the
//! rows. Per block of `BK` keys: K staged as f16 -> `S = Q K^T` in f32
//! fragments, stored to workgroup memory -> one invocation per row updates
//! the row's running max and sum in f32 and writes `P` as f16 (while the
//! others stage V over K) -> `P V` in fresh f32 fragments, stored to
//! workgroup memory, from which each invocation rescales and adds its 8
//! values per 16 columns into the output it holds in registers. Head
//! widths are padded with zeros to multiples of 16; keys past the end or
//! masked get `P = 0`; rows past the end are computed and not stored.

use super::{QUERY_BLOCK, Tiles};
use crate::backend::common::attention::AttentionDims;
use crate::backend::gpu::fragment::{Fragments, LANES, Layout, Operand};

/// Padding of every staged f16 row, in halves (16 bytes, which keeps each
/// fragment's rows 16-byte aligned and spreads them over the banks).
const PAD: usize = 8;

/// The candidate tiles, best first: 4 subgroups by 64 keys (the H100's at
/// `d = 64`), then smaller ones for wider heads and smaller adapters.
pub(super) const CANDIDATES: [(usize, usize); 6] =
    [(64, 64), (64, 32), (32, 64), (32, 32), (16, 32), (16, 16)];

/// Sizes derived from the head widths and tiles, in elements.
struct Strides {
    /// Head widths padded to fragments.
    dp: usize,
    dvp: usize,
    /// Row strides: Q (f16), K and V (f16, one buffer), P (f16), S (f32).
    qs: usize,
    kvs: usize,
    ps: usize,
    ss: usize,
}

fn layout(dims: &AttentionDims, t: Tiles) -> Strides {
    let (dp, dvp) = (dims.d.next_multiple_of(16), dims.dv.next_multiple_of(16));
    Strides {
        dp,
        dvp,
        qs: dp + PAD,
        kvs: dp.max(dvp) + PAD,
        ps: t.bk + PAD,
        // S, then each tile's `P V`, 16-byte aligned rows.
        ss: t.bk.max(dvp) + 4,
    }
}

/// Workgroup memory of the kernel with tiles `t`, in bytes.
pub(super) fn bytes(dims: &AttentionDims, t: Tiles) -> usize {
    let l = layout(dims, t);
    2 * (t.bq * l.qs + t.bk * l.kvs + t.bq * l.ps) + 4 * (t.bq * l.ss + 3 * t.bq)
}

/// The kernel's WGSL (without the leading `enable f16;` that the pipeline
/// cache adds) for f16 `q`, `k`, `v`, its output f32 in the packed layout.
pub(super) fn source(dims: &AttentionDims, t: Tiles, fragments: Fragments) -> String {
    let Strides {
        dp,
        dvp,
        qs,
        kvs,
        ps,
        ss,
    } = layout(dims, t);
    let inv = t.bq * 2;
    let (nk, nv) = (t.bk / 16, dvp / 16);
    let f = fragments;
    let mut s = String::from(f.enable());
    s.push_str(super::codegen::META);
    for (i, name) in ["q", "k", "v"].iter().enumerate() {
        s.push_str(&format!(
            "@group(0) @binding({}) var<storage, read> {name}: array<f16>;\n",
            i + 1
        ));
    }
    s.push_str(&super::codegen::output(4, crate::Dtype::F32));
    s.push_str(&format!(
        "const D: u32 = {}u;\nconst DV: u32 = {}u;\nconst BQ: u32 = {}u;\nconst BK: u32 = {}u;\n",
        dims.d, dims.dv, t.bq, t.bk
    ));
    s.push_str(super::SIZES);
    // S = Q K^T (K read by columns), then P V (V read by rows).
    let q_rows = |c: usize| format!("row0 * {qs}u + {}u", 16 * c);
    let p_rows = |c: usize| format!("row0 * {ps}u + {}u", 16 * c);
    let scores = product_to_memory(
        f,
        "s",
        nk,
        dp / 16,
        ("q_s", qs, &q_rows),
        ("kv_s", kvs, Layout::ColMajor, &|c, j| {
            format!("{}u", 16 * j * kvs + 16 * c)
        }),
        ("s_s", ss),
    );
    let pv = product_to_memory(
        f,
        "pv",
        nv,
        nk,
        ("p_s", ps, &p_rows),
        ("kv_s", kvs, Layout::RowMajor, &|c, j| {
            format!("{}u", 16 * c * kvs + 16 * j)
        }),
        ("s_s", ss),
    );
    // The output each invocation holds: row `prow`, columns
    // `16 j + pcol + c` of its subgroup's 16 x DVP block.
    let mut o_decl = String::new();
    let mut o_add = String::new();
    let mut o_store = String::new();
    for j in 0..nv {
        for c in 0..8 {
            let col = 16 * j + c;
            o_decl.push_str(&format!("    var o{j}_{c} = 0.0;\n"));
            o_add.push_str(&format!(
                "        o{j}_{c} = o{j}_{c} * alpha + s_s[orow + pcol + {col}u];\n"
            ));
            o_store.push_str(&format!(
                "        if (pcol + {col}u < DV) {{ store_out(ob + pcol + {col}u, o{j}_{c} * inv_l); }}\n"
            ));
        }
    }
    let q_stage = stage(
        inv,
        "q_s",
        "q",
        false,
        [
            "BQ",
            "D",
            &dp.to_string(),
            "lq() - q0",
            "params[6] + (bh * lq() + q0) * D",
        ],
        qs,
    );
    let k_stage = stage(
        inv,
        "kv_s",
        "k",
        false,
        [
            "BK",
            "D",
            &dp.to_string(),
            "lk() - k0",
            "params[7] + (bh * lk() + k0) * D",
        ],
        kvs,
    );
    let v_stage = stage(
        inv,
        "kv_s",
        "v",
        false,
        [
            "BK",
            "DV",
            &dvp.to_string(),
            "lk() - k0",
            "params[8] + (bh * lk() + k0) * DV",
        ],
        kvs,
    );
    s.push_str(&format!(
        r#"
var<workgroup> q_s: array<f16, {q_len}>;
var<workgroup> kv_s: array<f16, {kv_len}>;
var<workgroup> p_s: array<f16, {p_len}>;
var<workgroup> s_s: array<f32, {s_len}>;
var<workgroup> m_s: array<f32, BQ>;
var<workgroup> l_s: array<f32, BQ>;
var<workgroup> a_s: array<f32, BQ>;
@compute @workgroup_size({inv})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32) {{
{QUERY_BLOCK}    let sg = lid / 32u;
    let lane = lid % 32u;
    {LANES}
    // The subgroup's first row in the block.
    let row0 = sg * 16u;
{q_stage}
    if (lid < BQ) {{
        m_s[lid] = neg_inf();
        l_s[lid] = 0.0;
    }}
{o_decl}
    let orow = (row0 + prow) * {ss}u;
    // The keys the block's last row sees.
    let k_end = limit(min(q0 + BQ, lq()) - 1u);
    for (var k0 = 0u; k0 < k_end; k0 = k0 + BK) {{
        workgroupBarrier();
{k_stage}
        workgroupBarrier();
{scores}
        workgroupBarrier();
{v_stage}
        if (lane < 16u) {{
            let row = row0 + lane;
            let lim = limit(q0 + row);
            let m_old = m_s[row];
            var mx = m_old;
            for (var j = 0u; j < BK; j = j + 1u) {{
                if (k0 + j < lim) {{ mx = max(mx, s_s[row * {ss}u + j] * scale()); }}
            }}
            var sum = 0.0;
            for (var j = 0u; j < BK; j = j + 1u) {{
                var p = 0.0h;
                if (k0 + j < lim) {{ p = f16(exp(s_s[row * {ss}u + j] * scale() - mx)); }}
                p_s[row * {ps}u + j] = p;
                sum = sum + f32(p);
            }}
            // Every row sees key 0, so mx is finite from the first block on.
            let alpha = exp(m_old - mx);
            a_s[row] = alpha;
            l_s[row] = l_s[row] * alpha + sum;
            m_s[row] = mx;
        }}
        workgroupBarrier();
{pv}
        workgroupBarrier();
        let alpha = a_s[row0 + prow];
{o_add}
    }}
    let qi = q0 + row0 + prow;
    if (qi < lq()) {{
        let inv_l = 1.0 / l_s[row0 + prow];
        let ob = ((bi * lq() + qi) * h() + hi) * DV;
{o_store}
    }}
    let lrow = row0 + lane;
    if (lane < 16u && q0 + lrow < lq()) {{
        store_out(b() * h() * lq() * DV + bh * lq() + q0 + lrow, m_s[lrow] + log(l_s[lrow]));
    }}
}}
"#,
        q_len = t.bq * qs,
        kv_len = t.bk * kvs,
        p_len = t.bq * ps,
        s_len = t.bq * ss,
    ));
    s
}

/// WGSL in which `inv` invocations stage `rows` rows of `padded` f16 (the
/// first `width` from adjacent elements from `base` of input `name`, as
/// f16, or converted from f32 with `convert`; zeros past `width` and from
/// row `valid` on) into the workgroup array `tile`, rows `stride` apart.
pub(super) fn stage(
    inv: usize,
    tile: &str,
    name: &str,
    convert: bool,
    [rows, width, padded, valid, base]: [&str; 5],
    stride: usize,
) -> String {
    let mut read = format!("{name}[{base} + r * {width} + c]");
    if convert {
        read = format!("f16({read})");
    }
    format!(
        r#"    for (var e = lid; e < {rows} * {padded}u; e = e + {inv}u) {{
        let r = e / {padded}u;
        let c = e % {padded}u;
        var x = 0.0h;
        if (r < {valid} && c < {width}) {{ x = {read}; }}
        {tile}[r * {stride}u + c] = x;
    }}
"#
    )
}

/// WGSL of `acc{j} += A B_j` over `depth` fragments, A from `a` at
/// `a_base(c)`, `B_j` from `b` at `b_index(c, j)` for `j < n`.
pub(super) fn product(
    f: Fragments,
    acc: &str,
    n: usize,
    depth: usize,
    (a, a_stride, a_base): (&str, usize, &dyn Fn(usize) -> String),
    (b, b_stride, b_layout, b_index): (&str, usize, Layout, &dyn Fn(usize, usize) -> String),
) -> String {
    let names: Vec<(String, String, String)> = (0..n)
        .map(|j| (format!("fb{j}"), format!("ib{j}"), format!("{acc}{j}")))
        .collect();
    let fa = Operand {
        name: "fa",
        array: a,
        index: "ia",
        stride: a_stride,
        layout: Layout::RowMajor,
    };
    let mut s = String::new();
    for c in 0..depth {
        s.push_str(&format!("{{\nlet ia = {};\n", a_base(c)));
        s.push_str(&f.load_a(&fa));
        for (j, (fb, ib, accj)) in names.iter().enumerate() {
            let op = Operand {
                name: fb,
                array: b,
                index: ib,
                stride: b_stride,
                layout: b_layout,
            };
            s.push_str(&format!("let {ib} = {};\n", b_index(c, j)));
            s.push_str(&f.load_b(&op));
            s.push_str(&f.multiply_add(accj, &fa, &op));
        }
        s.push_str("}\n");
    }
    s
}

/// WGSL of a tile product through workgroup memory: `n` zeroed
/// accumulators `acc0..` ([`declare`]), `acc_j = A B_j` over `depth`
/// fragments ([`product`]), stored into the f32 workgroup array `dest` of
/// row stride `ds` ([`store_all`]).
pub(super) fn product_to_memory(
    f: Fragments,
    acc: &str,
    n: usize,
    depth: usize,
    a: (&str, usize, &dyn Fn(usize) -> String),
    b: (&str, usize, Layout, &dyn Fn(usize, usize) -> String),
    (dest, ds): (&str, usize),
) -> String {
    let products = product(f, acc, n, depth, a, b);
    format!(
        "{}{products}{}",
        declare(f, acc, n),
        store_all(f, acc, n, dest, ds)
    )
}

/// WGSL declaring `n` zeroed accumulators `acc0..`.
pub(super) fn declare(f: Fragments, acc: &str, n: usize) -> String {
    (0..n).map(|j| f.declare(&format!("{acc}{j}"))).collect()
}

/// WGSL storing accumulators `acc0..acc{n-1}` into the f32 workgroup
/// array `array` at the subgroup's rows (from `row0`), columns `16 j`.
fn store_all(f: Fragments, acc: &str, n: usize, array: &str, ss: usize) -> String {
    (0..n)
        .map(|j| {
            format!(
                "{{\nlet st0 = row0 * {ss}u + {}u;\n{}}}\n",
                16 * j,
                f.store(&format!("{acc}{j}"), array, "st0", ss)
            )
        })
        .collect()
}
