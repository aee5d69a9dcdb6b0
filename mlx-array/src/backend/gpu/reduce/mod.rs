//! Reductions over any set of axes and argmax/argmin along one axis, read
//! straight from the input's view (no copy whatever its strides).
//!
//! The reduced axes form one run of `len` values per output, walked through
//! their (collapsed) shape and strides. Long runs get one workgroup per
//! output: each invocation folds every 256th value, then a tree in
//! workgroup memory merges the 256 partials. Short runs, and runs whose
//! outputs sit next to each other in memory (a sum over a leading axis),
//! get one invocation per output folding its run in order, so neighbouring
//! invocations read neighbouring values.
//!
//! **Rows** ([`rows_kernel`]): a run that is one contiguous row of a
//! 32-bit dtype (`f32`, `i32`, `u32`), or of `f16`/`bf16` read as quads
//! (below), longer than [`SHORT_RUN`], which is
//! what `sum(x, -1)`, a mean or a row max over the last axis are, takes a
//! team of `T` invocations (a power of two, 8 to 256, about one per 16 of
//! the row's loads) instead of a whole workgroup, and a 256-invocation
//! workgroup holds `256 / T` rows. Where every row starts at a multiple of
//! 4 elements and its length is one, the input is read as `vec4`s. Each
//! invocation folds every `T`-th load of its row, in rounds of up to 16
//! loads that the generator unrolls so that all of them are issued
//! before the first is folded (`codegen::row_walk`; rows longer than `T x
//! 16` loads take several rounds); the team merges its partials in
//! `log2 T` workgroup-memory steps.
//!
//! **Split runs** ([`split_parts`]): a float reduction with few outputs
//! and long contiguous runs (a whole-array sum of a gradient, as the
//! float16 loss scale's overflow check and gradient clipping take) would
//! run on as many workgroups as outputs, one SM reading a 51 MB embedding
//! gradient on its own. Each run is cut into pieces that divide it, the
//! first pass writes a partial result (f32) per piece on as many
//! workgroups, and a second pass folds each output's pieces.
//!
//! Design figures for an H100 (132 SMs, 2048 invocations each), at
//! `gpu_bench`'s row sum of `[16384, 4096]` f32: rows of 1024 `vec4`s take
//! teams of 64, each invocation one round of 16 loads (256 B in flight),
//! 4 rows (64 KiB) a workgroup, 4096 workgroups of 1 KiB of workgroup
//! memory: 8 resident per SM (the invocation limit), 3.9 waves, 6 merge
//! steps a row. Measured on 2026-11-27 with the 16 loads in a loop (one in
//! flight per step where the driver keeps the loop; wgpu's loop guards
//! hide its trip count): 39-40% of the device copy's bandwidth (28-30% for
//! the kernel before, a workgroup per row). One load in flight per
//! invocation is at most 2048 x 16 B = 32 KiB per SM, barely HBM3's
//! bandwidth-latency product (3 TB/s x ~1 us over 132 SMs: ~23 KiB) and
//! less while each fold waits; with the round's 16 loads in flight it is
//! up to 512 KiB. Expected:
//! 60-75%. Subgroup merges (the H100 offers `SUBGROUP`, size 32) would
//! replace 5 of the 6 steps; the backend does not request the feature
//! yet.

mod arg;

pub use arg::arg_reduce;

use super::codegen::{self, compute_type};
use super::device::context;
use super::dispatch::{dispatch, dispatch_groups};
use super::pool::{alloc, supported};
use crate::backend::common::reduce::ReduceOp;
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Dtype, Result};

/// The body of `at` where the reduced axes are not one run (see `locators`).
const AT_RUNS: &str = include_str!("at_runs.wgsl");

/// The kernel reducing an output per workgroup (a template).
const PER_GROUP: &str = include_str!("per_group.wgsl");

/// The kernel reducing an output per invocation (a template).
const PER_THREAD: &str = include_str!("per_thread.wgsl");

/// The kernel reducing rows by teams of invocations (a template).
const ROWS: &str = include_str!("rows.wgsl");

/// The WGSL of `base` and `at` (a template).
const LOCATORS: &str = include_str!("locators.wgsl");

/// Runs no longer than this are folded by one invocation each.
const SHORT_RUN: usize = 32;

