//! Every layer against a hand-written reference on small inputs.

use mlx_array::{Array, Dtype, random};
use mlx_nn::losses::{
    CrossEntropyOptions, Reduction, cross_entropy, linear_cross_entropy, mse_loss,
};
use mlx_nn::*;

fn vals(a: &Array) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g as f64 - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

fn input(seed: u64, shape: &[usize]) -> Array {
    let x = random::normal(&random::key(seed), shape, Dtype::F32).unwrap();
    x.eval().unwrap();
    x
}

#[test]
fn linear_matches_the_formula_and_mlx_init_bounds() {
    let l = Linear::new(3, 2, true, &random::key(1)).unwrap();
    let w = vals(l.weight.value());
    let b = vals(l.bias.as_ref().unwrap().value());
    let bound = (1.0f32 / 3.0).sqrt();
    assert!(w.iter().chain(&b).all(|v| v.abs() <= bound));
    let x = input(2, &[4, 3]);
    let xv = vals(&x);
    let want: Vec<f64> = (0..4)
        .flat_map(|r| (0..2).map(move |o| (r, o)))
        .map(|(r, o)| {
            b[o] as f64
                + (0..3)
                    .map(|k| xv[r * 3 + k] as f64 * w[o * 3 + k] as f64)
                    .sum::<f64>()
        })
        .collect();
    close(&vals(&l.forward(&x).unwrap()), &want, 1e-5, "linear");
    assert!(
        Linear::new(3, 2, false, &random::key(1))
            .unwrap()
            .bias
            .is_none()
    );
}

#[test]
fn embedding_looks_up_rows_and_ties() {
    let e = Embedding::new(5, 3, &random::key(3)).unwrap();
    let w = vals(e.weight.value());
    let ids = Array::from_slice(&[4i32, 0, 4], &[3]).unwrap();
    let got = vals(&e.forward(&ids).unwrap());
    let want: Vec<f64> = [4usize, 0, 4]
        .iter()
        .flat_map(|&i| (0..3).map(|j| w[i * 3 + j] as f64).collect::<Vec<_>>())
        .collect();
    close(&got, &want, 0.0, "embedding");
    let x = input(4, &[2, 3]);
    assert_eq!(e.as_linear(&x).unwrap().shape(), &[2, 5]);
}

#[test]
fn rms_norm_and_layer_norm() {
    let x = input(5, &[2, 4]);
    let xv = vals(&x);
    let mut n = RMSNorm::new(4);
    n.weight
        .set(Array::from_slice(&[1.0f32, 2.0, 0.5, -1.0], &[4]).unwrap());
    let wv = [1.0, 2.0, 0.5, -1.0];
    let want: Vec<f64> = (0..2)
        .flat_map(|r| {
            let row = &xv[r * 4..r * 4 + 4];
            let ms = row.iter().map(|&v| (v as f64).powi(2)).sum::<f64>() / 4.0;
            (0..4)
                .map(move |j| row[j] as f64 / (ms + 1e-5).sqrt() * wv[j])
                .collect::<Vec<_>>()
        })
        .collect();
    close(&vals(&n.forward(&x).unwrap()), &want, 1e-5, "rms_norm");
    let ln = LayerNorm::new(4);
    let want: Vec<f64> = (0..2)
        .flat_map(|r| {
            let row: Vec<f64> = xv[r * 4..r * 4 + 4].iter().map(|&v| v as f64).collect();
            let m = row.iter().sum::<f64>() / 4.0;
            let var = row.iter().map(|v| (v - m).powi(2)).sum::<f64>() / 4.0;
            row.into_iter().map(move |v| (v - m) / (var + 1e-5).sqrt())
        })
        .collect();
    close(&vals(&ln.forward(&x).unwrap()), &want, 1e-5, "layer_norm");
    assert_eq!(
        LayerNorm::with_options(4, 1e-5, false, false).num_parameters(),
        0
    );
}

fn rope_ref(
    x: &[f32],
    l: usize,
    d: usize,
    dims: usize,
    traditional: bool,
    offset: usize,
) -> Vec<f64> {
    let mut out: Vec<f64> = x.iter().map(|&v| v as f64).collect();
    for p in 0..l {
        for i in 0..dims / 2 {
            let theta = (offset + p) as f64 * 10000f64.powf(-2.0 * i as f64 / dims as f64);
            let (a, b) = if traditional {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + dims / 2)
            };
            let (x1, x2) = (x[p * d + a] as f64, x[p * d + b] as f64);
            out[p * d + a] = x1 * theta.cos() - x2 * theta.sin();
            out[p * d + b] = x1 * theta.sin() + x2 * theta.cos();
        }
    }
    out
}

