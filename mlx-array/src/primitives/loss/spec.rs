//! Conformance specifications of the fused losses: the softmax
//! cross-entropy and its gradient, and the output projection fused with the
//! cross-entropy (the per-row losses, their gradient, and the one-pass
//! training loss with the view that hands it out), each against an f64
//! reference on the CPU and the GPU.
//!
//! On the GPU a target out of range gives a NaN loss (the CPU refuses it at
//! eval): the value checks assert whichever the device under test promises.

use proptest::prelude::*;

use super::{
    CrossEntropy, CrossEntropyGrad, LinearCrossEntropy, LinearCrossEntropyGrad,
    LinearCrossEntropyOptions, LinearCrossEntropyValueAndGrad,
};
use crate::conformance::*;
use crate::{Array, Device, Dtype};

/// Every loss primitive's specification.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec::new::<CrossEntropy>("cross_entropy", cross_entropy_values, || {
            let t = ints(&[4, 0, 2], &[3]);
            GradCase::new(vec![uniform(20, &[3, 5], -2.0, 2.0)], &[0], move |a| {
                crate::cross_entropy(&a[0], &t)
            })
        }),
        Spec::new::<CrossEntropyGrad>("cross_entropy_grad", cross_entropy_grad_values, || {
            // The gradient of the loss, differentiated again: no second
            // derivatives, and the error says which primitive refused.
            let t = ints(&[0, 2], &[2]);
            GradCase::new(vec![uniform(21, &[2, 3], -1.0, 1.0)], &[0], move |a| {
                let loss = |y: &[Array]| crate::cross_entropy(&y[0], &t)?.sum_all();
                Ok(crate::grad(loss, &[0])(a)?[0].clone())
            })
            .refused()
        }),
        Spec::new::<LinearCrossEntropy>("linear_cross_entropy", lce_values, || {
            let t = ints(&[6, 0, 2, 3, -100, 5], &[2, 3]);
            GradCase::new(
                vec![
                    uniform(21, &[2, 3, 4], -1.5, 1.5),
                    uniform(22, &[7, 4], -1.5, 1.5),
                ],
                &[0, 1],
                move |a| {
                    // Chunks of 3 classes (7 = 3 + 3 + 1), one ignored position, and
                    // label smoothing, stacked with the plain per-row losses.
                    let plain = LinearCrossEntropyOptions {
                        ignore_index: Some(-100),
                        chunk: 3,
                        ..Default::default()
                    };
                    let smooth = LinearCrossEntropyOptions {
                        label_smoothing: 0.2,
                        chunk: 0,
                        ..plain
                    };
                    crate::stack(
                        &[
                            crate::linear_cross_entropy(&a[0], &a[1], &t, &plain)?,
                            crate::linear_cross_entropy(&a[0], &a[1], &t, &smooth)?,
                        ],
                        0,
                    )
                },
            )
        }),
        Spec::new::<LinearCrossEntropyGrad>("linear_cross_entropy_grad", lce_grad_values, || {
            // No second derivatives.
            let (t, ct) = (ints(&[1, 3], &[2]), uniform(3, &[2], 0.5, 1.5));
            let opts = LinearCrossEntropyOptions::default();
            GradCase::new(
                vec![
                    uniform(33, &[2, 3], -1.0, 1.0),
                    uniform(34, &[4, 3], -1.0, 1.0),
                ],
                &[0, 1],
                move |a| {
                    let loss = crate::linear_cross_entropy(&a[0], &a[1], &t, &opts)?;
                    flat_gradients(LinearCrossEntropyGrad(opts).build(&a[0], &a[1], &t, &ct, &loss))
                },
            )
            .refused()
        }),
        // The one-pass training loss: its gradient comes from the pass, as
        // its other two outputs.
        Spec::new::<LinearCrossEntropyValueAndGrad>(
            "linear_cross_entropy_value_and_grad",
            |cx: &Ctx| {
                value_and_grad_values(cx);
                sum_values(cx);
            },
            || {
                let t = ints(&[6, 0, 2, 3, -100, 5], &[2, 3]);
                let weights = Array::from_slice(&[1.0f32, 0.5, 0.0, 2.0, 1.0, -1.0], &[2, 3])
                    .expect("weights");
                GradCase::new(
                    vec![
                        uniform(23, &[2, 3, 4], -1.5, 1.5),
                        uniform(24, &[7, 4], -1.5, 1.5),
                    ],
                    &[0, 1],
                    move |a| {
                        let opts = LinearCrossEntropyOptions {
                            ignore_index: Some(-100),
                            label_smoothing: 0.1,
                            block_rows: 4,
                            ..Default::default()
                        };
                        crate::linear_cross_entropy_sum(&a[0], &a[1], &t, &weights, &opts)
                    },
                )
            },
        ),
    ]
}

