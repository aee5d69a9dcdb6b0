//! Modules end to end: gradients by finite differences, learning XOR, weights I/O, freezing.

use mlx_array::{Array, Dtype, Result, Tree, eval, random};
use mlx_nn::losses::{CrossEntropyOptions, Reduction, cross_entropy, mse_loss};
use mlx_nn::*;

/// Checks `value_and_grad` of `loss(model)` against central differences for
/// a few entries of every parameter.
fn check_model_grads<M: Module>(mut model: M, loss: impl Fn(&M) -> Result<Array>, what: &str) {
    let vg = value_and_grad(|m: &M, _: &()| loss(m));
    let (_, grads) = vg(&mut model, &()).unwrap();
    for (name, g) in grads.flatten() {
        let g = g.to_vec::<f32>().unwrap();
        let p = model.parameters().get_array(&name).unwrap().clone();
        let pv = p.to_vec::<f32>().unwrap();
        for j in (0..pv.len()).step_by((pv.len() / 4).max(1)) {
            let eps = 1e-2f32;
            let mut at = |d: f32| -> f64 {
                let mut v = pv.clone();
                v[j] += d;
                let t = Tree::unflatten(vec![(
                    name.clone(),
                    Array::from_slice(&v, p.shape()).unwrap(),
                )])
                .unwrap();
                model.update(&t).unwrap();
                let l = loss(&model).unwrap().item::<f32>().unwrap() as f64;
                model
                    .update(&Tree::unflatten(vec![(name.clone(), p.clone())]).unwrap())
                    .unwrap();
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

fn x(seed: u64, shape: &[usize]) -> Array {
    let a = random::normal(&random::key(seed), shape, Dtype::F32).unwrap();
    a.eval().unwrap();
    a
}

fn weighted_sum(y: &Array, seed: u64) -> Result<Array> {
    y.multiply(&x(seed, y.shape()))?.sum_all()
}

#[test]
fn every_layer_has_correct_gradients() {
    let h = x(1, &[2, 3, 4]);
    check_model_grads(
        Linear::new(4, 3, true, &random::key(2)).unwrap(),
        |m| weighted_sum(&m.forward(&h)?, 10),
        "linear",
    );
    let ids = Array::from_slice(&[1i32, 3, 1, 0], &[2, 2]).unwrap();
    check_model_grads(
        Embedding::new(5, 4, &random::key(3)).unwrap(),
        |m| weighted_sum(&m.forward(&ids)?, 11),
        "embedding",
    );
    check_model_grads(
        RMSNorm::new(4),
        |m| weighted_sum(&m.forward(&h)?, 12),
        "rms_norm",
    );
    check_model_grads(
        LayerNorm::new(4),
        |m| weighted_sum(&m.forward(&h)?, 13),
        "layer_norm",
    );
    check_model_grads(
        SwiGLU::new(4, 6, &random::key(4)).unwrap(),
        |m| weighted_sum(&m.forward(&h)?, 14),
        "swiglu",
    );
    let mask = create_additive_causal_mask(3, Dtype::F32).unwrap();
    check_model_grads(
        MultiHeadAttention::new(4, 2, true, &random::key(5)).unwrap(),
        |m| weighted_sum(&m.forward(&h, &h, &h, Some(&mask))?, 15),
        "attention",
    );
    // RoPE, activations and the loss have no parameters: check them through a Linear in front.
    let rope = RoPE::new(4, true);
    check_model_grads(
        Linear::new(4, 4, false, &random::key(6)).unwrap(),
        |m| weighted_sum(&rope.forward(&m.forward(&h)?, 2)?, 16),
        "rope",
    );
    let rope_half = RoPE::new(4, false);
    check_model_grads(
        Linear::new(4, 4, false, &random::key(6)).unwrap(),
        |m| weighted_sum(&rope_half.forward(&m.forward(&h)?, 1)?, 16),
        "rope halves",
    );
    check_model_grads(
        Linear::new(4, 4, false, &random::key(7)).unwrap(),
        |m| weighted_sum(&gelu(&m.forward(&h)?)?, 17),
        "gelu",
    );
    let targets = Array::from_slice(&[0i32, 3, 1, 2, 2, 0], &[2, 3]).unwrap();
    let smooth = CrossEntropyOptions {
        label_smoothing: 0.1,
        ignore_index: Some(1),
        ..Default::default()
    };
    check_model_grads(
        Linear::new(4, 4, true, &random::key(8)).unwrap(),
        |m| cross_entropy(&m.forward(&h)?, &targets, &smooth),
        "cross_entropy",
    );
}

struct Mlp {
    l1: Linear,
    l2: Linear,
}
impl_module!(Mlp { l1, l2 });
impl Mlp {
    fn new(seed: u64) -> Mlp {
        let [a, b] = random::split2(&random::key(seed)).unwrap();
        Mlp {
            l1: Linear::new(2, 16, true, &a).unwrap(),
            l2: Linear::new(16, 1, true, &b).unwrap(),
        }
    }
    fn forward(&self, x: &Array) -> Result<Array> {
        self.l2.forward(&self.l1.forward(x)?.tanh()?)
    }
}

#[test]
fn a_two_layer_mlp_learns_xor_with_sgd() {
    let mut model = Mlp::new(0);
    let xs = Array::from_slice(&[0f32, 0., 0., 1., 1., 0., 1., 1.], &[4, 2]).unwrap();
    let ys = Array::from_slice(&[0f32, 1., 1., 0.], &[4, 1]).unwrap();
    let step = value_and_grad(|m: &Mlp, (x, y): &(Array, Array)| {
        mse_loss(&m.forward(x)?, y, Reduction::Mean)
    });
    let batch = (xs.clone(), ys);
    let mut first = None;
    let mut last = 0.0;
    for _ in 0..500 {
        let (loss, grads) = step(&mut model, &batch).unwrap();
        let new = model
            .trainable_parameters()
            .zip_map(&grads, |_, p, g| p.subtract(&g.mul_scalar(0.1)?))
            .unwrap();
        model.update(&new).unwrap();
        eval((&loss, &model.parameters())).unwrap();
        last = loss.item::<f32>().unwrap();
        first.get_or_insert(last);
    }
    assert!(
        first.unwrap() > 0.2,
        "the untrained loss should be large, got {first:?}"
    );
    assert!(last < 0.01, "XOR was not learned: final loss {last}");
    let pred = model.forward(&xs).unwrap().to_vec::<f32>().unwrap();
    assert!(
        pred[0] < 0.3 && pred[1] > 0.7 && pred[2] > 0.7 && pred[3] < 0.3,
        "{pred:?}"
    );
}

#[test]
fn weights_round_trip_bit_exactly_and_bad_files_name_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mlp.safetensors");
    let a = Mlp::new(1);
    a.save_weights(&path).unwrap();
    let mut b = Mlp::new(2);
    b.load_weights(&path).unwrap();
    for ((na, pa), (nb, pb)) in a.named_parameters().iter().zip(b.named_parameters()) {
        assert_eq!(na, &nb);
        let (va, vb) = (pa.to_vec::<f32>().unwrap(), pb.to_vec::<f32>().unwrap());
        assert!(
            va.iter().zip(&vb).all(|(x, y)| x.to_bits() == y.to_bits()),
            "{na}"
        );
    }
    let mut wrong = Mlp::new(3);
    wrong.l1 = Linear::new(2, 8, true, &random::key(4)).unwrap();
    let err = wrong.load_weights(&path).unwrap_err().to_string();
    assert!(
        err.contains("l1.weight") && err.contains("[16, 2]"),
        "{err}"
    );
    let mut extra = Linear::new(2, 16, true, &random::key(5)).unwrap();
    let err = extra.load_weights(&path).unwrap_err().to_string();
    assert!(err.contains("missing tensor `weight`"), "{err}");
    let bad = Tree::unflatten(vec![(
        "l3.weight".to_string(),
        Array::zeros(&[1], Dtype::F32),
    )])
    .unwrap();
    assert!(
        b.update(&bad)
            .unwrap_err()
            .to_string()
            .contains("l3.weight")
    );
}

#[test]
fn frozen_parameters_get_no_gradient() {
    let mut model = Mlp::new(6);
    model.l1.freeze_all();
    assert_eq!(model.trainable_parameters().flatten().len(), 2);
    let step = value_and_grad(|m: &Mlp, x: &Array| m.forward(x)?.sum_all());
    let (_, grads) = step(&mut model, &Array::ones(&[1, 2], Dtype::F32)).unwrap();
    let names: Vec<String> = grads.flatten().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["l2.bias", "l2.weight"]);
    assert_eq!(model.set_frozen_where(&["l1"], false), 2);
    assert_eq!(model.trainable_parameters().flatten().len(), 4);
    model.freeze();
    assert_eq!(model.trainable_parameters().flatten().len(), 0);
    model.unfreeze();
    assert_eq!(model.num_parameters(), 2 * 16 + 16 + 16 + 1);
}

trait FreezeAll {
    fn freeze_all(&mut self);
}
impl FreezeAll for Linear {
    fn freeze_all(&mut self) {
        ModuleExt::freeze(self)
    }
}