/// The kept and reduced dimensions of a reduction, collapsed, as `meta`
/// and the kernel's view of them.
struct Plan {
    n_out: usize,
    /// Values per output.
    len: usize,
    meta: Vec<u32>,
    /// The reduced run is one dimension of stride 1, and every run starts
    /// at a multiple of 4 elements.
    aligned_rows: bool,
    /// The reduced run is one strided dimension.
    flat_run: bool,
    /// One invocation per output rather than one workgroup.
    per_thread: bool,
    /// The kept dimensions (sizes and strides, collapsed).
    kept: Vec<(usize, isize)>,
    /// The reduced ones (at least one).
    red: Vec<(usize, isize)>,
    /// The input's first element.
    offset: usize,
}

fn plan(data: &ArrayData, shape: &[usize], axes: &[usize]) -> Plan {
    let dims = |keep: bool| {
        codegen::collapse(
            (0..shape.len())
                .filter(|a| axes.contains(a) != keep)
                .map(|a| (shape[a], data.strides()[a])),
        )
    };
    let mut red = dims(false);
    if red.is_empty() {
        red.push((1, 0));
    }
    Plan::new(data.offset(), dims(true), red)
}

impl Plan {
    /// The plan of reducing the runs `red` (sizes and strides, collapsed)
    /// at each index of `kept` from element `offset`.
    fn new(offset: usize, kept: Vec<(usize, isize)>, red: Vec<(usize, isize)>) -> Plan {
        let n_out: usize = kept.iter().map(|d| d.0).product();
        let len: usize = red.iter().map(|d| d.0).product();
        let mut meta = vec![
            n_out as u32,
            len as u32,
            kept.len() as u32,
            red.len() as u32,
            offset as u32,
        ];
        for dims in [&kept, &red] {
            meta.extend(dims.iter().map(|d| d.0 as u32));
            meta.extend(dims.iter().map(|d| d.1 as i32 as u32));
        }
        let inner_red_stride = red.last().map_or(1, |d| d.1);
        let per_thread = len <= SHORT_RUN || (inner_red_stride != 1 && n_out >= 2048);
        let aligned_rows = red.len() == 1
            && inner_red_stride == 1
            && offset.is_multiple_of(4)
            && kept.iter().all(|d| d.1 % 4 == 0);
        Plan {
            n_out,
            len,
            meta,
            aligned_rows,
            flat_run: red.len() == 1,
            per_thread,
            kept,
            red,
            offset,
        }
    }

    /// The first pass of a split reduction: each run cut into `parts`
    /// consecutive pieces, a partial result per piece (the pieces as the
    /// innermost kept dimension).
    fn split(&self, parts: usize) -> Plan {
        let (len, stride) = self.red[0];
        let piece = len / parts;
        let mut kept = self.kept.clone();
        kept.push((parts, piece as isize * stride));
        Plan::new(self.offset, kept, vec![(piece, stride)])
    }
}

/// Runs shorter than this are never split.
const SPLIT_FROM: usize = 1 << 16;

/// Values a piece of a split run holds at least.
const MIN_PIECE: usize = 4096;

/// Workgroups a split reduction's first pass aims for: four per SM of an
/// H100 (132 SMs).
const SPLIT_GROUPS: usize = 528;

/// Into how many pieces the first pass of a reduction planned as `p`
/// cuts each run, if it is split (see the module docs): float runs of
/// at least [`SPLIT_FROM`] contiguous values with too few of them to fill
/// the GPU, into the most pieces that divide the run (of at least
/// [`MIN_PIECE`] values) up to [`SPLIT_GROUPS`] workgroups; pieces of a
/// multiple of 4 values (the row kernel's `vec4`s) where those still give
/// a workgroup per SM. An embedding gradient's 50,257 x 256 values take
/// 464 pieces of 27,728 (`vec4`s); with a prime vocabulary such as 50,261,
/// 256 pieces read singly rather than 64 of `vec4`s on half the SMs.
fn split_parts(p: &Plan, dtype: Dtype) -> Option<usize> {
    let contiguous = p.red.len() == 1 && p.red[0].1 == 1;
    let few = p.n_out > 0 && p.n_out * 8 <= SPLIT_GROUPS;
    if !dtype.is_float() || !contiguous || p.len < SPLIT_FROM || !few {
        return None;
    }
    let most = (SPLIT_GROUPS / p.n_out).min(p.len / MIN_PIECE);
    let divides = |d: &usize| p.len.is_multiple_of(*d);
    let any = (2..=most).rev().find(divides);
    let aligned = (2..=most)
        .rev()
        .filter(divides)
        .find(|d| (p.len / d).is_multiple_of(4));
    match aligned {
        Some(d) if d * p.n_out >= SPLIT_GROUPS / 4 => Some(d),
        _ => any,
    }
}

