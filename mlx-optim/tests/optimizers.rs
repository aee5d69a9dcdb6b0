//! Each optimizer's first steps against references written from the
//! published formulas in f64.

mod common;

use common::*;
use mlx_array::{Tree, eval};
use mlx_optim::{Adam, AdamW, Error, Optimizer, Sgd, schedule};

const STEPS: usize = 6;

/// Runs `opt` for `STEPS` updates and returns the trained values after each.
fn run(opt: &mut dyn Optimizer) -> Vec<Vec<Vec<f32>>> {
    let mut params = params();
    let mut out = Vec::new();
    for t in 0..STEPS {
        opt.update_tree(&mut params, &grads(t)).unwrap();
        eval((&params, opt.state())).unwrap();
        out.push(values(&params));
        // The parameter without a gradient is untouched and has no state.
        assert_eq!(
            params.get_array("frozen").unwrap().to_vec::<f32>().unwrap(),
            vec![7.0, 8.0, 9.0]
        );
        assert!(opt.state().param("frozen").is_none());
    }
    assert_eq!(opt.step(), STEPS as u64);
    out
}

#[derive(Clone, Copy)]
struct SgdRef {
    momentum: f64,
    weight_decay: f64,
    dampening: f64,
    nesterov: bool,
}

/// SGD from the formulas: g += wd w; v = mu v + (1 - tau) g; w -= lr (nesterov ? g + mu v : v).
fn sgd_reference(c: SgdRef, lr: impl Fn(usize) -> f64) -> Vec<Vec<Vec<f64>>> {
    let mut w = init_f64();
    let mut v: Vec<Vec<f64>> = w.iter().map(|x| vec![0.0; x.len()]).collect();
    let mut out = Vec::new();
    for t in 0..STEPS {
        let g = grads_f64(t);
        for k in 0..w.len() {
            for i in 0..w[k].len() {
                let gi = g[k][i] + c.weight_decay * w[k][i];
                if c.momentum <= 0.0 {
                    w[k][i] -= lr(t) * gi;
                    continue;
                }
                v[k][i] = c.momentum * v[k][i] + (1.0 - c.dampening) * gi;
                let upd = if c.nesterov {
                    gi + c.momentum * v[k][i]
                } else {
                    v[k][i]
                };
                w[k][i] -= lr(t) * upd;
            }
        }
        out.push(w.clone());
    }
    out
}

fn check(got: &[Vec<Vec<f32>>], want: &[Vec<Vec<f64>>], tol: f64, what: &str) {
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(g, w, tol, &format!("{what}, step {}", t + 1));
    }
}

#[test]
fn sgd_plain_matches_reference() {
    let c = SgdRef {
        momentum: 0.0,
        weight_decay: 0.0,
        dampening: 0.0,
        nesterov: false,
    };
    let mut opt = Sgd::new(0.1);
    assert!(opt.slot_names().is_empty());
    check(&run(&mut opt), &sgd_reference(c, |_| 0.1), 1e-6, "sgd");
}

#[test]
fn sgd_momentum_weight_decay_dampening_matches_reference() {
    let c = SgdRef {
        momentum: 0.9,
        weight_decay: 0.05,
        dampening: 0.2,
        nesterov: false,
    };
    let mut opt = Sgd::new(0.1)
        .momentum(0.9)
        .weight_decay(0.05)
        .dampening(0.2);
    check(
        &run(&mut opt),
        &sgd_reference(c, |_| 0.1),
        1e-6,
        "sgd momentum",
    );
}

#[test]
fn sgd_nesterov_matches_reference() {
    let c = SgdRef {
        momentum: 0.8,
        weight_decay: 0.01,
        dampening: 0.0,
        nesterov: true,
    };
    let mut opt = Sgd::new(0.05)
        .momentum(0.8)
        .weight_decay(0.01)
        .nesterov(true);
    check(
        &run(&mut opt),
        &sgd_reference(c, |_| 0.05),
        1e-6,
        "sgd nesterov",
    );
}

