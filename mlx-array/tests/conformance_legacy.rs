//! What remains of the hand-written conformance suite while primitives move
//! to specifications next to them (`tests/conformance.rs` runs those): every
//! primitive in `primitive_names()` without a specification is checked
//! against the simple f64 reference in `common` on random inputs (proptest),
//! over its dtypes, odd shapes (0- and 1-sized axes) and non-contiguous
//! layouts. A primitive without a case here fails `every_primitive_is_covered`.

mod common;

use common::*;
use mlx_array::primitives::elementwise::{BinaryOp, UnaryOp};
use mlx_array::{Array, Dtype};
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
        "swiglu" => Box::new(swiglu_case),
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
