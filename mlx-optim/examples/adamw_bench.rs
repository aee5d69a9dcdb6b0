//! Times one AdamW update over the reference Llama's 28M parameters (f32)
//! beside a plain memcpy of the same bytes, and reports peak memory.
//!
//! ```text
//! cargo run --release -p mlx-optim --example adamw_bench [-- STEPS [--unfused]]
//! ```
//!
//! `--unfused` times the op-by-op graph instead of the fused kernel.
//!
//! The update reads the parameters, gradients and both moments and writes the
//! parameters and both moments: at best 7 tensor passes against memcpy's 2
//! (one read, one write), so about 3.5 memcpys is the floor.

use std::hint::black_box;
use std::time::Instant;

use mlx_array::{Dtype, Tree, eval, memory, random};
use mlx_optim::{AdamW, Optimizer};

/// (name, shape) of every parameter of the reference Llama (vocab 50257,
/// dims 256, 4 layers, MLP 512).
fn llama_shapes() -> Vec<(String, Vec<usize>)> {
    let (vocab, dims, mlp, layers) = (50257, 256, 512, 4);
    let mut s = vec![
        ("embedding.weight".to_string(), vec![vocab, dims]),
        ("out_proj.weight".to_string(), vec![dims, vocab]),
        ("norm.weight".to_string(), vec![dims]),
    ];
    for l in 0..layers {
        for m in ["wq", "wk", "wv", "wo"] {
            s.push((format!("layers.{l}.attention.{m}.weight"), vec![dims, dims]));
        }
        s.push((format!("layers.{l}.mlp.w1.weight"), vec![dims, mlp]));
        s.push((format!("layers.{l}.mlp.w3.weight"), vec![dims, mlp]));
        s.push((format!("layers.{l}.mlp.w2.weight"), vec![mlp, dims]));
        s.push((format!("layers.{l}.attention_norm.weight"), vec![dims]));
        s.push((format!("layers.{l}.mlp_norm.weight"), vec![dims]));
    }
    s
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let fused = !args.iter().any(|a| a == "--unfused");
    let steps: usize = args
        .iter()
        .find(|a| !a.starts_with("--"))
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10);
    let shapes = llama_shapes();
    let n: usize = shapes
        .iter()
        .map(|(_, s)| s.iter().product::<usize>())
        .sum();
    let bytes = n * 4;
    let key = random::key(42);
    let keys = random::split(&key, shapes.len())?;
    let mut params = Vec::new();
    let mut grads = Vec::new();
    for (i, (name, shape)) in shapes.iter().enumerate() {
        let k = keys.take(&mlx_array::Array::scalar(i as u32), 0)?;
        let [kp, kg] = random::split2(&k)?;
        params.push((
            name.clone(),
            random::normal(&kp, shape, Dtype::F32)?.mul_scalar(0.02)?,
        ));
        grads.push((
            name.clone(),
            random::normal(&kg, shape, Dtype::F32)?.mul_scalar(1e-3)?,
        ));
    }
    let mut params = Tree::unflatten(params)?;
    let grads = Tree::unflatten(grads)?;
    eval((&params, &grads))?;
    println!(
        "AdamW update over {n} f32 parameters ({:.1} MB per tensor), {} threads",
        bytes as f64 / 1e6,
        rayon::current_num_threads()
    );

    // memcpy of the same bytes, in this run.
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    dst.copy_from_slice(&src);
    let mut memcpy = Vec::new();
    for _ in 0..steps.max(5) {
        let t = Instant::now();
        dst.copy_from_slice(black_box(&src));
        black_box(&mut dst);
        memcpy.push(t.elapsed().as_secs_f64());
    }
    drop((src, dst));
    let memcpy = median(memcpy);

    let mut opt = AdamW::new(3e-4).fused(fused);
    // The first update creates the moments; time the steady state after it.
    opt.update_tree(&mut params, &grads)?;
    eval((&params, opt.state()))?;
    let mut times = Vec::new();
    let mut peak_extra = 0usize;
    for _ in 0..steps {
        let before = memory::active();
        memory::reset_peak();
        let t = Instant::now();
        opt.update_tree(&mut params, &grads)?;
        eval((&params, opt.state()))?;
        times.push(t.elapsed().as_secs_f64());
        peak_extra = peak_extra.max(memory::peak() - before);
    }
    let update = median(times);
    let live = memory::active();
    println!(
        "memcpy {bytes} B:        {:8.2} ms ({:.2} GB/s)",
        memcpy * 1e3,
        bytes as f64 / memcpy / 1e9
    );
    println!(
        "AdamW update, {} (median of {steps}): {:8.2} ms = {:.2} memcpys (goal <= 6)",
        if fused { "fused" } else { "op by op" },
        update * 1e3,
        update / memcpy
    );
    println!(
        "memory: {:.1} MB live after the update (params + grads + m + v = 4 x {:.1} MB); peak during an update {:.1} MB above the live set ({:.2} tensors)",
        live as f64 / 1e6,
        bytes as f64 / 1e6,
        peak_extra as f64 / 1e6,
        peak_extra as f64 / bytes as f64
    );
    Ok(())
}