/// Runs `f` on 24 (CPU) or 6 (GPU) random draws of `strategy`, panicking
/// with the first failure.
fn run<S: Strategy>(cx: &Ctx, strategy: &S, f: impl Fn(S::Value)) {
    cx.runner()
        .run(strategy, |v| {
            f(v);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
}

/// `nd`'s values rounded to `dtype`.
fn quantized(nd: Nd, dtype: Dtype) -> Nd {
    nd.map(|x| quantize(x, dtype))
}

/// A target out of range: the CPU refuses it at eval, naming the problem;
/// the GPU's kernels give NaN losses instead (checked where they run).
fn assert_out_of_range(cx: &Ctx, got: &Array, what: &str) {
    match cx.device() {
        Device::Cpu => {
            let err = got.eval().expect_err(what).to_string();
            assert!(err.contains("out of range"), "{what}: {err}");
        }
        Device::Gpu => {
            assert!(values(got).iter().any(|v| v.is_nan()), "{what}: no NaN");
        }
    }
}

// ---------------------------------------------------------------- cross_entropy

/// Logits `[rows.., v]` in `[-6, 6]` and i32 targets `[rows..]`.
fn ce_inputs(seed: u64, rows: &[usize], v: usize, dtype: Dtype) -> (Nd, Nd) {
    let mut ls = rows.to_vec();
    ls.push(v);
    (
        fill(&ls, dtype, -6.0, 6.0, seed),
        fill(rows, Dtype::I32, 0.0, v as f64 - 1.0, seed ^ 11),
    )
}

/// [`ce_inputs`] for `rows` rows whose first two targets are the first and
/// the last class.
fn wide_inputs(seed: u64, rows: usize, v: usize, dtype: Dtype) -> (Nd, Nd) {
    let (x, mut t) = ce_inputs(seed, &[rows], v, dtype);
    t.v[0] = 0.0;
    t.v[1] = v as f64 - 1.0;
    (x, t)
}

/// Row `i` (a multi-index of the rows) of logits `x`.
fn row(x: &Nd, i: &[usize]) -> Vec<f64> {
    let v = x.shape[x.shape.len() - 1];
    (0..v)
        .map(|c| {
            let mut j = i.to_vec();
            j.push(c);
            x.at(&j)
        })
        .collect()
}

/// The logsumexp of a row (whose entries may be -inf).
fn logsumexp(row: &[f64]) -> f64 {
    let m = row.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    m + row.iter().map(|r| (r - m).exp()).sum::<f64>().ln()
}

/// Per-row `logsumexp(x) - x[t]`.
fn cross_entropy_reference(x: &Nd, t: &Nd) -> Nd {
    Nd::from_fn(&t.shape, |i| {
        let r = row(x, i);
        logsumexp(&r) - r[t.at(i) as usize]
    })
}

/// `(softmax(x) - onehot(t)) * ct[..., None]`.
fn cross_entropy_grad_reference(x: &Nd, t: &Nd, ct: &Nd) -> Nd {
    let n = t.shape.len();
    Nd::from_fn(&x.shape, |i| {
        let (r, c) = (&i[..n], i[n]);
        let x = row(x, r);
        let onehot = (c == t.at(r) as usize) as u8 as f64;
        ((x[c] - logsumexp(&x)).exp() - onehot) * ct.at(r)
    })
}

fn cross_entropy_values(cx: &Ctx) {
    let strategy = (
        prop::collection::vec(1usize..4, 0..3),
        1usize..9,
        layout(),
        any::<u64>(),
    );
    for dtype in FLOATS {
        run(cx, &strategy, |(rows, v, l, seed)| {
            let (x, t) = ce_inputs(seed, &rows, v, dtype);
            let (lg, tg) = (make(&x, dtype, l), make(&t, Dtype::I32, Layout::Dense));
            let got = cx
                .on(|| crate::cross_entropy(&lg, &tg))
                .expect("cross_entropy");
            let want = quantized(cross_entropy_reference(&x, &t), dtype);
            let what = format!("cross_entropy {dtype} {rows:?} x {v} {l:?}");
            cx.check(&got, &want, dtype, tol(dtype) * 4.0, &what);
        });
        // A vocabulary wider than a GPU workgroup, and a tiny one, in every
        // layout, with the targets (the first and last class among them)
        // read backwards.
        for l in LAYOUTS {
            for (rows, v) in [(3, 300), (4, 3)] {
                let (x, t) = wide_inputs(30, rows, v, dtype);
                let (lg, tg) = (make(&x, dtype, l), make(&t, Dtype::I32, Layout::Reversed));
                let got = cx
                    .on(|| crate::cross_entropy(&lg, &tg))
                    .expect("cross_entropy");
                let want = quantized(cross_entropy_reference(&x, &t), dtype);
                let what = format!("cross_entropy {dtype} {rows} x {v} {l:?}");
                cx.check(&got, &want, dtype, tol(dtype) * 4.0, &what);
            }
        }
    }
    // Batched rows, u32 targets and -inf logits.
    let inf = f64::NEG_INFINITY;
    let x = Nd::new(&[2, 1, 3], vec![inf, 0.0, 1.0, 2.0, -1.0, inf]);
    let t = Nd::new(&[2, 1], vec![2.0, 0.0]);
    let (lg, tg) = (
        make(&x, Dtype::F32, Layout::Dense),
        make(&t, Dtype::U32, Layout::Dense),
    );
    let got = cx.on(|| crate::cross_entropy(&lg, &tg)).expect("-inf");
    let want = cross_entropy_reference(&x, &t);
    cx.check(
        &got,
        &want,
        Dtype::F32,
        tol(Dtype::F32),
        "cross_entropy -inf",
    );
    // No rows.
    let (lg, tg) = (
        typed(&[], &[0, 4], Dtype::F32),
        typed(&[], &[0], Dtype::I32),
    );
    let got = cx.on(|| crate::cross_entropy(&lg, &tg)).expect("no rows");
    cx.check(&got, &Nd::new(&[0], vec![]), Dtype::F32, 0.0, "no rows");
    // A target out of range.
    let (lg, tg) = (Array::zeros(&[1, 3], Dtype::F32), ints(&[3], &[1]));
    let bad = cx.on(|| crate::cross_entropy(&lg, &tg)).expect("built");
    assert_out_of_range(cx, &bad, "cross_entropy target 3 of 3 classes");
}

fn cross_entropy_grad_values(cx: &Ctx) {
    let grad = |x: &Array, t: &Array, ct: &Array| {
        cx.on(|| {
            Array::from_primitive(
                CrossEntropyGrad,
                vec![x.clone(), t.clone(), ct.clone()],
                x.shape().to_vec(),
                x.dtype(),
            )
        })
    };
    let strategy = (
        prop::collection::vec(1usize..4, 0..3),
        1usize..9,
        layout(),
        any::<u64>(),
    );
    for dtype in FLOATS {
        run(cx, &strategy, |(rows, v, l, seed)| {
            let (x, t) = ce_inputs(seed, &rows, v, dtype);
            let ct = fill(&rows, dtype, -2.0, 2.0, seed ^ 5);
            let got = grad(
                &make(&x, dtype, l),
                &make(&t, Dtype::I32, Layout::Dense),
                &make(&ct, dtype, Layout::Dense),
            );
            let want = quantized(cross_entropy_grad_reference(&x, &t, &ct), dtype);
            let what = format!("cross_entropy_grad {dtype} {rows:?} x {v} {l:?}");
            cx.check(&got, &want, dtype, tol(dtype) * 4.0, &what);
        });
        // Rows wider than a GPU workgroup, every layout, u32 targets (the
        // first and last class among them) read backwards.
        for l in LAYOUTS {
            for (rows, v) in [(3, 300), (4, 3)] {
                let (x, t) = wide_inputs(31, rows, v, dtype);
                let ct = fill(&[rows], dtype, -2.0, 2.0, 32);
                let got = grad(
                    &make(&x, dtype, l),
                    &make(&t, Dtype::U32, Layout::Reversed),
                    &make(&ct, dtype, Layout::Dense),
                );
                let want = quantized(cross_entropy_grad_reference(&x, &t, &ct), dtype);
                let what = format!("cross_entropy_grad {dtype} {rows} x {v} {l:?}");
                cx.check(&got, &want, dtype, tol(dtype) * 4.0, &what);
            }
        }
    }
}

// ---------------------------------------------------------------- the fused output projection

/// Inputs of the fused output projection + cross-entropy: hidden states
/// `[rows.., d]`, a weight `[v, d]`, targets (some equal to the ignore
/// index, which may lie outside the vocabulary) and the options.
struct LceCase {
    h: Nd,
    w: Nd,
    t: Nd,
    opts: LinearCrossEntropyOptions,
}

/// One draw of [`lce_strategy`]: row shape, hidden size, classes, ignore
/// mode (none, out of range, class 0), label smoothing, chunk, layout, seed.
type LceDraw = (Vec<usize>, usize, usize, u8, bool, usize, Layout, u64);

fn lce_strategy() -> impl Strategy<Value = LceDraw> {
    (
        prop::collection::vec(0usize..4, 1..3),
        0usize..5,
        1usize..9,
        0u8..3,
        any::<bool>(),
        0usize..4,
        layout(),
        any::<u64>(),
    )
}

fn lce_case(draw: &LceDraw, dtype: Dtype) -> LceCase {
    let (rows, d, v, ignore, smooth, chunk, _, seed) = draw.clone();
    let mut hs = rows.to_vec();
    hs.push(d);
    let mut t = fill(&rows, Dtype::I32, 0.0, v as f64 - 1.0, seed ^ 11);
    let ignore_index = match ignore {
        0 => None,
        1 => {
            // Out-of-range ignored targets on every third row.
            t.v.iter_mut().step_by(3).for_each(|x| *x = -100.0);
            Some(-100)
        }
        _ => Some(0),
    };
    LceCase {
        h: fill(&hs, dtype, -2.0, 2.0, seed),
        w: fill(&[v, d], dtype, -2.0, 2.0, seed ^ 7),
        t,
        opts: LinearCrossEntropyOptions {
            ignore_index,
            label_smoothing: if smooth { 0.25 } else { 0.0 },
            chunk,
            block_rows: 0,
        },
    }
}

/// Targets for `rows` rows of a `vocab`-class problem: the first and last
/// class, then pseudo-random ones, with every fifth row (from the third) set
/// to `ignored` when given.
fn edge_targets(rows: &[usize], vocab: usize, ignored: Option<i64>, seed: u64) -> Nd {
    let r = fill(rows, Dtype::I32, 0.0, vocab as f64 - 1.0, seed);
    let v = r.v.iter().enumerate().map(|(i, &x)| match (i, ignored) {
        (0, _) => 0.0,
        (1, _) => vocab as f64 - 1.0,
        (_, Some(ig)) if i % 5 == 2 => ig as f64,
        _ => x,
    });
    Nd::new(rows, v.collect())
}

/// Fixed problems at the sizes where the kernels change strategy: several
/// vocabulary chunks (the last partial), wider than a GPU matmul tile and
/// workgroup, ignore indices inside and outside the vocabulary, one class
/// per chunk, batched rows.
fn fixed_cases(dtype: Dtype) -> Vec<LceCase> {
    let o = |chunk, ignore_index, label_smoothing| LinearCrossEntropyOptions {
        ignore_index,
        label_smoothing,
        chunk,
        block_rows: 0,
    };
    let problems: [(&[usize], usize, usize, LinearCrossEntropyOptions); 6] = [
        (&[5], 16, 50, o(16, Some(-100), 0.0)),
        (&[37], 40, 300, o(70, None, 0.1)),
        (&[13], 24, 130, o(0, Some(3), 0.05)),
        (&[3], 5, 4, o(1, None, 0.0)),
        (&[21], 24, 150, o(32, Some(-1), 0.0)),
        (&[3, 4], 16, 120, o(50, None, 0.2)),
    ];
    problems
        .into_iter()
        .enumerate()
        .map(|(k, (rows, d, v, opts))| {
            let seed = 40 + k as u64;
            let mut hs = rows.to_vec();
            hs.push(d);
            LceCase {
                h: fill(&hs, dtype, -1.0, 1.0, seed),
                w: fill(&[v, d], dtype, -1.0, 1.0, seed + 100),
                t: edge_targets(rows, v, opts.ignore_index, seed),
                opts,
            }
        })
        .collect()
}

/// The weight is read transposed whenever the hidden states are not dense.
fn weight_layout(l: Layout) -> Layout {
    match l {
        Layout::Dense => Layout::Dense,
        _ => Layout::Transposed,
    }
}

/// The f64 reference: per-row losses and, for row cotangents `ct`, `dh` and `dw`.
fn lce_reference(c: &LceCase, ct: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let (v, d) = (c.w.shape[0], c.w.shape[1]);
    let n = c.t.v.len();
    let s = c.opts.label_smoothing as f64;
    let (mut loss, mut dh, mut dw) = (vec![0.0; n], vec![0.0; n * d], vec![0.0; v * d]);
    for r in 0..n {
        let t = c.t.v[r] as i64;
        if Some(t) == c.opts.ignore_index {
            continue;
        }
        let x: Vec<f64> = (0..v)
            .map(|j| (0..d).map(|k| c.h.v[r * d + k] * c.w.v[j * d + k]).sum())
            .collect();
        let lse = logsumexp(&x);
        let mean = x.iter().sum::<f64>() / v as f64;
        loss[r] = lse - (1.0 - s) * x[t as usize] - s * mean;
        for j in 0..v {
            let target = (1.0 - s) * ((j == t as usize) as u8 as f64) + s / v as f64;
            let g = ((x[j] - lse).exp() - target) * ct[r];
            for k in 0..d {
                dh[r * d + k] += g * c.w.v[j * d + k];
                dw[j * d + k] += g * c.h.v[r * d + k];
            }
        }
    }
    (loss, dh, dw)
}

/// The per-row losses of `c` on the device under test against the reference.
fn check_lce(cx: &Ctx, c: &LceCase, dtype: Dtype, (lh, lw, lt): (Layout, Layout, Layout)) {
    let (h, w) = (make(&c.h, dtype, lh), make(&c.w, dtype, lw));
    let t = make(&c.t, Dtype::I32, lt);
    let got = cx
        .on(|| crate::linear_cross_entropy(&h, &w, &t, &c.opts))
        .expect("linear_cross_entropy");
    let (loss, _, _) = lce_reference(c, &vec![0.0; c.t.v.len()]);
    // Computed in f32 from the (quantized) inputs, whatever their dtype.
    let what = format!(
        "linear_cross_entropy {dtype} h {:?} {lh:?}, w {:?} {lw:?}, {:?}",
        c.h.shape, c.w.shape, c.opts
    );
    let want = Nd::new(&c.t.shape, loss);
    cx.check(&got, &want, Dtype::F32, tol(Dtype::F32) * 8.0, &what);
}

fn lce_values(cx: &Ctx) {
    for dtype in FLOATS {
        run(cx, &lce_strategy(), |draw| {
            let l = draw.6;
            check_lce(cx, &lce_case(&draw, dtype), dtype, (l, l, Layout::Dense));
        });
        for c in fixed_cases(dtype) {
            for l in LAYOUTS {
                check_lce(cx, &c, dtype, (l, weight_layout(l), Layout::Dense));
            }
        }
    }
    // Batched rows and u32 targets, one of them an ignore index beyond i32.
    let big = 4_000_000_000i64;
    let c = LceCase {
        h: fill(&[2, 3, 8], Dtype::F32, -1.0, 1.0, 50),
        w: fill(&[33, 8], Dtype::F32, -1.0, 1.0, 51),
        t: Nd::new(&[2, 3], vec![32.0, 0.0, 7.0, big as f64, 5.0, 31.0]),
        opts: LinearCrossEntropyOptions {
            ignore_index: Some(big),
            chunk: 10,
            ..Default::default()
        },
    };
    let (h, w) = (
        make(&c.h, Dtype::F32, Layout::Dense),
        make(&c.w, Dtype::F32, Layout::Dense),
    );
    let t = make(&c.t, Dtype::U32, Layout::Dense);
    let got = cx
        .on(|| crate::linear_cross_entropy(&h, &w, &t, &c.opts))
        .expect("u32 targets");
    let want = Nd::new(&[2, 3], lce_reference(&c, &[0.0; 6]).0);
    cx.check(
        &got,
        &want,
        Dtype::F32,
        tol(Dtype::F32) * 8.0,
        "u32 targets",
    );
    // No rows: no losses.
    let (h0, t0) = (
        typed(&[], &[0, 8], Dtype::F32),
        typed(&[], &[0], Dtype::I32),
    );
    let got = cx
        .on(|| crate::linear_cross_entropy(&h0, &w, &t0, &c.opts))
        .expect("no rows");
    cx.check(&got, &Nd::new(&[0], vec![]), Dtype::F32, 0.0, "no rows");

    // A target out of range, and arguments refused when the op is built.
    let h = Array::zeros(&[2, 3], Dtype::F32);
    let w = Array::zeros(&[4, 3], Dtype::F32);
    let opts = LinearCrossEntropyOptions::default();
    let bad = cx
        .on(|| crate::linear_cross_entropy(&h, &w, &ints(&[1, 4], &[2]), &opts))
        .expect("built");
    assert_out_of_range(cx, &bad, "linear_cross_entropy target 4 of 4 classes");
    let t = ints(&[1, 2], &[2]);
    cx.on(|| {
        let w16 = w.astype(Dtype::F16).expect("f16");
        let tf = t.astype(Dtype::F32).expect("f32");
        let smooth = LinearCrossEntropyOptions {
            label_smoothing: 1.0,
            ..opts
        };
        let lce = crate::linear_cross_entropy;
        assert!(
            lce(&h, &w.t().expect("t"), &t, &opts).is_err(),
            "weight [D, V]"
        );
        assert!(lce(&h, &w16, &t, &opts).is_err(), "mixed dtypes");
        assert!(lce(&h, &w, &tf, &opts).is_err(), "float targets");
        assert!(lce(&h, &w, &t, &smooth).is_err(), "label smoothing 1");
    });
}

/// `linear_cross_entropy_grad` of `c` for the row cotangents `ct`, built on
/// the device under test from the reference losses, against `dh` then `dw`.
fn check_lce_grad(cx: &Ctx, c: &LceCase, ct: &Nd, dtype: Dtype, layouts: [Layout; 3]) {
    let [lh, lw, lc] = layouts;
    let (loss, dh, dw) = lce_reference(c, &ct.v);
    let n = c.h.v.len() + c.w.v.len();
    let [h, w, t, ct, loss] = [
        make(&c.h, dtype, lh),
        make(&c.w, dtype, lw),
        make(&c.t, Dtype::I32, Layout::Dense),
        make(ct, Dtype::F32, lc),
        make(&Nd::new(&c.t.shape, loss), Dtype::F32, Layout::Dense),
    ];
    let got = cx.on(|| {
        flat_gradients(LinearCrossEntropyGrad(c.opts).build(&h, &w, &t, &ct, &loss))
            .expect("dh and dw flatten")
    });
    let want = quantized(Nd::new(&[n], dh.into_iter().chain(dw).collect()), dtype);
    // The logits are recomputed in f32 and summed over the rows and classes.
    let rel = tol(dtype).max(1e-4) * 4.0;
    let what = format!(
        "linear_cross_entropy_grad {dtype} h {:?} {lh:?}, w {:?} {lw:?}, ct {lc:?}, {:?}",
        c.h.shape, c.w.shape, c.opts
    );
    cx.check(&got, &want, dtype, rel, &what);
}

/// `dh` then `dw` in one flat array, as the reference lays them out.
fn flat_gradients(grads: Vec<Array>) -> crate::Result<Array> {
    let flat = grads
        .iter()
        .map(|g| g.reshape(&[-1]))
        .collect::<crate::Result<Vec<_>>>()?;
    crate::concatenate(&flat, 0)
}

fn lce_grad_values(cx: &Ctx) {
    for dtype in FLOATS {
        run(cx, &lce_strategy(), |draw| {
            let c = lce_case(&draw, dtype);
            let ct = fill(&draw.0, Dtype::F32, -2.0, 2.0, draw.7 ^ 5);
            check_lce_grad(cx, &c, &ct, dtype, [draw.6; 3]);
        });
        for (k, c) in fixed_cases(dtype).into_iter().enumerate() {
            // Whole cotangents in [-2, 2], zeros among them, read backwards.
            let ct = fill(&c.t.shape, Dtype::I32, -2.0, 2.0, 240 + k as u64);
            for l in LAYOUTS {
                let layouts = [l, weight_layout(l), Layout::Reversed];
                check_lce_grad(cx, &c, &ct, dtype, layouts);
            }
        }
    }
    // No rows: a zero weight gradient.
    let c = LceCase {
        h: Nd::new(&[0, 8], vec![]),
        w: fill(&[33, 8], Dtype::F32, -1.0, 1.0, 51),
        t: Nd::new(&[0], vec![]),
        opts: LinearCrossEntropyOptions {
            chunk: 10,
            ..Default::default()
        },
    };
    let ct = Nd::new(&[0], vec![]);
    check_lce_grad(cx, &c, &ct, Dtype::F32, [Layout::Dense; 3]);
}

/// Row weights for `rows` rows: values in `[-1, 2]` with every fourth row
/// masked (zero).
fn row_weights(rows: &[usize], seed: u64) -> Nd {
    let mut rw = fill(rows, Dtype::F32, -1.0, 2.0, seed);
    rw.v.iter_mut().step_by(4).for_each(|x| *x = 0.0);
    rw
}

/// The training loss of the old GPU suite: 21 rows of a 150-class problem in
/// chunks of 32 and blocks of 8 rows, with masked and ignored rows and label
/// smoothing, the hidden states read transposed. `dims` features: 24, or 32
/// for the CPU's row-block kernels (AVX-512, and AVX512_BF16 or AMX for
/// bfloat16), which take whole micro-tiles of 32 features.
fn training_case(dtype: Dtype, dims: usize) -> (LceCase, Nd) {
    let opts = LinearCrossEntropyOptions {
        ignore_index: Some(-1),
        label_smoothing: 0.1,
        chunk: 32,
        block_rows: 8,
    };
    let c = LceCase {
        h: fill(&[21, dims], dtype, -1.0, 1.0, 67),
        w: fill(&[150, dims], dtype, -1.0, 1.0, 68),
        t: edge_targets(&[21], 150, opts.ignore_index, 66),
        opts,
    };
    let rw = Nd::from_fn(&[21], |i| {
        if i[0] % 4 == 1 {
            0.0
        } else {
            quantize(0.5 + i[0] as f64 / 21.0, Dtype::F32)
        }
    });
    (c, rw)
}

/// The three outputs of `linear_cross_entropy_value_and_grad` (the
/// weighted loss, f32 `dh` and `dw`) on the device under test.
fn check_value_and_grad(cx: &Ctx, c: &LceCase, rw: &Nd, dtype: Dtype, (l, lw): (Layout, Layout)) {
    let (loss, dh, dw) = lce_reference(c, &rw.v);
    let total: f64 = loss.iter().zip(&rw.v).map(|(a, b)| a * b).sum();
    let inputs = [
        make(&c.h, dtype, l),
        make(&c.w, dtype, lw),
        make(&c.t, Dtype::I32, Layout::Dense),
        make(rw, Dtype::F32, l),
    ];
    let node = LinearCrossEntropyValueAndGrad(c.opts);
    let got = cx.on(|| node.build(&inputs[0], &inputs[1], &inputs[2], inputs[3].clone()));
    // Everything in f32 from the quantized inputs; the total sums every row.
    let rel = tol(dtype).max(1e-4) * 4.0;
    let what = format!(
        "linear_cross_entropy_value_and_grad {dtype} h {:?} {l:?}, w {:?} {lw:?}, {:?}",
        c.h.shape, c.w.shape, c.opts
    );
    cx.check(
        &got[0],
        &Nd::new(&[], vec![total]),
        Dtype::F32,
        rel,
        &format!("{what}: loss"),
    );
    cx.check(
        &got[1],
        &Nd::new(&c.h.shape, dh),
        Dtype::F32,
        rel,
        &format!("{what}: dh"),
    );
    cx.check(
        &got[2],
        &Nd::new(&c.w.shape, dw),
        Dtype::F32,
        rel,
        &format!("{what}: dw"),
    );
}

fn value_and_grad_values(cx: &Ctx) {
    for dtype in FLOATS {
        run(cx, &lce_strategy(), |draw| {
            let mut c = lce_case(&draw, dtype);
            c.opts.block_rows = draw.5;
            let rw = row_weights(&draw.0, draw.7 ^ 9);
            check_value_and_grad(cx, &c, &rw, dtype, (draw.6, draw.6));
        });
        for dims in [24, 32] {
            let (c, rw) = training_case(dtype, dims);
            check_value_and_grad(cx, &c, &rw, dtype, (Layout::Transposed, Layout::Dense));
        }
    }
}

/// `linear_cross_entropy_sum` on the device under test: plainly (the loss
/// alone), and through `value_and_grad` and `vjp` (the one-pass primitive,
/// whose vjp hands out its gradient outputs).
fn check_sum(cx: &Ctx, c: &LceCase, rw: &Nd, dtype: Dtype, l: Layout) {
    let (loss, dh, dw) = lce_reference(c, &rw.v);
    let total: f64 = loss.iter().zip(&rw.v).map(|(a, b)| a * b).sum();
    let t = make(&c.t, Dtype::I32, Layout::Dense);
    let weights = make(rw, Dtype::F32, l);
    let opts = c.opts;
    let f = |x: &[Array]| crate::linear_cross_entropy_sum(&x[0], &x[1], &t, &weights, &opts);
    let inputs = [make(&c.h, dtype, l), make(&c.w, dtype, l)];
    let plain = cx.on(|| f(&inputs)).expect("linear_cross_entropy_sum");
    let (value, grads) = cx
        .on(|| crate::value_and_grad(f, &[0, 1])(&inputs))
        .expect("value_and_grad");
    if dtype == Dtype::F32 {
        // Under a seed of 1 both gradients are views of the one buffer the
        // pass wrote, not scaled copies.
        crate::eval(&grads).expect("gradients");
        let (a, b) = (grads[0].data().expect("dh"), grads[1].data().expect("dw"));
        assert!(
            std::sync::Arc::ptr_eq(a.storage(), b.storage()),
            "dh and dw are views of one buffer"
        );
    }
    let rel = tol(dtype).max(1e-4) * 4.0;
    let what = format!(
        "linear_cross_entropy_sum {dtype} h {:?} {l:?}, w {:?}, {:?}",
        c.h.shape, c.w.shape, c.opts
    );
    cx.check(&value, &Nd::new(&[], vec![total]), Dtype::F32, rel, &what);
    cx.check(
        &plain,
        &Nd::new(&[], vec![total]),
        Dtype::F32,
        rel,
        &format!("{what}: plain"),
    );
    let dh = quantized(Nd::new(&c.h.shape, dh), dtype);
    let dw = quantized(Nd::new(&c.w.shape, dw), dtype);
    cx.check(&grads[0], &dh, dtype, rel, &format!("{what}: dh"));
    cx.check(&grads[1], &dw, dtype, rel, &format!("{what}: dw"));
    // A cotangent other than 1 scales both gradients.
    let three = Array::full(&[], 3.0, Dtype::F32);
    let (_, g3) = cx
        .on(|| {
            crate::vjp(
                |x: &[Array]| Ok(vec![f(x)?]),
                &inputs,
                std::slice::from_ref(&three),
            )
        })
        .expect("vjp");
    for ((a, b), name) in g3.iter().zip(&grads).zip(["dh", "dw"]) {
        let tripled = values(b).into_iter().map(|v| 3.0 * v).collect();
        let want = Nd::new(b.shape(), tripled);
        let got = cx.on(|| a.astype(Dtype::F32)).expect("f32");
        assert_close(
            &got,
            &want,
            Dtype::F32,
            cx.rel(rel, dtype),
            &format!("{what}: 3 {name}"),
        );
    }
}

fn sum_values(cx: &Ctx) {
    for dtype in FLOATS {
        run(cx, &lce_strategy(), |draw| {
            // Blocks of 1 to 3 rows.
            let mut c = lce_case(&draw, dtype);
            c.opts.block_rows = draw.5;
            let rw = row_weights(&draw.0, draw.7 ^ 9);
            check_sum(cx, &c, &rw, dtype, draw.6);
        });
        for dims in [24, 32] {
            let (c, rw) = training_case(dtype, dims);
            check_sum(cx, &c, &rw, dtype, Layout::Transposed);
        }
    }
    // Row weights must be floats shaped like the targets.
    let h = Array::zeros(&[2, 3], Dtype::F32);
    let w = Array::zeros(&[4, 3], Dtype::F32);
    let t = ints(&[1, 2], &[2]);
    let opts = LinearCrossEntropyOptions::default();
    cx.on(|| {
        let ones = Array::ones(&[3], Dtype::F32);
        let err = crate::linear_cross_entropy_sum(&h, &w, &t, &ones, &opts)
            .expect_err("3 row weights for 2 rows")
            .to_string();
        assert!(err.contains("row weights"), "{err}");
        assert!(crate::linear_cross_entropy_sum(&h, &w, &t, &t, &opts).is_err());
    });
}
