//! The fused loss's own kernels (the products are `matmul`'s): targets
//! resolved, a chunk's logits folded into the rows' statistics, the
//! weights' column mean, the rows' logsumexps and cotangents, and the
//! logits' gradient.

use super::{IGNORED, Setup};
use crate::backend::gpu::codegen;
use crate::backend::gpu::device::context;
use crate::backend::gpu::dispatch::dispatch;
use crate::backend::gpu::indexing::{Meta, VLOC};
use crate::backend::gpu::pool::alloc;
use crate::data::ArrayData;
use crate::shape::size_of_shape;
use crate::{Dtype, Result};

/// The kernel of the logits' gradient (a template).
const GRAD: &str = include_str!("lce_grad.wgsl");

/// The kernel of the rows' logsumexps and cotangents (a template).
const ROW_TERMS: &str = include_str!("lce_rows.wgsl");

/// The kernel of the weights' column mean (a template).
const COLUMN_MEAN: &str = include_str!("lce_column_mean.wgsl");

/// The kernel folding a chunk into the rows' statistics (a template).
const STATS: &str = include_str!("lce_stats.wgsl");

/// The kernel resolving targets (a template).
const TARGETS: &str = include_str!("lce_targets.wgsl");

/// Per row, a dense u32: its class, [`IGNORED`] when it equals the ignore
/// index, `IGNORED - 1` when out of range.
pub(super) fn resolve_targets(
    t: &ArrayData,
    rows_shape: &[usize],
    t_dtype: Dtype,
    vocab: usize,
    ignore: Option<i64>,
) -> Result<ArrayData> {
    let rows = size_of_shape(rows_shape);
    // The ignore index as the target's 32 bits, when a target can equal it.
    let range = match t_dtype {
        Dtype::I32 => i32::MIN as i64..=i32::MAX as i64,
        _ => 0..=u32::MAX as i64,
    };
    let ign = ignore.filter(|i| range.contains(i));
    let mut m = Meta(vec![
        rows as u32,
        vocab as u32,
        ign.is_some() as u32,
        ign.unwrap_or(0) as u32,
        0,
    ]);
    m.0[4] = m.view(t, rows_shape);
    let key = format!("lce_targets:{t_dtype}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(VLOC);
        s.push_str(&codegen::input("t", 1, t_dtype));
        s.push_str("@group(0) @binding(2) var<storage, read_write> out: array<u32>;\n");
        s.push_str(codegen::ENTRY);
        s.push_str(&codegen::fill(
            TARGETS,
            &[
                ("index", codegen::THREAD_INDEX),
                ("IGNORED", &IGNORED.to_string()),
                ("bad", &(IGNORED - 1).to_string()),
            ],
        ));
        s
    })?;
    let out = alloc(&[rows], Dtype::U32)?;
    dispatch(&pipeline, &m.0, &[t], &out, rows * 4, false, rows)?;
    Ok(out)
}

/// `red` reductions over the 256 invocations of a workgroup (call from
/// uniform control flow; every invocation gets the result).
const WORKGROUP_REDUCE: &str = include_str!("workgroup_reduce.wgsl");

/// One workgroup per row: folds the chunk `x` (`[rows, n]`, classes `c0..`),
/// read in [`codegen::row_walk`]'s unrolled rounds, into the row's running `(max, sum of exp(x - max), x[target], sum x)` in
/// `stats`; after the last chunk writes the row's loss. The rows are
/// `params[7]..` of the targets and losses (a block of rows).
pub(super) fn stats_source() -> String {
    // A row's classes in unrolled rounds of 16 loads per invocation (the
    // block's rows are 50,257 classes long: 13 rounds).
    let walk = |take: &dyn Fn(&str) -> String| {
        codegen::row_walk(
            "n",
            (256, codegen::ROW_LOADS),
            "f32",
            &|i| format!("x[base + {i}]"),
            &|v, _| take(v),
        )
    };
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    s.push_str(WORKGROUP_REDUCE);
    s.push_str(
        r#"@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> tg: array<u32>;
@group(0) @binding(3) var<storage, read_write> stats: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
"#,
    );
    s.push_str(codegen::GROUP_ENTRY);
    s.push_str(&codegen::fill(
        STATS,
        &[
            ("index", codegen::GROUP_INDEX),
            ("max_walk", &walk(&|v| format!("pm = max(pm, {v});"))),
            (
                "sum_walk",
                &walk(&|v| format!("pe = pe + exp({v} - m); ps = ps + {v};")),
            ),
            ("IGNORED", &IGNORED.to_string()),
        ],
    ));
    s
}

/// `mean(w, axis 0)` as dense f32 `[dims]` (for label smoothing).
pub(super) fn column_mean(st: &Setup) -> Result<ArrayData> {
    let wd = st.operands();
    let pipeline = context()?.pipeline(&format!("lce_column_mean:{wd}"), || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(&codegen::input("w", 1, wd));
        s.push_str("@group(0) @binding(2) var<storage, read_write> out: array<f32>;\n");
        s.push_str(codegen::ENTRY);
        s.push_str(&codegen::fill(
            COLUMN_MEAN,
            &[("index", codegen::THREAD_INDEX)],
        ));
        s
    })?;
    let out = alloc(&[st.dims], Dtype::F32)?;
    let meta = [st.dims as u32, st.vocab as u32, st.w.offset() as u32];
    dispatch(
        &pipeline,
        &meta,
        &[&st.w],
        &out,
        st.dims * 4,
        false,
        st.dims,
    )?;
    Ok(out)
}

