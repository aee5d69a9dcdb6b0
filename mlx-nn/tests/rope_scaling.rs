//! RoPE's frequency scaling: the inverse frequencies of every
//! [`RopeScaling`] against Hugging Face transformers' (a fixture written by
//! `tests/fixtures/rope/make_rope_fixtures.py`, no Python needed here), and
//! the layer's rotation with them against one computed on the host.

use mlx_array::{Array, Dtype, random};
use mlx_nn::{RoPE, RopeScaling};
use serde_json::Value;

const FIXTURE: &str = include_str!("fixtures/rope/rope_inv_freqs.json");

/// The scaling a fixture case names, in transformers' spelling.
fn scaling_of(case: &Value) -> RopeScaling {
    let f = |key: &str| case[key].as_f64().unwrap_or_else(|| panic!("{key}"));
    let n = |key: &str| case[key].as_u64().unwrap_or_else(|| panic!("{key}")) as usize;
    match case["rope_type"].as_str().expect("rope_type") {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: f("factor"),
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: f("factor"),
            original_max_position_embeddings: n("original_max_position_embeddings"),
        },
        "llama3" => RopeScaling::Llama3 {
            factor: f("factor"),
            low_freq_factor: f("low_freq_factor"),
            high_freq_factor: f("high_freq_factor"),
            original_max_position_embeddings: n("original_max_position_embeddings"),
        },
        other => panic!("no RopeScaling for rope_type {other}"),
    }
}

#[test]
fn inv_freqs_match_transformers() {
    let doc: Value = serde_json::from_str(FIXTURE).expect("fixture");
    let cases = doc["cases"].as_array().expect("cases");
    assert!(cases.len() >= 20, "{} cases", cases.len());
    let mut grown = 0;
    for case in cases {
        let mut rope = RoPE::new(case["head_dim"].as_u64().unwrap() as usize, false);
        rope.base = case["rope_theta"].as_f64().unwrap();
        rope.scaling = scaling_of(case);
        let seq_len = case["seq_len"].as_u64().unwrap_or(1) as usize;
        let want: Vec<f64> = case["inv_freq"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let got = rope.inv_freqs(seq_len);
        let what = format!("{:?} dims {} seq_len {seq_len}", rope.scaling, rope.dims);
        assert_eq!(got.len(), want.len(), "{what}");
        for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
            assert!(
                (f64::from(g) - w).abs() <= 1e-6 * w.abs(),
                "{what}: pair {i}: {g} vs transformers' {w}"
            );
        }
        // Dynamic scaling changes the frequencies only past the original length.
        if let RopeScaling::Dynamic {
            original_max_position_embeddings: original,
            ..
        } = rope.scaling
        {
            let mut unscaled = rope.clone();
            unscaled.scaling = RopeScaling::Default;
            let same = got == unscaled.inv_freqs(seq_len);
            assert_eq!(same, seq_len <= original, "{what}");
            grown += usize::from(!same);
        }
    }
    assert!(grown >= 4, "{grown} dynamic cases past the original length");
}

/// `x` (`[..., L, D]`, f32 values) rotated on the host by `freqs` from
/// `offset`: the angle as the f32 product the kernels form, its cosine
/// and sine in f64.
fn host_rotation(
    x: &[f32],
    shape: &[usize],
    freqs: &[f32],
    traditional: bool,
    offset: usize,
) -> Vec<f64> {
    let (len, width) = (shape[shape.len() - 2], shape[shape.len() - 1]);
    let (dims, half) = (2 * freqs.len(), freqs.len());
    let mut out: Vec<f64> = x.iter().map(|&v| f64::from(v)).collect();
    for (row, r) in x.chunks(width).enumerate() {
        let pos = (offset + row % len) as f32;
        for (i, &f) in freqs.iter().enumerate() {
            let theta = f64::from(pos * f);
            let (a, b) = if traditional {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x1, x2) = (f64::from(r[a]), f64::from(r[b]));
            out[row * width + a] = x1 * theta.cos() - x2 * theta.sin();
            out[row * width + b] = x1 * theta.sin() + x2 * theta.cos();
        }
        assert!(dims <= width);
    }
    out
}

