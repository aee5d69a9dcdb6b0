//! The host's cost per GPU dispatch: how long recording one kernel takes
//! (its meta words, bind group, pass and, every chunk, a submission), apart
//! from the GPU's execution, submitted in chunks while recording and once
//! per eval, side by side in one process (issue 38: on an H100 the host's
//! recording was on a training step's critical path).
//!
//! Two workloads, each run for every configuration in alternating rounds
//! (the median of the rounds is printed):
//! - `kernels`: a chain of `--dispatches` (5,000) unfused unary kernels of
//!   eight distinct ops on a 1,024-element f32 array, called straight on the
//!   GPU backend (no graph, no evaluator): host time from the first call to
//!   the end of the final submission, then the wait for the GPU;
//! - `block`: `eval` of one forward+backward of a small Llama-like block
//!   (T = 64, D = 64): the evaluator's host time per dispatch, fusion
//!   planning and kernels' own setup included.
//!
//! Configurations: chunked submission (the default) and one submission per
//! eval (the GPU tuning's `chunks=off`). The recording's three savings
//! measured here on 2026-11-28 (the meta arena, shared compute passes, kept
//! bind group layouts) are settled and no longer switches.
//!
//! `cargo run -p mlx-array --example gpu_dispatch_bench [-- --dispatches N --rounds R --evals E]`;
//! `--only I` runs configuration `I` (0 or 1, in the order above) alone,
//! for a profiler.
//! A software adapter (lavapipe) runs the submitted chunks on the host's own
//! cores while it records: one submission per eval keeps the wait out of
//! the recording, for a quieter figure.
use std::time::{Duration, Instant};

use mlx_array::backend::common::elementwise::UnaryOp;
use mlx_array::backend::gpu;
#[path = "common/block.rs"]
mod common_block;
use common_block::block;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Operand, Result, random, settings, value_and_grad};

/// (name, chunked submission).
const CONFIGS: [(&str, bool); 2] = [("chunks (default)", true), ("one submission", false)];

/// Distinct unary ops that keep values finite along a chain.
const OPS: [UnaryOp; 8] = [
    UnaryOp::Sin,
    UnaryOp::Neg,
    UnaryOp::Tanh,
    UnaryOp::Abs,
    UnaryOp::Cos,
    UnaryOp::Sigmoid,
    UnaryOp::Square,
    UnaryOp::Floor,
];

/// One measurement: host time, wait time, dispatches.
#[derive(Clone, Copy)]
struct Run {
    host: Duration,
    wait: Duration,
    dispatches: usize,
    submits: usize,
}

fn apply(config: (&str, bool)) {
    settings::tune_gpu(|t| t.chunks = config.1);
}

/// Reads `y` back to the host: waits for every queued GPU command.
fn wait_for(y: Array) -> Result<()> {
    y.to_device(Device::Cpu).eval()
}

/// A chain of `n` unary kernels on `x` (1,024 f32 on the GPU).
fn kernels(x: &Array, n: usize) -> Result<Run> {
    let shape = x.shape().to_vec();
    let (d0, s0) = (gpu::dispatch_count(), gpu::submit_count());
    let t0 = Instant::now();
    let mut y = x.data()?;
    for i in 0..n {
        y = gpu::unary(OPS[i % OPS.len()], &Operand::new(y, &shape, Dtype::F32))?;
    }
    gpu::submit()?;
    let host = t0.elapsed();
    let (dispatches, submits) = (gpu::dispatch_count() - d0, gpu::submit_count() - s0);
    let t1 = Instant::now();
    wait_for(Array::from_data(y, shape, Dtype::F32))?;
    Ok(Run {
        host,
        wait: t1.elapsed(),
        dispatches,
        submits,
    })
}

