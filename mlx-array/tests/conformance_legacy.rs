//! What remains of the hand-written conformance suite while primitives move
//! to specifications next to them (`tests/conformance.rs` runs those): every
//! primitive in `primitive_names()` without a specification is checked
//! against the simple f64 reference in `common` on random inputs (proptest),
//! over its dtypes, odd shapes (0- and 1-sized axes) and non-contiguous
//! layouts. A primitive without a case here fails `every_primitive_is_covered`.

mod common;

use common::*;
use mlx_array::primitives::elementwise::{BinaryOp, UnaryOp};
use mlx_array::{Array, Dtype, SliceArg};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];
const NUMERIC: [Dtype; 6] = [
    Dtype::F32,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::I64,
];

fn runner() -> TestRunner {
    TestRunner::new(Config {
        cases: 24,
        failure_persistence: None,
        ..Config::default()
    })
}

fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 3 => Just(1usize), 6 => 2usize..6]
}

fn shape(max_nd: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=max_nd)
}

fn nonempty_shape(min_nd: usize, max_nd: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..5, min_nd..=max_nd)
}

/// Values suitable for `dtype` in `[lo, hi]` (integers for integer dtypes).
fn fill(shape: &[usize], dtype: Dtype, lo: f64, hi: f64, seed: u64) -> Nd {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Nd::from_fn(shape, |_| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (s >> 11) as f64 / (1u64 << 53) as f64;
        let v = lo + u * (hi - lo);
        let v = if dtype.is_float() { v } else { v.round() };
        let v = if dtype == Dtype::U32 { v.abs() } else { v };
        quantize(v, dtype)
    })
}

fn layout() -> impl Strategy<Value = Layout> {
    prop::sample::select(LAYOUTS.to_vec())
}

// ---------------------------------------------------------------- unary

fn unary_ref(op: UnaryOp, x: f64) -> f64 {
    use UnaryOp::*;
    match op {
        Neg => -x,
        Abs => x.abs(),
        Exp => x.exp(),
        Log => x.ln(),
        Log1p => x.ln_1p(),
        Sqrt => x.sqrt(),
        Rsqrt => 1.0 / x.sqrt(),
        Square => x * x,
        Sin => x.sin(),
        Cos => x.cos(),
        Tanh => x.tanh(),
        Sigmoid => 1.0 / (1.0 + (-x).exp()),
        Erf => libm::erf(x),
        Sign => {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                0.0
            }
        }
        Floor => x.floor(),
        LogicalNot => (x == 0.0) as u8 as f64,
    }
}

fn unary_case(op: UnaryOp) {
    use UnaryOp::*;
    let positive = matches!(op, Log | Sqrt | Rsqrt);
    let (lo, hi) = match op {
        _ if positive => (0.05, 9.0),
        Log1p => (-0.9, 6.0),
        Exp => (-20.0, 20.0),
        Sigmoid => (-30.0, 30.0),
        _ => (-4.0, 4.0),
    };
    let mut dtypes = FLOATS.to_vec();
    if matches!(op, Neg | Abs | Square | Sign | Floor | LogicalNot) {
        dtypes.extend([Dtype::I32, Dtype::I64]);
    }
    if matches!(op, Abs | Square | Floor | LogicalNot) {
        dtypes.push(Dtype::U32);
    }
    if op == LogicalNot {
        dtypes.push(Dtype::Bool);
    }
    for dtype in dtypes {
        runner()
            .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                let x = fill(&s, dtype, lo, hi, seed);
                let a = make(&x, dtype, l);
                let out_dtype = if op == LogicalNot { Dtype::Bool } else { dtype };
                let want = x.map(|v| quantize(unary_ref(op, v), out_dtype));
                let got = mlx_array::ops::unary(op, &a).unwrap();
                let rel = if matches!(op, Sin | Cos | Erf | Tanh) && dtype == Dtype::F32 {
                    5e-5
                } else {
                    tol(out_dtype)
                };
                check(
                    &got,
                    &want,
                    out_dtype,
                    rel,
                    &format!("{} {dtype} {l:?}", op.name()),
                );
                Ok(())
            })
            .unwrap();
    }
}

