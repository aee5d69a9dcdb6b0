//! Optimizer steps and loss scales decided on the device: the
//! [`DeviceLossScaler`] follows the host's [`LossScaler`] step for step, a
//! skipped step leaves the parameters, moments and step count bit for bit,
//! an applied one equals the ungated step, and a step built before the
//! previous one was settled (the trainer's overlap) uses the learning rate
//! of the steps really applied.

mod common;

use common::*;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Tree, eval};
use mlx_optim::{
    Adam, AdamW, DeviceLossScaler, Error, LossScaler, Optimizer, Sgd, Sharded, schedule,
};

/// A one-element gradient tree of `value`, plus a finite companion.
fn tree(value: f32) -> Tree {
    Tree::unflatten([
        (
            "a".to_string(),
            Array::from_slice(&[1.5f32, -3.0], &[2]).unwrap(),
        ),
        ("b".to_string(), Array::from_slice(&[value], &[1]).unwrap()),
    ])
    .unwrap()
}

/// A 0-d float32 flag.
fn flag(apply: bool) -> Array {
    Array::full(&[], f64::from(u8::from(apply)), Dtype::F32)
}

#[test]
fn the_device_scale_follows_the_host_scaler_through_growth_and_backoff() {
    // Interval 3: three finite steps double the scale, an overflow halves
    // it and restarts the count.
    let pattern = [
        true, true, true, false, true, true, false, false, true, true, true, true, true, true,
    ];
    let mut host = LossScaler::with(1024.0, 3);
    let mut device = DeviceLossScaler::new(host.clone()).unwrap();
    let bad = [f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
    for (t, &ok) in pattern.iter().enumerate() {
        let before = host.scale();
        let value = if ok { 64.0 } else { bad[t % 3] };
        assert_eq!(
            device.scale().item::<f32>().unwrap() as f64,
            before,
            "step {t}"
        );
        let (unscaled, finite) = device.check(&tree(value), Ok).unwrap();
        eval((&unscaled, &finite, &device)).unwrap();
        assert_eq!(
            finite.item::<f32>().unwrap(),
            f32::from(u8::from(ok)),
            "step {t}"
        );
        if ok {
            // Divided by the scale the step used (powers of two: exact).
            assert_eq!(
                unscaled.get_array("b").unwrap().to_vec::<f32>().unwrap(),
                [(64.0 / before) as f32]
            );
        }
        let applied = host.update(ok);
        assert_eq!(applied, ok);
        assert_eq!(
            device.scale().item::<f32>().unwrap() as f64,
            host.scale(),
            "step {t}"
        );
        assert_eq!(device.settle(ok), ok);
        assert_eq!(device.settled(), &host, "step {t}");
    }
    // Three growths (steps 3, 11 and 14), three halvings: 1024 * 8 / 8.
    assert_eq!((host.scale(), host.skipped()), (1024.0, 3));
}

#[test]
fn every_rank_skips_when_one_ranks_gradients_overflow() {
    let finite = mlx_dist::run_local(2, |g| {
        let mut s = DeviceLossScaler::new(LossScaler::with(4.0, 10)).unwrap();
        let mine = if g.rank() == 1 { f32::INFINITY } else { 1.0 };
        let (_, finite) = s
            .check(&tree(mine), |f| Ok(mlx_dist::all_sum(&f, &g)?))
            .unwrap();
        (
            finite.item::<f32>().unwrap(),
            s.scale().item::<f32>().unwrap(),
        )
    })
    .unwrap();
    assert_eq!(finite, vec![(0.0, 2.0), (0.0, 2.0)]);
}

/// The bits of every trained parameter and every slot, and the step count.
type Snapshot = (Vec<Vec<u32>>, Vec<(String, Vec<u32>)>, u64);

/// A way to make an optimizer under test, fresh each time.
type Make = Box<dyn Fn() -> Box<dyn Optimizer>>;

/// The [`Snapshot`] of `params` trained by `opt`.
fn snapshot(params: &Tree, opt: &dyn Optimizer) -> Snapshot {
    let bits = |a: &Array| -> Vec<u32> {
        a.to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect()
    };
    let p = TRAINED
        .iter()
        .map(|(n, _)| bits(params.get_array(n).unwrap()))
        .collect();
    let s = opt
        .state()
        .flatten()
        .iter()
        .map(|(n, a)| (n.clone(), bits(a)))
        .collect();
    (p, s, opt.step())
}

/// The optimizers under test: the fused Adam(W) kernels, and the select
/// fallback of the other rules.
fn optimizers() -> Vec<(&'static str, Make)> {
    let lr = || schedule::linear_schedule(0.01, 0.1, 8).unwrap();
    vec![
        (
            "adamw fused",
            Box::new(move || Box::new(AdamW::new(lr())) as _),
        ),
        (
            "adam fused, bias correction",
            Box::new(move || Box::new(Adam::new(lr()).bias_correction(true)) as _),
        ),
        (
            "adamw op by op",
            Box::new(move || Box::new(AdamW::new(lr()).fused(false)) as _),
        ),
        (
            "sgd momentum",
            Box::new(move || Box::new(Sgd::new(lr()).momentum(0.9)) as _),
        ),
    ]
}

/// Two ordinary steps (the moments then live in the buffers a fused step
/// updates in place), then a skipped gated step changes nothing and an
/// applied one equals the ordinary step, bit for bit.
fn skipped_and_applied_steps(device: Device) {
    for (name, make) in optimizers() {
        with_device(device, || {
            let mut opt = make();
            let mut params = params();
            for t in 0..2 {
                opt.update_tree(&mut params, &grads(t)).unwrap();
                eval((&params, opt.state())).unwrap();
            }
            let before = snapshot(&params, opt.as_ref());
            // A skipped step, with gradients that are not even finite.
            let nan = grads(2).map(|_, g| g.mul_scalar(f64::NAN)).unwrap();
            let kept = opt
                .apply_gradients_gated(&nan, &params, &flag(false))
                .unwrap();
            for (path, a) in kept.flatten() {
                params = replace(&params, &path, a);
            }
            eval((&params, opt.state())).unwrap();
            assert_eq!(opt.state().pending().len(), 1, "{name}");
            opt.state_mut().settle(false).unwrap();
            assert_eq!(
                snapshot(&params, opt.as_ref()),
                before,
                "{name} on {device:?}: skipped"
            );

            // An applied gated step equals the ordinary one.
            let mut reference = make();
            *reference.state_mut() = opt.state().clone();
            let mut want = params.clone();
            reference.update_tree(&mut want, &grads(3)).unwrap();
            eval((&want, reference.state())).unwrap();
            let new = opt
                .apply_gradients_gated(&grads(3), &params, &flag(true))
                .unwrap();
            for (path, a) in new.flatten() {
                params = replace(&params, &path, a);
            }
            eval((&params, opt.state())).unwrap();
            opt.state_mut().settle(true).unwrap();
            assert_eq!(
                snapshot(&params, opt.as_ref()),
                snapshot(&want, reference.as_ref()),
                "{name} on {device:?}: applied"
            );
            assert_eq!(opt.step(), 3, "{name}");
        });
    }
}

/// `tree` with the leaf `path` replaced.
fn replace(tree: &Tree, path: &str, a: Array) -> Tree {
    Tree::unflatten(
        tree.flatten()
            .into_iter()
            .map(|(p, x)| if p == path { (p, a.clone()) } else { (p, x) }),
    )
    .unwrap()
}

#[test]
fn a_skipped_step_leaves_parameters_moments_and_step_count_bit_identical() {
    skipped_and_applied_steps(Device::Cpu);
}

#[test]
fn a_skipped_step_on_the_gpu_leaves_everything_bit_identical() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    skipped_and_applied_steps(Device::Gpu);
}