#[test]
fn sgd_nesterov_needs_momentum_and_no_dampening() {
    let mut params = params();
    let mut opt = Sgd::new(0.1).nesterov(true);
    let err = opt.update_tree(&mut params, &grads(0)).unwrap_err();
    assert!(matches!(err, Error::Config(_)), "{err}");
    let mut opt = Sgd::new(0.1).momentum(0.9).dampening(0.1).nesterov(true);
    assert!(opt.update_tree(&mut params, &grads(0)).is_err());
    assert_eq!(opt.step(), 0, "a failed update leaves the step alone");
}

#[test]
fn sgd_uses_the_schedule_at_the_step_before_the_update() {
    let c = SgdRef {
        momentum: 0.0,
        weight_decay: 0.0,
        dampening: 0.0,
        nesterov: false,
    };
    let lr = schedule::exponential_decay(0.1, 0.5);
    let mut opt = Sgd::new(lr);
    check(
        &run(&mut opt),
        &sgd_reference(c, |t| 0.1 * 0.5f64.powi(t as i32)),
        1e-6,
        "sgd scheduled",
    );
}

#[derive(Clone, Copy)]
struct AdamRef {
    lr: f64,
    b1: f64,
    b2: f64,
    eps: f64,
    weight_decay: f64,
    bias_correction: bool,
}

/// Adam(W) from the formulas: w *= 1 - lr wd; m = b1 m + (1 - b1) g;
/// v = b2 v + (1 - b2) g^2; w -= lr m / (sqrt(v) + eps), or with bias
/// correction w -= lr / (1 - b1^t) m / (sqrt(v) / sqrt(1 - b2^t) + eps).
fn adam_reference(c: AdamRef) -> Vec<Vec<Vec<f64>>> {
    let mut w = init_f64();
    let mut m: Vec<Vec<f64>> = w.iter().map(|x| vec![0.0; x.len()]).collect();
    let mut v = m.clone();
    let mut out = Vec::new();
    for t in 0..STEPS {
        let g = grads_f64(t);
        let step = (t + 1) as i32;
        for k in 0..w.len() {
            for i in 0..w[k].len() {
                let gi = g[k][i];
                w[k][i] *= 1.0 - c.lr * c.weight_decay;
                m[k][i] = c.b1 * m[k][i] + (1.0 - c.b1) * gi;
                v[k][i] = c.b2 * v[k][i] + (1.0 - c.b2) * gi * gi;
                if c.bias_correction {
                    let num = c.lr / (1.0 - c.b1.powi(step)) * m[k][i];
                    let den = v[k][i].sqrt() / (1.0 - c.b2.powi(step)).sqrt() + c.eps;
                    w[k][i] -= num / den;
                } else {
                    w[k][i] -= c.lr * m[k][i] / (v[k][i].sqrt() + c.eps);
                }
            }
        }
        out.push(w.clone());
    }
    out
}

const ADAM_DEFAULTS: AdamRef = AdamRef {
    lr: 0.01,
    b1: 0.9,
    b2: 0.999,
    eps: 1e-8,
    weight_decay: 0.0,
    bias_correction: false,
};

#[test]
fn adam_defaults_match_reference() {
    let mut opt = Adam::new(0.01);
    assert_eq!(opt.config().betas, (0.9, 0.999));
    assert_eq!(opt.config().eps, 1e-8);
    assert!(!opt.config().bias_correction);
    check(&run(&mut opt), &adam_reference(ADAM_DEFAULTS), 2e-6, "adam");
}

#[test]
fn adam_bias_correction_matches_reference() {
    let c = AdamRef {
        b1: 0.8,
        b2: 0.99,
        eps: 1e-6,
        bias_correction: true,
        ..ADAM_DEFAULTS
    };
    let mut opt = Adam::new(0.01)
        .betas(0.8, 0.99)
        .eps(1e-6)
        .bias_correction(true);
    check(
        &run(&mut opt),
        &adam_reference(c),
        2e-6,
        "adam bias-corrected",
    );
}

#[test]
fn adamw_default_decay_matches_reference() {
    let c = AdamRef {
        lr: 0.05,
        weight_decay: 0.01,
        ..ADAM_DEFAULTS
    };
    let mut opt = AdamW::new(0.05);
    assert_eq!(opt.weight_decay_value(), 0.01);
    check(&run(&mut opt), &adam_reference(c), 2e-6, "adamw");
}

