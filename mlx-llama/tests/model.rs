//! The model: MLX's weight names, causal masking, the KV cache, generation.

use mlx_array::{Array, Dtype, random};
use mlx_llama::{KvCache, Llama, LlamaConfig};
use mlx_nn::ModuleExt;

fn small() -> Llama {
    Llama::new(
        &LlamaConfig {
            num_layers: 2,
            vocab_size: 50,
            dims: 16,
            mlp_dims: 32,
            num_heads: 2,
            ..LlamaConfig::default()
        },
        1,
    )
    .unwrap()
}

#[test]
fn weight_names_follow_mlx_llama() {
    let names: Vec<String> = small()
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for want in [
        "embedding.weight",
        "layers.0.attention.query_proj.weight",
        "layers.0.attention.key_proj.weight",
        "layers.0.attention.value_proj.weight",
        "layers.0.attention.out_proj.weight",
        "layers.1.norm1.weight",
        "layers.1.norm2.weight",
        "layers.1.linear1.weight",
        "layers.1.linear2.weight",
        "layers.1.linear3.weight",
        "norm.weight",
        "out_proj.weight",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "missing {want} in {names:?}"
        );
    }
    let reference = Llama::new(&LlamaConfig::default(), 0).unwrap();
    assert_eq!(
        reference.num_parameters(),
        28_355_328,
        "the reference model's size (as MLX reports it)"
    );
}

#[test]
fn the_output_at_a_position_ignores_later_tokens() {
    let m = small();
    let a = Array::from_slice(&[1u32, 2, 3, 4, 5], &[1, 5]).unwrap();
    let b = Array::from_slice(&[1u32, 2, 3, 9, 9], &[1, 5]).unwrap();
    let la = m
        .forward(&a)
        .unwrap()
        .slice_axis(1, 0, 3)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let lb = m
        .forward(&b)
        .unwrap()
        .slice_axis(1, 0, 3)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(la, lb);
}

#[test]
fn the_kv_cache_reproduces_the_full_forward_pass() {
    let m = small();
    let toks = random::randint(&random::key(3), 0, 50, &[1, 7], Dtype::U32).unwrap();
    let full = m.forward(&toks).unwrap().to_vec::<f32>().unwrap();
    let mut caches: Vec<Option<KvCache>> = vec![None; 2];
    let mut pieces = m
        .forward_cached(&toks.slice_axis(1, 0, 4).unwrap(), &mut caches)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    for t in 4..7 {
        pieces.extend(
            m.forward_cached(&toks.slice_axis(1, t, t + 1).unwrap(), &mut caches)
                .unwrap()
                .to_vec::<f32>()
                .unwrap(),
        );
    }
    for (i, (a, b)) in full.iter().zip(&pieces).enumerate() {
        assert!((a - b).abs() < 1e-4, "logit {i}: full {a} vs cached {b}");
    }
    let g1 = m.generate(&[1, 2, 3], 5, 0.0, 0).unwrap();
    let g2 = m.generate(&[1, 2, 3], 5, 0.0, 0).unwrap();
    assert_eq!(g1, g2);
    assert_eq!(g1.len(), 5);
    assert!(g1.iter().all(|&t| t < 50));
    assert!(m.generate(&[], 5, 0.0, 0).is_err());
}

#[test]
fn the_fused_training_loss_equals_cross_entropy_of_the_logits() {
    use mlx_nn::losses::{CrossEntropyOptions, Reduction, cross_entropy};
    let m = small();
    let x = Array::from_slice(&[3u32, 7, 1, 0, 5, 2, 9, 4], &[2, 4]).unwrap();
    let y = Array::from_slice(&[7u32, 1, 0, 5, 2, 9, 4, 8], &[2, 4]).unwrap();
    let opts = CrossEntropyOptions {
        reduction: Reduction::Sum,
        ..Default::default()
    };
    let ones = Array::ones(&[2, 4], mlx_array::Dtype::F32);
    let fused = m.loss(&x, &y, &ones).unwrap().item::<f32>().unwrap();
    let plain = cross_entropy(&m.forward(&x).unwrap(), &y, &opts)
        .unwrap()
        .item::<f32>()
        .unwrap();
    assert!(
        (fused - plain).abs() <= 1e-5 * plain.abs(),
        "{fused} vs {plain}"
    );
}

