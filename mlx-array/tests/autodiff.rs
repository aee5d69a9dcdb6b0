//! `value_and_grad` over several inputs and over parameter trees (each
//! primitive's own gradient is checked by `tests/conformance.rs`).

use mlx_array::{Array, value_and_grad};

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

/// The gradient of a matrix used transposed (`x @ w^T`, a linear layer's
/// weight) is dense in the matrix's own layout, lazy or evaluated, with
/// the values of `(x^T @ dy)^T`; a matrix used as it is keeps `x^T @ dy`.
#[test]
fn a_transposed_weight_gets_a_dense_gradient() {
    let x = Array::from_slice(&[1.0f32, -2.0, 0.5, 3.0, 1.5, -1.0], &[3, 2]).unwrap();
    let w = Array::from_slice(&[0.2f32, -0.4, 1.0, 0.3, -0.7, 0.6, 0.9, -0.1], &[4, 2]).unwrap();
    let dy = Array::from_slice(
        &[
            1.0f32, 0.0, -1.0, 2.0, 0.5, 1.5, -0.5, 1.0, 2.0, -2.0, 0.25, 0.75,
        ],
        &[3, 4],
    )
    .unwrap();
    // d/dw sum(dy o (x @ w^T)) = dy^T @ x, [4, 2].
    let want = dy.t().unwrap().matmul(&x).unwrap().to_vec::<f32>().unwrap();
    let grad = |w_in: &Array| {
        let f = |a: &[Array]| a[0].matmul(&a[1].t()?)?.multiply(&a[2])?.sum_all();
        let (_, g) = value_and_grad(f, &[1])(&[x.clone(), w_in.clone(), dy.clone()]).unwrap();
        g[0].clone()
    };
    let g = grad(&w);
    g.eval().unwrap();
    assert!(g.operand().unwrap().is_contiguous(), "a lazy transpose");
    assert_eq!(g.to_vec::<f32>().unwrap(), want);
    // With the transpose already evaluated (a column-major view).
    let f = |a: &[Array]| a[0].matmul(&a[1])?.multiply(&a[2])?.sum_all();
    let wt = w.t().unwrap();
    wt.eval().unwrap();
    let (_, g) = value_and_grad(f, &[1])(&[x.clone(), wt.clone(), dy.clone()]).unwrap();
    g[0].eval().unwrap();
    assert_eq!(g[0].shape(), &[2, 4]);
    assert_eq!(
        g[0].t().unwrap().to_vec::<f32>().unwrap(),
        want,
        "the gradient of w^T, transposed"
    );
    // A matrix used as it is: x @ v, v [2, 4], gradient x^T @ dy, dense.
    let v = w.t().unwrap().contiguous().unwrap();
    let (_, g) = value_and_grad(f, &[1])(&[x.clone(), v, dy.clone()]).unwrap();
    g[0].eval().unwrap();
    assert!(g[0].operand().unwrap().is_contiguous());
    assert_eq!(
        g[0].to_vec::<f32>().unwrap(),
        x.t().unwrap().matmul(&dy).unwrap().to_vec::<f32>().unwrap()
    );
}

/// A remembered cast ([`Array::remember_cast`]) is read, not computed, and
/// differentiates as the cast it stands for, also through a tracer of the
/// array; the gradient is the plain cast's, bit for bit. The independent
/// expectation: the same function of a fresh array that remembers nothing.
#[test]
fn a_remembered_cast_reads_the_copy_and_differentiates_as_the_cast() {
    use mlx_array::Dtype;
    let values = [1.1f32, -2.3, 0.7, 65519.0];
    let p = Array::from_slice(&values, &[4]).unwrap();
    let plain = Array::from_slice(&values, &[4]).unwrap();
    let copy = p.astype(Dtype::F16).unwrap();
    copy.eval().unwrap();
    p.remember_cast(&copy).unwrap();
    let cast = p.astype(Dtype::F16).unwrap();
    assert_eq!(cast.primitive_name(), Some("remembered_cast"));
    assert_eq!(
        cast.to_vec::<half::f16>().unwrap(),
        copy.to_vec::<half::f16>().unwrap()
    );
    // Scaled so the f16 cotangent rounds: a wrong path shows in the bits.
    let seen = std::cell::Cell::new(None);
    let f = |a: &[Array]| {
        let c = a[0].astype(Dtype::F16)?;
        seen.set(c.primitive_name());
        c.mul_scalar(0.3)?.square()?.astype(Dtype::F32)?.sum_all()
    };
    let (v, g) = value_and_grad(f, &[0])(std::slice::from_ref(&p)).unwrap();
    assert_eq!(seen.get(), Some("remembered_cast"), "the tracer remembers");
    let (v0, g0) = value_and_grad(f, &[0])(std::slice::from_ref(&plain)).unwrap();
    assert_eq!(seen.get(), Some("astype"));
    assert_eq!(g[0].dtype(), Dtype::F32);
    assert_eq!(v.item::<f32>().unwrap(), v0.item::<f32>().unwrap());
    assert_eq!(
        g[0].to_vec::<f32>().unwrap(),
        g0[0].to_vec::<f32>().unwrap()
    );

    // What cannot be a cast of `p`, and a second copy, are refused.
    let e = |r: mlx_array::Result<()>| r.unwrap_err().to_string();
    let other = Array::zeros(&[3], Dtype::F16);
    assert!(e(plain.remember_cast(&other)).contains("keeps the shape"));
    let same = Array::zeros(&[4], Dtype::F32);
    assert!(e(plain.remember_cast(&same)).contains("two float dtypes"));
    let ints = Array::zeros(&[4], Dtype::I32);
    assert!(e(plain.remember_cast(&ints)).contains("two float dtypes"));
    assert!(e(p.remember_cast(&copy)).contains("already has a remembered cast"));
}
