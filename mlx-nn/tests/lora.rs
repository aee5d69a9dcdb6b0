//! LoRA and DoRA adapters: the base output at step 0, gradients by finite
//! differences, fusing, and the frozen base.

use mlx_array::{Array, Dtype, Result, Tree, random};
use mlx_nn::*;

fn normal(seed: u64, shape: &[usize]) -> Array {
    let a = random::normal(&random::key(seed), shape, Dtype::F32).unwrap();
    a.eval().unwrap();
    a
}

fn weighted_sum(y: &Array, seed: u64) -> Result<Array> {
    y.multiply(&normal(seed, y.shape()))?.sum_all()
}

fn vec(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn assert_close(got: &Array, want: &Array, rel: f32, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}");
    let scale = vec(want).iter().fold(0f32, |m, v| m.max(v.abs()));
    for (i, (g, w)) in vec(got).iter().zip(vec(want)).enumerate() {
        assert!(
            (g - w).abs() <= rel * scale,
            "{what}[{i}]: {g} vs {w} (max |want| {scale})"
        );
    }
}

/// The Euclidean norm of each row of `w`.
fn row_norms(w: &Array) -> Array {
    w.square()
        .unwrap()
        .sum(&[1], false)
        .unwrap()
        .sqrt()
        .unwrap()
}

/// `||W + scale B A||` of each output row of `dora`, computed here.
fn merged_norms(dora: &DoRALinear) -> Array {
    let delta = dora.lora_b.value().matmul(dora.lora_a.value()).unwrap();
    row_norms(
        &dora
            .base
            .weight
            .value()
            .add(&delta.mul_scalar(dora.scale).unwrap())
            .unwrap(),
    )
}

fn base(bias: bool) -> Linear {
    Linear::new(5, 3, bias, &random::key(7)).unwrap()
}

fn config() -> LoRAConfig {
    LoRAConfig::default().rank(2).alpha(3.0)
}

/// Gives `B` (and `m`, for DoRA) random values, as after some training.
fn perturb<M: Module>(model: &mut M, seed: u64) {
    let t = model
        .trainable_parameters()
        .map(|name, p| {
            Ok(match name {
                "lora_b" => normal(seed, p.shape()).mul_scalar(0.5)?,
                "magnitude" => p.add(&normal(seed + 1, p.shape()).mul_scalar(0.1)?)?,
                _ => p.clone(),
            })
        })
        .unwrap();
    model.update(&t).unwrap();
}

/// Checks the gradients of `loss` from `value_and_grad` against central
/// differences of `reference` (the same function, or one with the detached
/// parts held at their current values) for a few entries of each.
fn check_grads<M: Module>(
    mut model: M,
    loss: impl Fn(&M) -> Result<Array>,
    reference: impl Fn(&M) -> Result<Array>,
    want: &[&str],
    what: &str,
) {
    let vg = value_and_grad(|m: &M, _: &()| loss(m));
    let (_, grads) = vg(&mut model, &()).unwrap();
    let names: Vec<String> = grads.flatten().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, want, "{what}: gradient names");
    for (name, g) in grads.flatten() {
        let g = vec(&g);
        let p = model.parameters().get_array(&name).unwrap().clone();
        let pv = vec(&p);
        for j in (0..pv.len()).step_by((pv.len() / 5).max(1)) {
            let eps = 1e-2f32;
            let mut at = |d: f32| -> f64 {
                let mut v = pv.clone();
                v[j] += d;
                let set = |a: Array| Tree::unflatten(vec![(name.clone(), a)]).unwrap();
                model
                    .update(&set(Array::from_slice(&v, p.shape()).unwrap()))
                    .unwrap();
                let l = reference(&model).unwrap().item::<f32>().unwrap() as f64;
                model.update(&set(p.clone())).unwrap();
                l
            };
            let fd = (at(eps) - at(-eps)) / (2.0 * eps as f64);
            assert!(
                (g[j] as f64 - fd).abs() <= 5e-3 + 1e-2 * fd.abs(),
                "{what}: d/d{name}[{j}] = {} vs finite difference {fd}",
                g[j]
            );
        }
    }
}