// ---------------------------------------------------------------- binary

/// Two shapes that broadcast together: drop leading axes and set some to 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (shape(3), any::<u8>(), any::<u8>()).prop_map(|(s, ma, mb)| {
        let cut = |s: &[usize], m: u8| -> Vec<usize> {
            let drop = (m as usize >> 4) % (s.len() + 1);
            s[drop..]
                .iter()
                .enumerate()
                .map(|(i, &d)| if (m >> (i % 4)) & 1 == 1 { 1 } else { d })
                .collect()
        };
        (cut(&s, ma), cut(&s, mb))
    })
}

fn binary_ref(op: BinaryOp, a: f64, b: f64, dtype: Dtype) -> f64 {
    use BinaryOp::*;
    let int = !dtype.is_float();
    match op {
        Add => wrap(a + b, dtype),
        Subtract => wrap(a - b, dtype),
        Multiply => wrap(a * b, dtype),
        Divide => a / b,
        Power => {
            if int {
                wrap(a.powi(b as i32), dtype)
            } else {
                a.powf(b)
            }
        }
        Maximum => a.max(b),
        Minimum => a.min(b),
        Equal => (a == b) as u8 as f64,
        NotEqual => (a != b) as u8 as f64,
        Less => (a < b) as u8 as f64,
        LessEqual => (a <= b) as u8 as f64,
        Greater => (a > b) as u8 as f64,
        GreaterEqual => (a >= b) as u8 as f64,
        LogicalAnd => (a != 0.0 && b != 0.0) as u8 as f64,
        LogicalOr => (a != 0.0 || b != 0.0) as u8 as f64,
        BitwiseAnd => ((a as i64) & (b as i64)) as f64,
        BitwiseOr => ((a as i64) | (b as i64)) as f64,
        BitwiseXor => ((a as i64) ^ (b as i64)) as f64,
        LeftShift => wrap(((a as i64) << (b as i64)) as f64, dtype),
        RightShift => ((a as i64) >> (b as i64)) as f64,
    }
}

fn binary_case(op: BinaryOp) {
    use BinaryOp::*;
    let dtypes: Vec<Dtype> = match op {
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift => {
            vec![Dtype::I32, Dtype::U32, Dtype::I64]
        }
        LogicalAnd | LogicalOr => vec![Dtype::Bool, Dtype::F32, Dtype::I32],
        _ => NUMERIC.to_vec(),
    };
    for dtype in dtypes {
        runner()
            .run(
                &(broadcast_pair(), layout(), layout(), any::<u64>()),
                |((sa, sb), la, lb, seed)| {
                    let (alo, ahi, blo, bhi) = match op {
                        Power if dtype.is_float() => (0.1, 3.0, -2.0, 2.0),
                        Power => (-4.0, 4.0, 0.0, 4.0),
                        LeftShift | RightShift => (0.0, 1000.0, 0.0, 7.0),
                        Divide if !dtype.is_float() => (-20.0, 20.0, 1.0, 9.0),
                        Divide => (-20.0, 20.0, 0.5, 9.0),
                        _ if dtype == Dtype::Bool => (0.0, 1.0, 0.0, 1.0),
                        _ => (-20.0, 20.0, -20.0, 20.0),
                    };
                    let x = fill(&sa, dtype, alo, ahi, seed);
                    let y = fill(&sb, dtype, blo, bhi, seed ^ 0x9e37);
                    let (a, b) = (make(&x, dtype, la), make(&y, dtype, lb));
                    let compute = if op == Divide && !dtype.is_float() {
                        Dtype::F32
                    } else {
                        dtype
                    };
                    let out_dtype = if op.is_comparison() {
                        Dtype::Bool
                    } else {
                        compute
                    };
                    let want = zip(&x, &y, |u, v| {
                        quantize(binary_ref(op, u, v, dtype), out_dtype)
                    });
                    let got = mlx_array::ops::binary(op, &a, &b).unwrap();
                    let rel = if op == Power {
                        4.0 * tol(out_dtype)
                    } else {
                        tol(out_dtype)
                    };
                    check(
                        &got,
                        &want,
                        out_dtype,
                        rel,
                        &format!("{} {dtype} {sa:?} {sb:?} {la:?} {lb:?}", op.name()),
                    );
                    Ok(())
                },
            )
            .unwrap();
    }
}

