//! Conformance specifications of the reductions (`sum`, `prod`, `max`,
//! `min`), the arg-reductions and the cumulative sum: f64 references over
//! every dtype, axis set and view (taken on the device under test, so GPU
//! kernels read real strides), long and empty runs, ties and NaNs.

use proptest::prelude::*;

use super::{ArgReduce, CumSum, Reduce, ReduceOp};
use crate::conformance::*;
use crate::{ALL_DTYPES, Array, Dtype, Result, SliceArg};

/// Every reduction primitive's specification.
pub fn specs() -> Vec<Spec> {
    let reduce = |op: ReduceOp, name: &'static str, grad: fn() -> GradCase| {
        Spec::new::<Reduce>(name, move |cx: &Ctx| reduce_values(cx, op), grad)
    };
    vec![
        reduce(ReduceOp::Sum, "sum", || {
            GradCase::new(vec![uniform(12, &[2, 3, 4], -1.0, 1.0)], &[0], |a| {
                a[0].sum(&[0, 2], false)
            })
        }),
        reduce(ReduceOp::Prod, "prod", || {
            GradCase::new(vec![uniform(13, &[2, 3], 0.5, 1.5)], &[0], |a| {
                a[0].prod(&[1], false)
            })
        }),
        reduce(ReduceOp::Max, "max", || {
            GradCase::new(vec![spread(14, &[3, 4])], &[0], |a| a[0].max(&[1], true))
        }),
        reduce(ReduceOp::Min, "min", || {
            GradCase::new(vec![spread(15, &[3, 4])], &[0], |a| a[0].min(&[0], false))
        }),
        Spec::new::<ArgReduce>(
            "argmax",
            |cx: &Ctx| arg_reduce_values(cx, true),
            || {
                GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |a| {
                    a[0].argmax(1, false)
                })
                .zero()
            },
        ),
        Spec::new::<ArgReduce>(
            "argmin",
            |cx: &Ctx| arg_reduce_values(cx, false),
            || {
                GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |a| {
                    a[0].argmin(0, false)
                })
                .zero()
            },
        ),
        Spec::new::<CumSum>("cumsum", cumsum_values, || {
            // Reverse exclusive along one axis, forward inclusive along the other.
            GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |a| {
                crate::stack(
                    &[a[0].cumsum(1, true, false)?, a[0].cumsum(0, false, true)?],
                    0,
                )
            })
        }),
    ]
}

// ---------------------------------------------------------------- views

/// How a test input reaches a primitive.
#[derive(Clone, Copy, Debug)]
pub(crate) enum View {
    /// One of the harness's layouts.
    Laid(Layout),
    /// Broadcast along a new axis 1 of length 2 (a stride-0 axis).
    Broadcast,
}

/// Every [`View`].
pub(crate) const VIEWS: [View; 5] = [
    View::Laid(Layout::Dense),
    View::Laid(Layout::Transposed),
    View::Laid(Layout::Strided),
    View::Laid(Layout::Reversed),
    View::Broadcast,
];

