//! Conformance specifications of the elementwise primitives: f64
//! references, the dtypes and input ranges each one is checked over, and
//! their gradient cases.

use proptest::prelude::*;

use super::{
    AsType, Binary, BinaryOp, RememberedCast, Select, StopGradient, Swiglu, Unary, UnaryOp,
};
use crate::conformance::*;
use crate::{ALL_DTYPES, Array, Device, Dtype, ops};

/// Every elementwise primitive's specification.
pub fn specs() -> Vec<Spec> {
    let mut specs: Vec<Spec> = UnaryOp::ALL.iter().map(|&op| unary(op)).collect();
    specs.extend(BinaryOp::ALL.iter().map(|&op| binary(op)));
    specs.extend([
        Spec::new::<Select>("where", where_values, || {
            let c = Array::from_slice(&[1u32, 0, 1], &[3])
                .and_then(|c| c.astype(Dtype::Bool))
                .expect("condition");
            GradCase::new(
                vec![
                    uniform(4, &[2, 3], -2.0, 2.0),
                    uniform(5, &[2, 1], -1.0, 1.0),
                ],
                &[0, 1],
                move |a| c.where_(&a[0], &a[1]),
            )
        }),
        Spec::new::<AsType>("astype", astype_values, || {
            // f16 input: the cast is linear, so finite differences are exact at any step.
            let h = uniform(6, &[2, 3], -2.0, 2.0)
                .astype(Dtype::F16)
                .expect("f16");
            GradCase::new(vec![h], &[0], |a| a[0].astype(Dtype::F32)?.mul_scalar(3.0))
        }),
        Spec::new::<RememberedCast>("remembered_cast", remembered_cast_values, || {
            // A fresh node per call remembers its cast (a tracer stands in
            // for it while differentiating); f16 to f32 is linear, so
            // finite differences are exact.
            let h = uniform(7, &[2, 3], -2.0, 2.0)
                .astype(Dtype::F16)
                .expect("f16");
            GradCase::new(vec![h], &[0], |a| {
                let x = a[0].mul_scalar(1.0)?;
                x.remember_cast(&x.astype(Dtype::F32)?)?;
                x.astype(Dtype::F32)?.mul_scalar(3.0)
            })
        }),
        Spec::new::<StopGradient>(
            "stop_gradient",
            |cx: &Ctx| identity_values(cx, "stop_gradient", |a| a.stop_gradient()),
            || {
                GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |x| {
                    x[0].stop_gradient()
                })
                .zero()
            },
        ),
        Spec::new::<Swiglu>("swiglu", swiglu_values, || {
            GradCase::new(
                vec![
                    uniform(29, &[2, 3], -3.0, 3.0),
                    uniform(30, &[3], -2.0, 2.0),
                ],
                &[0, 1],
                |a| crate::swiglu(&a[0], &a[1]),
            )
        }),
    ]);
    specs
}

// ---------------------------------------------------------------- unary