#[test]
fn rope_traditional_and_halves_with_offset() {
    let x = input(6, &[1, 5, 6]);
    let xv = vals(&x);
    for traditional in [true, false] {
        for (dims, offset) in [(6, 0), (4, 3)] {
            let got = vals(&RoPE::new(dims, traditional).forward(&x, offset).unwrap());
            close(
                &got,
                &rope_ref(&xv, 5, 6, dims, traditional, offset),
                1e-4,
                &format!("rope trad={traditional} dims={dims} offset={offset}"),
            );
        }
    }
    assert!(RoPE::new(7, true).forward(&x, 0).is_err());
}

#[test]
fn causal_attention_matches_a_direct_computation() {
    let mask = create_additive_causal_mask(3, Dtype::F32).unwrap();
    assert_eq!(
        vals(&mask),
        vec![0.0, -1e9, -1e9, 0.0, 0.0, -1e9, 0.0, 0.0, 0.0]
    );
    let (l, d) = (3, 2);
    let q = input(7, &[1, 1, l, d]);
    let k = input(8, &[1, 1, l, d]);
    let v = input(9, &[1, 1, l, d]);
    let got = vals(&scaled_dot_product_attention(&q, &k, &v, 0.5, Some(&mask)).unwrap());
    let (qv, kv, vv) = (vals(&q), vals(&k), vals(&v));
    let mut want = vec![];
    for i in 0..l {
        let s: Vec<f64> = (0..=i)
            .map(|j| {
                0.5 * (0..d)
                    .map(|c| qv[i * d + c] as f64 * kv[j * d + c] as f64)
                    .sum::<f64>()
            })
            .collect();
        let m = s.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
        for c in 0..d {
            want.push(
                (0..=i)
                    .map(|j| (s[j] - m).exp() / z * vv[j * d + c] as f64)
                    .sum::<f64>(),
            );
        }
    }
    close(&got, &want, 1e-5, "attention");
    let mha = MultiHeadAttention::new(4, 2, false, &random::key(10)).unwrap();
    let x = input(11, &[2, 3, 4]);
    assert_eq!(
        mha.forward(&x, &x, &x, Some(&mask)).unwrap().shape(),
        &[2, 3, 4]
    );
    let names: Vec<String> = mha.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "query_proj.weight",
            "key_proj.weight",
            "value_proj.weight",
            "out_proj.weight"
        ]
    );
    assert!(MultiHeadAttention::new(5, 2, false, &random::key(0)).is_err());
}

#[test]
fn activations_swiglu_dropout_sequential() {
    let x = input(12, &[7]);
    let xv = vals(&x);
    let sig = |v: f64| 1.0 / (1.0 + (-v).exp());
    close(
        &vals(&silu(&x).unwrap()),
        &xv.iter()
            .map(|&v| v as f64 * sig(v as f64))
            .collect::<Vec<_>>(),
        1e-5,
        "silu",
    );
    let erf_ref = |v: f64| {
        // erf by its Taylor series (|v| is small here).
        let mut s = 0.0;
        let mut term = v;
        for n in 0..40 {
            s += term / (2 * n + 1) as f64;
            term *= -v * v / (n + 1) as f64;
        }
        s * 2.0 / std::f64::consts::PI.sqrt()
    };
    close(
        &vals(&gelu(&x).unwrap()),
        &xv.iter()
            .map(|&v| 0.5 * v as f64 * (1.0 + erf_ref(v as f64 / 2f64.sqrt())))
            .collect::<Vec<_>>(),
        1e-5,
        "gelu",
    );
    close(
        &vals(&gelu_approx(&x).unwrap()),
        &vals(&gelu(&x).unwrap())
            .iter()
            .map(|&v| v as f64)
            .collect::<Vec<_>>(),
        2e-3,
        "gelu_approx",
    );
    let mlp = SwiGLU::new(3, 5, &random::key(13)).unwrap();
    let h = input(14, &[2, 3]);
    let want = mlp
        .linear3
        .forward(
            &silu(&mlp.linear1.forward(&h).unwrap())
                .unwrap()
                .multiply(&mlp.linear2.forward(&h).unwrap())
                .unwrap(),
        )
        .unwrap();
    close(
        &vals(&mlp.forward(&h).unwrap()),
        &vals(&want).iter().map(|&v| v as f64).collect::<Vec<_>>(),
        0.0,
        "swiglu",
    );
    let dropout = Dropout::new(0.25).unwrap();
    let ones = Array::ones(&[10_000], Dtype::F32);
    let dropped = vals(&dropout.forward(&ones, Some(&random::key(1))).unwrap());
    let kept = dropped.iter().filter(|&&v| v != 0.0).count() as f64 / 10_000.0;
    assert!(
        (kept - 0.75).abs() < 0.02
            && dropped
                .iter()
                .all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-6)
    );
    assert_eq!(vals(&dropout.forward(&ones, None).unwrap()), vals(&ones));
    assert!(Dropout::new(1.0).is_err());
    let seq = Sequential::new()
        .push(Linear::new(3, 4, true, &random::key(15)).unwrap())
        .push(SiLU)
        .push(Linear::new(4, 2, false, &random::key(16)).unwrap());
    assert_eq!(seq.forward(&h).unwrap().shape(), &[2, 2]);
    let names: Vec<String> = seq.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["layers.0.weight", "layers.0.bias", "layers.2.weight"]
    );
}

