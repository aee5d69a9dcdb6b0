//! Conformance specifications of the gathers, joins and placements: f64
//! references over every dtype the device has, index arrays of every
//! integer dtype and layout with negative and repeated entries, empty axes,
//! and their gradients.

use proptest::prelude::*;

use super::{Concatenate, Pad, ScatterAdd, SliceUpdate, Take, TakeAlongAxis};
use crate::conformance::*;
use crate::primitives::view::spec::{picks, slice_arg};
use crate::{ALL_DTYPES, Array, Device, Dtype, SliceArg};

/// The index dtypes.
const INDEX_DTYPES: [Dtype; 3] = [Dtype::I32, Dtype::U32, Dtype::I64];

/// Every indexing primitive's specification.
pub fn specs() -> Vec<Spec> {
    let x23 = || uniform(4, &[2, 3], -2.0, 2.0);
    vec![
        Spec::new::<Take>("take", take_values, || {
            // Repeated and negative indices: their cotangents add up.
            GradCase::new(vec![uniform(10, &[4, 3], -1.0, 1.0)], &[0], |a| {
                a[0].take(&ints(&[3, 0, 3, -1, 2], &[5]), 0)
            })
        }),
        Spec::new::<TakeAlongAxis>("take_along_axis", take_along_axis_values, move || {
            GradCase::new(vec![x23()], &[0], |a| {
                a[0].take_along_axis(&ints(&[2, -1, 0, 1], &[2, 2]), 1)
            })
        }),
        Spec::new::<Concatenate>("concatenate", concatenate_values, move || {
            GradCase::new(vec![x23(), uniform(11, &[2, 2], -1.0, 1.0)], &[0, 1], |a| {
                crate::concatenate(&[a[0].clone(), a[1].clone()], 1)
            })
        }),
        Spec::new::<Pad>("pad", pad_values, move || {
            GradCase::new(vec![x23()], &[0], |a| a[0].pad(&[(1, 0), (2, 1)], 5.0))
        }),
        Spec::new::<ScatterAdd>("scatter_add", scatter_add_values, || {
            GradCase::new(vec![uniform(18, &[5, 3], -1.0, 1.0)], &[0], |a| {
                // The gradient of take is itself differentiable (back to a gather).
                let g = crate::grad(
                    |x: &[Array]| {
                        x[0].take(&ints(&[1, 1, 0], &[3]), 0)?
                            .multiply(&x[1])?
                            .sum_all()
                    },
                    &[0],
                )(&[
                    Array::zeros(&[2, 3], Dtype::F32),
                    a[0].slice_axis(0, 0, 3)?,
                ])?;
                Ok(g[0].clone())
            })
        }),
        Spec::new::<SliceUpdate>("slice_update", slice_update_values, move || {
            GradCase::new(vec![x23(), uniform(19, &[2, 1], -1.0, 1.0)], &[0, 1], |a| {
                a[0].slice_update(&a[1], &[SliceArg::FULL, SliceArg::range(1, 2)])
            })
        }),
    ]
}

/// Index values for an axis of `len`: from `-len` for signed dtypes.
fn indices(shape: &[usize], dtype: Dtype, len: usize, seed: u64) -> Nd {
    let lo = if dtype == Dtype::U32 {
        0.0
    } else {
        -(len as f64)
    };
    fill(shape, dtype, lo, len as f64 - 1.0, seed)
}

/// A possibly negative index resolved against an axis of `len`.
fn resolve(i: f64, len: usize) -> usize {
    let i = i as i64;
    (if i < 0 { i + len as i64 } else { i }) as usize
}

/// An axis of `nd` dimensions, as a non-negative or negative argument.
fn axis_arg(axis: usize, nd: usize, negative: bool) -> i32 {
    if negative {
        axis as i32 - nd as i32
    } else {
        axis as i32
    }
}