#[test]
fn adamw_strong_decay_with_bias_correction_matches_reference() {
    let c = AdamRef {
        lr: 0.05,
        weight_decay: 0.5,
        bias_correction: true,
        ..ADAM_DEFAULTS
    };
    let mut opt = AdamW::new(0.05).weight_decay(0.5).bias_correction(true);
    check(&run(&mut opt), &adam_reference(c), 2e-6, "adamw wd 0.5");
}

#[test]
fn adamw_without_weight_decay_is_adam_bit_for_bit() {
    for bc in [false, true] {
        let a = run(&mut Adam::new(0.01).bias_correction(bc));
        let b = run(&mut AdamW::new(0.01).weight_decay(0.0).bias_correction(bc));
        assert_eq!(a, b, "bias_correction={bc}");
    }
}

#[test]
fn state_mirrors_the_gradients() {
    let mut params = params();
    let mut opt = Adam::new(0.01);
    assert!(opt.state().is_empty());
    opt.update_tree(&mut params, &grads(0)).unwrap();
    let names: Vec<String> = opt.state().flatten().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "b.m",
            "b.v",
            "layers.0.w.m",
            "layers.0.w.v",
            "layers.1.w.m",
            "layers.1.w.v"
        ]
    );
    let tree = opt.state().tree().unwrap();
    assert!(matches!(tree.get("layers"), Some(Tree::List(l)) if l.len() == 2));
    // After one step from zero: m = (1 - b1) g.
    let m: Vec<f32> = opt.state().get("b", "m").unwrap().to_vec().unwrap();
    for (i, x) in m.iter().enumerate() {
        let want = 0.1 * grad_value(0, i, 0) as f64;
        assert!((*x as f64 - want).abs() < 1e-7, "{x} vs {want}");
    }
}

#[test]
fn apply_gradients_returns_the_structure_of_the_gradients() {
    let params = params();
    let grads =
        Tree::unflatten([("b".to_string(), grads(0).get_array("b").unwrap().clone())]).unwrap();
    let mut opt = Sgd::new(1.0);
    let out = opt.apply_gradients(&grads, &params).unwrap();
    let names: Vec<String> = out.flatten().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["b"]);
    let got: Vec<f32> = out.get_array("b").unwrap().to_vec().unwrap();
    for (i, x) in got.iter().enumerate() {
        assert_eq!(*x, init_value(0, i) - grad_value(0, i, 0));
    }
}

#[test]
fn gradient_errors_name_the_parameter() {
    let mut params = params();
    let bad = Tree::unflatten([(
        "nope.w".to_string(),
        mlx_array::Array::zeros(&[2], mlx_array::Dtype::F32),
    )])
    .unwrap();
    let mut opt = Adam::new(0.1);
    let err = opt.update_tree(&mut params, &bad).unwrap_err().to_string();
    assert!(err.contains("nope.w"), "{err}");
    let bad = Tree::unflatten([(
        "b".to_string(),
        mlx_array::Array::zeros(&[5], mlx_array::Dtype::F32),
    )])
    .unwrap();
    let err = opt.update_tree(&mut params, &bad).unwrap_err().to_string();
    assert!(err.contains("`b`") && err.contains("[5]"), "{err}");
    assert_eq!(opt.step(), 0);
    assert!(opt.state().is_empty());
}

#[test]
fn optimizers_work_as_trait_objects() {
    let mut opts: Vec<Box<dyn Optimizer>> = vec![
        Box::new(Sgd::new(0.1).momentum(0.9)),
        Box::new(Adam::new(0.1)),
        Box::new(AdamW::new(0.1)),
    ];
    for opt in &mut opts {
        let mut params = params();
        opt.update_tree(&mut params, &grads(0)).unwrap();
        eval((&params, opt.state())).unwrap();
        assert_eq!(opt.step(), 1);
        assert_eq!(opt.learning_rate(), 0.1);
    }
}

