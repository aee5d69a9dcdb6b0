//! `clip_grad_norm` against a norm computed in f64.

use mlx_array::{Array, Dtype, Tree, eval};
use mlx_optim::clip_grad_norm;

fn grads() -> (Tree, Vec<Vec<f32>>) {
    let a: Vec<f32> = (0..12).map(|i| (i as f32 * 0.37).sin()).collect();
    let b: Vec<f32> = (0..5).map(|i| i as f32 - 2.0).collect();
    let tree = Tree::unflatten([
        (
            "layers.0.w".to_string(),
            Array::from_slice(&a, &[3, 4]).unwrap(),
        ),
        ("b".to_string(), Array::from_slice(&b, &[5]).unwrap()),
    ])
    .unwrap();
    // In the order of `flatten`: `b`, then `layers.0.w`.
    (tree, vec![b, a])
}

fn norm_f64(vals: &[Vec<f32>]) -> f64 {
    vals.iter()
        .flatten()
        .map(|x| (*x as f64) * (*x as f64))
        .sum::<f64>()
        .sqrt()
}

#[test]
fn clips_to_max_norm() {
    let (g, vals) = grads();
    let want_norm = norm_f64(&vals);
    let max_norm = 1.5;
    assert!(want_norm > max_norm);
    let (clipped, norm) = clip_grad_norm(&g, max_norm).unwrap();
    eval((&clipped, &norm)).unwrap();
    let got_norm = norm.item::<f32>().unwrap() as f64;
    assert!((got_norm - want_norm).abs() < 1e-5 * want_norm);
    let scale = max_norm / (want_norm + 1e-6);
    for ((_, a), v) in clipped.flatten().iter().zip(&vals) {
        assert_eq!(a.dtype(), Dtype::F32);
        for (x, y) in a.to_vec::<f32>().unwrap().iter().zip(v) {
            let want = *y as f64 * scale;
            assert!((*x as f64 - want).abs() < 1e-6, "{x} vs {want}");
        }
    }
    let (_, after) = clip_grad_norm(&clipped, max_norm).unwrap();
    assert!((after.item::<f32>().unwrap() as f64 - max_norm).abs() < 1e-5);
}

#[test]
fn leaves_small_gradients_unchanged() {
    let (g, vals) = grads();
    let (clipped, norm) = clip_grad_norm(&g, 100.0).unwrap();
    assert!((norm.item::<f32>().unwrap() as f64 - norm_f64(&vals)).abs() < 1e-5);
    for ((_, a), v) in clipped.flatten().iter().zip(&vals) {
        assert_eq!(&a.to_vec::<f32>().unwrap(), v);
    }
}

#[test]
fn keeps_low_precision_dtypes() {
    let (g, _) = grads();
    let g = g.map(|_, a| a.astype(Dtype::BF16)).unwrap();
    let (clipped, _) = clip_grad_norm(&g, 0.5).unwrap();
    for (_, a) in clipped.flatten() {
        assert_eq!(a.dtype(), Dtype::BF16);
    }
}

#[test]
fn empty_tree_has_zero_norm() {
    let (clipped, norm) = clip_grad_norm(&Tree::new(), 1.0).unwrap();
    assert!(clipped.flatten().is_empty());
    assert_eq!(norm.item::<f32>().unwrap(), 0.0);
}