/// The f64 reference of each unary function.
fn unary_reference(op: UnaryOp, x: f64) -> f64 {
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

/// Where each unary function is checked, its dtypes, and whether a
/// gradient flows through it.
struct UnaryDomain {
    lo: f64,
    hi: f64,
    dtypes: Vec<Dtype>,
    differentiable: bool,
}

fn unary_domain(op: UnaryOp) -> UnaryDomain {
    use UnaryOp::*;
    let (lo, hi) = match op {
        Log | Sqrt | Rsqrt => (0.05, 9.0),
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
    UnaryDomain {
        lo,
        hi,
        dtypes,
        differentiable: !matches!(op, Sign | Floor | LogicalNot),
    }
}

fn unary(op: UnaryOp) -> Spec {
    Spec::new::<Unary>(
        op.name(),
        move |cx| unary_values(cx, op),
        move || unary_grad(op),
    )
}

fn unary_values(cx: &Ctx, op: UnaryOp) {
    use UnaryOp::*;
    let d = unary_domain(op);
    for dtype in cx.dtypes(&d.dtypes) {
        cx.runner()
            .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                let x = fill(&s, dtype, d.lo, d.hi, seed);
                let a = make(&x, dtype, l);
                let out_dtype = if op == LogicalNot { Dtype::Bool } else { dtype };
                let want = x.map(|v| quantize(unary_reference(op, v), out_dtype));
                let got = cx.on(|| ops::unary(op, &a)).expect("unary");
                let rel = if matches!(op, Sin | Cos | Erf | Tanh) && dtype == Dtype::F32 {
                    5e-5
                } else {
                    tol(out_dtype)
                };
                cx.check(
                    &got,
                    &want,
                    out_dtype,
                    rel,
                    &format!("{} {dtype} {l:?}", op.name()),
                );
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn unary_grad(op: UnaryOp) -> GradCase {
    use UnaryOp::*;
    let x = match op {
        Log | Sqrt | Rsqrt => uniform(1, &[2, 3], 0.5, 3.0),
        Log1p => uniform(1, &[2, 3], -0.5, 3.0),
        Abs | Sign | Floor => spread(1, &[2, 3]),
        _ => uniform(1, &[2, 3], -2.0, 2.0),
    };
    // Through a transposed view, so strided inputs are covered too.
    let case = GradCase::new(vec![x], &[0], move |a| ops::unary(op, &a[0].t()?));
    if unary_domain(op).differentiable {
        case
    } else {
        case.zero()
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

/// The f64 reference of each binary function in `dtype`.
fn binary_reference(op: BinaryOp, a: f64, b: f64, dtype: Dtype) -> f64 {
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

fn binary(op: BinaryOp) -> Spec {
    Spec::new::<Binary>(
        op.name(),
        move |cx| {
            binary_values(cx, op);
            mixed_dtypes(cx);
        },
        move || binary_grad(op),
    )
}

fn binary_values(cx: &Ctx, op: BinaryOp) {
    use BinaryOp::*;
    let dtypes: Vec<Dtype> = match op {
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift => {
            vec![Dtype::I32, Dtype::U32, Dtype::I64]
        }
        LogicalAnd | LogicalOr => vec![Dtype::Bool, Dtype::F32, Dtype::I32],
        _ => NUMERIC.to_vec(),
    };
    for dtype in cx.dtypes(&dtypes) {
        cx.runner()
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
                        quantize(binary_reference(op, u, v, dtype), out_dtype)
                    });
                    let got = cx.on(|| ops::binary(op, &a, &b)).expect("binary");
                    let rel = if op == Power {
                        4.0 * tol(out_dtype)
                    } else {
                        tol(out_dtype)
                    };
                    let what = format!("{} {dtype} {sa:?} {sb:?} {la:?} {lb:?}", op.name());
                    cx.check(&got, &want, out_dtype, rel, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Promotion: mixed dtypes give MLX's result type and values.
fn mixed_dtypes(cx: &Ctx) {
    let a = ints(&[1, -2, 3], &[3]);
    let b = Array::from_slice(&[0.5f32, 0.25, 2.0], &[3]).expect("b");
    let c = cx.on(|| a.add(&b)).expect("add");
    cx.check(
        &c,
        &Nd::new(&[3], vec![1.5, -1.75, 5.0]),
        Dtype::F32,
        0.0,
        "i32 + f32",
    );
    let u = Array::from_slice(&[1u32, 2, 3], &[3]).expect("u");
    assert_eq!(
        cx.on(|| a.add(&u)).expect("add").dtype(),
        Dtype::I64,
        "i32 + u32"
    );
}

fn binary_grad(op: BinaryOp) -> GradCase {
    use BinaryOp::*;
    let (a, b) = match op {
        Power => (uniform(2, &[2, 3], 0.5, 2.0), uniform(3, &[3], -1.5, 1.5)),
        Divide => (uniform(2, &[2, 3], -2.0, 2.0), uniform(3, &[3], 0.5, 2.0)),
        Maximum | Minimum => (
            spread(2, &[2, 3]),
            spread(3, &[3]).mul_scalar(1.1).expect("scale"),
        ),
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift => {
            // Integer-only ops: a float input passes through an integer cast.
            let x = uniform(2, &[2, 3], 0.0, 8.0);
            return GradCase::new(vec![x], &[0], move |a| {
                let i = a[0].astype(Dtype::I32)?;
                ops::binary(op, &i, &ints(&[1, 2, 3], &[3]))
            })
            .zero();
        }
        _ => (uniform(2, &[2, 3], -2.0, 2.0), uniform(3, &[3], -2.0, 2.0)),
    };
    // `b` broadcasts along the first axis, so BroadcastTo's gradient is covered.
    let case = GradCase::new(vec![a, b], &[0, 1], move |x| ops::binary(op, &x[0], &x[1]));
    if op.is_comparison() {
        case.zero()
    } else {
        case
    }
}

// ---------------------------------------------------------------- where, astype, identity, swiglu

fn where_values(cx: &Ctx) {
    for dtype in [Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::Bool] {
        cx.runner()
            .run(
                &(broadcast_pair(), layout(), any::<u64>()),
                |((sa, sb), l, seed)| {
                    let c = fill(&sa, Dtype::Bool, 0.0, 1.0, seed);
                    let x = fill(&sb, dtype, -9.0, 9.0, seed ^ 1);
                    let y = fill(&sa, dtype, -9.0, 9.0, seed ^ 2);
                    let (mc, mx, my) = (
                        make(&c, Dtype::Bool, l),
                        make(&x, dtype, Layout::Dense),
                        make(&y, dtype, l),
                    );
                    let got = cx.on(|| crate::where_(&mc, &mx, &my)).expect("where");
                    let shape = broadcast(&broadcast(&c.shape, &x.shape).expect("c, x"), &y.shape)
                        .expect("c, x, y");
                    let want = Nd::from_fn(&shape, |i| {
                        if c.at_broadcast(i) != 0.0 {
                            x.at_broadcast(i)
                        } else {
                            y.at_broadcast(i)
                        }
                    });
                    cx.check(&got, &want, dtype, 0.0, "where");
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn astype_values(cx: &Ctx) {
    for from in cx.dtypes(&ALL_DTYPES) {
        for to in cx.dtypes(&ALL_DTYPES) {
            cx.runner()
                .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                    let x = fill(&s, from, -300.0, 300.0, seed);
                    let a = make(&x, from, l);
                    let got = cx.on(|| a.astype(to)).expect("astype");
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
                    let what = format!("astype {from} -> {to}");
                    if from == to {
                        // The same dtype: the input itself, wherever it lives.
                        assert_close(&got, &want, to, 0.0, &what);
                    } else {
                        cx.check(&got, &want, to, tol(to), &what);
                    }
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A cast recorded beside its source (`Array::remember_cast`) between every
/// pair of float dtypes, on the device under test: `astype` then builds a
/// `remembered_cast` node whose values are the recorded copy's, bit for
/// bit, and the cast's against the f64 reference.
fn remembered_cast_values(cx: &Ctx) {
    for from in FLOATS {
        for to in FLOATS.into_iter().filter(|&to| to != from) {
            cx.runner()
                .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                    let x = fill(&s, from, -300.0, 300.0, seed);
                    let a = cx.on(|| make(&x, from, l).to_device(cx.device()));
                    let copy = cx.on(|| a.astype(to)).expect("astype");
                    crate::eval((&a, &copy)).expect("evaluated");
                    a.remember_cast(&copy).expect("remembered");
                    let got = cx.on(|| a.astype(to)).expect("astype");
                    let what = format!("remembered_cast {from} -> {to}");
                    assert_eq!(got.primitive_name(), Some("remembered_cast"), "{what}");
                    assert_eq!(got.device(), cx.device(), "{what}");
                    let bits = |v: &Array| -> Vec<u32> {
                        let v = v.astype(Dtype::F32).and_then(|v| v.to_vec::<f32>());
                        v.expect("values").iter().map(|f| f.to_bits()).collect()
                    };
                    assert_eq!(bits(&got), bits(&copy), "{what}: the copy's values");
                    cx.check(&got, &x.map(|v| quantize(v, to)), to, tol(to), &what);
                    Ok(())
                })
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// A primitive that returns its input's values unchanged, over every dtype
/// and layout.
pub(crate) fn identity_values(cx: &Ctx, name: &str, f: fn(&Array) -> crate::Result<Array>) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                let x = fill(&s, dtype, -9.0, 9.0, seed);
                let a = make(&x, dtype, l);
                let got = cx.on(|| f(&a)).expect(name);
                cx.check(&got, &x, dtype, 0.0, name);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

fn swiglu_values(cx: &Ctx) {
    for dtype in FLOATS {
        cx.runner()
            .run(
                &(broadcast_pair(), layout(), layout(), any::<u64>()),
                |((sa, sb), la, lb, seed)| {
                    let x = fill(&sa, dtype, -8.0, 8.0, seed);
                    let y = fill(&sb, dtype, -3.0, 3.0, seed ^ 0x51);
                    let want = zip(&x, &y, |g, u| quantize(g / (1.0 + (-g).exp()) * u, dtype));
                    let (g, u) = (make(&x, dtype, la), make(&y, dtype, lb));
                    let got = cx.on(|| crate::swiglu(&g, &u)).expect("swiglu");
                    let what = format!("swiglu {dtype} {sa:?} {sb:?}");
                    cx.check(&got, &want, dtype, tol(dtype) * 4.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let i = ints(&[1, 2], &[2]);
    let err = cx
        .on(|| crate::swiglu(&i, &i))
        .expect_err("ints refused")
        .to_string();
    assert!(err.contains("floating point"), "{err}");
    let extreme = Array::from_slice(&[-200.0f32, 200.0, 0.0], &[3]).expect("extreme");
    let got = cx
        .on(|| crate::swiglu(&extreme, &extreme.scalar_like(2.0)))
        .expect("swiglu");
    cx.check(
        &got,
        &Nd::new(&[3], vec![0.0, 400.0, 0.0]),
        Dtype::F32,
        0.0,
        "no overflow at the extremes",
    );
    if cx.device() == Device::Gpu {
        swiglu_gradient_kernels();
    }
}

/// On the GPU, swiglu's two gradients take one kernel each (each use of the
/// sigmoid is its own node, computed inline by its one reader), and equal
/// the CPU's composite (which shares them) within the GPU's slack.
fn swiglu_gradient_kernels() {
    let g = make(
        &fill(&[4, 8], Dtype::F32, -6.0, 6.0, 3),
        Dtype::F32,
        Layout::Dense,
    );
    let u = make(
        &fill(&[4, 8], Dtype::F32, -2.0, 2.0, 4),
        Dtype::F32,
        Layout::Dense,
    );
    let ct = make(
        &fill(&[4, 8], Dtype::F32, -1.0, 1.0, 5),
        Dtype::F32,
        Layout::Dense,
    );
    let grads = |device: Device| {
        crate::device::with_device(device, || {
            let [g, u, ct] = [&g, &u, &ct].map(|a| a.to_device(device));
            crate::eval([&g, &u, &ct]).expect("inputs");
            let f = |a: &[Array]| Ok(vec![crate::swiglu(&a[0], &a[1])?]);
            let (_, grads) = crate::vjp(f, &[g, u], &[ct]).expect("vjp");
            let before = crate::backend::gpu::dispatch_count();
            crate::eval(&grads).expect("gradients");
            (grads, crate::backend::gpu::dispatch_count() - before)
        })
    };
    let (gpu, kernels) = grads(Device::Gpu);
    assert_eq!(kernels, 2, "swiglu's gradients on the GPU: one kernel each");
    let (cpu, _) = grads(Device::Cpu);
    for (k, (a, b)) in gpu.iter().zip(&cpu).enumerate() {
        let want = Nd::new(b.shape(), values(b));
        assert_close(
            a,
            &want,
            Dtype::F32,
            tol(Dtype::F32) + gpu_slack(Dtype::F32),
            &format!("swiglu gradient {k}"),
        );
    }
}
