//! Hugging Face's Llama forward pass in plain Rust (f64 loops over the
//! exported float32 tensors, no mlx-array), as an independent expectation.

use std::collections::HashMap;

/// How queries and keys are rotated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rope {
    /// Hugging Face's `rotate_half`: pairs `(x[i], x[i + d/2])`.
    Halves,
    /// MLX's `traditional`: pairs `(x[2i], x[2i+1])`.
    Interleaved,
}

/// The hyper-parameters the forward pass needs.
pub struct Shape {
    pub layers: usize,
    pub dims: usize,
    pub heads: usize,
    pub vocab: usize,
    pub eps: f64,
    pub theta: f64,
}

/// Named row-major tensors.
pub type Tensors = HashMap<String, (Vec<usize>, Vec<f32>)>;

fn get<'a>(t: &'a Tensors, name: &str) -> &'a [f32] {
    &t.get(name).unwrap_or_else(|| panic!("no tensor {name}")).1
}

/// `x W^T` for one row `x` and `W` of `out` rows.
fn linear(x: &[f64], w: &[f32], out: usize) -> Vec<f64> {
    let n = x.len();
    (0..out)
        .map(|o| (0..n).map(|i| x[i] * w[o * n + i] as f64).sum())
        .collect()
}

fn rms_norm(x: &[f64], w: &[f32], eps: f64) -> Vec<f64> {
    let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
    let r = 1.0 / (ms + eps).sqrt();
    x.iter().zip(w).map(|(v, w)| v * r * *w as f64).collect()
}

/// Rotates one head's features `x` at position `pos`.
fn rotate(x: &mut [f64], pos: usize, theta: f64, rope: Rope) {
    let d = x.len();
    for i in 0..d / 2 {
        let angle = pos as f64 * theta.powf(-2.0 * i as f64 / d as f64);
        let (a, b) = match rope {
            Rope::Halves => (i, i + d / 2),
            Rope::Interleaved => (2 * i, 2 * i + 1),
        };
        let (xa, xb) = (x[a], x[b]);
        x[a] = xa * angle.cos() - xb * angle.sin();
        x[b] = xa * angle.sin() + xb * angle.cos();
    }
}

/// Logits `[tokens.len()][vocab]` of a causal Llama with Hugging Face's
/// tensor names.
pub fn logits(t: &Tensors, s: &Shape, tokens: &[u32], rope: Rope) -> Vec<Vec<f64>> {
    let (dims, len) = (s.dims, tokens.len());
    let hd = dims / s.heads;
    let embed = get(t, "model.embed_tokens.weight");
    let mut x: Vec<Vec<f64>> = tokens
        .iter()
        .map(|&tok| {
            let row = tok as usize * dims;
            embed[row..row + dims].iter().map(|&v| v as f64).collect()
        })
        .collect();
    for l in 0..s.layers {
        let p = |n: &str| get(t, &format!("model.layers.{l}.{n}.weight"));
        let h: Vec<Vec<f64>> = x
            .iter()
            .map(|r| rms_norm(r, p("input_layernorm"), s.eps))
            .collect();
        let project = |w: &[f32], rotated: bool| -> Vec<Vec<f64>> {
            h.iter()
                .enumerate()
                .map(|(pos, r)| {
                    let mut y = linear(r, w, dims);
                    if rotated {
                        for head in y.chunks_mut(hd) {
                            rotate(head, pos, s.theta, rope);
                        }
                    }
                    y
                })
                .collect()
        };
        let q = project(p("self_attn.q_proj"), true);
        let k = project(p("self_attn.k_proj"), true);
        let v = project(p("self_attn.v_proj"), false);
        let scale = 1.0 / (hd as f64).sqrt();
        for i in 0..len {
            let mut attended = vec![0.0; dims];
            for head in 0..s.heads {
                let r = head * hd..(head + 1) * hd;
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        q[i][r.clone()]
                            .iter()
                            .zip(&k[j][r.clone()])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, w) in e.iter().enumerate() {
                    for c in r.clone() {
                        attended[c] += w / z * v[j][c];
                    }
                }
            }
            let o = linear(&attended, p("self_attn.o_proj"), dims);
            x[i].iter_mut().zip(o).for_each(|(a, b)| *a += b);
        }
        let mlp_dims = t[&format!("model.layers.{l}.mlp.gate_proj.weight")].0[0];
        for row in x.iter_mut() {
            let h = rms_norm(row, p("post_attention_layernorm"), s.eps);
            let g = linear(&h, p("mlp.gate_proj"), mlp_dims);
            let u = linear(&h, p("mlp.up_proj"), mlp_dims);
            let m: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let y = linear(&m, p("mlp.down_proj"), dims);
            row.iter_mut().zip(y).for_each(|(a, b)| *a += b);
        }
    }
    x.iter()
        .map(|r| {
            let h = rms_norm(r, get(t, "model.norm.weight"), s.eps);
            linear(&h, get(t, "lm_head.weight"), s.vocab)
        })
        .collect()
}