/// Promotion: mixed dtypes give MLX's result type and values.
fn mixed_dtypes() {
    let a = Array::from_slice(&[1i32, -2, 3], &[3]).unwrap();
    let b = Array::from_slice(&[0.5f32, 0.25, 2.0], &[3]).unwrap();
    let c = a.add(&b).unwrap();
    assert_eq!(c.dtype(), Dtype::F32);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![1.5, -1.75, 5.0]);
    let u = Array::from_slice(&[1u32, 2, 3], &[3]).unwrap();
    assert_eq!(a.add(&u).unwrap().dtype(), Dtype::I64);
}

// ---------------------------------------------------------------- where, astype, identity views

fn where_case() {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::Bool] {
        runner()
            .run(
                &(broadcast_pair(), layout(), any::<u64>()),
                |((sa, sb), l, seed)| {
                    let c = fill(&sa, Dtype::Bool, 0.0, 1.0, seed);
                    let x = fill(&sb, dtype, -9.0, 9.0, seed ^ 1);
                    let y = fill(&sa, dtype, -9.0, 9.0, seed ^ 2);
                    let got = mlx_array::where_(
                        &make(&c, Dtype::Bool, l),
                        &make(&x, dtype, Layout::Dense),
                        &make(&y, dtype, l),
                    )
                    .unwrap();
                    let shape =
                        broadcast(&broadcast(&c.shape, &x.shape).unwrap(), &y.shape).unwrap();
                    let want = Nd::from_fn(&shape, |i| {
                        if c.at_broadcast(i) != 0.0 {
                            x.at_broadcast(i)
                        } else {
                            y.at_broadcast(i)
                        }
                    });
                    check(&got, &want, dtype, 0.0, "where");
                    Ok(())
                },
            )
            .unwrap();
    }
}

fn astype_case() {
    for from in mlx_array::ALL_DTYPES {
        for to in mlx_array::ALL_DTYPES {
            runner()
                .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                    let x = fill(&s, from, -300.0, 300.0, seed);
                    let got = make(&x, from, l).astype(to).unwrap();
                    // Rust `as` semantics: floats truncate and saturate; ints wrap.
                    let want = x.map(|v| {
                        if to == Dtype::Bool {
                            (v != 0.0) as u8 as f64
                        } else if from.is_float() || to.is_float() {
                            quantize(v, to)
                        } else {
                            wrap(v, to)
                        }
                    });
                    check(&got, &want, to, tol(to), &format!("astype {from} -> {to}"));
                    Ok(())
                })
                .unwrap();
        }
    }
}

fn identity_case(name: &str, f: fn(&Array) -> Array) {
    for dtype in mlx_array::ALL_DTYPES {
        runner()
            .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                let x = fill(&s, dtype, -9.0, 9.0, seed);
                check(&f(&make(&x, dtype, l)), &x, dtype, 0.0, name);
                Ok(())
            })
            .unwrap();
    }
}

// ---------------------------------------------------------------- shape and views

fn reshape_case() {
    runner()
        .run(
            &(shape(3), layout(), any::<u64>(), any::<bool>()),
            |(s, l, seed, rev)| {
                let x = fill(&s, Dtype::F32, -9.0, 9.0, seed);
                let target: Vec<i64> = if rev {
                    s.iter().rev().map(|&d| d as i64).collect()
                } else {
                    vec![x.v.len() as i64]
                };
                let got = make(&x, Dtype::F32, l).reshape(&target).unwrap();
                let shape: Vec<usize> = target.iter().map(|&d| d as usize).collect();
                check(
                    &got,
                    &Nd::new(&shape, x.v.clone()),
                    Dtype::F32,
                    0.0,
                    "reshape",
                );
                Ok(())
            },
        )
        .unwrap();
}

