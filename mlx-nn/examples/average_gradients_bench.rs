//! Times `average_gradients` on the gradient tree of the reference Llama
//! (4 layers, dims 256, MLP 512, vocab 50257, untied output: 39 tensors,
//! 28.4M f32 parameters) against one `all_sum` per tensor, and shows the
//! communication stream at work: the same averaging evaluated in one `eval`
//! with a (synthetic) backward pass that computes the gradients, against
//! evaluating the backward pass first and communicating afterwards.
//!
//! ```text
//! cargo build --release -p mlx-nn --example average_gradients_bench
//! target/release/mlx-launch -n 2 -- target/release/examples/average_gradients_bench
//! target/release/mlx-launch -n 2 --backend quic -- target/release/examples/average_gradients_bench
//! ```
//!
//! `ITERS` (default 5) sets the number of timed repetitions; the median is
//! printed. `--json PATH` makes rank 0 also write the figures there as JSON
//! (`cargo xtask bench collectives` runs it that way at world 2).

use std::time::Instant;

use mlx_array::{Array, Dtype, Tree, eval};
use mlx_dist::{Backend, Group, init};
use mlx_nn::{AverageOptions, average_gradients};

/// (name, shape) of every gradient of the reference Llama.
fn llama_shapes() -> Vec<(String, Vec<usize>)> {
    let (vocab, dims, mlp) = (50257, 256, 512);
    let mut v = vec![("embedding.weight".to_string(), vec![vocab, dims])];
    for l in 0..4 {
        for p in ["query_proj", "key_proj", "value_proj", "out_proj"] {
            v.push((format!("layers.{l}.attention.{p}.weight"), vec![dims, dims]));
        }
        v.push((format!("layers.{l}.mlp.linear1.weight"), vec![mlp, dims]));
        v.push((format!("layers.{l}.mlp.linear2.weight"), vec![mlp, dims]));
        v.push((format!("layers.{l}.mlp.linear3.weight"), vec![dims, mlp]));
        v.push((format!("layers.{l}.attention_norm.weight"), vec![dims]));
        v.push((format!("layers.{l}.mlp_norm.weight"), vec![dims]));
    }
    v.push(("norm.weight".to_string(), vec![dims]));
    v.push(("out_proj.weight".to_string(), vec![vocab, dims]));
    v
}

/// A lazy stand-in for the backward pass: each gradient is a matmul over an
/// inner dimension of `k` (about `2 * k` flops per element), not yet evaluated.
fn lazy_grads(rank: usize, k: usize) -> anyhow::Result<Tree> {
    let mut leaves = Vec::new();
    for (name, shape) in llama_shapes() {
        let (rows, cols) = match shape[..] {
            [r, c] => (r, c),
            [c] => (1, c),
            _ => unreachable!("matrices and vectors only"),
        };
        let a = Array::full(&[rows, k], 0.01 * (rank + 1) as f64, Dtype::F32);
        let b = Array::full(&[k, cols], 0.02, Dtype::F32);
        leaves.push((name, a.matmul(&b)?.reshape(&shape_i64(&shape))?));
    }
    Ok(Tree::unflatten(leaves)?)
}

fn shape_i64(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).expect("finite"));
    v[v.len() / 2]
}