/// `evals` evaluations of the block's loss and gradients: the host time of
/// the `eval` calls (graphs are built before the clock starts).
fn block_evals(p: &[Array], evals: usize) -> Result<Run> {
    let argnums: Vec<usize> = (1..p.len()).collect();
    let mut run = Run {
        host: Duration::ZERO,
        wait: Duration::ZERO,
        dispatches: 0,
        submits: 0,
    };
    for _ in 0..evals {
        let (loss, grads) = with_device(Device::Gpu, || value_and_grad(block, &argnums)(p))?;
        let (d0, s0) = (gpu::dispatch_count(), gpu::submit_count());
        let t0 = Instant::now();
        mlx_array::eval((&loss, &grads))?;
        run.host += t0.elapsed();
        run.dispatches += gpu::dispatch_count() - d0;
        run.submits += gpu::submit_count() - s0;
        let t1 = Instant::now();
        wait_for(loss)?;
        run.wait += t1.elapsed();
    }
    Ok(run)
}

fn gpu_uniform(shape: &[usize], seed: u64, scale: f64) -> Result<Array> {
    let x = random::uniform(&random::key(seed), -scale, scale, shape, Dtype::F32)?;
    let g = x.to_device(Device::Gpu);
    g.eval()?;
    Ok(g)
}

fn arg(name: &str, default: usize) -> usize {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(default)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> Result<()> {
    mlx_array::device::gpu_available()?;
    let n = arg("--dispatches", 5000);
    let rounds = arg("--rounds", 3).max(1);
    let evals = arg("--evals", 5).max(1);
    let only = arg("--only", usize::MAX);
    let configs: Vec<(&str, bool)> = CONFIGS
        .iter()
        .enumerate()
        .filter(|&(i, _)| only == usize::MAX || i == only)
        .map(|(_, c)| *c)
        .collect();
    println!("adapter: {}", gpu::adapter_name()?);
    println!("{n} kernels and {evals} block evals per round, {rounds} rounds");
    let x = gpu_uniform(&[1024], 1, 1.0)?;
    let (t, d) = (64, 64);
    let mut p = vec![gpu_uniform(&[t, d], 10, 1.0)?];
    for (i, shape) in [[d, d], [d, d], [d, d], [d, d], [d, 2 * d], [2 * d, d]]
        .iter()
        .enumerate()
    {
        p.push(gpu_uniform(shape, 11 + i as u64, (1.0 / d as f64).sqrt())?);
    }
    // Warm-up: every pipeline compiled, the pool and the arena filled.
    for &config in &configs {
        apply(config);
        kernels(&x, OPS.len() * 4)?;
        block_evals(&p, 1)?;
    }
    let mut results: Vec<Vec<(Run, Run)>> = vec![Vec::new(); configs.len()];
    for _ in 0..rounds {
        for (c, config) in configs.iter().enumerate() {
            apply(*config);
            results[c].push((kernels(&x, n)?, block_evals(&p, evals)?));
        }
    }
    println!(
        "{:<20} {:>14} {:>12} {:>9} | {:>14} {:>12} {:>13} {:>9}",
        "config",
        "kernels us/disp",
        "wait us/disp",
        "submits",
        "block us/disp",
        "disp/eval",
        "eval host ms",
        "submits"
    );
    for (config, runs) in configs.iter().zip(&results) {
        let per = |r: &Run, t: Duration| t.as_secs_f64() * 1e6 / r.dispatches.max(1) as f64;
        let k_host = median(runs.iter().map(|(k, _)| per(k, k.host)).collect());
        let k_wait = median(runs.iter().map(|(k, _)| per(k, k.wait)).collect());
        let b_host = median(runs.iter().map(|(_, b)| per(b, b.host)).collect());
        let b_ms = median(
            runs.iter()
                .map(|(_, b)| b.host.as_secs_f64() * 1e3 / evals as f64)
                .collect(),
        );
        let (k, b) = runs[0];
        println!(
            "{:<20} {:>14.2} {:>12.2} {:>9} | {:>14.2} {:>12} {:>13.3} {:>9}",
            config.0,
            k_host,
            k_wait,
            k.submits,
            b_host,
            b.dispatches / evals,
            b_ms,
            b.submits / evals
        );
    }
    apply(CONFIGS[0]);
    Ok(())
}