/// An input holding `nd`'s values (quantized to `dtype`) seen through
/// `view`, the view built on the device under test: a transfer copies an
/// array dense, so only a view taken there makes the device's kernels read
/// transposed, strided, negative and zero strides. Returns the array and
/// the values it holds (`Broadcast` adds an axis).
pub(crate) fn view_on(cx: &Ctx, nd: &Nd, dtype: Dtype, view: View) -> (Array, Nd) {
    let n = nd.shape.len();
    let held = nd.map(|v| quantize(v, dtype));
    let dense = |v: &Nd| make(v, dtype, Layout::Dense);
    let built = |r: Result<Array>| r.expect("view");
    match view {
        _ if n == 0 => (dense(nd), held),
        View::Laid(Layout::Dense) => (dense(nd), held),
        View::Laid(Layout::Transposed) => {
            let rshape: Vec<usize> = nd.shape.iter().rev().copied().collect();
            let base = dense(&Nd::from_fn(&rshape, |i| {
                nd.at(&i.iter().rev().copied().collect::<Vec<_>>())
            }));
            (built(cx.on(|| base.transpose(&[]))), held)
        }
        View::Laid(Layout::Strided) => {
            let mut big = nd.shape.clone();
            big[n - 1] *= 2;
            let base = dense(&Nd::from_fn(&big, |i| {
                let mut j = i.to_vec();
                j[n - 1] /= 2;
                if i[n - 1] % 2 == 0 { nd.at(&j) } else { 77.0 }
            }));
            let mut args = vec![SliceArg::FULL; n];
            args[n - 1] = SliceArg::FULL.step(2);
            (built(cx.on(|| base.slice(&args))), held)
        }
        View::Laid(Layout::Reversed) => {
            let base = dense(&Nd::from_fn(&nd.shape, |i| {
                let mut j = i.to_vec();
                j[0] = nd.shape[0] - 1 - i[0];
                nd.at(&j)
            }));
            let mut args = vec![SliceArg::FULL; n];
            args[0] = SliceArg::FULL.step(-1);
            (built(cx.on(|| base.slice(&args))), held)
        }
        View::Broadcast => {
            let mut one = nd.shape.clone();
            one.insert(1, 1);
            let base = dense(&Nd::new(&one, nd.v.clone()));
            let mut two = one.clone();
            two[1] = 2;
            let want = Nd::from_fn(&two, |i| {
                let mut j = i.to_vec();
                j.remove(1);
                held.at(&j)
            });
            (built(cx.on(|| base.broadcast_to(&two))), want)
        }
    }
}

/// Small integers in `[lo, hi]` held in `dtype` (0 or 1 for bools): sums
/// of them are exact in every float type whatever the order of the adds.
fn small_ints(shape: &[usize], dtype: Dtype, lo: f64, hi: f64, seed: u64) -> Nd {
    let as_int = match dtype {
        Dtype::U32 | Dtype::Bool | Dtype::I64 => dtype,
        _ => Dtype::I32,
    };
    fill(shape, as_int, lo, hi, seed).map(|v| quantize(v, dtype))
}

// ---------------------------------------------------------------- sum, prod, max, min

fn axes_subset(nd: usize, mask: u8) -> Vec<usize> {
    (0..nd).filter(|i| mask >> i & 1 == 1).collect()
}

/// The dtype a reduction of `dtype` gives (bools sum and multiply as int32).
fn reduced_dtype(op: ReduceOp, dtype: Dtype) -> Dtype {
    match (op, dtype) {
        (ReduceOp::Sum | ReduceOp::Prod, Dtype::Bool) => Dtype::I32,
        _ => dtype,
    }
}

/// The f64 reference of one reduction of `values` (held in `dtype`):
/// integers wrap, NaN propagates through max and min, and the max (min) of
/// nothing is the smallest (largest) value of the type.
fn fold(op: ReduceOp, values: &[f64], dtype: Dtype) -> f64 {
    let out = reduced_dtype(op, dtype);
    let int = !dtype.is_float();
    let extreme = |is_max: bool| -> f64 {
        let pick = |a: f64, b: f64| {
            if a.is_nan() || b.is_nan() {
                f64::NAN
            } else if is_max {
                a.max(b)
            } else {
                a.min(b)
            }
        };
        let init = match (dtype, is_max) {
            (Dtype::Bool, true) => 0.0,
            (Dtype::Bool, false) => 1.0,
            (Dtype::I32, true) => i32::MIN as f64,
            (Dtype::I32, false) => i32::MAX as f64,
            (Dtype::U32, true) => 0.0,
            (Dtype::U32, false) => u32::MAX as f64,
            (Dtype::I64, true) => i64::MIN as f64,
            (Dtype::I64, false) => i64::MAX as f64,
            (_, true) => f64::NEG_INFINITY,
            (_, false) => f64::INFINITY,
        };
        values.iter().fold(init, |a, &b| pick(a, b))
    };
    match op {
        ReduceOp::Sum if int => wrap(values.iter().sum(), out),
        ReduceOp::Sum => quantize(values.iter().sum(), out),
        ReduceOp::Prod if int => {
            // Wrapping in i64 wraps the same modulo 2^32.
            let p = values.iter().fold(1i64, |a, &b| a.wrapping_mul(b as i64));
            match out {
                Dtype::U32 => p as u32 as f64,
                Dtype::I32 => p as i32 as f64,
                _ => p as f64,
            }
        }
        ReduceOp::Prod => quantize(values.iter().product(), out),
        ReduceOp::Max => extreme(true),
        ReduceOp::Min => extreme(false),
    }
}