/// Median milliseconds of `f` over `iters` runs (after one warm-up), ranks in step.
fn time(g: &Group, iters: usize, mut f: impl FnMut() -> anyhow::Result<()>) -> anyhow::Result<f64> {
    f()?;
    let mut t = Vec::new();
    for _ in 0..iters {
        g.barrier()?;
        let s = Instant::now();
        f()?;
        t.push(s.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(t))
}

fn main() -> anyhow::Result<()> {
    let g = init(Backend::Any)?;
    let iters: usize = std::env::var("ITERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let shapes = llama_shapes();
    let params: usize = shapes
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    let json_path = json_arg()?;
    let mut figures: Vec<(String, f64)> = Vec::new();
    let say = |s: String| {
        if g.rank() == 0 {
            println!("{s}");
        }
    };
    say(format!(
        "backend {} world {}: {} tensors, {:.1}M f32 parameters ({:.0} MiB), median of {iters}",
        g.backend(),
        g.size(),
        shapes.len(),
        params as f64 / 1e6,
        (params * 4) as f64 / (1 << 20) as f64
    ));

    // 1. Communication alone: evaluated gradients, then average them.
    let ready = lazy_grads(g.rank(), 1)?;
    eval(&ready)?;
    for (label, opts) in [
        (
            "one all_sum per tensor",
            AverageOptions {
                all_reduce_size: 0,
                communication_dtype: None,
            },
        ),
        (
            "average_gradients, 32 MiB buckets",
            AverageOptions::default(),
        ),
        (
            "average_gradients, 4 MiB buckets",
            AverageOptions {
                all_reduce_size: 4 << 20,
                communication_dtype: None,
            },
        ),
        (
            "average_gradients, 32 MiB, bf16 on the wire",
            AverageOptions {
                all_reduce_size: 32 << 20,
                communication_dtype: Some(Dtype::BF16),
            },
        ),
    ] {
        let ms = time(&g, iters, || {
            let avg = average_gradients(&ready, &g, &opts)?;
            eval(&avg)?;
            Ok(())
        })?;
        say(format!("  {label:<44} {ms:8.1} ms"));
        figures.push((label.to_string(), ms));
    }

    // 2. Overlap: the same averaging with the backward pass in the graph.
    let k = 32;
    let opts = AverageOptions {
        all_reduce_size: 4 << 20,
        communication_dtype: None,
    };
    let compute = time(&g, iters, || {
        eval(&lazy_grads(g.rank(), k)?)?;
        Ok(())
    })?;
    let sequential = time(&g, iters, || {
        let grads = lazy_grads(g.rank(), k)?;
        eval(&grads)?;
        eval(&average_gradients(&grads, &g, &opts)?)?;
        Ok(())
    })?;
    let overlapped = time(&g, iters, || {
        let grads = lazy_grads(g.rank(), k)?;
        eval(&average_gradients(&grads, &g, &opts)?)?;
        Ok(())
    })?;
    say(format!(
        "  synthetic backward (matmuls, k={k}) alone            {compute:8.1} ms"
    ));
    say(format!(
        "  backward, then average (two evals, 4 MiB buckets)  {sequential:8.1} ms"
    ));
    say(format!(
        "  backward and average in one eval (overlapped)      {overlapped:8.1} ms"
    ));
    say(format!(
        "  communication hidden by overlap: {:.1} ms of {:.1} ms",
        sequential - overlapped,
        sequential - compute
    ));
    figures.push((
        format!("synthetic backward (matmuls, k={k}) alone"),
        compute,
    ));
    figures.push((
        "backward, then average (two evals, 4 MiB buckets)".into(),
        sequential,
    ));
    figures.push((
        "backward and average in one eval (overlapped)".into(),
        overlapped,
    ));
    if let (Some(path), 0) = (json_path, g.rank()) {
        let rows: Vec<serde_json::Value> = figures
            .iter()
            .map(|(label, ms)| serde_json::json!({"label": label, "ms": ms}))
            .collect();
        let text = serde_json::to_string_pretty(&serde_json::json!({
            "backend": g.backend().to_string(),
            "world": g.size(),
            "tensors": shapes.len(),
            "parameters": params,
            "iters": iters,
            "rows": rows,
        }))?;
        std::fs::write(&path, text)
            .map_err(|e| anyhow::anyhow!("writing {}: {e}", path.display()))?;
    }
    Ok(())
}

/// The path after `--json`, if given.
fn json_arg() -> anyhow::Result<Option<std::path::PathBuf>> {
    let mut args = std::env::args().skip(1);
    match args.next().as_deref() {
        None => Ok(None),
        Some("--json") => match args.next() {
            Some(p) => Ok(Some(p.into())),
            None => anyhow::bail!("--json needs a path"),
        },
        Some(other) => anyhow::bail!("unknown argument {other:?} (only --json PATH)"),
    }
}