/// Per row `(logsumexp, cotangent)`: the logsumexp from the loss
/// (`loss + (1 - s) x[t] + s mean(x)`, with `x[t]` and `mean(x)` as dot
/// products); `(0, 0)` for ignored rows and rows with a zero cotangent,
/// NaNs for rows whose target is out of range.
pub(super) fn row_terms(
    st: &Setup,
    loss: &ArrayData,
    ct: &ArrayData,
    w_mean: Option<&ArrayData>,
) -> Result<ArrayData> {
    row_block_terms(st, 0, st.rows, loss, ct, w_mean)
}

/// [`row_terms`] of the rows `r0..r0 + rows` (`loss` and `ct` are views
/// starting at row `r0`), numbered from 0 in the result.
pub(super) fn row_block_terms(
    st: &Setup,
    r0: usize,
    rows: usize,
    loss: &ArrayData,
    ct: &ArrayData,
    w_mean: Option<&ArrayData>,
) -> Result<ArrayData> {
    let smooth = w_mean.is_some();
    let hw = st.operands();
    let key = format!("lce_rows:{smooth}:{hw}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(&codegen::input("h", 1, hw));
        s.push_str(&codegen::input("w", 2, hw));
        s.push_str(
            r#"@group(0) @binding(3) var<storage, read> tg: array<u32>;
@group(0) @binding(4) var<storage, read> ct: array<f32>;
@group(0) @binding(5) var<storage, read> loss: array<f32>;
"#,
        );
        let out_at = if smooth {
            s.push_str("@group(0) @binding(6) var<storage, read> wm: array<f32>;\n");
            7
        } else {
            6
        };
        s.push_str(&format!(
            "@group(0) @binding({out_at}) var<storage, read_write> out: array<f32>;\n"
        ));
        s.push_str(codegen::ENTRY);
        let mean = if smooth {
            "for (var d = 0u; d < dims; d = d + 1u) { mean = mean + load_h(hb + d) * wm[d]; }"
        } else {
            ""
        };
        s.push_str(&codegen::fill(
            ROW_TERMS,
            &[
                ("index", codegen::THREAD_INDEX),
                ("mean", mean),
                ("bad", &(IGNORED - 1).to_string()),
            ],
        ));
        s
    })?;
    let out = alloc(&[rows, 2], Dtype::F32)?;
    let meta = [
        rows as u32,
        st.dims as u32,
        st.vocab as u32,
        st.smoothing.to_bits(),
        (st.h.offset() + r0 * st.dims) as u32,
        st.w.offset() as u32,
        ct.offset() as u32,
        loss.offset() as u32,
        r0 as u32,
    ];
    let mut inputs = vec![&st.h, &st.w, &st.tg, ct, loss];
    inputs.extend(w_mean);
    dispatch(&pipeline, &meta, &inputs, &out, rows * 8, false, rows)?;
    Ok(out)
}

/// Over the chunk `x` (`[rows, n]`, classes `c0..`):
/// `ct * (softmax(x) - (1 - s) onehot(t) - s / V)`, zero for rows whose
/// cotangent is zero, in place; with `half`, rounded to f16 into `g`
/// instead (`x` left as it was). The rows are `params[5]..` of the targets.
pub(super) fn grad_source(half: bool) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    s.push_str(
        r#"@group(0) @binding(1) var<storage, read> terms: array<f32>;
@group(0) @binding(2) var<storage, read> tg: array<u32>;
"#,
    );
    s.push_str(if half {
        "@group(0) @binding(3) var<storage, read> x: array<f32>;\n\
         @group(0) @binding(4) var<storage, read_write> gh: array<f16>;\n\
         fn store_g(i: u32, v: f32) { gh[i] = f16(round_f16(v)); }\n"
    } else {
        "@group(0) @binding(3) var<storage, read_write> x: array<f32>;\n\
         fn store_g(i: u32, v: f32) { x[i] = v; }\n"
    });
    s.push_str(codegen::ENTRY);
    s.push_str(&codegen::fill(GRAD, &[("index", codegen::THREAD_INDEX)]));
    s
}

/// Records [`grad_source`]'s kernel over the `[rows, n]` logits `x` with
/// `meta`: in place, or into the f16 scratch `g` where the products take
/// f16 operands. Returns the products' gradient operand (`g` or `x`).
pub(super) fn record_grad<'a>(
    meta: &[u32],
    terms: &ArrayData,
    tg: &ArrayData,
    x: &'a ArrayData,
    g: Option<&'a ArrayData>,
    count: usize,
) -> Result<&'a ArrayData> {
    let half = g.is_some();
    let pipeline = context()?.pipeline(&format!("lce_grad:{half}"), || grad_source(half))?;
    match g {
        Some(g) => {
            dispatch(&pipeline, meta, &[terms, tg, x], g, count * 2, false, count)?;
            Ok(g)
        }
        None => {
            dispatch(&pipeline, meta, &[terms, tg], x, count * 4, false, count)?;
            Ok(x)
        }
    }
}