#[test]
fn cross_entropy_options_and_mse() {
    let logits = input(17, &[4, 5]);
    let lv = vals(&logits);
    let t = [1i32, 4, 0, 2];
    let targets = Array::from_slice(&t, &[4]).unwrap();
    let row = |r: usize| -> Vec<f64> { lv[r * 5..r * 5 + 5].iter().map(|&v| v as f64).collect() };
    let lse = |r: usize| row(r).iter().map(|v| v.exp()).sum::<f64>().ln();
    let per: Vec<f64> = (0..4).map(|r| lse(r) - row(r)[t[r] as usize]).collect();
    let opts = |reduction| CrossEntropyOptions {
        reduction,
        ..Default::default()
    };
    close(
        &vals(&cross_entropy(&logits, &targets, &opts(Reduction::None)).unwrap()),
        &per,
        1e-5,
        "ce none",
    );
    close(
        &vals(&cross_entropy(&logits, &targets, &opts(Reduction::Sum)).unwrap()),
        &[per.iter().sum()],
        1e-5,
        "ce sum",
    );
    let ignored = CrossEntropyOptions {
        ignore_index: Some(4),
        ..Default::default()
    };
    close(
        &vals(&cross_entropy(&logits, &targets, &ignored).unwrap()),
        &[(per[0] + per[2] + per[3]) / 3.0],
        1e-5,
        "ce ignore",
    );
    let mask = Array::from_slice(&[1.0f32, 0.0, 1.0, 0.0], &[4]).unwrap();
    let masked = CrossEntropyOptions {
        weights: Some(mask),
        ..Default::default()
    };
    close(
        &vals(&cross_entropy(&logits, &targets, &masked).unwrap()),
        &[(per[0] + per[2]) / 2.0],
        1e-5,
        "ce mask",
    );
    let smooth = CrossEntropyOptions {
        label_smoothing: 0.1,
        reduction: Reduction::None,
        ..Default::default()
    };
    let want: Vec<f64> = (0..4)
        .map(|r| 0.9 * per[r] + 0.1 * (lse(r) - row(r).iter().sum::<f64>() / 5.0))
        .collect();
    close(
        &vals(&cross_entropy(&logits, &targets, &smooth).unwrap()),
        &want,
        1e-5,
        "ce smoothing",
    );
    assert!(
        cross_entropy(
            &logits,
            &Array::from_slice(&[1i32], &[1]).unwrap(),
            &opts(Reduction::Mean)
        )
        .is_err()
    );
    let p = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let q = Array::from_slice(&[0.0f32, 4.0], &[2]).unwrap();
    close(
        &vals(&mse_loss(&p, &q, Reduction::Mean).unwrap()),
        &[2.5],
        0.0,
        "mse",
    );
}