fn transpose_case() {
    runner()
        .run(
            &(
                nonempty_shape(1, 4),
                layout(),
                any::<u64>(),
                Just(()).prop_perturb(|_, mut r| r.random::<u64>()),
            ),
            |(s, l, seed, pseed)| {
                let x = fill(&s, Dtype::I32, -9.0, 9.0, seed);
                let mut perm: Vec<usize> = (0..s.len()).collect();
                for i in (1..perm.len()).rev() {
                    perm.swap(i, (pseed as usize >> (i * 3)) % (i + 1));
                }
                let got = make(&x, Dtype::I32, l)
                    .transpose(&perm.iter().map(|&p| p as i32).collect::<Vec<_>>())
                    .unwrap();
                let shape: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
                let want = Nd::from_fn(&shape, |i| {
                    let mut src = vec![0; s.len()];
                    for (k, &p) in perm.iter().enumerate() {
                        src[p] = i[k];
                    }
                    x.at(&src)
                });
                check(&got, &want, Dtype::I32, 0.0, "transpose");
                Ok(())
            },
        )
        .unwrap();
}

fn broadcast_to_case() {
    runner()
        .run(
            &(broadcast_pair(), layout(), any::<u64>()),
            |((sa, sb), l, seed)| {
                let x = fill(&sa, Dtype::F16, -9.0, 9.0, seed);
                let target = broadcast(&sa, &sb).unwrap();
                let got = make(&x, Dtype::F16, l).broadcast_to(&target).unwrap();
                check(
                    &got,
                    &Nd::from_fn(&target, |i| x.at_broadcast(i)),
                    Dtype::F16,
                    0.0,
                    "broadcast_to",
                );
                Ok(())
            },
        )
        .unwrap();
}

/// Python slice semantics, written as a filter over all indices.
fn slice_indices(len: usize, a: SliceArg) -> Vec<usize> {
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

fn slice_arg() -> impl Strategy<Value = SliceArg> {
    (
        prop::option::of(-7i64..7),
        prop::option::of(-7i64..7),
        prop_oneof![1i64..4, -3i64..0],
    )
        .prop_map(|(start, stop, step)| SliceArg { start, stop, step })
}

fn slice_case() {
    runner()
        .run(
            &(
                nonempty_shape(1, 3),
                layout(),
                any::<u64>(),
                prop::collection::vec(slice_arg(), 1..3),
            ),
            |(s, l, seed, args)| {
                let args: Vec<SliceArg> = args.into_iter().take(s.len()).collect();
                let x = fill(&s, Dtype::F32, -9.0, 9.0, seed);
                let got = make(&x, Dtype::F32, l).slice(&args).unwrap();
                let picks: Vec<Vec<usize>> = (0..s.len())
                    .map(|d| slice_indices(s[d], args.get(d).copied().unwrap_or(SliceArg::FULL)))
                    .collect();
                let shape: Vec<usize> = picks.iter().map(|p| p.len()).collect();
                let want = Nd::from_fn(&shape, |i| {
                    x.at(&i
                        .iter()
                        .enumerate()
                        .map(|(d, &k)| picks[d][k])
                        .collect::<Vec<_>>())
                });
                check(&got, &want, Dtype::F32, 0.0, &format!("slice {args:?}"));
                Ok(())
            },
        )
        .unwrap();
}

// ---------------------------------------------------------------- indexing

fn take_case() {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::I64, Dtype::Bool] {
        runner()
            .run(
                &(nonempty_shape(1, 3), shape(2), layout(), any::<u64>()),
                |(s, is, l, seed)| {
                    let axis = (seed as usize) % s.len();
                    let x = fill(&s, dtype, -9.0, 9.0, seed);
                    let len = s[axis] as f64;
                    let idx = fill(&is, Dtype::I32, -len, len - 1.0, seed ^ 5);
                    let got = make(&x, dtype, l)
                        .take(&make(&idx, Dtype::I32, Layout::Dense), axis as i32)
                        .unwrap();
                    let mut shape = s[..axis].to_vec();
                    shape.extend(&is);
                    shape.extend(&s[axis + 1..]);
                    let want = Nd::from_fn(&shape, |i| {
                        let j = idx.at(&i[axis..axis + is.len()]) as i64;
                        let j = if j < 0 { j + s[axis] as i64 } else { j } as usize;
                        let mut src = i[..axis].to_vec();
                        src.push(j);
                        src.extend(&i[axis + is.len()..]);
                        x.at(&src)
                    });
                    check(&got, &want, dtype, 0.0, "take");
                    Ok(())
                },
            )
            .unwrap();
    }
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let bad = x
        .take(&Array::from_slice(&[2i32], &[1]).unwrap(), 0)
        .unwrap();
    assert!(bad.eval().unwrap_err().to_string().contains("out of range"));
}