#[test]
fn fused_kernel_is_bit_identical_to_the_op_graph() {
    for bc in [false, true] {
        for wd in [0.0, 0.1] {
            let fused = run(&mut AdamW::new(0.01).weight_decay(wd).bias_correction(bc));
            let ops = run(&mut AdamW::new(0.01)
                .weight_decay(wd)
                .bias_correction(bc)
                .fused(false));
            assert_eq!(fused, ops, "bias_correction={bc} weight_decay={wd}");
        }
    }
}

#[test]
fn fused_kernel_reads_strided_gradients() {
    // A transposed gradient is a strided view; the result must not change.
    let w = mlx_array::Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]).unwrap();
    let g = mlx_array::Array::from_slice(&[0.5f32, -1.0, 0.25, 2.0, -0.5, 1.5], &[2, 3])
        .unwrap()
        .t()
        .unwrap();
    let dense = g.contiguous().unwrap();
    let tree = |a: &mlx_array::Array| Tree::unflatten([("w".to_string(), a.clone())]).unwrap();
    let mut outs = Vec::new();
    for (grad, fused) in [(&g, true), (&dense, false)] {
        let mut params = tree(&w);
        let mut opt = Adam::new(0.1).fused(fused);
        for _ in 0..3 {
            opt.update_tree(&mut params, &tree(grad)).unwrap();
            eval((&params, opt.state())).unwrap();
        }
        outs.push(params.get_array("w").unwrap().to_vec::<f32>().unwrap());
    }
    assert_eq!(outs[0], outs[1]);
}

/// The address of the buffer behind an evaluated array.
fn buffer_of(a: &mlx_array::Array) -> usize {
    a.data().unwrap().storage().as_ptr() as usize
}

#[test]
fn fused_kernel_updates_in_place_from_the_second_step() {
    let w = mlx_array::Array::from_slice(&[1.0f32, -2.0, 3.0, 0.5], &[2, 2]).unwrap();
    let g = mlx_array::Array::from_slice(&[0.5f32, -1.0, 0.25, 2.0], &[2, 2]).unwrap();
    let tree = |a: &mlx_array::Array| Tree::unflatten([("w".to_string(), a.clone())]).unwrap();
    let mut params = tree(&w);
    let mut opt = AdamW::new(0.1).weight_decay(0.1);
    let mut buffers = Vec::new();
    for _ in 0..3 {
        opt.update_tree(&mut params, &tree(&g)).unwrap();
        eval((&params, opt.state())).unwrap();
        buffers.push(buffer_of(params.get_array("w").unwrap()));
    }
    // The first step allocates the [3, ...] state buffer; later ones reuse it.
    assert_eq!(buffers[1], buffers[2]);
    // And the values are the op-by-op graph's, bit for bit.
    let mut reference = tree(&w);
    let mut plain = AdamW::new(0.1).weight_decay(0.1).fused(false);
    for _ in 0..3 {
        plain.update_tree(&mut reference, &tree(&g)).unwrap();
        eval((&reference, plain.state())).unwrap();
    }
    let w_of = |t: &Tree| t.get_array("w").unwrap().to_vec::<f32>().unwrap();
    assert_eq!(w_of(&params), w_of(&reference));
}

#[test]
fn fused_kernel_never_overwrites_a_parameter_someone_still_holds() {
    let w = mlx_array::Array::from_slice(&[1.0f32, -2.0, 3.0], &[3]).unwrap();
    let g = mlx_array::Array::from_slice(&[0.5f32, -1.0, 0.25], &[3]).unwrap();
    let tree = |a: &mlx_array::Array| Tree::unflatten([("w".to_string(), a.clone())]).unwrap();
    let mut params = tree(&w);
    let mut opt = Adam::new(0.1);
    opt.update_tree(&mut params, &tree(&g)).unwrap();
    eval((&params, opt.state())).unwrap();
    // A snapshot of the parameter (e.g. an EMA copy) keeps the buffer alive:
    // the next step must write elsewhere.
    let snapshot = params.get_array("w").unwrap().clone();
    let before = snapshot.to_vec::<f32>().unwrap();
    opt.update_tree(&mut params, &tree(&g)).unwrap();
    eval((&params, opt.state())).unwrap();
    assert_eq!(snapshot.to_vec::<f32>().unwrap(), before);
    assert_ne!(
        params.get_array("w").unwrap().to_vec::<f32>().unwrap(),
        before
    );
}
