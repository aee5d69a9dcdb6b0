//! Conformance specifications of the view primitives: each one against an
//! f64 reference over every dtype the device has and every input layout,
//! and its gradient through finite differences.

use proptest::prelude::*;

use super::{BroadcastTo, Contiguous, Reshape, Slice, Transpose};
use crate::conformance::*;
use crate::{ALL_DTYPES, Array, Dtype, SliceArg};

/// Every view primitive's specification.
pub fn specs() -> Vec<Spec> {
    let x23 = || uniform(4, &[2, 3], -2.0, 2.0);
    vec![
        Spec::new::<Reshape>("reshape", reshape_values, move || {
            GradCase::new(vec![x23()], &[0], |a| a[0].t()?.reshape(&[6, 1]))
        }),
        Spec::new::<Transpose>("transpose", transpose_values, || {
            GradCase::new(vec![uniform(7, &[2, 3, 2], -1.0, 1.0)], &[0], |a| {
                a[0].transpose(&[1, 2, 0])
            })
        }),
        Spec::new::<BroadcastTo>("broadcast_to", broadcast_to_values, || {
            GradCase::new(vec![uniform(8, &[3, 1], -1.0, 1.0)], &[0], |a| {
                a[0].broadcast_to(&[2, 3, 4])
            })
        }),
        Spec::new::<Slice>("slice", slice_values, || {
            GradCase::new(vec![uniform(9, &[4, 5], -1.0, 1.0)], &[0], |a| {
                a[0].slice(&[SliceArg::FULL.step(-2), SliceArg::range(1, 5).step(2)])
            })
        }),
        Spec::new::<Contiguous>("contiguous", contiguous_values, move || {
            GradCase::new(vec![x23()], &[0], |a| a[0].t()?.contiguous())
        }),
    ]
}

/// Checks the result of an op that may return its input unchanged (a
/// reshape to the same shape, a whole slice): that input stays where it
/// was; anything else must be on the device under test.
pub(crate) fn check_exact(cx: &Ctx, got: &Array, input: &Array, want: &Nd, what: &str) {
    let dtype = input.dtype();
    if got.id() == input.id() {
        assert_close(got, want, dtype, 0.0, what);
    } else {
        cx.check(got, want, dtype, 0.0, what);
    }
}

/// `x` in `layout` as a view built on the device under test over dense
/// data there (on the GPU, a transfer makes a strided host array dense, so
/// only such views reach the GPU kernels strided), evaluated.
pub(crate) fn device_view(cx: &Ctx, x: &Nd, dtype: Dtype, layout: Layout) -> Array {
    let n = x.shape.len();
    let here = cx.device();
    let a = match layout {
        _ if n == 0 => Ok(make(x, dtype, Layout::Dense).to_device(here)),
        Layout::Dense => Ok(make(x, dtype, Layout::Dense).to_device(here)),
        Layout::Transposed => {
            let rshape: Vec<usize> = x.shape.iter().rev().copied().collect();
            let t = Nd::from_fn(&rshape, |i| {
                x.at(&i.iter().rev().copied().collect::<Vec<_>>())
            });
            let base = make(&t, dtype, Layout::Dense);
            cx.on(|| base.transpose(&[]))
        }
        Layout::Strided => {
            let mut big = x.shape.clone();
            big[n - 1] *= 2;
            let b = Nd::from_fn(&big, |i| {
                let mut j = i.to_vec();
                j[n - 1] /= 2;
                if i[n - 1] % 2 == 0 { x.at(&j) } else { 77.0 }
            });
            let base = make(&b, dtype, Layout::Dense);
            let mut args = vec![SliceArg::FULL; n];
            args[n - 1] = SliceArg::FULL.step(2);
            cx.on(|| base.slice(&args))
        }
        Layout::Reversed => {
            let r = Nd::from_fn(&x.shape, |i| {
                let mut j = i.to_vec();
                j[0] = x.shape[0] - 1 - i[0];
                x.at(&j)
            });
            let base = make(&r, dtype, Layout::Dense);
            let mut args = vec![SliceArg::FULL; n];
            args[0] = SliceArg::FULL.step(-1);
            cx.on(|| base.slice(&args))
        }
    };
    let a = a.expect("a device view");
    a.eval().expect("the view evaluates");
    a
}

/// `x` in `layout`: a host array (copied dense on the way to the GPU), or,
/// when `on_device`, a view built on the device under test.
pub(crate) fn input(cx: &Ctx, x: &Nd, dtype: Dtype, layout: Layout, on_device: bool) -> Array {
    if on_device {
        device_view(cx, x, dtype, layout)
    } else {
        make(x, dtype, layout)
    }
}

/// The [4, 6] inputs of the fixed cases: every layout, on the host and as
/// a view on the device.
fn fixed_inputs(cx: &Ctx, dtype: Dtype) -> Vec<(Nd, Array, String)> {
    let x = fill(&[4, 6], dtype, -9.0, 9.0, 8);
    let mut out = vec![];
    for l in LAYOUTS {
        for on_device in [false, true] {
            let a = input(cx, &x, dtype, l, on_device);
            out.push((
                x.clone(),
                a,
                format!("{dtype} [4, 6] {l:?} on device {on_device}"),
            ));
        }
    }
    out
}

