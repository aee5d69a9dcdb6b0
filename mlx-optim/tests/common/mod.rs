//! Shared fixtures: a small nested parameter tree and deterministic gradients.
#![allow(dead_code)]

use mlx_array::{Array, Tree};

/// (path, shape) of the trained parameters.
pub const TRAINED: &[(&str, &[usize])] = &[
    ("b", &[4]),
    ("layers.0.w", &[2, 3]),
    ("layers.1.w", &[2, 3]),
];

/// Initial value of element `i` of parameter number `k` (exactly an f32).
pub fn init_value(k: usize, i: usize) -> f32 {
    ((k as f32 + 1.0) * 0.25 - i as f32 * 0.125).mul_add(1.0, 0.5)
}

/// Gradient of element `i` of parameter number `k` at step `t` (exactly an f32).
pub fn grad_value(k: usize, i: usize, t: usize) -> f32 {
    ((1.3 * i as f64 + 0.7 * t as f64 + k as f64).sin() * 0.5) as f32
}

fn size(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// The parameters: the trained ones plus `frozen`, which never gets a gradient.
pub fn params() -> Tree {
    let mut items: Vec<(String, Array)> = TRAINED
        .iter()
        .enumerate()
        .map(|(k, (p, s))| {
            let v: Vec<f32> = (0..size(s)).map(|i| init_value(k, i)).collect();
            (p.to_string(), Array::from_slice(&v, s).unwrap())
        })
        .collect();
    items.push((
        "frozen".to_string(),
        Array::from_slice(&[7.0f32, 8.0, 9.0], &[3]).unwrap(),
    ));
    Tree::unflatten(items).unwrap()
}

/// The gradients of step `t` (only for the trained parameters).
pub fn grads(t: usize) -> Tree {
    Tree::unflatten(TRAINED.iter().enumerate().map(|(k, (p, s))| {
        let v: Vec<f32> = (0..size(s)).map(|i| grad_value(k, i, t)).collect();
        (p.to_string(), Array::from_slice(&v, s).unwrap())
    }))
    .unwrap()
}

/// The trained parameters' initial values in f64, one vector per parameter.
pub fn init_f64() -> Vec<Vec<f64>> {
    TRAINED
        .iter()
        .enumerate()
        .map(|(k, (_, s))| (0..size(s)).map(|i| init_value(k, i) as f64).collect())
        .collect()
}

/// Step `t`'s gradients in f64, one vector per parameter.
pub fn grads_f64(t: usize) -> Vec<Vec<f64>> {
    TRAINED
        .iter()
        .enumerate()
        .map(|(k, (_, s))| (0..size(s)).map(|i| grad_value(k, i, t) as f64).collect())
        .collect()
}

/// The trained parameters' current values.
pub fn values(params: &Tree) -> Vec<Vec<f32>> {
    TRAINED
        .iter()
        .map(|(p, _)| params.get_array(p).unwrap().to_vec::<f32>().unwrap())
        .collect()
}

/// Asserts `got` (f32) is within `tol * max(1, |want|)` of `want` (f64).
pub fn assert_close(got: &[Vec<f32>], want: &[Vec<f64>], tol: f64, what: &str) {
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len());
        for (i, (a, b)) in g.iter().zip(w).enumerate() {
            let err = (*a as f64 - b).abs();
            assert!(
                err <= tol * b.abs().max(1.0),
                "{what}: parameter {} element {i}: got {a}, reference {b} (error {err:e})",
                TRAINED[k].0
            );
        }
    }
}