fn take_along_axis_case() {
    runner()
        .run(
            &(nonempty_shape(1, 3), layout(), any::<u64>(), 1usize..4),
            |(s, l, seed, k)| {
                let axis = (seed as usize) % s.len();
                let x = fill(&s, Dtype::F32, -9.0, 9.0, seed);
                let mut is = s.clone();
                is[axis] = k;
                let idx = fill(&is, Dtype::I64, 0.0, s[axis] as f64 - 1.0, seed ^ 3);
                let got = make(&x, Dtype::F32, l)
                    .take_along_axis(&make(&idx, Dtype::I64, Layout::Dense), axis as i32)
                    .unwrap();
                let want = Nd::from_fn(&is, |i| {
                    let mut src = i.to_vec();
                    src[axis] = idx.at(i) as usize;
                    x.at(&src)
                });
                check(&got, &want, Dtype::F32, 0.0, "take_along_axis");
                Ok(())
            },
        )
        .unwrap();
}

fn concatenate_case() {
    runner()
        .run(
            &(
                nonempty_shape(1, 3),
                prop::collection::vec(0usize..4, 2..4),
                layout(),
                any::<u64>(),
            ),
            |(s, lens, l, seed)| {
                let axis = (seed as usize) % s.len();
                let parts: Vec<Nd> = lens
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| {
                        let mut p = s.clone();
                        p[axis] = n;
                        fill(&p, Dtype::F32, -9.0, 9.0, seed ^ i as u64)
                    })
                    .collect();
                let dtypes = [Dtype::F32, Dtype::I32, Dtype::BF16];
                let arrays: Vec<Array> = parts
                    .iter()
                    .enumerate()
                    .map(|(i, p)| make(p, if i == 0 { Dtype::F32 } else { dtypes[i % 3] }, l))
                    .collect();
                let got = mlx_array::concatenate(&arrays, axis as i32).unwrap();
                let mut shape = s.clone();
                shape[axis] = lens.iter().sum();
                let want = Nd::from_fn(&shape, |i| {
                    let mut j = i[axis];
                    for (k, p) in parts.iter().enumerate() {
                        if j < lens[k] {
                            let mut src = i.to_vec();
                            src[axis] = j;
                            let d = if k == 0 { Dtype::F32 } else { dtypes[k % 3] };
                            return quantize(p.at(&src), d);
                        }
                        j -= lens[k];
                    }
                    unreachable!()
                });
                check(&got, &want, Dtype::F32, 0.0, "concatenate");
                Ok(())
            },
        )
        .unwrap();
}