/// Values suitable for `dtype`, nonzero often enough to matter for bools.
fn values_for(shape: &[usize], dtype: Dtype, seed: u64) -> Nd {
    if dtype == Dtype::Bool {
        fill(shape, dtype, 0.0, 1.0, seed)
    } else {
        fill(shape, dtype, -9.0, 9.0, seed)
    }
}

// ---------------------------------------------------------------- take

fn take_values(cx: &Ctx) {
    let index_dtypes = cx.dtypes(&INDEX_DTYPES);
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(
                    prop::collection::vec(dim(), 1..=3),
                    shape(2),
                    (layout(), layout()),
                    prop::sample::select(index_dtypes.clone()),
                    any::<u64>(),
                ),
                |(s, is, (l, li), idt, seed)| {
                    let axis = (seed as usize) % s.len();
                    let x = values_for(&s, dtype, seed);
                    let idx = indices(&is, idt, s[axis], seed ^ 5);
                    let (a, i) = (make(&x, dtype, l), make(&idx, idt, li));
                    let arg = axis_arg(axis, s.len(), seed & 64 != 0);
                    let what = format!("take {dtype} {s:?} axis {arg} {idt} {is:?} {l:?} {li:?}");
                    let got = cx.on(|| a.take(&i, arg));
                    if s[axis] == 0 && size(&is) > 0 {
                        let err = got.expect_err(&what).to_string();
                        assert!(err.contains("cannot take from empty axis"), "{what}: {err}");
                        return Ok(());
                    }
                    let got = got.expect("take");
                    let mut shape = s[..axis].to_vec();
                    shape.extend(&is);
                    shape.extend(&s[axis + 1..]);
                    let want = Nd::from_fn(&shape, |k| {
                        let mut src = k[..axis].to_vec();
                        src.push(resolve(idx.at(&k[axis..axis + is.len()]), s[axis]));
                        src.extend(&k[axis + is.len()..]);
                        x.at(&src)
                    });
                    cx.check(&got, &want, dtype, 0.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Out of range: an error at eval on the CPU; the GPU never reads outside
    // the array and gives zeros instead.
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).expect("x");
    let i = ints(&[1, 3, -4, -3], &[4]);
    let got = cx.on(|| x.take(&i, 0)).expect("take");
    match cx.device() {
        Device::Cpu => {
            let err = got.eval().expect_err("out of range").to_string();
            assert!(err.contains("out of range"), "{err}");
        }
        Device::Gpu => {
            let want = Nd::new(&[4], vec![2.0, 0.0, 0.0, 1.0]);
            cx.check(&got, &want, Dtype::F32, 0.0, "take out of range");
        }
    }
    let err = cx
        .on(|| x.take(&x, 0))
        .expect_err("float indices")
        .to_string();
    assert!(err.contains("indices must be integers"), "{err}");
}

// ---------------------------------------------------------------- take_along_axis

/// `shape` with the axes (other than `axis`) whose bit is set in `mask` set to 1.
fn ones_where(shape: &[usize], axis: usize, mask: u8) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            if d != axis && mask >> d & 1 == 1 {
                1
            } else {
                n
            }
        })
        .collect()
}