#[test]
fn the_training_loss_and_its_gradients_equal_the_plain_loss() {
    use mlx_nn::losses::{CrossEntropyOptions, Reduction, cross_entropy};
    use mlx_nn::value_and_grad;
    let mut m = small();
    let x = Array::from_slice(&[3u32, 7, 1, 0, 5, 2, 9, 4], &[2, 4]).unwrap();
    let y = Array::from_slice(&[7u32, 1, 0, 5, 2, 9, 4, 8], &[2, 4]).unwrap();
    // A loss mask with one padded position, times a normalisation.
    let mask = Array::from_slice(&[1.0f32, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0], &[2, 4]).unwrap();
    let weights = mask.mul_scalar(0.25).unwrap();
    let plain = value_and_grad(|m: &Llama, _: &()| {
        let opts = CrossEntropyOptions {
            reduction: Reduction::Sum,
            weights: Some(mask.clone()),
            ..Default::default()
        };
        // The composite: the logits, then the cross-entropy.
        cross_entropy(&m.forward(&x)?, &y, &opts)?.mul_scalar(0.25)
    });
    let fused = value_and_grad(|m: &Llama, _: &()| m.loss(&x, &y, &weights));
    let (a, ga) = plain(&mut m, &()).unwrap();
    let (b, gb) = fused(&mut m, &()).unwrap();
    let (a, b) = (a.item::<f32>().unwrap(), b.item::<f32>().unwrap());
    assert!((a - b).abs() <= 1e-5 * a.abs(), "{a} vs {b}");
    let (fa, fb) = (ga.flatten(), gb.flatten());
    assert_eq!(fa.len(), fb.len());
    for ((name, p), (_, q)) in fa.iter().zip(&fb) {
        let (p, q) = (p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
        let scale = p.iter().fold(0f32, |s, x| s.max(x.abs())).max(1e-6);
        for (u, v) in p.iter().zip(&q) {
            assert!((u - v).abs() <= 1e-4 * scale, "{name}: {u} vs {v}");
        }
    }
}

#[test]
fn generation_streams_each_token_and_stops_before_a_stop_token() {
    use mlx_llama::sampling::Sampling;
    let m = small();
    let greedy = m.generate(&[1, 2, 3], 12, 0.0, 0).unwrap();
    // Stop at the fourth greedy token: the three before it come back, each
    // handed to the callback in order as it was drawn.
    let stop = greedy[3];
    let first = greedy.iter().position(|&t| t == stop).unwrap();
    let mut streamed = Vec::new();
    let got = m
        .generate_with(
            &[1, 2, 3],
            12,
            &Sampling::temperature(0.0),
            0,
            &[stop],
            &mut |t| {
                streamed.push(t);
                Ok(())
            },
        )
        .unwrap();
    assert_eq!(got, greedy[..first].to_vec());
    assert_eq!(streamed, got);
    // Top-k 1 at any temperature is greedy.
    for seed in 0..3 {
        let s = Sampling {
            top_k: 1,
            ..Sampling::temperature(1.5)
        };
        let k1 = m
            .generate_with(&[1, 2, 3], 12, &s, seed, &[], &mut |_| Ok(()))
            .unwrap();
        assert_eq!(k1, greedy, "seed {seed}");
    }
    // A temperature draw differs from greedy for some seed (the filters
    // are what made it greedy).
    let sampled: Vec<Vec<u32>> = (0..3)
        .map(|seed| m.generate(&[1, 2, 3], 12, 1.5, seed).unwrap())
        .collect();
    assert!(sampled.iter().any(|s| *s != greedy));
}