#[test]
fn linear_cross_entropy_matches_the_unfused_projection_and_loss() {
    let h = input(31, &[2, 6, 16]);
    let w = input(32, &[300, 16]);
    let mut tv: Vec<i32> = (0..12).map(|i| i * 37 % 300).collect();
    tv[5] = -100;
    let targets = Array::from_slice(&tv, &[2, 6]).unwrap();
    let mask = Array::from_slice(
        &[
            1.0f32, 1.0, 0.0, 1.0, 1.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0,
        ],
        &[2, 6],
    )
    .unwrap();
    let all = [
        CrossEntropyOptions::default(),
        CrossEntropyOptions {
            reduction: Reduction::Sum,
            weights: Some(mask),
            ignore_index: Some(-100),
            ..Default::default()
        },
        CrossEntropyOptions {
            reduction: Reduction::None,
            ignore_index: Some(-100),
            label_smoothing: 0.1,
            ..Default::default()
        },
    ];
    for (k, opts) in all.iter().enumerate() {
        // The unfused reference cannot take an out-of-range ignored target.
        let safe_t = if opts.ignore_index.is_some() {
            targets.maximum(&Array::scalar(0i32)).unwrap()
        } else {
            targets.abs().unwrap()
        };
        let t_fused = if opts.ignore_index.is_some() {
            targets.clone()
        } else {
            safe_t.clone()
        };
        let keep = targets.not_equal(&Array::scalar(-100i32)).unwrap();
        let unfused = |x: &[Array]| {
            let per = cross_entropy(
                &x[0].matmul(&x[1].t()?)?,
                &safe_t,
                &CrossEntropyOptions {
                    reduction: Reduction::None,
                    ignore_index: None,
                    weights: None,
                    ..opts.clone()
                },
            )?;
            let per = if opts.ignore_index.is_some() {
                per.multiply(&keep.astype(Dtype::F32)?)?
            } else {
                per
            };
            let w = match (&opts.weights, opts.ignore_index) {
                (Some(m), Some(_)) => Some(m.multiply(&keep.astype(Dtype::F32)?)?),
                (None, Some(_)) => Some(keep.astype(Dtype::F32)?),
                (m, None) => m.clone(),
            };
            let per = match &opts.weights {
                Some(m) => per.multiply(m)?,
                None => per,
            };
            let r = match opts.reduction {
                Reduction::None => per,
                Reduction::Sum => per.sum_all()?,
                Reduction::Mean => match w {
                    Some(w) => per.sum_all()?.divide(&w.sum_all()?)?,
                    None => per.mean_all()?,
                },
            };
            r.square()?.sum_all()
        };
        let fused = |x: &[Array]| {
            linear_cross_entropy(&x[0], &x[1], &t_fused, opts)?
                .square()?
                .sum_all()
        };
        let (lu, gu) =
            mlx_array::value_and_grad(unfused, &[0, 1])(&[h.clone(), w.clone()]).unwrap();
        let (lf, gf) = mlx_array::value_and_grad(fused, &[0, 1])(&[h.clone(), w.clone()]).unwrap();
        let lu = lu.item::<f32>().unwrap() as f64;
        close(&vals(&lf), &[lu], 1e-5, &format!("options {k}: loss"));
        for (i, (a, b)) in gf.iter().zip(&gu).enumerate() {
            let want: Vec<f64> = vals(b).into_iter().map(f64::from).collect();
            close(&vals(a), &want, 1e-4, &format!("options {k}: gradient {i}"));
        }
    }
}

/// Keys and values shared by every head (a broadcast view) attend as
/// explicit per-head copies do.
#[test]
fn attention_with_broadcast_heads_matches_explicit_heads() {
    use mlx_array::{Dtype, random};
    use mlx_nn::{AttentionMask, scaled_dot_product_attention};
    let q = random::normal(&random::key(7), &[2, 3, 4, 8], Dtype::F32).unwrap();
    let k = random::normal(&random::key(8), &[2, 1, 4, 8], Dtype::F32).unwrap();
    let v = random::normal(&random::key(9), &[2, 1, 4, 8], Dtype::F32).unwrap();
    let shared = scaled_dot_product_attention(&q, &k, &v, 0.35, AttentionMask::Causal).unwrap();
    let whole = |x: &mlx_array::Array| x.broadcast_to(&[2, 3, 4, 8]).unwrap().contiguous().unwrap();
    let explicit =
        scaled_dot_product_attention(&q, &whole(&k), &whole(&v), 0.35, AttentionMask::Causal)
            .unwrap();
    let (a, b) = (vals(&shared), vals(&explicit));
    assert_eq!(a.len(), b.len());
    // More queries than keys under a causal mask is refused on both paths.
    let long = random::normal(&random::key(10), &[2, 3, 5, 8], Dtype::F32).unwrap();
    for keys in [k.clone(), whole(&k)] {
        let err =
            scaled_dot_product_attention(&long, &keys, &whole(&v), 1.0, AttentionMask::Causal)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
        assert!(err.contains("no more queries than keys"), "{err}");
    }
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
}