// ---------------------------------------------------------------- reshape

fn reshape_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(shape(3), layout(), any::<bool>(), any::<u64>(), 0u8..3),
                |(s, l, dev, seed, kind)| {
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let n = x.v.len() as i64;
                    // The dimensions reversed, flattened, or a new leading axis
                    // with the last one inferred.
                    let target: Vec<i64> = match kind {
                        0 => s.iter().rev().map(|&d| d as i64).collect(),
                        2 if n > 0 => {
                            let mut t = vec![1];
                            t.extend(s.iter().map(|&d| d as i64));
                            *t.last_mut().expect("a leading axis") = -1;
                            t
                        }
                        _ => vec![n],
                    };
                    let a = input(cx, &x, dtype, l, dev);
                    let got = cx.on(|| a.reshape(&target)).expect("reshape");
                    let shape: Vec<usize> = match kind {
                        2 if n > 0 => {
                            let mut t = vec![1];
                            t.extend(&s);
                            t
                        }
                        _ => target.iter().map(|&d| d as usize).collect(),
                    };
                    let what = format!("reshape {dtype} {s:?} -> {target:?} {l:?} on device {dev}");
                    check_exact(cx, &got, &a, &Nd::new(&shape, x.v.clone()), &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        // Every layout for sure (a strided input is copied first).
        for (x, a, what) in fixed_inputs(cx, dtype) {
            let got = cx.on(|| a.reshape(&[3, 8])).expect("reshape");
            let what = format!("reshape {what} -> [3, 8]");
            cx.check(&got, &Nd::new(&[3, 8], x.v.clone()), dtype, 0.0, &what);
        }
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = cx.on(|| x.reshape(&[4, 2])).expect_err("7 elements");
    assert!(err.to_string().contains("cannot reshape"), "{err}");
}

// ---------------------------------------------------------------- transpose

/// `x` with its axes permuted by `perm`.
fn transposed(x: &Nd, perm: &[usize]) -> Nd {
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    Nd::from_fn(&shape, |i| {
        let mut src = vec![0; perm.len()];
        for (k, &p) in perm.iter().enumerate() {
            src[p] = i[k];
        }
        x.at(&src)
    })
}

fn transpose_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 4),
                    (layout(), any::<bool>()),
                    any::<u64>(),
                    Just(()).prop_perturb(|_, mut r| r.random::<u64>()),
                ),
                |(s, (l, dev), seed, pseed)| {
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let mut perm: Vec<usize> = (0..s.len()).collect();
                    for i in (1..perm.len()).rev() {
                        perm.swap(i, (pseed as usize >> (i * 3)) % (i + 1));
                    }
                    let axes: Vec<i32> = perm.iter().map(|&p| p as i32).collect();
                    let a = input(cx, &x, dtype, l, dev);
                    let got = cx.on(|| a.transpose(&axes)).expect("transpose");
                    let what = format!("transpose {dtype} {s:?} {perm:?} {l:?} on device {dev}");
                    check_exact(cx, &got, &a, &transposed(&x, &perm), &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        for (x, a, what) in fixed_inputs(cx, dtype) {
            let got = cx.on(|| a.transpose(&[1, 0])).expect("transpose");
            let want = transposed(&x, &[1, 0]);
            cx.check(&got, &want, dtype, 0.0, &format!("transpose {what}"));
            // A kernel reading the transposed view.
            if dtype.is_float() {
                let got = cx.on(|| a.transpose(&[1, 0])?.exp()).expect("exp");
                let want = want.map(|v| quantize(v.exp(), dtype));
                let what = format!("exp of transpose {what}");
                cx.check(&got, &want, dtype, tol(dtype), &what);
            }
        }
    }
}

// ---------------------------------------------------------------- broadcast_to

/// A shape and a shape it broadcasts to: the target with some leading axes
/// dropped and some others set to 1.
fn broadcastable() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (shape(3), any::<u8>()).prop_map(|(target, m)| {
        let drop = (m as usize >> 4) % (target.len() + 1);
        let from = target[drop..]
            .iter()
            .enumerate()
            .map(|(i, &d)| if (m >> (i % 4)) & 1 == 1 { 1 } else { d })
            .collect();
        (from, target)
    })
}