#[test]
fn lora_at_initialisation_is_the_base_layer_bit_for_bit() {
    let x = normal(1, &[2, 4, 5]);
    for bias in [true, false] {
        let lora = LoRALinear::from_linear(base(bias), &config(), &random::key(2)).unwrap();
        assert_eq!(lora.lora_a.value().shape(), &[2, 5]);
        assert_eq!(lora.lora_b.value().shape(), &[3, 2]);
        assert_eq!(lora.scale, 1.5);
        // PEFT's Kaiming-uniform with a = sqrt(5): |A| < 1/sqrt(in).
        let bound = 1.0 / 5f32.sqrt();
        assert!(vec(lora.lora_a.value()).iter().all(|v| v.abs() < bound));
        let y = lora.forward(&x).unwrap();
        assert_eq!(
            vec(&y),
            vec(&base(bias).forward(&x).unwrap()),
            "bias {bias}"
        );
        // Dropout with a key changes nothing while B is zero.
        let lora =
            LoRALinear::from_linear(base(bias), &config().dropout(0.5), &random::key(2)).unwrap();
        let yd = lora.forward_train(&x, Some(&random::key(3))).unwrap();
        assert_eq!(vec(&yd), vec(&y));
    }
}

#[test]
fn dora_at_initialisation_is_the_base_layer() {
    let x = normal(1, &[2, 4, 5]);
    for bias in [true, false] {
        let dora = DoRALinear::from_linear(base(bias), &config(), &random::key(2)).unwrap();
        let w = vec(base(bias).weight.value());
        let m = vec(dora.magnitude.value());
        for (o, m) in m.iter().enumerate() {
            let norm = w[o * 5..o * 5 + 5]
                .iter()
                .map(|v| v * v)
                .sum::<f32>()
                .sqrt();
            assert!(
                (m - norm).abs() <= 1e-6 * norm,
                "m[{o}] = {m}, ||W[{o}]|| = {norm}"
            );
        }
        let y = dora.forward(&x).unwrap();
        assert_close(&y, &base(bias).forward(&x).unwrap(), 1e-6, "dora step 0");
    }
}

#[test]
fn lora_gradients_match_finite_differences() {
    let x = normal(1, &[2, 3, 5]);
    for bias in [true, false] {
        let mut lora = LoRALinear::from_linear(base(bias), &config(), &random::key(2)).unwrap();
        perturb(&mut lora, 4);
        let loss = |m: &LoRALinear| weighted_sum(&m.forward(&x)?, 10);
        check_grads(lora, loss, loss, &["lora_a", "lora_b"], "lora");
    }
}

#[test]
fn dora_gradients_match_finite_differences_with_the_norm_detached() {
    let x = normal(1, &[2, 3, 5]);
    for bias in [true, false] {
        let mut dora = DoRALinear::from_linear(base(bias), &config(), &random::key(2)).unwrap();
        perturb(&mut dora, 4);
        // The reference: m / n0 * (x W^T + scale x A^T B^T) + b with the
        // norm n0 = ||W + scale B A|| fixed at the unperturbed point.
        let w = dora.base.weight.value().clone();
        let n0 = merged_norms(&dora);
        let reference = |m: &DoRALinear| {
            let lr = x
                .matmul(&m.lora_a.value().t()?)?
                .matmul(&m.lora_b.value().t()?)?
                .mul_scalar(m.scale)?;
            let mut y = x
                .matmul(&w.t()?)?
                .add(&lr)?
                .multiply(&m.magnitude.value().divide(&n0)?)?;
            if let Some(b) = &m.base.bias {
                y = y.add(b.value())?;
            }
            weighted_sum(&y, 10)
        };
        let loss = |m: &DoRALinear| weighted_sum(&m.forward(&x)?, 10);
        let (l, r) = (loss(&dora).unwrap(), reference(&dora).unwrap());
        assert_close(&l, &r, 1e-5, "dora against its reference");
        check_grads(
            dora,
            loss,
            reference,
            &["lora_a", "lora_b", "magnitude"],
            "dora",
        );
    }
}

#[test]
fn fused_layers_give_the_unfused_outputs() {
    let x = normal(1, &[2, 4, 5]);
    for bias in [true, false] {
        let mut lora = LoRALinear::from_linear(base(bias), &config(), &random::key(2)).unwrap();
        perturb(&mut lora, 4);
        let fused = lora.fuse().unwrap();
        assert_eq!(fused.weight.value().shape(), &[3, 5]);
        assert_close(
            &fused.forward(&x).unwrap(),
            &lora.forward(&x).unwrap(),
            1e-5,
            "lora fused",
        );
        let mut dora = DoRALinear::from_linear(base(bias), &config(), &random::key(2)).unwrap();
        perturb(&mut dora, 4);
        let fused = dora.fuse().unwrap();
        assert_close(
            &fused.forward(&x).unwrap(),
            &dora.forward(&x).unwrap(),
            1e-5,
            "dora fused",
        );
        // The fused DoRA rows have the magnitudes as their norms.
        let norms = row_norms(fused.weight.value());
        assert_close(&norms, dora.magnitude.value(), 1e-5, "dora fused norms");
    }
}