/// The additive causal mask holds no NaN in any float dtype (-1e9 is -inf
/// in float16, and 0 * -inf would be NaN).
#[test]
fn the_causal_mask_is_finite_or_minus_infinity_in_every_float_dtype() {
    use mlx_array::Dtype;
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let m = mlx_nn::create_additive_causal_mask(3, dtype)
            .unwrap()
            .astype(Dtype::F32)
            .unwrap();
        let v = vals(&m);
        for (k, x) in v.iter().enumerate() {
            let (i, j) = (k / 3, k % 3);
            if j > i {
                assert!(*x <= -1e9 * 0.99, "{dtype} [{i}, {j}] = {x}");
            } else {
                assert_eq!(*x, 0.0, "{dtype} [{i}, {j}]");
            }
        }
    }
}

/// Grouped-query and multi-query keys and values (fewer heads than the
/// queries) attend, on the fused path (no mask, causal) and on the
/// composite one (an additive mask), as the same keys and values repeated
/// to every query head do; the gradients of `k` and `v` have their own
/// shapes and are the repeated ones' summed over each group.
#[test]
fn grouped_query_attention_matches_repeated_heads_fused_and_composite() {
    use mlx_array::{Array, Dtype, random};
    use mlx_nn::{AttentionMask, create_additive_causal_mask, scaled_dot_product_attention};
    let mask = create_additive_causal_mask(5, Dtype::F32).unwrap();
    for hkv in [2usize, 1] {
        let q = random::normal(&random::key(11), &[2, 4, 5, 8], Dtype::F32).unwrap();
        let k = random::normal(&random::key(12), &[2, hkv, 5, 8], Dtype::F32).unwrap();
        let v = random::normal(&random::key(13), &[2, hkv, 5, 6], Dtype::F32).unwrap();
        // k or v with each head copied over its group of 4 / hkv query heads.
        let repeat = |x: &Array| {
            let s = x.shape().to_vec();
            x.reshape(&[2, hkv as i64, 1, 5, s[3] as i64])
                .unwrap()
                .broadcast_to(&[2, hkv, 4 / hkv, 5, s[3]])
                .unwrap()
                .reshape(&[2, 4, 5, s[3] as i64])
                .unwrap()
        };
        for causal in [false, true] {
            let what = format!("hkv {hkv} causal {causal}");
            let grouped = |x: &[Array]| {
                let m = if causal {
                    AttentionMask::Causal
                } else {
                    AttentionMask::None
                };
                scaled_dot_product_attention(&x[0], &x[1], &x[2], 0.4, m)?.sum_all()
            };
            // Any additive mask (all zeros: none) takes the composite path.
            let zeros = Array::zeros(&[5, 5], Dtype::F32);
            let composite = |x: &[Array]| {
                let m = if causal { &mask } else { &zeros };
                scaled_dot_product_attention(&x[0], &x[1], &x[2], 0.4, m)?.sum_all()
            };
            let repeated = |x: &[Array]| {
                let m = if causal {
                    AttentionMask::Causal
                } else {
                    AttentionMask::None
                };
                scaled_dot_product_attention(&x[0], &repeat(&x[1]), &repeat(&x[2]), 0.4, m)?
                    .sum_all()
            };
            let inputs = [q.clone(), k.clone(), v.clone()];
            let (lw, gw) = mlx_array::value_and_grad(repeated, &[0, 1, 2])(&inputs).unwrap();
            for (name, f) in [
                (
                    "fused",
                    &grouped as &dyn Fn(&[Array]) -> mlx_array::Result<Array>,
                ),
                ("composite", &composite),
            ] {
                let (l, g) = mlx_array::value_and_grad(f, &[0, 1, 2])(&inputs).unwrap();
                let lw = f64::from(lw.item::<f32>().unwrap());
                close(&vals(&l), &[lw], 1e-4, &format!("{what} {name}: value"));
                for (i, (a, b)) in g.iter().zip(&gw).enumerate() {
                    assert_eq!(a.shape(), inputs[i].shape(), "{what} {name}: gradient {i}");
                    let want: Vec<f64> = vals(b).into_iter().map(f64::from).collect();
                    close(
                        &vals(a),
                        &want,
                        1e-4,
                        &format!("{what} {name}: gradient {i}"),
                    );
                }
            }
        }
    }
}