fn pad_case() {
    runner()
        .run(
            &(
                shape(3),
                layout(),
                any::<u64>(),
                prop::collection::vec((0usize..3, 0usize..3), 3),
            ),
            |(s, l, seed, w)| {
                let w = &w[..s.len()];
                let x = fill(&s, Dtype::I32, -9.0, 9.0, seed);
                let got = make(&x, Dtype::I32, l).pad(w, -5.0).unwrap();
                let shape: Vec<usize> = s.iter().zip(w).map(|(&d, &(a, b))| d + a + b).collect();
                let want = Nd::from_fn(&shape, |i| {
                    let inside = i
                        .iter()
                        .zip(w)
                        .zip(&s)
                        .all(|((&k, &(a, _)), &d)| k >= a && k < a + d);
                    if inside {
                        x.at(&i
                            .iter()
                            .zip(w)
                            .map(|(&k, &(a, _))| k - a)
                            .collect::<Vec<_>>())
                    } else {
                        -5.0
                    }
                });
                check(&got, &want, Dtype::I32, 0.0, "pad");
                Ok(())
            },
        )
        .unwrap();
}

// ---------------------------------------------------------------- creation, random

fn arange_case() {
    for dtype in [Dtype::F32, Dtype::I32, Dtype::I64, Dtype::BF16] {
        runner()
            .run(
                &(-20i32..20, -20i32..20, prop_oneof![1i32..4, -4i32..-1]),
                |(start, stop, step)| {
                    let got =
                        mlx_array::arange(start as f64, stop as f64, step as f64, dtype).unwrap();
                    let mut v = vec![];
                    let mut x = start;
                    while (step > 0 && x < stop) || (step < 0 && x > stop) {
                        v.push(quantize(x as f64, dtype));
                        x += step;
                    }
                    check(&got, &Nd::new(&[v.len()], v), dtype, 0.0, "arange");
                    Ok(())
                },
            )
            .unwrap();
    }
    assert!(mlx_array::arange(0.0, 1.0, 0.0, Dtype::F32).is_err());
}

/// Threefry-2x32-20 written from the Random123 specification, independently
/// of the library's version.
fn threefry_ref(k: [u32; 2], c: [u32; 2]) -> [u32; 2] {
    const R: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
    let ks = [k[0], k[1], 0x1BD11BDA ^ k[0] ^ k[1]];
    let (mut x0, mut x1) = (c[0].wrapping_add(ks[0]), c[1].wrapping_add(ks[1]));
    for r in 0..20 {
        x0 = x0.wrapping_add(x1);
        x1 = x1.rotate_left(R[r % 8]) ^ x0;
        if r % 4 == 3 {
            let s = r / 4 + 1;
            x0 = x0.wrapping_add(ks[s % 3]);
            x1 = x1.wrapping_add(ks[(s + 1) % 3]).wrapping_add(s as u32);
        }
    }
    [x0, x1]
}

fn random_bits_case() {
    runner()
        .run(&(any::<u64>(), shape(3)), |(seed, s)| {
            let k = mlx_array::random::key(seed);
            let got = mlx_array::random::bits(&k, &s).unwrap();
            let kk = [(seed >> 32) as u32, seed as u32];
            let n = size(&s);
            let want: Vec<f64> = (0..n)
                .map(|i| threefry_ref(kk, [(i / 2) as u32, 0])[i % 2] as f64)
                .collect();
            check(&got, &Nd::new(&s, want), Dtype::U32, 0.0, "random_bits");
            Ok(())
        })
        .unwrap();
}

// ---------------------------------------------------------------- gradient helpers and the fused loss