#[test]
fn the_base_layer_is_frozen_and_gets_no_gradient() {
    let x = normal(1, &[3, 5]);
    let lora = LoRALinear::from_linear(base(true), &config(), &random::key(2)).unwrap();
    let dora = DoRALinear::from_linear(base(true), &config(), &random::key(2)).unwrap();
    let names = |t: Tree| -> Vec<String> { t.flatten().into_iter().map(|(n, _)| n).collect() };
    assert_eq!(
        names(lora.parameters()),
        ["base.bias", "base.weight", "lora_a", "lora_b"]
    );
    assert_eq!(names(lora.trainable_parameters()), ["lora_a", "lora_b"]);
    assert_eq!(
        names(dora.trainable_parameters()),
        ["lora_a", "lora_b", "magnitude"]
    );
    let mut lora = lora;
    let step = value_and_grad(|m: &LoRALinear, x: &Array| m.forward(x)?.sum_all());
    let (_, grads) = step(&mut lora, &x).unwrap();
    assert_eq!(names(grads), ["lora_a", "lora_b"]);
    let mut dora = dora;
    let step = value_and_grad(|m: &DoRALinear, x: &Array| m.forward(x)?.sum_all());
    let (_, grads) = step(&mut dora, &x).unwrap();
    assert_eq!(names(grads), ["lora_a", "lora_b", "magnitude"]);
}

#[test]
fn invalid_configurations_are_refused() {
    for cfg in [
        config().rank(0),
        config().dropout(1.0),
        config().alpha(f64::NAN),
    ] {
        assert!(LoRALinear::from_linear(base(true), &cfg, &random::key(0)).is_err());
        assert!(DoRALinear::from_linear(base(true), &cfg, &random::key(0)).is_err());
    }
}

#[test]
fn dropout_applies_to_the_adapter_input_only_in_training() {
    let x = normal(1, &[4, 5]);
    let key = random::key(3);
    let drop = Dropout::new(0.5).unwrap();
    let xd = drop.forward(&x, Some(&key)).unwrap();
    let mut lora =
        LoRALinear::from_linear(base(true), &config().dropout(0.5), &random::key(2)).unwrap();
    perturb(&mut lora, 4);
    let low_rank = |m: &LoRALinear, x: &Array| -> Array {
        x.matmul(&m.lora_a.value().t().unwrap())
            .unwrap()
            .matmul(&m.lora_b.value().t().unwrap())
            .unwrap()
            .mul_scalar(m.scale)
            .unwrap()
    };
    let want = base(true)
        .forward(&x)
        .unwrap()
        .add(&low_rank(&lora, &xd))
        .unwrap();
    let got = lora.forward_train(&x, Some(&key)).unwrap();
    assert_close(&got, &want, 1e-6, "lora with dropout");
    assert_ne!(vec(&got), vec(&lora.forward(&x).unwrap()));
    assert_eq!(
        vec(&lora.forward_train(&x, None).unwrap()),
        vec(&lora.forward(&x).unwrap())
    );

    // DoRA, as PEFT: base(x) + (m/n - 1) x' W^T + m/n scale x' A^T B^T.
    let mut dora =
        DoRALinear::from_linear(base(true), &config().dropout(0.5), &random::key(2)).unwrap();
    perturb(&mut dora, 4);
    let w = dora.base.weight.value();
    let norm = merged_norms(&dora);
    let ms = dora.magnitude.value().divide(&norm).unwrap();
    let lr = xd
        .matmul(&dora.lora_a.value().t().unwrap())
        .unwrap()
        .matmul(&dora.lora_b.value().t().unwrap())
        .unwrap()
        .mul_scalar(dora.scale)
        .unwrap();
    let xdw = xd.matmul(&w.t().unwrap()).unwrap();
    let want = base(true)
        .forward(&x)
        .unwrap()
        .add(&ms.sub_scalar(1.0).unwrap().multiply(&xdw).unwrap())
        .unwrap()
        .add(&ms.multiply(&lr).unwrap())
        .unwrap();
    let got = dora.forward_train(&x, Some(&key)).unwrap();
    assert_close(&got, &want, 1e-6, "dora with dropout");
    assert_ne!(vec(&got), vec(&dora.forward(&x).unwrap()));
    assert_eq!(
        vec(&dora.forward_train(&x, None).unwrap()),
        vec(&dora.forward(&x).unwrap())
    );
}