fn take_along_axis_values(cx: &Ctx) {
    let index_dtypes = cx.dtypes(&INDEX_DTYPES);
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    0usize..4,
                    (any::<u8>(), any::<u8>()),
                    (layout(), layout()),
                    prop::sample::select(index_dtypes.clone()),
                    any::<u64>(),
                ),
                |(s, k, (mx, mi), (l, li), idt, seed)| {
                    let axis = (seed as usize) % s.len();
                    // Either side may be 1 where the other is not: they broadcast.
                    let xs = ones_where(&s, axis, mx);
                    let mut is = ones_where(&s, axis, mi);
                    is[axis] = k;
                    let x = values_for(&xs, dtype, seed);
                    let idx = indices(&is, idt, s[axis], seed ^ 3);
                    let (a, i) = (make(&x, dtype, l), make(&idx, idt, li));
                    let arg = axis_arg(axis, s.len(), seed & 64 != 0);
                    let got = cx
                        .on(|| a.take_along_axis(&i, arg))
                        .expect("take_along_axis");
                    let mut shape: Vec<usize> =
                        xs.iter().zip(&is).map(|(&p, &q)| p.max(q)).collect();
                    shape[axis] = k;
                    let want = Nd::from_fn(&shape, |o| {
                        let at = |sh: &[usize], d: usize| if sh[d] == 1 { 0 } else { o[d] };
                        let io: Vec<usize> = (0..o.len())
                            .map(|d| if d == axis { o[d] } else { at(&is, d) })
                            .collect();
                        let src: Vec<usize> = (0..o.len())
                            .map(|d| {
                                if d == axis {
                                    resolve(idx.at(&io), s[axis])
                                } else {
                                    at(&xs, d)
                                }
                            })
                            .collect();
                        x.at(&src)
                    });
                    let what = format!(
                        "take_along_axis {dtype} {xs:?} axis {arg} {idt} {is:?} {l:?} {li:?}"
                    );
                    cx.check(&got, &want, dtype, 0.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = cx
        .on(|| x.take_along_axis(&ints(&[0, 1], &[2]), 1))
        .expect_err("1-d indices for a 2-d array")
        .to_string();
    assert!(err.contains("need as many dimensions"), "{err}");
}

// ---------------------------------------------------------------- concatenate

/// `parts` joined along `axis`, each rounded to the dtype it was made in.
fn joined(parts: &[(Nd, Dtype)], axis: usize) -> Nd {
    let mut shape = parts[0].0.shape.clone();
    shape[axis] = parts.iter().map(|(p, _)| p.shape[axis]).sum();
    Nd::from_fn(&shape, |i| {
        let mut j = i[axis];
        for (p, d) in parts {
            if j < p.shape[axis] {
                let mut src = i.to_vec();
                src[axis] = j;
                return quantize(p.at(&src), *d);
            }
            j -= p.shape[axis];
        }
        unreachable!("an index past the joined axis")
    })
}

fn concatenate_values(cx: &Ctx) {
    // Parts of one dtype, and (`mixed`) parts promoted to f32 as the op does.
    let mixed = [Dtype::F32, Dtype::I32, Dtype::BF16];
    let mut runs: Vec<(Dtype, bool)> = cx
        .dtypes(&ALL_DTYPES)
        .into_iter()
        .map(|d| (d, false))
        .collect();
    runs.push((Dtype::F32, true));
    for (dtype, mix) in runs {
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    prop::collection::vec((0usize..4, layout()), 2..6),
                    any::<u64>(),
                ),
                |(s, lens, seed)| {
                    let axis = (seed as usize) % s.len();
                    let parts: Vec<(Nd, Dtype)> = lens
                        .iter()
                        .enumerate()
                        .map(|(i, &(n, _))| {
                            let mut p = s.clone();
                            p[axis] = n;
                            let d = if mix { mixed[i % 3] } else { dtype };
                            (values_for(&p, d, seed ^ i as u64), d)
                        })
                        .collect();
                    let arrays: Vec<Array> = parts
                        .iter()
                        .zip(&lens)
                        .map(|((p, d), &(_, l))| make(p, *d, l))
                        .collect();
                    let arg = axis_arg(axis, s.len(), seed & 64 != 0);
                    let got = cx
                        .on(|| crate::concatenate(&arrays, arg))
                        .expect("concatenate");
                    let what = format!("concatenate {dtype} {s:?} axis {arg} {lens:?}");
                    cx.check(&got, &joined(&parts, axis), dtype, 0.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let (a, b) = (
        Array::zeros(&[2, 3], Dtype::F32),
        Array::zeros(&[3, 3], Dtype::F32),
    );
    let err = cx
        .on(|| crate::concatenate(&[a, b], 1))
        .expect_err("shapes differ off the axis")
        .to_string();
    assert!(err.contains("outside axis 1"), "{err}");
}

// ---------------------------------------------------------------- pad

fn pad_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(
                    shape(3),
                    layout(),
                    any::<u64>(),
                    prop::collection::vec((0usize..3, 0usize..3), 3),
                    prop::sample::select(vec![0.0, -5.0, -2.5, 7.0]),
                ),
                |(s, l, seed, w, value)| {
                    let w = &w[..s.len()];
                    let x = values_for(&s, dtype, seed);
                    let a = make(&x, dtype, l);
                    let got = cx.on(|| a.pad(w, value)).expect("pad");
                    let shape: Vec<usize> =
                        s.iter().zip(w).map(|(&d, &(lo, hi))| d + lo + hi).collect();
                    // The fill value converts as `as` does (-2.5 is -2 in i32, 0 in u32).
                    let fill_value = quantize(value, dtype);
                    let want = Nd::from_fn(&shape, |i| {
                        let inside = i
                            .iter()
                            .zip(w)
                            .zip(&s)
                            .all(|((&k, &(lo, _)), &d)| k >= lo && k < lo + d);
                        if inside {
                            x.at(&i
                                .iter()
                                .zip(w)
                                .map(|(&k, &(lo, _))| k - lo)
                                .collect::<Vec<_>>())
                        } else {
                            fill_value
                        }
                    });
                    let what = format!("pad {dtype} {s:?} {w:?} {value} {l:?}");
                    cx.check(&got, &want, dtype, 0.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = cx
        .on(|| x.pad(&[(1, 1)], 0.0))
        .expect_err("one width for two axes");
    assert!(err.to_string().contains("pad widths"), "{err}");
}

// ---------------------------------------------------------------- scatter_add

/// The primitive itself (the op that builds it is take's vjp), placed on
/// the device under test: `ct` added into zeros of `shape` at `idx`.
fn scatter_add(cx: &Ctx, prim: ScatterAdd, ct: &Array, idx: &Array, shape: &[usize]) -> Array {
    cx.on(|| {
        Array::from_primitive(
            prim,
            vec![ct.clone(), idx.clone()],
            shape.to_vec(),
            ct.dtype(),
        )
    })
}

fn scatter_add_values(cx: &Ctx) {
    let index_dtypes = cx.dtypes(&INDEX_DTYPES);
    for dtype in cx.dtypes(&ALL_DTYPES) {
        // f32 sums in a different order than the reference's f64 ones.
        let rel = if dtype == Dtype::F32 {
            1e-5
        } else {
            tol(dtype)
        };
        let (lo, hi) = if dtype == Dtype::Bool {
            (0.0, 1.0)
        } else {
            (-3.0, 3.0)
        };
        // The gradient of take: rows of ct added at their indices (repeats accumulate).
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    shape(2),
                    (layout(), layout()),
                    prop::sample::select(index_dtypes.clone()),
                    any::<u64>(),
                ),
                |(s, is, (l, li), idt, seed)| {
                    let axis = seed as usize % s.len();
                    let idx = indices(&is, idt, s[axis], seed ^ 1);
                    let mut cs = s[..axis].to_vec();
                    cs.extend(&is);
                    cs.extend(&s[axis + 1..]);
                    let ct = fill(&cs, dtype, lo, hi, seed ^ 2);
                    let prim = ScatterAdd {
                        axis,
                        along_axis: false,
                    };
                    let got = scatter_add(cx, prim, &make(&ct, dtype, l), &make(&idx, idt, li), &s);
                    let mut sum = Nd::from_fn(&s, |_| 0.0);
                    for_each_index(&cs, |i| {
                        let mut dst = i[..axis].to_vec();
                        dst.push(resolve(idx.at(&i[axis..axis + is.len()]), s[axis]));
                        dst.extend(&i[axis + is.len()..]);
                        let k = sum.flat_index(&dst);
                        sum.v[k] += ct.at(i);
                    });
                    let want = sum.map(|v| quantize(v, dtype));
                    let what =
                        format!("scatter_add {dtype} {s:?} axis {axis} {idt} {is:?} {l:?} {li:?}");
                    cx.check(&got, &want, dtype, rel, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        // The gradient of take_along_axis: each entry added at its own index.
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    0usize..4,
                    (layout(), layout()),
                    prop::sample::select(index_dtypes.clone()),
                    any::<u64>(),
                ),
                |(s, k, (l, li), idt, seed)| {
                    let axis = seed as usize % s.len();
                    let mut is = s.clone();
                    is[axis] = k;
                    let idx = indices(&is, idt, s[axis], seed ^ 3);
                    let ct = fill(&is, dtype, lo, hi, seed ^ 4);
                    let prim = ScatterAdd {
                        axis,
                        along_axis: true,
                    };
                    let got = scatter_add(cx, prim, &make(&ct, dtype, l), &make(&idx, idt, li), &s);
                    let mut sum = Nd::from_fn(&s, |_| 0.0);
                    for_each_index(&is, |i| {
                        let mut dst = i.to_vec();
                        dst[axis] = resolve(idx.at(i), s[axis]);
                        let f = sum.flat_index(&dst);
                        sum.v[f] += ct.at(i);
                    });
                    let want = sum.map(|v| quantize(v, dtype));
                    let what = format!(
                        "scatter_add along axis {dtype} {s:?} axis {axis} {idt} {is:?} {l:?} {li:?}"
                    );
                    cx.check(&got, &want, dtype, rel, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

// ---------------------------------------------------------------- slice_update

fn slice_update_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(
                    nonempty_shape(1, 3),
                    (layout(), layout()),
                    any::<u64>(),
                    prop::collection::vec(slice_arg(), 1..3),
                    any::<u8>(),
                ),
                |(s, (l, lu), seed, args, m)| {
                    let args: Vec<SliceArg> = args.into_iter().take(s.len()).collect();
                    let x = values_for(&s, dtype, seed);
                    let picks = picks(&s, &args);
                    let wshape: Vec<usize> = picks.iter().map(|p| p.len()).collect();
                    // The update: the window's shape, or one that broadcasts to
                    // it (leading axes dropped, others 1); in the array's dtype
                    // or in f32 (cast by the op).
                    let drop = (m as usize >> 4) % (wshape.len() + 1);
                    let ushape: Vec<usize> = wshape[drop..]
                        .iter()
                        .enumerate()
                        .map(|(i, &d)| if m >> i & 1 == 1 { 1 } else { d })
                        .collect();
                    let udt = if m & 8 != 0 && cx.supports(Dtype::F32) {
                        Dtype::F32
                    } else {
                        dtype
                    };
                    let u = fill(&ushape, Dtype::I32, 100.0, 200.0, seed ^ 9);
                    let got = cx
                        .on(|| make(&x, dtype, l).slice_update(&make(&u, udt, lu), &args))
                        .expect("slice_update");
                    let mut want = x.clone();
                    for_each_index(&wshape, |i| {
                        let dst: Vec<usize> =
                            i.iter().enumerate().map(|(d, &k)| picks[d][k]).collect();
                        let f = want.flat_index(&dst);
                        want.v[f] = quantize(u.at_broadcast(i), dtype);
                    });
                    let what = format!(
                        "slice_update {dtype} {s:?} {args:?} {ushape:?} {udt} {l:?} {lu:?}"
                    );
                    cx.check(&got, &want, dtype, 0.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = cx
        .on(|| {
            x.slice_update(
                &Array::zeros(&[3], Dtype::F32),
                &[SliceArg::FULL, SliceArg::range(0, 2)],
            )
        })
        .expect_err("3 values for a window of 2")
        .to_string();
    assert!(err.contains("broadcast"), "{err}");
}