fn broadcast_to_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(broadcastable(), layout(), any::<bool>(), any::<u64>()),
                |((s, t), l, dev, seed)| {
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let a = input(cx, &x, dtype, l, dev);
                    let got = cx.on(|| a.broadcast_to(&t)).expect("broadcast_to");
                    let want = Nd::from_fn(&t, |i| x.at_broadcast(i));
                    let what = format!("broadcast_to {dtype} {s:?} -> {t:?} {l:?} on device {dev}");
                    check_exact(cx, &got, &a, &want, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        for (x, a, what) in fixed_inputs(cx, dtype) {
            let got = cx
                .on(|| a.reshape(&[4, 1, 6])?.broadcast_to(&[4, 2, 6]))
                .expect("broadcast_to");
            let want = Nd::from_fn(&[4, 2, 6], |i| x.at(&[i[0], i[2]]));
            let what = format!("broadcast_to {what} -> [4, 2, 6]");
            cx.check(&got, &want, dtype, 0.0, &what);
        }
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = cx.on(|| x.broadcast_to(&[3, 3])).expect_err("2 vs 3");
    assert!(err.to_string().contains("broadcast"), "{err}");
}

// ---------------------------------------------------------------- slice

/// The indices Python's `start:stop:step` picks from an axis of `len`,
/// written as a filter over all indices.
pub(crate) fn slice_indices(len: usize, a: SliceArg) -> Vec<usize> {
    let n = len as i64;
    let norm = |v: i64| if v < 0 { v + n } else { v };
    let mut out: Vec<usize> = Vec::new();
    if a.step > 0 {
        let start = a.start.map_or(0, norm).clamp(0, n);
        let stop = a.stop.map_or(n, norm).clamp(0, n);
        for i in 0..n {
            if i >= start && i < stop && (i - start) % a.step == 0 {
                out.push(i as usize);
            }
        }
    } else {
        let start = a.start.map_or(n - 1, norm).clamp(-1, n - 1);
        let stop = a.stop.map_or(-1, norm).clamp(-1, n - 1);
        for i in (0..n).rev() {
            if i <= start && i > stop && (start - i) % -a.step == 0 {
                out.push(i as usize);
            }
        }
    }
    out
}

/// One axis of a slice: open or negative ends, positive or negative steps.
pub(crate) fn slice_arg() -> impl Strategy<Value = SliceArg> {
    (
        prop::option::of(-7i64..7),
        prop::option::of(-7i64..7),
        prop_oneof![1i64..4, -3i64..0],
    )
        .prop_map(|(start, stop, step)| SliceArg { start, stop, step })
}

/// The indices each axis of `shape` keeps under `args` (missing axes whole).
pub(crate) fn picks(shape: &[usize], args: &[SliceArg]) -> Vec<Vec<usize>> {
    (0..shape.len())
        .map(|d| slice_indices(shape[d], args.get(d).copied().unwrap_or(SliceArg::FULL)))
        .collect()
}

fn sliced(x: &Nd, args: &[SliceArg]) -> Nd {
    let picks = picks(&x.shape, args);
    let shape: Vec<usize> = picks.iter().map(|p| p.len()).collect();
    Nd::from_fn(&shape, |i| {
        x.at(&i
            .iter()
            .enumerate()
            .map(|(d, &k)| picks[d][k])
            .collect::<Vec<_>>())
    })
}

fn slice_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    (layout(), any::<bool>()),
                    any::<u64>(),
                    prop::collection::vec(slice_arg(), 1..3),
                ),
                |(s, (l, dev), seed, args)| {
                    let args: Vec<SliceArg> = args.into_iter().take(s.len()).collect();
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let a = input(cx, &x, dtype, l, dev);
                    let got = cx.on(|| a.slice(&args)).expect("slice");
                    let what = format!("slice {dtype} {s:?} {args:?} {l:?} on device {dev}");
                    check_exact(cx, &got, &a, &sliced(&x, &args), &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        for (x, a, what) in fixed_inputs(cx, dtype) {
            let args = [SliceArg::range(1, 4), SliceArg::FULL.step(-2)];
            let got = cx.on(|| a.slice(&args)).expect("slice");
            let what = format!("slice {what} {args:?}");
            cx.check(&got, &sliced(&x, &args), dtype, 0.0, &what);
        }
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = cx
        .on(|| x.slice(&[SliceArg::FULL, SliceArg::FULL.step(0)]))
        .expect_err("step 0");
    assert!(err.to_string().contains("step of axis 1 is zero"), "{err}");
}

// ---------------------------------------------------------------- contiguous

fn contiguous_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(shape(3), layout(), any::<bool>(), any::<u64>()),
                |(s, l, dev, seed)| {
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let a = input(cx, &x, dtype, l, dev);
                    let got = cx.on(|| a.contiguous()).expect("contiguous");
                    let what = format!("contiguous {dtype} {s:?} {l:?} on device {dev}");
                    cx.check(&got, &x, dtype, 0.0, &what);
                    // Row-major, whatever the input's strides.
                    got.eval().expect("contiguous evaluates");
                    let data = got.data().expect("evaluated");
                    assert!(data.is_contiguous(&s), "{what}: {:?}", data.strides());
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        for (x, a, what) in fixed_inputs(cx, dtype) {
            let got = cx.on(|| a.contiguous()).expect("contiguous");
            cx.check(&got, &x, dtype, 0.0, &format!("contiguous {what}"));
            got.eval().expect("contiguous evaluates");
            let data = got.data().expect("evaluated");
            assert!(
                data.is_contiguous(&[4, 6]),
                "contiguous {what}: {:?}",
                data.strides()
            );
        }
    }
}