/// `base(o)`: where output `o`'s run starts; `at(r)`: the offset of its
/// `r`-th value from there (see [`plan`] for the `meta` layout).
fn locators(flat_run: bool) -> String {
    let at = if flat_run {
        "    return i32(r) * bitcast<i32>(params[6u + 2u * params[2]]);".to_string()
    } else {
        AT_RUNS.to_string()
    };
    codegen::fill(LOCATORS, &[("at", &at)])
}

/// The accumulator type, its initial value, how a loaded value enters it,
/// how two merge (WGSL over `a`, `b`), and how it becomes the output.
struct Fold {
    acc: &'static str,
    init: &'static str,
    conv: &'static str,
    merge: &'static str,
    finish: &'static str,
}

fn fold(op: ReduceOp, dtype: Dtype) -> Fold {
    use ReduceOp::*;
    match (compute_type(dtype), dtype) {
        (_, Dtype::Bool) => Fold {
            // Sum and product count in i32; max and min are any and all.
            acc: "i32",
            init: match op {
                Sum | Max => "0",
                Prod | Min => "1",
            },
            conv: "i32(x)",
            merge: match op {
                Sum => "a + b",
                Prod => "a * b",
                Max => "max(a, b)",
                Min => "min(a, b)",
            },
            finish: match op {
                Sum | Prod => "a",
                Max | Min => "u32(a)",
            },
        },
        ("f32", _) => Fold {
            acc: "f32",
            init: match op {
                Sum => "0.0",
                Prod => "1.0",
                Max => "bitcast<f32>(0xff800000u)",
                Min => "bitcast<f32>(0x7f800000u)",
            },
            conv: "x",
            // NaN wins, as on the CPU.
            merge: match op {
                Sum => "a + b",
                Prod => "a * b",
                Max => "select(a, b, b > a || is_nan(b))",
                Min => "select(a, b, b < a || is_nan(b))",
            },
            finish: "a",
        },
        ("i32", _) => Fold {
            acc: "i32",
            init: match op {
                Sum => "0",
                Prod => "1",
                Max => "bitcast<i32>(0x80000000u)",
                Min => "2147483647",
            },
            conv: "x",
            merge: match op {
                Sum => "a + b",
                Prod => "a * b",
                Max => "max(a, b)",
                Min => "min(a, b)",
            },
            finish: "a",
        },
        _ => Fold {
            acc: "u32",
            init: match op {
                Sum | Max => "0u",
                Prod => "1u",
                Min => "0xffffffffu",
            },
            conv: "x",
            merge: match op {
                Sum => "a + b",
                Prod => "a * b",
                Max => "max(a, b)",
                Min => "min(a, b)",
            },
            finish: "a",
        },
    }
}

/// The row kernel's shape for a reduction planned as `p` of `dtype`:
/// `Some((team, unroll, vec4))` for one contiguous row per output of a
/// 32-bit dtype, longer than [`SHORT_RUN`] (see the module docs).
fn rows_kernel(p: &Plan, dtype: Dtype) -> Option<(usize, usize, bool)> {
    let wide = matches!(dtype, Dtype::F32 | Dtype::I32 | Dtype::U32);
    let half = matches!(dtype, Dtype::F16 | Dtype::BF16);
    let contiguous = p.meta[3] == 1 && p.meta.last() == Some(&1);
    let vec4 = p.aligned_rows && p.len.is_multiple_of(4);
    // Half rows only as quads (8 bytes a load: one 2-byte load per
    // invocation ran at half the f32 kernel's bytes per second on an H100).
    if !(wide || half && vec4) || !contiguous || p.per_thread {
        return None;
    }
    let loads = if vec4 { p.len / 4 } else { p.len };
    let team = codegen::row_team(loads);
    Some((team, codegen::row_unroll(loads, team), vec4))
}

