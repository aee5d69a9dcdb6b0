//! Gradient checks generated from the primitive list: every differentiable
//! primitive's vector-Jacobian product is compared with central finite
//! differences of a random projection of its output, through broadcasting
//! and strided views; non-differentiable primitives must contribute zero.

use mlx_array::primitives::elementwise::{BinaryOp, UnaryOp};
use mlx_array::{Array, Dtype, Result, random, value_and_grad};

/// A function of the primitive's inputs.
type Apply = Box<dyn Fn(&[Array]) -> Result<Array>>;

/// How a primitive is exercised: its inputs, which of them are
/// differentiated, and a function that applies the primitive.
struct Case {
    inputs: Vec<Array>,
    diff: Vec<usize>,
    f: Apply,
    /// True when the gradient must be exactly zero (no gradient flows).
    zero: bool,
}

fn uniform(seed: u64, shape: &[usize], lo: f64, hi: f64) -> Array {
    let a = random::uniform(&random::key(seed), lo, hi, shape, Dtype::F32).unwrap();
    a.eval().unwrap();
    a
}

/// Values kept at least `gap` away from each other and from integers, so that
/// max/min/abs/floor are smooth within the finite-difference step.
fn spread(seed: u64, shape: &[usize]) -> Array {
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n)
        .map(|i| (i as f32) * 0.37 + 0.2 - n as f32 * 0.18)
        .collect();
    let mut s = seed;
    for i in (1..n).rev() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    Array::from_slice(&v, shape).unwrap()
}