/// The f64 reference of a reduction of `x` over `axes` (normalized).
fn reduce_reference(op: ReduceOp, x: &Nd, axes: &[usize], keep: bool, dtype: Dtype) -> Nd {
    let nd = x.shape.len();
    let shape: Vec<usize> = (0..nd)
        .map(|a| if axes.contains(&a) { 1 } else { x.shape[a] })
        .collect();
    let mut groups = vec![vec![]; size(&shape)];
    let grouped = Nd::new(&shape, vec![0.0; size(&shape)]);
    for_each_index(&x.shape, |i| {
        let o: Vec<usize> = (0..nd)
            .map(|a| if axes.contains(&a) { 0 } else { i[a] })
            .collect();
        groups[grouped.flat_index(&o)].push(x.at(i));
    });
    let v = groups.iter().map(|g| fold(op, g, dtype)).collect();
    let shape = if keep {
        shape
    } else {
        (0..nd)
            .filter(|a| !axes.contains(a))
            .map(|a| x.shape[a])
            .collect()
    };
    Nd::new(&shape, v)
}

fn apply(op: ReduceOp, x: &Array, axes: &[i32], keep: bool) -> Result<Array> {
    match op {
        ReduceOp::Sum => x.sum(axes, keep),
        ReduceOp::Prod => x.prod(axes, keep),
        ReduceOp::Max => x.max(axes, keep),
        ReduceOp::Min => x.min(axes, keep),
    }
}

fn op_name(op: ReduceOp) -> &'static str {
    match op {
        ReduceOp::Sum => "sum",
        ReduceOp::Prod => "prod",
        ReduceOp::Max => "max",
        ReduceOp::Min => "min",
    }
}

/// Reduces `a` (holding `x`, in `a`'s dtype) on the device under test and
/// checks it against the reference, within `tol` of the result type scaled
/// by the square root of the run length.
fn check_reduce(cx: &Ctx, op: ReduceOp, a: &Array, x: &Nd, axes: &[i32], keep: bool, what: &str) {
    let dtype = a.dtype();
    let nd = x.shape.len() as i32;
    let mut norm: Vec<usize> = axes.iter().map(|&a| a.rem_euclid(nd) as usize).collect();
    norm.sort_unstable();
    let want = reduce_reference(op, x, &norm, keep, dtype);
    let got = cx
        .on(|| apply(op, a, axes, keep))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = reduced_dtype(op, dtype);
    let n: usize = norm.iter().map(|&a| x.shape[a]).product();
    let rel = tol(out) * (n as f64).sqrt().max(1.0);
    let what = format!(
        "{} {dtype} {:?} axes {axes:?} keep {keep}: {what}",
        op_name(op),
        x.shape
    );
    if norm.is_empty() {
        // Nothing reduced: a cast (or the input itself), wherever it lives.
        assert_close(&got, &want, out, cx.rel(rel, out), &what);
    } else {
        cx.check(&got, &want, out, rel, &what);
    }
}

/// Values a reduction is checked over: products of values near one (floats)
/// or of small nonzero integers (which wrap), small integers otherwise.
fn reduce_input(op: ReduceOp, shape: &[usize], dtype: Dtype, seed: u64) -> Nd {
    match op {
        ReduceOp::Prod if dtype.is_float() => fill(shape, dtype, 0.9, 1.1, seed),
        ReduceOp::Prod if dtype != Dtype::Bool => {
            small_ints(shape, dtype, -3.0, 3.0, seed).map(|v| if v == 0.0 { 3.0 } else { v })
        }
        _ => small_ints(shape, dtype, -4.0, 4.0, seed),
    }
}

