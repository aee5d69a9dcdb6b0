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

/// Any count, with the edges (0, small, near `u64::MAX`) likelier than
/// uniform draws make them.
fn count() -> impl proptest::strategy::Strategy<Value = u64> {
    proptest::prop_oneof![
        proptest::prelude::any::<u64>(),
        0u64..4,
        proptest::strategy::Strategy::prop_map(0u64..4, |d| u64::MAX - d),
    ]
}

/// Loads `bytes` as an AdamW state file for [`trained_only`] parameters,
/// as a resume does, and takes a step with it when it loads: an error or a
/// state that steps, never a panic.
fn resume_from_bytes(dir: &Path, bytes: &[u8]) {
    let path = dir.join("fuzzed.safetensors");
    std::fs::write(&path, bytes).unwrap();
    let mut params = trained_only();
    let mut opt = AdamW::new(1e-2);
    if opt.load_state(&path, &params).is_ok() {
        opt.update_tree(&mut params, &grads(0)).unwrap();
        values(&params);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(100))]

    /// Arbitrary bytes as an optimizer state file (the fuzz target
    /// `optimizer_state` runs the same reader under coverage guidance).
    #[test]
    fn arbitrary_bytes_are_a_state_or_an_error(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
    ) {
        let dir = tempfile::tempdir().unwrap();
        resume_from_bytes(dir.path(), &bytes);
    }

    /// A saved state with bytes flipped or cut.
    #[test]
    fn mutated_states_are_a_state_or_an_error(
        flips in proptest::collection::vec((0usize..4096, 1u8..=255), 1..4),
        cut in 0usize..4096,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut b = std::fs::read(saved_state(dir.path())).unwrap();
        for (at, x) in flips {
            let at = at % b.len();
            b[at] ^= x;
        }
        b.truncate(cut.max(8));
        resume_from_bytes(dir.path(), &b);
    }

    /// Any `loss_scale.json` a float16 checkpoint could hold resumes on
    /// the device or is refused, and settles steps without a panic.
    #[test]
    fn any_loss_scale_resumes_or_is_refused(
        scale in proptest::prop_oneof![
            proptest::prelude::any::<f64>(),
            proptest::strategy::Just(0.0),
            proptest::strategy::Just(-1.0),
            proptest::strategy::Just(1e300),
        ],
        growth_interval in count(),
        good_steps in count(),
        skipped in count(),
        outcomes in proptest::collection::vec(proptest::prelude::any::<bool>(), 0..8),
    ) {
        let text = format!(
            r#"{{"scale":{scale:?},"growth_interval":{growth_interval},"good_steps":{good_steps},"skipped":{skipped}}}"#
        );
        if let Ok(s) = serde_json::from_str::<mlx_optim::LossScaler>(&text)
            && let Ok(mut d) = mlx_optim::DeviceLossScaler::new(s)
        {
            for finite in outcomes {
                d.settle(finite);
            }
        }
    }
}

/// Regression: a `loss_scale.json` whose counts are at `u64::MAX` resumed,
/// and the next step's `update` overflowed ("attempt to add with
/// overflow"); the counts now saturate.
#[test]
fn a_loss_scale_with_counts_at_their_maximum_settles_steps() {
    let max = u64::MAX;
    let text =
        format!(r#"{{"scale":1024.0,"growth_interval":3,"good_steps":{max},"skipped":{max}}}"#);
    let s: mlx_optim::LossScaler = serde_json::from_str(&text).unwrap();
    let mut d = mlx_optim::DeviceLossScaler::new(s).unwrap();
    assert!(d.settle(true));
    assert!(!d.settle(false));
    assert_eq!(d.settled().skipped(), max);
}

/// A `loss_scale.json` whose scale is not a positive float32, or whose
/// growth interval is 0, is refused rather than resumed (a scale of 0
/// zeroed every gradient; a negative one turned training uphill).
#[test]
fn a_loss_scale_that_is_not_positive_is_refused() {
    for (scale, interval) in [("0.0", 3), ("-2.0", 3), ("1e300", 3), ("1024.0", 0)] {
        let text = format!(
            r#"{{"scale":{scale},"growth_interval":{interval},"good_steps":0,"skipped":0}}"#
        );
        let s: mlx_optim::LossScaler = serde_json::from_str(&text).unwrap();
        let err = mlx_optim::DeviceLossScaler::new(s).map(|_| ()).unwrap_err();
        assert!(err.to_string().contains("loss scale"), "{err}");
    }
}