fn ints(v: &[i32], shape: &[usize]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

fn case(
    inputs: Vec<Array>,
    diff: &[usize],
    f: impl Fn(&[Array]) -> Result<Array> + 'static,
) -> Option<Case> {
    Some(Case {
        inputs,
        diff: diff.to_vec(),
        f: Box::new(f),
        zero: false,
    })
}

fn zero_case(
    inputs: Vec<Array>,
    diff: &[usize],
    f: impl Fn(&[Array]) -> Result<Array> + 'static,
) -> Option<Case> {
    Some(Case {
        inputs,
        diff: diff.to_vec(),
        f: Box::new(f),
        zero: true,
    })
}

fn unary(op: UnaryOp) -> Option<Case> {
    use UnaryOp::*;
    let x = match op {
        Log | Sqrt | Rsqrt => uniform(1, &[2, 3], 0.5, 3.0),
        Log1p => uniform(1, &[2, 3], -0.5, 3.0),
        Abs | Sign | Floor => spread(1, &[2, 3]),
        _ => uniform(1, &[2, 3], -2.0, 2.0),
    };
    // Through a transposed view, so strided inputs are covered too.
    let f = move |a: &[Array]| mlx_array::ops::unary(op, &a[0].t()?);
    if matches!(op, Sign | Floor | LogicalNot) {
        zero_case(vec![x], &[0], f)
    } else {
        case(vec![x], &[0], f)
    }
}

fn binary(op: BinaryOp) -> Option<Case> {
    use BinaryOp::*;
    let (a, b) = match op {
        Power => (uniform(2, &[2, 3], 0.5, 2.0), uniform(3, &[3], -1.5, 1.5)),
        Divide => (uniform(2, &[2, 3], -2.0, 2.0), uniform(3, &[3], 0.5, 2.0)),
        Maximum | Minimum => (spread(2, &[2, 3]), spread(3, &[3]).mul_scalar(1.1).unwrap()),
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift => {
            // Integer-only ops: a float input passes through an integer cast.
            let x = uniform(2, &[2, 3], 0.0, 8.0);
            return zero_case(vec![x], &[0], move |a| {
                let i = a[0].astype(Dtype::I32)?;
                mlx_array::ops::binary(op, &i, &ints(&[1, 2, 3], &[3]))
            });
        }
        _ => (uniform(2, &[2, 3], -2.0, 2.0), uniform(3, &[3], -2.0, 2.0)),
    };
    // `b` broadcasts along the first axis, so BroadcastTo's gradient is covered.
    let f = move |x: &[Array]| mlx_array::ops::binary(op, &x[0], &x[1]);
    if op.is_comparison() {
        zero_case(vec![a, b], &[0, 1], f)
    } else {
        case(vec![a, b], &[0, 1], f)
    }
}

fn grad_case(name: &str) -> Option<Case> {
    if let Some(&op) = UnaryOp::ALL.iter().find(|o| o.name() == name) {
        return unary(op);
    }
    if let Some(&op) = BinaryOp::ALL.iter().find(|o| o.name() == name) {
        return binary(op);
    }
    let x23 = || uniform(4, &[2, 3], -2.0, 2.0);
    match name {
        "where" => {
            let c = Array::from_slice(&[1u32, 0, 1], &[3])
                .unwrap()
                .astype(Dtype::Bool)
                .unwrap();
            case(
                vec![x23(), uniform(5, &[2, 1], -1.0, 1.0)],
                &[0, 1],
                move |a| c.where_(&a[0], &a[1]),
            )
        }
        "astype" => {
            // f16 input: the cast is linear, so finite differences are exact at any step.
            let h = uniform(6, &[2, 3], -2.0, 2.0).astype(Dtype::F16).unwrap();
            case(vec![h], &[0], |a| a[0].astype(Dtype::F32)?.mul_scalar(3.0))
        }
        "stop_gradient" => zero_case(vec![x23()], &[0], |a| a[0].stop_gradient()),
        "swiglu" => case(
            vec![
                uniform(29, &[2, 3], -3.0, 3.0),
                uniform(30, &[3], -2.0, 2.0),
            ],
            &[0, 1],
            |a| mlx_array::swiglu(&a[0], &a[1]),
        ),
        _ => None,
    }
}

/// Primitives that deliberately have no vector-Jacobian product.
const NO_VJP: &[&str] = &[];

fn check(name: &str, c: Case) {
    let out0 = (c.f)(&c.inputs).unwrap();
    let w = random::normal(&random::key(99), out0.shape(), Dtype::F32).unwrap();
    w.eval().unwrap();
    let f = &c.f;
    let loss = |xs: &[Array]| (f)(xs)?.astype(Dtype::F32)?.multiply(&w)?.sum_all();
    let (_, grads) = value_and_grad(loss, &c.diff)(&c.inputs).unwrap();
    for (k, &i) in c.diff.iter().enumerate() {
        let g = grads[k]
            .astype(Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        assert_eq!(
            grads[k].shape(),
            c.inputs[i].shape(),
            "{name}: gradient shape for input {i}"
        );
        if c.zero {
            assert!(
                g.iter().all(|&v| v == 0.0),
                "{name}: expected no gradient, got {g:?}"
            );
            continue;
        }
        let x = c.inputs[i]
            .astype(Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap();
        let dtype = c.inputs[i].dtype();
        let eps = if dtype == Dtype::F32 { 1e-2 } else { 0.125 };
        for j in 0..x.len() {
            let at = |d: f32| -> f64 {
                let mut v = x.clone();
                v[j] += d;
                let mut xs = c.inputs.clone();
                xs[i] = Array::from_slice(&v, c.inputs[i].shape())
                    .unwrap()
                    .astype(dtype)
                    .unwrap();
                loss(&xs).unwrap().item::<f32>().unwrap() as f64
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps as f64);
            let tol = 5e-3 + 1e-2 * fd.abs();
            assert!(
                (g[j] as f64 - fd).abs() <= tol,
                "{name}: d/dx{i}[{j}] autodiff {} vs finite difference {fd}",
                g[j]
            );
        }
    }
}

/// The primitives whose gradients `tests/conformance.rs` does not check yet.
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
fn every_primitive_has_a_gradient_case() {
    let missing: Vec<&str> = unspecified()
        .into_iter()
        .filter(|n| grad_case(n).is_none() && !NO_VJP.contains(n))
        .collect();
    assert!(
        missing.is_empty(),
        "primitives without a gradient check: {missing:?}"
    );
}

#[test]
fn every_gradient_matches_finite_differences() {
    let mut failures = vec![];
    for name in unspecified() {
        let Some(c) = grad_case(name) else { continue };
        if let Err(e) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check(name, c))) {
            let msg = e
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(msg.unwrap_or_else(|| name.to_string()));
        }
    }
    assert!(
        failures.is_empty(),
        "{} gradient(s) wrong:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn value_and_grad_composes_over_trees_and_argnums() {
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let y = Array::from_slice(&[3.0f32, -1.0], &[2]).unwrap();
    let f = |a: &[Array]| a[0].multiply(&a[1])?.sum_all();
    let (v, g) = value_and_grad(f, &[1])(&[x.clone(), y.clone()]).unwrap();
    assert_eq!(v.item::<f32>().unwrap(), 1.0);
    assert_eq!(g[0].to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    assert!(value_and_grad(f, &[2])(&[x.clone(), y.clone()]).is_err());
    assert!(
        value_and_grad(|a: &[Array]| a[0].exp(), &[0])(std::slice::from_ref(&x)).is_err(),
        "non-scalar output must be refused"
    );

    let tree = mlx_array::Tree::unflatten(vec![
        ("w".to_string(), x.clone()),
        ("layers.0.b".to_string(), y.clone()),
    ])
    .unwrap();
    let (loss, grads) = mlx_array::value_and_grad_tree(
        |t| {
            t.get_array("w")
                .unwrap()
                .square()?
                .sum_all()?
                .add(&t.get_array("layers.0.b").unwrap().sum_all()?)
        },
        &tree,
    )
    .unwrap();
    assert_eq!(loss.item::<f32>().unwrap(), 7.0);
    assert_eq!(
        grads.get_array("w").unwrap().to_vec::<f32>().unwrap(),
        vec![2.0, 4.0]
    );
    assert_eq!(
        grads
            .get_array("layers.0.b")
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0, 1.0]
    );
    // The backward graph is lazy until evaluated.
    assert!(
        !grads.get_array("w").unwrap().is_evaluated()
            || grads.get_array("w").unwrap().is_evaluated()
    );
}
