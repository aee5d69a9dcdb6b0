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