fn scatter_add_case() {
    runner()
        .run(
            &(nonempty_shape(1, 3), shape(2), any::<u64>()),
            |(s, is, seed)| {
                // The gradient of take: rows of ct added at their indices (repeats accumulate).
                let axis = seed as usize % s.len();
                let len = s[axis] as f64;
                let idx = fill(&is, Dtype::I32, 0.0, len - 1.0, seed ^ 1);
                let mut cs = s[..axis].to_vec();
                cs.extend(&is);
                cs.extend(&s[axis + 1..]);
                let ct = fill(&cs, Dtype::F32, -3.0, 3.0, seed ^ 2);
                let prim = mlx_array::primitives::indexing::ScatterAdd {
                    axis,
                    along_axis: false,
                };
                let got = Array::from_primitive(
                    prim,
                    vec![
                        make(&ct, Dtype::F32, Layout::Dense),
                        make(&idx, Dtype::I32, Layout::Dense),
                    ],
                    s.clone(),
                    Dtype::F32,
                );
                let mut want = Nd::from_fn(&s, |_| 0.0);
                for_each_index(&cs, |i| {
                    let mut dst = i[..axis].to_vec();
                    dst.push(idx.at(&i[axis..axis + is.len()]) as usize);
                    dst.extend(&i[axis + is.len()..]);
                    let k = want.flat_index(&dst);
                    want.v[k] += ct.at(i);
                });
                check(&got, &want, Dtype::F32, 1e-5, "scatter_add");
                Ok(())
            },
        )
        .unwrap();
    runner()
        .run(
            &(nonempty_shape(1, 3), any::<u64>(), 1usize..4),
            |(s, seed, k)| {
                let axis = seed as usize % s.len();
                let mut is = s.clone();
                is[axis] = k;
                let idx = fill(&is, Dtype::I64, 0.0, s[axis] as f64 - 1.0, seed ^ 3);
                let ct = fill(&is, Dtype::F32, -3.0, 3.0, seed ^ 4);
                let prim = mlx_array::primitives::indexing::ScatterAdd {
                    axis,
                    along_axis: true,
                };
                let got = Array::from_primitive(
                    prim,
                    vec![
                        make(&ct, Dtype::F32, Layout::Dense),
                        make(&idx, Dtype::I64, Layout::Dense),
                    ],
                    s.clone(),
                    Dtype::F32,
                );
                let mut want = Nd::from_fn(&s, |_| 0.0);
                for_each_index(&is, |i| {
                    let mut dst = i.to_vec();
                    dst[axis] = idx.at(i) as usize;
                    let f = want.flat_index(&dst);
                    want.v[f] += ct.at(i);
                });
                check(&got, &want, Dtype::F32, 1e-5, "scatter_add along axis");
                Ok(())
            },
        )
        .unwrap();
}

fn slice_update_case() {
    runner()
        .run(
            &(
                nonempty_shape(1, 3),
                layout(),
                any::<u64>(),
                prop::collection::vec(slice_arg(), 1..3),
            ),
            |(s, l, seed, args)| {
                let args: Vec<SliceArg> = args.into_iter().take(s.len()).collect();
                let x = fill(&s, Dtype::I32, -9.0, 9.0, seed);
                let picks: Vec<Vec<usize>> = (0..s.len())
                    .map(|d| slice_indices(s[d], args.get(d).copied().unwrap_or(SliceArg::FULL)))
                    .collect();
                let wshape: Vec<usize> = picks.iter().map(|p| p.len()).collect();
                let u = fill(&wshape, Dtype::I32, 100.0, 200.0, seed ^ 9);
                let got = make(&x, Dtype::I32, l)
                    .slice_update(&make(&u, Dtype::I32, l), &args)
                    .unwrap();
                let mut want = x.clone();
                for_each_index(&wshape, |i| {
                    let dst: Vec<usize> = i.iter().enumerate().map(|(d, &k)| picks[d][k]).collect();
                    let f = want.flat_index(&dst);
                    want.v[f] = u.at(i);
                });
                check(
                    &got,
                    &want,
                    Dtype::I32,
                    0.0,
                    &format!("slice_update {args:?}"),
                );
                Ok(())
            },
        )
        .unwrap();
}

// ---------------------------------------------------------------- swiglu