fn reduce_values(cx: &Ctx, op: ReduceOp) {
    // Random shapes (with 0- and 1-long axes), axis sets and layouts.
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(shape(4), layout(), any::<u64>(), any::<u8>(), any::<bool>()),
                |(s, l, seed, mask, keep)| {
                    let axes: Vec<i32> = axes_subset(s.len(), mask)
                        .into_iter()
                        .map(|a| a as i32)
                        .collect();
                    let (lo, hi) = if op == ReduceOp::Prod {
                        (0.5, 1.5)
                    } else {
                        (-9.0, 9.0)
                    };
                    let x = fill(&s, dtype, lo, hi, seed);
                    let (a, x) = view_on(cx, &x, dtype, View::Laid(l));
                    check_reduce(cx, op, &a, &x, &axes, keep, &format!("{l:?}"));
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Every view of one array over every axis set, negative axes included.
    let axis_sets: [&[i32]; 7] = [&[], &[0], &[1], &[-1], &[0, 2], &[1, 2], &[0, 1, 2]];
    for dtype in cx.dtypes(&ALL_DTYPES) {
        for (vi, view) in VIEWS.into_iter().enumerate() {
            let x = reduce_input(op, &[3, 4, 6], dtype, 20 + vi as u64);
            let (a, x) = view_on(cx, &x, dtype, view);
            for (k, axes) in axis_sets.iter().enumerate() {
                check_reduce(cx, op, &a, &x, axes, k % 2 == 1, &format!("{view:?}"));
            }
        }
    }
    // Long runs (one workgroup per output, over a dense run, a strided run
    // of few outputs, all axes of a non-collapsible view), short runs over
    // a leading axis, empty reduced axes (the identity) and empty outputs;
    // rows of odd length (read one value at a time, 8 rows a workgroup on
    // the GPU, 5 of them live) and of a multiple of 4 (read as vec4s).
    let runs: [(&[usize], &[i32]); 9] = [
        (&[5, 333], &[1]),
        (&[3, 4100], &[-1]),
        (&[3, 700], &[1]),
        (&[700, 3], &[0]),
        (&[40, 2100], &[0]),
        (&[2, 3, 300], &[0, 2]),
        (&[0, 4], &[0]),
        (&[0, 4], &[1]),
        (&[3, 0, 2], &[1, 2]),
    ];
    for dtype in cx.dtypes(&[Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::U32, Dtype::Bool]) {
        for (shape, axes) in runs {
            let x = reduce_input(op, shape, dtype, 30);
            let a = make(&x, dtype, Layout::Dense);
            check_reduce(cx, op, &a, &x, axes, false, "run");
        }
        // Rows reversed (a negative stride between rows), vec4-aligned and not.
        for shape in [[6, 700], [5, 333]] {
            let x = reduce_input(op, &shape, dtype, 32);
            let (a, x) = view_on(cx, &x, dtype, View::Laid(Layout::Reversed));
            check_reduce(cx, op, &a, &x, &[1], false, "reversed rows");
        }
        // Every other column of a [60, 80] array: the run over both axes
        // cannot collapse into one strided dimension.
        let x = reduce_input(op, &[60, 40], dtype, 31);
        let (a, x) = view_on(cx, &x, dtype, View::Laid(Layout::Strided));
        check_reduce(cx, op, &a, &x, &[0, 1], false, "all of a strided view");
    }
    match op {
        ReduceOp::Max | ReduceOp::Min => {
            for dtype in FLOATS {
                let x = with_nans();
                let a = make(&x, dtype, Layout::Dense);
                check_reduce(cx, op, &a, &x, &[1], false, "NaN propagates");
                let short = Nd::new(&[60, 20], x.v.clone());
                let a = make(&short, dtype, Layout::Dense);
                check_reduce(cx, op, &a, &short, &[1], false, "NaN, short runs");
            }
            let y = Nd::new(&[5], vec![2.0, f64::NAN, 5.0, f64::NAN, 1.0]);
            let a = make(&y, Dtype::F32, Layout::Dense);
            check_reduce(cx, op, &a, &y, &[0], false, "NaN, all");
        }
        ReduceOp::Prod => {
            // Integer products wrap, the same in any order.
            for dtype in cx.dtypes(&[Dtype::I32, Dtype::U32, Dtype::I64]) {
                let x = reduce_input(op, &[5, 90], dtype, 32);
                let a = make(&x, dtype, Layout::Dense);
                check_reduce(cx, op, &a, &x, &[1], false, "wraps");
            }
        }
        ReduceOp::Sum => {}
    }
}

/// Two rows of 600 ones: the first with a tied maximum (3 at 5 and 400),
/// the second with NaNs at 7 and 300 and a 9 at 2.
fn with_nans() -> Nd {
    let mut v = vec![1.0; 2 * 600];
    v[5] = 3.0;
    v[400] = 3.0;
    v[600 + 7] = f64::NAN;
    v[600 + 300] = f64::NAN;
    v[600 + 2] = 9.0;
    Nd::new(&[2, 600], v)
}

// ---------------------------------------------------------------- argmax, argmin

/// The index of the first maximum (minimum) along `axis`; a NaN counts as
/// the extreme, so the first NaN wins.
fn arg_reference(x: &Nd, axis: usize, is_max: bool, keep: bool) -> Nd {
    let s = &x.shape;
    let shape: Vec<usize> = (0..s.len()).filter(|&d| d != axis).map(|d| s[d]).collect();
    let want = Nd::from_fn(&shape, |i| {
        let mut best = (0usize, f64::NAN);
        for j in 0..s[axis] {
            let mut src = i.to_vec();
            src.insert(axis, j);
            let v = x.at(&src);
            let better = if is_max { v > best.1 } else { v < best.1 };
            if j == 0 || (!best.1.is_nan() && (v.is_nan() || better)) {
                best = (j, v);
            }
        }
        best.0 as f64
    });
    if keep {
        let mut kept = s.clone();
        kept[axis] = 1;
        Nd::new(&kept, want.v)
    } else {
        want
    }
}

fn check_arg(cx: &Ctx, is_max: bool, a: &Array, x: &Nd, axis: i32, keep: bool, what: &str) {
    let name = if is_max { "argmax" } else { "argmin" };
    let what = format!(
        "{name} {} {:?} axis {axis} keep {keep}: {what}",
        a.dtype(),
        x.shape
    );
    let ax = axis.rem_euclid(x.shape.len() as i32) as usize;
    let want = arg_reference(x, ax, is_max, keep);
    let got = cx
        .on(|| {
            if is_max {
                a.argmax(axis, keep)
            } else {
                a.argmin(axis, keep)
            }
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cx.check(&got, &want, Dtype::U32, 0.0, &what);
}

fn arg_reduce_values(cx: &Ctx, is_max: bool) {
    for dtype in cx.dtypes(&[Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::U32]) {
        cx.runner()
            .run(
                &(nonempty_shape(1, 3), layout(), any::<u64>()),
                |(s, l, seed)| {
                    let axis = (seed as usize % s.len()) as i32;
                    let x = fill(&s, dtype, -5.0, 5.0, seed);
                    let (a, x) = view_on(cx, &x, dtype, View::Laid(l));
                    check_arg(cx, is_max, &a, &x, axis, false, &format!("{l:?}"));
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Few distinct values, so many ties, over every view and dtype; long
    // runs, and short runs over a leading axis.
    for dtype in cx.dtypes(&ALL_DTYPES) {
        for (vi, view) in VIEWS.into_iter().enumerate() {
            let x = small_ints(&[3, 4, 6], dtype, -4.0, 4.0, 40 + vi as u64);
            let (a, x) = view_on(cx, &x, dtype, view);
            for axis in [0, 1, 2, -1] {
                check_arg(cx, is_max, &a, &x, axis, axis == 1, &format!("{view:?}"));
            }
        }
        for (shape, axis) in [
            (&[2usize, 900][..], 1),
            (&[700, 3][..], 0),
            (&[40, 2100][..], 0),
        ] {
            let x = small_ints(shape, dtype, -4.0, 4.0, 41);
            let a = make(&x, dtype, Layout::Dense);
            check_arg(cx, is_max, &a, &x, axis, false, "run");
        }
    }
    // The first NaN wins over any value; ties go to the first index.
    for dtype in FLOATS {
        let x = with_nans();
        let a = make(&x, dtype, Layout::Dense);
        check_arg(cx, is_max, &a, &x, 1, false, "NaN");
        let short = Nd::new(&[60, 20], x.v.clone());
        let a = make(&short, dtype, Layout::Dense);
        check_arg(cx, is_max, &a, &short, 1, false, "NaN, short runs");
    }
    let y = Nd::new(&[5], vec![2.0, f64::NAN, 5.0, f64::NAN, 1.0]);
    let a = make(&y, Dtype::F32, Layout::Dense);
    check_arg(cx, is_max, &a, &y, 0, true, "first NaN");
    // An empty axis has no extreme.
    let empty = Array::zeros(&[2, 0], Dtype::F32);
    let err = cx
        .on(|| {
            if is_max {
                empty.argmax(1, false)
            } else {
                empty.argmin(1, false)
            }
        })
        .expect_err("an empty axis is refused")
        .to_string();
    assert!(err.contains("is empty"), "{err}");
}

// ---------------------------------------------------------------- cumsum

fn cumsum_reference(x: &Nd, axis: usize, rev: bool, inc: bool, dtype: Dtype) -> Nd {
    let out = if dtype == Dtype::Bool {
        Dtype::I32
    } else {
        dtype
    };
    Nd::from_fn(&x.shape, |i| {
        let mut acc = 0.0;
        for j in 0..x.shape[axis] {
            let counted = if rev {
                j > i[axis] || (inc && j == i[axis])
            } else {
                j < i[axis] || (inc && j == i[axis])
            };
            if counted {
                let mut src = i.to_vec();
                src[axis] = j;
                acc += x.at(&src);
            }
        }
        quantize(wrap(acc, out), out)
    })
}

/// `a.cumsum` (of `a` holding `x`, in `a`'s dtype) on the device under
/// test against the reference.
fn check_cumsum(cx: &Ctx, a: &Array, x: &Nd, axis: usize, rev: bool, inc: bool, what: &str) {
    let dtype = a.dtype();
    let what = format!(
        "cumsum {dtype} {:?} axis {axis} reverse {rev} inclusive {inc}: {what}",
        x.shape
    );
    let want = cumsum_reference(x, axis, rev, inc, dtype);
    let got = cx
        .on(|| a.cumsum(axis as i32, rev, inc))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let out = if dtype == Dtype::Bool {
        Dtype::I32
    } else {
        dtype
    };
    cx.check(&got, &want, out, tol(out) * 4.0, &what);
}

fn cumsum_values(cx: &Ctx) {
    for dtype in cx.dtypes(&[Dtype::F32, Dtype::F16, Dtype::I32, Dtype::I64]) {
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    layout(),
                    any::<u64>(),
                    any::<bool>(),
                    any::<bool>(),
                ),
                |(s, l, seed, rev, inc)| {
                    let axis = seed as usize % s.len();
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let (a, x) = view_on(cx, &x, dtype, View::Laid(l));
                    check_cumsum(cx, &a, &x, axis, rev, inc, &format!("{l:?}"));
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Every dtype, view, axis and direction; rows longer than a workgroup
    // (several values per invocation, the last chunks short or empty), and
    // empty arrays.
    for dtype in cx.dtypes(&ALL_DTYPES) {
        for (vi, view) in VIEWS.into_iter().enumerate() {
            let x = small_ints(&[3, 4, 6], dtype, -4.0, 4.0, 50 + vi as u64);
            let (a, x) = view_on(cx, &x, dtype, view);
            for axis in 0..x.shape.len() {
                for (rev, inc) in [(false, true), (false, false), (true, true), (true, false)] {
                    check_cumsum(cx, &a, &x, axis, rev, inc, &format!("{view:?}"));
                }
            }
        }
        for (shape, axis) in [
            (&[2usize, 1000][..], 1),
            (&[300, 2][..], 0),
            (&[0, 3][..], 1),
            (&[3, 0][..], 1),
        ] {
            for (rev, inc) in [(false, true), (true, false)] {
                let x = small_ints(shape, dtype, -4.0, 4.0, 51);
                let a = make(&x, dtype, Layout::Dense);
                check_cumsum(cx, &a, &x, axis, rev, inc, "run");
            }
        }
    }
}