/// WGSL of the row kernel: `256 / team` rows a workgroup, `team`
/// invocations a row, each folding every `team`-th load (`vec4`s with
/// `vec4`) in unrolled rounds of `unroll` ([`codegen::row_walk`]), merged
/// in workgroup memory.
fn rows_source(f: &Fold, dtype: Dtype, (team, unroll, vec4): (usize, usize, bool)) -> String {
    let t = compute_type(dtype);
    let walk = if vec4 {
        codegen::row_walk(
            "params[1] / 4u",
            (team, unroll),
            &format!("vec4<{t}>"),
            &|i| format!("load4_in0(b4 + {i})"),
            &|x, _| format!("acc = merge(acc, merge(merge({x}.x, {x}.y), merge({x}.z, {x}.w)));"),
        )
    } else {
        codegen::row_walk(
            "params[1]",
            (team, unroll),
            t,
            &|i| format!("in0[u32(b) + {i}]"),
            &|x, _| format!("acc = merge(acc, {x});"),
        )
    };
    let decl = if vec4 {
        super::elementwise::input4("in0", 1, dtype)
    } else {
        format!("@group(0) @binding(1) var<storage, read> in0: array<{t}>;\n")
    };
    codegen::fill(
        ROWS,
        &[
            ("decl", &decl),
            ("acc", f.acc),
            ("entry", codegen::GROUP_ENTRY),
            ("index", codegen::GROUP_INDEX),
            ("rows", &(256 / team).to_string()),
            ("team", &team.to_string()),
            ("init", f.init),
            ("walk", &walk),
            ("half", &(team / 2).to_string()),
        ],
    )
}

/// The output dtype of reducing `dtype` with `op` (bool sums count in i32).
fn out_dtype(op: ReduceOp, dtype: Dtype) -> Dtype {
    match (op, dtype) {
        (ReduceOp::Sum | ReduceOp::Prod, Dtype::Bool) => Dtype::I32,
        (_, d) => d,
    }
}

/// Reduces `data` (of `shape`, `dtype`) over `axes` (sorted, distinct) with
/// the CPU backend's rules: floats accumulate in f32 and NaN propagates
/// through max and min, integers wrap, bool sums and products count in i32
/// and bool max and min are any and all. The result is contiguous with the
/// kept dimensions only.
pub fn reduce(op: ReduceOp, x: &Operand<'_>, axes: &[usize]) -> Result<ArrayData> {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    supported(dtype)?;
    let odt = out_dtype(op, dtype);
    codegen::check_size("reduce", size_of_shape(shape), &[data])?;
    let p = plan(data, shape, axes);
    let kept: Vec<usize> = (0..shape.len())
        .filter(|a| !axes.contains(a))
        .map(|a| shape[a])
        .collect();
    if let Some(parts) = split_parts(&p, dtype) {
        // Partial results in f32 (every float accumulates in it), then
        // one more pass over each output's pieces.
        let partials = run(
            op,
            data,
            dtype,
            &p.split(parts),
            Dtype::F32,
            &[p.n_out, parts],
        )?;
        let second = Plan::new(0, vec![(p.n_out, parts as isize)], vec![(parts, 1)]);
        return run(op, &partials, Dtype::F32, &second, odt, &kept);
    }
    run(op, data, dtype, &p, odt, &kept)
}