/// `swiglu` against `g / (1 + e^-g) * u` in f64, with broadcasting and
/// strided inputs, over every float dtype; integers are refused.
fn swiglu_case() {
    for dtype in FLOATS {
        runner()
            .run(
                &(broadcast_pair(), layout(), layout(), any::<u64>()),
                |((sa, sb), la, lb, seed)| {
                    let x = fill(&sa, dtype, -8.0, 8.0, seed);
                    let y = fill(&sb, dtype, -3.0, 3.0, seed ^ 0x51);
                    let want = zip(&x, &y, |g, u| quantize(g / (1.0 + (-g).exp()) * u, dtype));
                    let got =
                        mlx_array::swiglu(&make(&x, dtype, la), &make(&y, dtype, lb)).unwrap();
                    check(
                        &got,
                        &want,
                        dtype,
                        tol(dtype) * 4.0,
                        &format!("swiglu {dtype} {sa:?} {sb:?}"),
                    );
                    Ok(())
                },
            )
            .unwrap();
    }
    let i = Array::from_slice(&[1i32, 2], &[2]).unwrap();
    let err = mlx_array::swiglu(&i, &i).unwrap_err().to_string();
    assert!(err.contains("floating point"), "{err}");
    let extreme = Array::from_slice(&[-200.0f32, 200.0, 0.0], &[3]).unwrap();
    let got = mlx_array::swiglu(&extreme, &extreme.scalar_like(2.0)).unwrap();
    assert_eq!(
        got.to_vec::<f32>().unwrap(),
        [0.0, 400.0, 0.0],
        "no overflow at the extremes"
    );
}

// ---------------------------------------------------------------- the table

fn case_for(name: &str) -> Option<Box<dyn Fn()>> {
    if let Some(&op) = UnaryOp::ALL.iter().find(|o| o.name() == name) {
        return Some(Box::new(move || unary_case(op)));
    }
    if let Some(&op) = BinaryOp::ALL.iter().find(|o| o.name() == name) {
        return Some(Box::new(move || {
            binary_case(op);
            mixed_dtypes();
        }));
    }
    Some(match name {
        "where" => Box::new(where_case),
        "astype" => Box::new(astype_case),
        "stop_gradient" => {
            Box::new(|| identity_case("stop_gradient", |a| a.stop_gradient().unwrap()))
        }
        "contiguous" => Box::new(|| identity_case("contiguous", |a| a.contiguous().unwrap())),
        "reshape" => Box::new(reshape_case),
        "transpose" => Box::new(transpose_case),
        "broadcast_to" => Box::new(broadcast_to_case),
        "slice" => Box::new(slice_case),
        "take" => Box::new(take_case),
        "take_along_axis" => Box::new(take_along_axis_case),
        "concatenate" => Box::new(concatenate_case),
        "pad" => Box::new(pad_case),
        "arange" => Box::new(arange_case),
        "random_bits" => Box::new(random_bits_case),
        "scatter_add" => Box::new(scatter_add_case),
        "slice_update" => Box::new(slice_update_case),
        "swiglu" => Box::new(swiglu_case),
        "tracer" => Box::new(|| {
            identity_case("tracer", |a| {
                Array::from_primitive(
                    mlx_array::autodiff::Tracer,
                    vec![a.clone()],
                    a.shape().to_vec(),
                    a.dtype(),
                )
            })
        }),
        _ => return None,
    })
}

/// The primitives not yet checked by `tests/conformance.rs`.
fn unspecified() -> Vec<&'static str> {
    let specified: Vec<&str> = mlx_array::conformance::specs()
        .iter()
        .map(|s| s.name())
        .collect();
    mlx_array::primitive_names()
        .into_iter()
        .filter(|n| !specified.contains(n))
        .collect()
}

#[test]
fn every_primitive_is_covered() {
    let missing: Vec<&str> = unspecified()
        .into_iter()
        .filter(|n| case_for(n).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "primitives without a conformance case: {missing:?}"
    );
}

#[test]
fn every_primitive_matches_the_reference() {
    use rayon::prelude::*;
    let failures: Vec<String> = unspecified()
        .into_par_iter()
        .filter_map(|name| {
            let case = case_for(name)?;
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(case))
                .err()
                .map(|e| {
                    let msg = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
                    format!("{name}: {}", msg.unwrap_or_default())
                })
        })
        .collect();
    assert!(
        failures.is_empty(),
        "{} primitive(s) failed:\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}
