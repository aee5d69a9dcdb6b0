//! `cargo bench -p mlx-nn --bench nn`: forward+backward of the reference
//! Llama's block shapes and of the 50,257-way cross-entropy, with time and
//! peak memory (`memory::peak()`) per step.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use mlx_array::{Array, Dtype, Result, eval, memory, random};
use mlx_nn::losses::{CrossEntropyOptions, cross_entropy};
use mlx_nn::*;

const B: usize = 4;
const L: usize = 511;
const D: usize = 256;
const H: usize = 4;
const MLP: usize = 512;
const V: usize = 50257;

/// The reference Llama block: RMSNorm, attention with RoPE, residual, RMSNorm, SwiGLU, residual.
struct Block {
    norm1: RMSNorm,
    attention: MultiHeadAttention,
    norm2: RMSNorm,
    mlp: SwiGLU,
}
impl_module!(Block {
    norm1,
    attention,
    norm2,
    mlp
});

impl Block {
    fn forward(&self, x: &Array, mask: AttentionMask<'_>, rope: &RoPE) -> Result<Array> {
        let h = self.norm1.forward(x)?;
        let a = &self.attention;
        let q = rope.forward(&split_heads(&a.query_proj.forward(&h)?, H)?, 0)?;
        let k = rope.forward(&split_heads(&a.key_proj.forward(&h)?, H)?, 0)?;
        let v = split_heads(&a.value_proj.forward(&h)?, H)?;
        let o = scaled_dot_product_attention(&q, &k, &v, 1.0 / ((D / H) as f64).sqrt(), mask)?;
        let x = x.add(&a.out_proj.forward(&merge_heads(&o)?)?)?;
        x.add(&self.mlp.forward(&self.norm2.forward(&x)?)?)
    }
}

/// Runs `step` once to warm up, then once measuring peak memory above the starting point.
fn peak_of(what: &str, step: &mut dyn FnMut()) {
    step();
    memory::clear_cache();
    let base = memory::active();
    memory::reset_peak();
    let t = Instant::now();
    step();
    let dt = t.elapsed();
    eprintln!(
        "{what}: {:.1} ms, peak {:.1} MiB above the {:.1} MiB held before the step",
        dt.as_secs_f64() * 1e3,
        (memory::peak() - base) as f64 / (1 << 20) as f64,
        base as f64 / (1 << 20) as f64
    );
}

fn block(c: &mut Criterion) {
    let mut blk = Block {
        norm1: RMSNorm::new(D),
        attention: MultiHeadAttention::new(D, H, false, &random::key(1)).unwrap(),
        norm2: RMSNorm::new(D),
        mlp: SwiGLU::new(D, MLP, &random::key(2)).unwrap(),
    };
    let x = random::normal(&random::key(3), &[B, L, D], Dtype::F32).unwrap();
    let mask = create_additive_causal_mask(L, Dtype::F32).unwrap();
    let rope = RoPE::new(D / H, true);
    eval((&x, &mask)).unwrap();
    let mut g = c.benchmark_group("llama_block");
    g.sample_size(10).measurement_time(Duration::from_secs(5));
    // The causal mask as an additive array (the graph of ops: the scores and
    // probabilities are held for the gradient), then as `Causal` (the fused
    // primitive, which skips the hidden half).
    for (name, mask) in [
        ("additive_mask", AttentionMask::Additive(&mask)),
        ("causal_fused", AttentionMask::Causal),
    ] {
        let vg = value_and_grad(|m: &Block, x: &Array| m.forward(x, mask, &rope)?.sum_all());
        let mut step = || {
            let (loss, grads) = vg(&mut blk, &x).unwrap();
            eval((&loss, &grads)).unwrap();
            black_box(loss);
        };
        peak_of(
            &format!("llama block fwd+bwd (4x511x256, 4 heads, MLP 512), {name}"),
            &mut step,
        );
        g.bench_function(format!("forward_backward_4x511x256_{name}"), |b| {
            b.iter(&mut step)
        });
    }
    g.finish();
}

fn loss(c: &mut Criterion) {
    let n = B * L;
    let h = random::normal(&random::key(4), &[n, D], Dtype::F32).unwrap();
    let w = random::normal_with(&random::key(5), &[V, D], Dtype::F32, 0.0, 0.06).unwrap();
    let t = random::randint(&random::key(6), 0, V as i64, &[n], Dtype::I32).unwrap();
    eval((&h, &w, &t)).unwrap();
    eprintln!(
        "one logits buffer [{n}, {V}] f32 = {:.1} MiB",
        (n * V * 4) as f64 / (1 << 20) as f64
    );
    // The output projection feeds the loss: logits exist only inside the graph.
    let vg = mlx_array::value_and_grad(
        |a: &[Array]| {
            cross_entropy(
                &a[0].matmul(&a[1].t()?)?,
                &a[2],
                &CrossEntropyOptions::default(),
            )
        },
        &[0, 1],
    );
    let mut fused = || {
        let (l, g) = vg(&[h.clone(), w.clone(), t.clone()]).unwrap();
        eval((&l, &g)).unwrap();
        black_box(l);
    };
    peak_of(
        "fused cross-entropy fwd+bwd incl. output projection",
        &mut fused,
    );
    // The unfused composite (log_softmax + gather) for comparison.
    let naive = mlx_array::value_and_grad(
        |a: &[Array]| {
            let logits = a[0].matmul(&a[1].t()?)?;
            let logp = logits.subtract(&logits.logsumexp(&[-1], true)?)?;
            logp.take_along_axis(&a[2].reshape(&[-1, 1])?, -1)?
                .mean_all()?
                .negative()
        },
        &[0, 1],
    );
    let mut unfused = || {
        let (l, g) = naive(&[h.clone(), w.clone(), t.clone()]).unwrap();
        eval((&l, &g)).unwrap();
        black_box(l);
    };
    peak_of(
        "unfused log_softmax+gather fwd+bwd incl. output projection",
        &mut unfused,
    );
    let mut g = c.benchmark_group("cross_entropy_50257");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    g.bench_function("fused_fwd_bwd", |b| b.iter(&mut fused));
    g.bench_function("unfused_fwd_bwd", |b| b.iter(&mut unfused));
    g.finish();
}

criterion_group!(benches, block, loss);
criterion_main!(benches);