fn close(got: &[f32], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        assert!(
            (f64::from(g) - w).abs() <= tol * w.abs().max(1.0),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

#[test]
fn llama3_forward_equals_a_host_rotation() {
    let shape = [2, 3, 5, 16];
    let x = random::normal(&random::key(7), &shape, Dtype::F32).unwrap();
    let xv = x.to_vec::<f32>().unwrap();
    for traditional in [false, true] {
        for (factor, offset) in [(8.0, 0), (32.0, 8190)] {
            let mut rope = RoPE::new(16, traditional);
            rope.base = 500_000.0;
            rope.scaling = RopeScaling::Llama3 {
                factor,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: 8192,
            };
            let freqs = rope.inv_freqs(offset + 5);
            let got = rope.forward(&x, offset).unwrap().to_vec::<f32>().unwrap();
            let want = host_rotation(&xv, &shape, &freqs, traditional, offset);
            // The same f32 angle as the kernel's, even near 8192 radians.
            close(
                &got,
                &want,
                1e-5,
                &format!("llama3 factor {factor} offset {offset} traditional {traditional}"),
            );
        }
    }
}

#[test]
fn dynamic_forward_takes_the_frequencies_of_offset_plus_length() {
    let shape = [1, 6, 8];
    let x = random::normal(&random::key(8), &shape, Dtype::F32).unwrap();
    let mut rope = RoPE::new(8, false);
    rope.scaling = RopeScaling::Dynamic {
        factor: 2.0,
        original_max_position_embeddings: 4,
    };
    for offset in [0, 3] {
        let got = rope.forward(&x, offset).unwrap().to_vec::<f32>().unwrap();
        let freqs = rope.inv_freqs(offset + 6);
        let want = mlx_array::rope_with_freqs(&x, &freqs, false, offset).unwrap();
        assert_eq!(got, want.to_vec::<f32>().unwrap(), "offset {offset}");
        assert_ne!(
            freqs,
            rope.inv_freqs(6 - 1 + offset),
            "grown with the length"
        );
    }
}

#[test]
fn default_scaling_is_the_unscaled_rope_and_linear_divides() {
    let x = random::normal(&random::key(9), &[2, 4, 10], Dtype::F32).unwrap();
    let mut rope = RoPE::new(8, true);
    rope.base = 500.0;
    assert_eq!(rope.scaling, RopeScaling::Default);
    let got = rope.forward(&x, 2).unwrap().to_vec::<f32>().unwrap();
    let want = mlx_array::rope(&x, 8, true, 500.0, 1.0, 2).unwrap();
    assert_eq!(got, want.to_vec::<f32>().unwrap(), "bit for bit");
    // Linear: every frequency divided by the factor, positions scaled too.
    rope.scaling = RopeScaling::Linear { factor: 4.0 };
    rope.scale = 0.5;
    let unscaled = {
        let mut r = rope.clone();
        r.scaling = RopeScaling::Default;
        r.inv_freqs(1)
    };
    let freqs = rope.inv_freqs(1);
    let odd = RoPE {
        dims: 7,
        ..rope.clone()
    };
    let e = odd.forward(&x, 0).unwrap_err().to_string();
    assert!(e.contains("cannot rotate 7 features"), "{e}");
    for (f, u) in freqs.iter().zip(&unscaled) {
        assert_eq!(*f, u / 4.0);
    }
    let scaled: Vec<f32> = freqs.iter().map(|f| f * 0.5).collect();
    let got = rope.forward(&x, 2).unwrap().to_vec::<f32>().unwrap();
    let xv = x.to_vec::<f32>().unwrap();
    close(
        &got,
        &host_rotation(&xv, &[2, 4, 10], &scaled, true, 2),
        1e-5,
        "linear with scale 0.5",
    );
}

#[test]
fn rope_scaling_round_trips_through_serde() {
    for scaling in [
        RopeScaling::Default,
        RopeScaling::Linear { factor: 2.0 },
        RopeScaling::Dynamic {
            factor: 2.0,
            original_max_position_embeddings: 2048,
        },
        RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192,
        },
    ] {
        let json = serde_json::to_string(&scaling).unwrap();
        let back: RopeScaling = serde_json::from_str(&json).unwrap();
        assert_eq!(back, scaling, "{json}");
    }
    assert_eq!(RopeScaling::default(), RopeScaling::Default);
}

#[test]
fn scaled_rope_keeps_half_dtypes_and_differentiates() {
    let x = random::normal(&random::key(10), &[1, 3, 8], Dtype::F32).unwrap();
    let mut rope = RoPE::new(8, false);
    rope.scaling = RopeScaling::Linear { factor: 2.0 };
    for dtype in [Dtype::F16, Dtype::BF16] {
        let y = rope.forward(&x.astype(dtype).unwrap(), 1).unwrap();
        assert_eq!(y.dtype(), dtype);
    }
    // The gradient of a rotation is its inverse: d sum(w * R x) = R^T w.
    let w = random::normal(&random::key(11), &[1, 3, 8], Dtype::F32).unwrap();
    let f = |a: &[Array]| rope.forward(&a[0], 1)?.multiply(&w)?.sum_all();
    let (_, g) = mlx_array::value_and_grad(f, &[0])(std::slice::from_ref(&x)).unwrap();
    let back = rope.forward(&g[0], 1).unwrap().to_vec::<f32>().unwrap();
    let wv: Vec<f64> = w
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|&v| f64::from(v))
        .collect();
    close(&back, &wv, 1e-5, "R (R^T w) = w");
}