/// Which steps of [`overlapped_steps_use_the_rate_of_the_applied_ones`]
/// apply (the schedule changes every step, so a wrong count shows).
const APPLIED: [bool; 8] = [true, false, true, true, false, false, true, true];

/// Trains with the gated steps of [`APPLIED`], each settled `lag` steps
/// after it was built (the trainer's overlap is 1); returns the trained
/// values after every step.
fn gated_run(opt: &mut dyn Optimizer, lag: usize) -> Vec<Vec<Vec<f32>>> {
    let mut params = params();
    let mut out = Vec::new();
    for (t, &apply) in APPLIED.iter().enumerate() {
        let new = opt
            .apply_gradients_gated(&grads(t), &params, &flag(apply))
            .unwrap();
        for (path, a) in new.flatten() {
            params = replace(&params, &path, a);
        }
        eval((&params, opt.state())).unwrap();
        if t >= lag {
            opt.state_mut().settle(APPLIED[t - lag]).unwrap();
        }
        out.push(values(&params));
    }
    for &apply in &APPLIED[APPLIED.len() - lag..] {
        opt.state_mut().settle(apply).unwrap();
    }
    out
}

/// The same steps without gates: the skipped ones simply not taken.
fn reference_run(opt: &mut dyn Optimizer) -> Vec<Vec<Vec<f32>>> {
    let mut params = params();
    let mut out = Vec::new();
    for (t, &apply) in APPLIED.iter().enumerate() {
        if apply {
            opt.update_tree(&mut params, &grads(t)).unwrap();
            eval((&params, opt.state())).unwrap();
        }
        out.push(values(&params));
    }
    out
}

#[test]
fn overlapped_steps_use_the_rate_of_the_applied_ones() {
    let applied = APPLIED.iter().filter(|a| **a).count() as u64;
    for (name, make) in optimizers() {
        let want = reference_run(make().as_mut());
        for lag in [0, 1, 2] {
            let mut opt = make();
            let got = gated_run(opt.as_mut(), lag);
            assert_eq!(got, want, "{name}, settled {lag} step(s) late");
            assert_eq!(opt.step(), applied, "{name}");
        }
    }
}

#[test]
fn sharded_gated_steps_equal_the_applied_steps_alone() {
    // Two ranks: the fused kernel's separate moments and parameter passes.
    let lr = || schedule::linear_schedule(0.01, 0.1, 8).unwrap();
    let want = reference_run(&mut AdamW::new(lr()));
    let got = mlx_dist::run_local(2, |g| {
        let mut opt = Sharded::new(AdamW::new(lr()), &g);
        (gated_run(&mut opt, 1), opt.step())
    })
    .unwrap();
    for (values, step) in got {
        assert_eq!(values, want);
        assert_eq!(step, APPLIED.iter().filter(|a| **a).count() as u64);
    }
}

#[test]
fn unsettled_steps_refuse_to_be_saved_or_followed_by_an_ungated_step() {
    let mut opt = AdamW::new(0.1);
    let mut params = params();
    assert!(matches!(
        opt.state_mut().settle(true),
        Err(Error::NothingToSettle)
    ));
    let new = opt
        .apply_gradients_gated(&grads(0), &params, &flag(true))
        .unwrap();
    eval(&new).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let err = opt
        .save_state(&dir.path().join("s.safetensors"))
        .unwrap_err();
    assert!(matches!(err, Error::Unsettled(_, 1)), "{err}");
    let err = opt.update_tree(&mut params, &grads(1)).unwrap_err();
    assert!(err.to_string().contains("not settled"), "{err}");
    opt.state_mut().settle(true).unwrap();
    opt.update_tree(&mut params, &grads(1)).unwrap();
    assert_eq!(opt.step(), 2);
}
