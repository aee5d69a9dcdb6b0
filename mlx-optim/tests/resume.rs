//! Saving and resuming optimizer state: bit-identical runs, and errors that
//! name the parameter when the state does not fit the model.

mod common;

use std::path::Path;

use common::*;
use mlx_array::{Array, Dtype, Tree, eval, load_tree, save_tree};
use mlx_optim::{AdamW, Error, Optimizer, Sgd, schedule};

/// Gradients that depend on the parameters, so the trajectory does too:
/// d/dw of sum(w^4 / 4 - w) plus the step's fixed gradient.
fn grads_at(params: &Tree, t: usize) -> Tree {
    let fixed = grads(t);
    fixed
        .map(|path, g| {
            let w = params.get_array(path).unwrap();
            w.square()?.mul(w)?.sub_scalar(1.0)?.add(g)
        })
        .unwrap()
}

fn make_adamw() -> AdamW {
    let lr = schedule::join_schedules(
        vec![
            schedule::linear_schedule(0.0, 0.05, 3).unwrap(),
            schedule::cosine_decay(0.05, 10, 0.001).unwrap(),
        ],
        &[3],
    )
    .unwrap();
    AdamW::new(lr).weight_decay(0.1).bias_correction(true)
}

fn train(opt: &mut dyn Optimizer, params: &mut Tree, steps: std::ops::Range<usize>) {
    for t in steps {
        let g = grads_at(params, t);
        opt.update_tree(params, &g).unwrap();
        eval((&*params, opt.state())).unwrap();
    }
}

fn bits(t: &Tree) -> Vec<(String, Vec<u32>)> {
    t.flatten()
        .into_iter()
        .map(|(n, a)| {
            let v: Vec<u32> = a
                .to_vec::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            (n, v)
        })
        .collect()
}

fn resume_is_bit_identical(make: &dyn Fn() -> Box<dyn Optimizer>, dir: &Path) {
    let mut straight = params();
    let mut opt = make();
    train(opt.as_mut(), &mut straight, 0..10);

    let mut first = params();
    let mut opt = make();
    train(opt.as_mut(), &mut first, 0..4);
    save_tree(dir.join("params.safetensors"), &first, None).unwrap();
    opt.save_state(&dir.join("opt.safetensors")).unwrap();
    drop(opt);
    drop(first);

    let mut resumed = load_tree(dir.join("params.safetensors")).unwrap();
    let mut opt = make();
    // Checked against the trained parameters (`frozen` never had a gradient).
    let err = opt
        .load_state(&dir.join("opt.safetensors"), &resumed)
        .unwrap_err();
    assert!(err.to_string().contains("`frozen`"), "{err}");
    opt.load_state(&dir.join("opt.safetensors"), &trained_only())
        .unwrap();
    assert_eq!(opt.step(), 4);
    train(opt.as_mut(), &mut resumed, 4..10);
    assert_eq!(opt.step(), 10);
    assert_eq!(bits(&straight), bits(&resumed));
}

#[test]
fn adamw_with_schedule_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    resume_is_bit_identical(&|| Box::new(make_adamw()), dir.path());
}

#[test]
fn sgd_with_momentum_resumes_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    resume_is_bit_identical(
        &|| {
            Box::new(
                Sgd::new(schedule::step_decay(0.05, 0.5, 3).unwrap())
                    .momentum(0.9)
                    .nesterov(true),
            )
        },
        dir.path(),
    );
}

#[test]
fn state_file_uses_mlx_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("opt.safetensors");
    let mut p = params();
    let mut opt = make_adamw();
    train(&mut opt, &mut p, 0..2);
    opt.save_state(&path).unwrap();
    let (arrays, meta) = mlx_array::load_safetensors(&path).unwrap();
    let names: Vec<&str> = arrays.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "b.m",
            "b.v",
            "layers.0.w.m",
            "layers.0.w.v",
            "layers.1.w.m",
            "layers.1.w.v",
            "learning_rate",
            "step"
        ]
    );
    assert_eq!(arrays["step"].item::<i64>().unwrap(), 2);
    assert_eq!(meta["step"], "2");
    // The learning rate of the last update: the warmup at step 1 = 0.05 / 3.
    let lr = arrays["learning_rate"].item::<f32>().unwrap();
    assert_eq!(lr, (0.05f64 / 3.0) as f32);
}

/// Trains two steps, saves, and returns the state file.
fn saved_state(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("opt.safetensors");
    let mut p = params();
    let mut opt = make_adamw();
    train(&mut opt, &mut p, 0..2);
    opt.save_state(&path).unwrap();
    path
}

fn load_into(path: &Path, params: &Tree) -> Error {
    let mut opt = make_adamw();
    let err = opt.load_state(path, params).unwrap_err();
    assert_eq!(opt.step(), 0, "a failed load leaves the state alone");
    assert!(opt.state().is_empty());
    err
}

fn trained_only() -> Tree {
    let p = params();
    Tree::unflatten(p.flatten().into_iter().filter(|(n, _)| n != "frozen")).unwrap()
}

#[test]
fn loading_into_a_model_with_an_extra_parameter_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved_state(dir.path());
    let mut items = trained_only().flatten();
    items.push(("layers.2.w".into(), Array::zeros(&[2, 3], Dtype::F32)));
    let err = load_into(&path, &Tree::unflatten(items).unwrap());
    assert!(matches!(err, Error::MissingState { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("`layers.2.w`"), "{msg}");
}

#[test]
fn loading_into_a_model_without_a_parameter_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved_state(dir.path());
    let items = trained_only()
        .flatten()
        .into_iter()
        .filter(|(n, _)| n != "layers.1.w");
    let err = load_into(&path, &Tree::unflatten(items).unwrap());
    assert!(matches!(err, Error::UnexpectedState { .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("layers.1.w"), "{msg}");
}

#[test]
fn loading_into_a_parameter_of_another_shape_names_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved_state(dir.path());
    let items = trained_only().flatten().into_iter().map(|(n, a)| {
        if n == "layers.0.w" {
            (n, Array::zeros(&[3, 2], Dtype::F32))
        } else {
            (n, a)
        }
    });
    let err = load_into(&path, &Tree::unflatten(items).unwrap());
    assert!(matches!(err, Error::StateMismatch { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("layers.0.w") && msg.contains("[3, 2]") && msg.contains("[2, 3]"),
        "{msg}"
    );
}

#[test]
fn loading_into_an_optimizer_with_other_slots_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = saved_state(dir.path());
    let mut sgd = Sgd::new(0.1).momentum(0.9);
    let err = sgd.load_state(&path, &trained_only()).unwrap_err();
    assert!(matches!(err, Error::UnexpectedState { .. }), "{err}");
    assert!(err.to_string().contains("b.m"), "{err}");
}

#[test]
fn loading_a_file_that_is_not_optimizer_state_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("params.safetensors");
    save_tree(&path, &params(), None).unwrap();
    let err = make_adamw().load_state(&path, &params()).unwrap_err();
    assert!(matches!(err, Error::Format { .. }), "{err}");
    let missing = make_adamw()
        .load_state(&dir.path().join("nope.safetensors"), &params())
        .unwrap_err();
    assert!(
        missing.to_string().contains("nope.safetensors"),
        "{missing}"
    );
}