/// Records the reduction planned as `p` of `data` (of `dtype`) into a new
/// array of `shape` and `odt`.
fn run(
    op: ReduceOp,
    data: &ArrayData,
    dtype: Dtype,
    p: &Plan,
    odt: Dtype,
    shape: &[usize],
) -> Result<ArrayData> {
    let out = alloc(shape, odt)?;
    if p.n_out == 0 {
        return Ok(out);
    }
    let f = fold(op, dtype);
    let rows = rows_kernel(p, dtype);
    let key = format!(
        "reduce:{op:?}:{dtype}:{odt}:{}:{}:{rows:?}",
        p.flat_run,
        if p.per_thread { "thread" } else { "group" }
    );
    let pipeline = context()?.pipeline(&key, || {
        let mut src = String::from(codegen::PRELUDE);
        src.push_str(codegen::IS_NAN);
        src.push_str(codegen::META);
        if let Some(shape) = rows {
            src.push_str(&codegen::output(2, odt));
            src.push_str(&locators(p.flat_run));
            src.push_str(&format!(
                "fn merge(a: {acc}, b: {acc}) -> {acc} {{ return {m}; }}\n\
                 fn finish(a: {acc}) -> {o} {{ return {fin}; }}\n",
                acc = f.acc,
                m = f.merge,
                o = compute_type(odt),
                fin = f.finish,
            ));
            src.push_str(&rows_source(&f, dtype, shape));
            return src;
        }
        src.push_str(&codegen::input("in0", 1, dtype));
        src.push_str(&codegen::output(2, odt));
        src.push_str(&locators(p.flat_run));
        src.push_str(&format!(
            "fn merge(a: {acc}, b: {acc}) -> {acc} {{ return {m}; }}\n\
             fn value(j: i32) -> {acc} {{ let x = load_in0(u32(j)); return {c}; }}\n\
             fn finish(a: {acc}) -> {o} {{ return {fin}; }}\n",
            acc = f.acc,
            m = f.merge,
            c = f.conv,
            o = compute_type(odt),
            fin = f.finish,
        ));
        if p.per_thread {
            src.push_str(codegen::ENTRY);
            src.push_str(&codegen::fill(
                PER_THREAD,
                &[
                    ("index", codegen::THREAD_INDEX),
                    ("acc", f.acc),
                    ("init", f.init),
                ],
            ));
        } else {
            src.push_str(&format!(
                "var<workgroup> part: array<{}, 256>;\n{}",
                f.acc,
                codegen::GROUP_ENTRY
            ));
            src.push_str(&codegen::fill(
                PER_GROUP,
                &[
                    ("index", codegen::GROUP_INDEX),
                    ("acc", f.acc),
                    ("init", f.init),
                ],
            ));
        }
        src
    })?;
    let bytes = p.n_out * odt.size_of();
    let clear = codegen::packed(odt);
    if let Some((team, _, _)) = rows {
        let groups = p.n_out.div_ceil(256 / team);
        dispatch_groups(&pipeline, &p.meta, &[data], &out, bytes, clear, groups)?;
    } else if p.per_thread {
        dispatch(&pipeline, &p.meta, &[data], &out, bytes, clear, p.n_out)?;
    } else {
        dispatch_groups(&pipeline, &p.meta, &[data], &out, bytes, clear, p.n_out)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plan of reducing `outputs` contiguous runs of `len` values.
    fn runs(outputs: usize, len: usize) -> Plan {
        let kept = if outputs > 1 {
            vec![(outputs, len as isize)]
        } else {
            vec![]
        };
        Plan::new(0, kept, vec![(len, 1)])
    }

    #[test]
    fn long_runs_with_few_outputs_split_into_pieces_that_divide_them() {
        // 65,536 values: 16 pieces of 4,096 (the least a piece holds).
        assert_eq!(split_parts(&runs(1, 1 << 16), Dtype::F32), Some(16));
        // An embedding gradient, 2^8 x 50,257 (= 29 x 1,733): 464 pieces
        // of 27,728, read as vec4s.
        assert_eq!(split_parts(&runs(1, 256 * 50257), Dtype::F32), Some(464));
        // 2^8 x 50,261 (prime): 256 pieces read singly rather than 64 of
        // vec4s on half the SMs.
        assert_eq!(split_parts(&runs(1, 256 * 50261), Dtype::F32), Some(256));
        // 2^20 values: 256 pieces of 4,096 (a multiple of 4, 256 >= 132).
        assert_eq!(split_parts(&runs(1, 1 << 20), Dtype::BF16), Some(256));
        // Three runs of 70,000: 16 pieces of 4,375 each (14 of 5,000, as
        // vec4s, would make 42 workgroups: fewer than one per SM either way).
        assert_eq!(split_parts(&runs(3, 70_000), Dtype::F32), Some(16));
        // A prime length, short runs, many outputs, integers, strided runs.
        assert_eq!(split_parts(&runs(1, 65_537), Dtype::F32), None);
        assert_eq!(split_parts(&runs(1, 60_000), Dtype::F32), None);
        assert_eq!(split_parts(&runs(67, 1 << 16), Dtype::F32), None);
        assert_eq!(split_parts(&runs(1, 1 << 16), Dtype::I32), None);
        // No outputs (a sum over the long axis of a [0, 65536] array).
        let none = Plan::new(0, vec![(0, 1 << 16)], vec![(1 << 16, 1)]);
        assert_eq!(split_parts(&none, Dtype::F32), None);
        let strided = Plan::new(0, vec![], vec![(1 << 16, 2)]);
        assert_eq!(split_parts(&strided, Dtype::F32), None);
    }

    #[test]
    fn a_split_plan_reads_each_piece_where_its_run_lies() {
        let p = runs(3, 70_000).split(14);
        assert_eq!((p.n_out, p.len), (42, 5_000));
        assert_eq!(p.kept, vec![(3, 70_000), (14, 5_000)]);
        assert_eq!(p.red, vec![(5_000, 1)]);
        assert!(p.aligned_rows);
    }
}
