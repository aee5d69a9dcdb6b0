//! GPU throughput: matmul GFLOP/s at 1024^3, 4096^3, 8192^3 and at the
//! Llama shapes of `benches/core.rs`; memory-bound kernels in GB/s (an
//! elementwise copy-like scale, a copy gathering attention heads, an add,
//! an exp, a row sum and a row softmax); causal fused attention, forward and forward+backward; and one
//! forward+backward of a Llama-like block. The last line,
//! `RESULT {json}`, holds every figure (for `bench/gpu.sh`, which puts them
//! beside PyTorch's on the same card).
//!
//! `cargo run -p mlx-array --example gpu_bench` (full sizes; the dev
//! profile is optimised), or
//! `... --example gpu_bench -- --small` to divide every dimension by 4 (a
//! software adapter such as lavapipe needs that), `--dtype f16` (or
//! `bf16`) for half-precision operands and block (`MLX_GPU_TUNING=f16=off` packs f16
//! two to a word even where the adapter stores it natively;
//! `--only matmul,attention` runs just those sections (of `matmul`,
//! `memory`, `attention`, `block`: a device scan of one setting needs one);
//! `MLX_GPU_TUNING=coopmat=off` multiplies f16, in products and attention, on the
//! f32-compute kernels instead of the tensor cores, to compare the two; `MLX_GPU_TUNING=split_wave=1` runs products
//! with few output tiles unsplit over their depth, and `MLX_GPU_TUNING=chunks=off`
//! submits each eval at its end; `MLX_PROFILE=1` adds to every figure the
//! GPU's own execution time per call (timestamp queries around each
//! compute pass: `GPU time`, and `gpu_seconds` in `RESULT`), free of the
//! host's recording and waits, and a table of each kernel's after
//! `RESULT`; every eval then waits for the GPU, so only those GPU times
//! are the kernels' speed). Shapes with an
//! operand larger than the adapter's largest storage buffer are reported as
//! skipped, and so is the 8192^3 cube under `--small` (2048^3 there: on a
//! software adapter it would take a minute).
//!
//! Bytes counted for GB/s, as `bench/torch_gpu_ops.py` counts them: every
//! element read once and written once (scale, heads copy and exp: 2 x 4 bytes per f32
//! element; add: 3 x; row sum: the input only; softmax: input and output).
use std::time::Instant;

#[path = "common/block.rs"]
mod common_block;
use common_block::block;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result, random, value_and_grad};

/// The sections `--only` chooses among.
const SECTIONS: [&str; 4] = ["matmul", "memory", "attention", "block"];

/// (name, m, k, n, transpose a, transpose b), as in `benches/core.rs`.
const SHAPES: &[(&str, usize, usize, usize, bool, bool)] = &[
    ("1024^3", 1024, 1024, 1024, false, false),
    ("4096^3", 4096, 4096, 4096, false, false),
    ("8192^3", 8192, 8192, 8192, false, false),
    ("logits 2044x256@256x50257", 2044, 256, 50257, false, false),
    ("dW 256x2044@2044x50257 (aT)", 256, 2044, 50257, true, false),
    (
        "dX 2044x50257@50257x256 (bT)",
        2044,
        50257,
        256,
        false,
        true,
    ),
    ("mlp 2044x256@256x512", 2044, 256, 512, false, false),
    ("dW 256x2044@2044x512 (aT)", 256, 2044, 512, true, false),
    ("dX 2044x512@512x256 (bT)", 2044, 512, 256, false, true),
    // The large model's (12 x 768, MLP 2048, 16 x 512 tokens): an MLP
    // product, and weight gradients over 8,192 rows.
    ("large 8192x768@768x2048", 8192, 768, 2048, false, false),
    (
        "large dW 768x8192@8192x2048 (aT)",
        768,
        8192,
        2048,
        true,
        false,
    ),
    (
        "large dW 768x8192@8192x768 (aT)",
        768,
        8192,
        768,
        true,
        false,
    ),
];

/// A uniform GPU array of `shape` and `dtype` (made on the CPU, moved once).
fn gpu_uniform(shape: &[usize], seed: u64, scale: f64, dtype: Dtype) -> Result<Array> {
    let x = random::uniform(&random::key(seed), -scale, scale, shape, Dtype::F32)?.astype(dtype)?;
    let g = x.to_device(Device::Gpu);
    g.eval()?;
    Ok(g)
}

/// Waits for every queued GPU command (reads back one element of `y`).
fn sync(y: &Array) -> Result<()> {
    let first = vec![mlx_array::SliceArg::range(0, 1); y.ndim()];
    let one = with_device(Device::Gpu, || y.slice(&first))?;
    one.to_device(Device::Cpu).eval()
}

/// One measurement: seconds per call on the host's clock (the host's
/// recording and waits included), and with `MLX_PROFILE=1` the GPU's own
/// execution time per call (timestamp queries around each compute pass).
#[derive(Clone, Copy)]
struct Timing {
    wall: f64,
    gpu: Option<f64>,
}

impl Timing {
    /// ` (GPU time 1.234 ms)` when measured.
    fn gpu_note(self) -> String {
        self.gpu
            .map(|g| format!(" (GPU time {:.3} ms)", g * 1e3))
            .unwrap_or_default()
    }
}

/// The GPU execution time recorded so far, in seconds.
fn gpu_seconds() -> f64 {
    mlx_array::profile::entries()
        .iter()
        .filter(|e| e.clock == mlx_array::profile::Clock::Gpu)
        .map(|e| e.total.as_secs_f64())
        .sum()
}

/// [`Timing`] per call of `f`, after one warm-up call, over `iters` calls.
fn time(iters: usize, f: impl Fn() -> Result<Array>) -> Result<Timing> {
    sync(&f()?)?;
    let g0 = gpu_seconds();
    let t = Instant::now();
    let mut last = None;
    for _ in 0..iters {
        let y = f()?;
        y.eval()?;
        last = Some(y);
    }
    sync(&last.expect("iters > 0"))?;
    let wall = t.elapsed().as_secs_f64() / iters as f64;
    let gpu = mlx_array::profile::enabled().then(|| (gpu_seconds() - g0) / iters as f64);
    Ok(Timing { wall, gpu })
}

/// Memory-bound kernels on `[rows, 4096]` arrays `x` and `y`: their names
/// and the arrays' worth of bytes each call reads and writes.
const MEMORY_KERNELS: [(&str, usize); 6] = [
    ("scale x*2", 2),
    ("heads copy", 2),
    ("add x+y", 3),
    ("exp", 2),
    ("row sum", 1),
    ("row softmax", 2),
];

/// The computation [`MEMORY_KERNELS`] names `name`.
fn memory_op(name: &str, x: &Array, y: &Array) -> Result<Array> {
    match name {
        "scale x*2" => x.mul_scalar(2.0),
        // `[R, 64, 64]` as `[64, R, 64]`, made dense: the copy that
        // gathers attention heads (rows of 64 adjacent elements).
        "heads copy" => {
            let rows = x.shape()[0] as i64;
            x.reshape(&[rows, 64, 64])?.swapaxes(0, 1)?.contiguous()
        }
        "add x+y" => x.add(y),
        "exp" => x.exp(),
        "row sum" => x.sum(&[-1], false),
        "row softmax" => x.softmax(&[-1]),
        other => unreachable!("no memory kernel {other}"),
    }
}

/// Attention shapes `[B, H, L, d]` (causal, `Lq = Lk`), as `bench/gpu.sh`
/// measures PyTorch's SDPA.
const ATTENTION_SHAPES: [[usize; 4]; 2] = [[4, 4, 512, 64], [16, 12, 512, 64]];

/// The median of `repeats` timings of `f` (each [`time`] over `iters`
/// calls), on each clock.
fn median_time(repeats: usize, iters: usize, f: impl Fn() -> Result<Array>) -> Result<Timing> {
    let runs = (0..repeats)
        .map(|_| time(iters, &f))
        .collect::<Result<Vec<Timing>>>()?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let gpu: Option<Vec<f64>> = runs.iter().map(|r| r.gpu).collect();
    Ok(Timing {
        wall: median(runs.iter().map(|r| r.wall).collect()),
        gpu: gpu.map(median),
    })
}

/// `fused_attention`, causal, forward and forward+backward (its vjp for a
/// cotangent: `dq`, `dk`, `dv`) at [`ATTENTION_SHAPES`] (`B`, `H` and `L`
/// divided by `div`), the median over repeats.
fn attention_bench(dtype: Dtype, div: usize) -> Result<Vec<serde_json::Value>> {
    let mut results = Vec::new();
    for [b, h, l, d] in ATTENTION_SHAPES {
        let (b, h, l) = (b.div_ceil(div), h.div_ceil(div), l / div);
        let qkv: Vec<Array> = (0..3)
            .map(|i| gpu_uniform(&[b, h, l, d], 30 + i, 1.0, dtype))
            .collect::<Result<_>>()?;
        let ct = gpu_uniform(&[b, h, l, d], 33, 1.0, dtype)?;
        let scale = 1.0 / (d as f64).sqrt();
        let attend = |x: &[Array]| mlx_array::fused_attention(&x[0], &x[1], &x[2], scale, true);
        let (repeats, iters) = if div > 1 { (3, 2) } else { (7, 20) };
        let forward = median_time(repeats, iters, || with_device(Device::Gpu, || attend(&qkv)))?;
        let both = median_time(repeats, iters, || {
            with_device(Device::Gpu, || {
                let (outs, grads) = mlx_array::vjp(
                    |x: &[Array]| Ok(vec![attend(x)?]),
                    &qkv,
                    std::slice::from_ref(&ct),
                )?;
                mlx_array::eval((&outs, &grads))?;
                Ok(grads[0].clone())
            })
        })?;
        println!(
            "attention {:?} {dtype}: forward {:.3} ms{}, forward+backward {:.3} ms{}",
            [b, h, l, d],
            forward.wall * 1e3,
            forward.gpu_note(),
            both.wall * 1e3,
            both.gpu_note()
        );
        results.push(serde_json::json!({
            "kind": "attention", "name": "attention causal", "shape": [b, h, l, d],
            "forward_seconds": forward.wall, "forward_backward_seconds": both.wall,
            "forward_gpu_seconds": forward.gpu, "forward_backward_gpu_seconds": both.gpu,
        }));
    }
    Ok(results)
}

fn main() -> Result<()> {
    mlx_array::device::gpu_available()?;
    let small = std::env::args().any(|a| a == "--small");
    let div = if small { 4 } else { 1 };
    let args: Vec<String> = std::env::args().collect();
    let dtype = match args.iter().position(|a| a == "--dtype") {
        Some(i) => {
            let name = args.get(i + 1).map(String::as_str).unwrap_or("");
            let full = match name {
                "f16" => "float16",
                "bf16" => "bfloat16",
                "f32" => "float32",
                other => other,
            };
            Dtype::from_name(full).ok_or_else(|| {
                mlx_array::Error::eval("gpu_bench", format!("--dtype: unknown dtype `{name}`"))
            })?
        }
        None => Dtype::F32,
    };
    let adapter = mlx_array::backend::gpu::adapter_name()?;
    println!("adapter: {adapter}");
    println!(
        "sizes divided by {div}; dtype {dtype} (f16 stored natively: {})",
        mlx_array::backend::gpu::native_f16()
    );
    let only: Option<Vec<String>> = args.iter().position(|a| a == "--only").map(|i| {
        let list = args.get(i + 1).map(String::as_str).unwrap_or("");
        list.split(',').map(|s| s.trim().to_string()).collect()
    });
    if let Some(list) = &only
        && let Some(bad) = list.iter().find(|s| !SECTIONS.contains(&s.as_str()))
    {
        return Err(mlx_array::Error::eval(
            "gpu_bench",
            format!(
                "--only: unknown section `{bad}` (sections: {})",
                SECTIONS.join(", ")
            ),
        ));
    }
    let wanted = |section: &str| only.as_ref().is_none_or(|l| l.iter().any(|s| s == section));
    let mut results = Vec::new();
    if wanted("matmul") {
        for &(name, m, k, n, ta, tb) in SHAPES {
            let (m, k, n) = (m / div, k / div, n / div);
            if small && m * k * n > 1 << 30 {
                println!("matmul {dtype} {name} ({m}x{k}x{n}): skipped: --small");
                continue;
            }
            let run = || -> Result<Timing> {
                let a = gpu_uniform(&if ta { [k, m] } else { [m, k] }, 1, 1.0, dtype)?;
                let b = gpu_uniform(&if tb { [n, k] } else { [k, n] }, 2, 1.0, dtype)?;
                let iters = if small { 2 } else { 10 };
                time(iters, || {
                    with_device(Device::Gpu, || {
                        let a = if ta { a.t()? } else { a.clone() };
                        let b = if tb { b.t()? } else { b.clone() };
                        a.matmul(&b)
                    })
                })
            };
            let s = match run() {
                Ok(s) => s,
                // An operand beyond the adapter's largest buffer (lavapipe's is 128 MiB).
                Err(e) if e.to_string().contains("exceeds the largest storage buffer") => {
                    println!("matmul {dtype} {name} ({m}x{k}x{n}): skipped: {e}");
                    continue;
                }
                Err(e) => return Err(e),
            };
            let flop = 2.0 * (m * n * k) as f64;
            let gflops = flop / s.wall / 1e9;
            println!(
                "matmul {dtype} {name} ({m}x{k}x{n}): {gflops:.1} GFLOP/s ({:.2} ms){}",
                s.wall * 1e3,
                s.gpu
                    .map(|g| format!(
                        "; GPU time {:.3} ms: {:.1} GFLOP/s",
                        g * 1e3,
                        flop / g / 1e9
                    ))
                    .unwrap_or_default()
            );
            results.push(serde_json::json!({
                "kind": "matmul", "name": name, "m": m, "k": k, "n": n,
                "seconds": s.wall, "tflops": gflops / 1e3,
                "gpu_seconds": s.gpu, "gpu_tflops": s.gpu.map(|g| flop / g / 1e12),
            }));
        }
    }
    if wanted("memory") {
        // Memory-bound kernels: 64 Mi elements (256 MiB of f32), 1 Mi with --small.
        let elements = if small { 1 << 20 } else { 1 << 26 };
        let cols = 4096.min(elements);
        let x = gpu_uniform(&[elements / cols, cols], 20, 1.0, dtype)?;
        let y = gpu_uniform(&[elements / cols, cols], 21, 1.0, dtype)?;
        for (name, arrays) in MEMORY_KERNELS {
            let bytes = arrays * elements * dtype.size_of();
            let iters = if small { 3 } else { 20 };
            // The median of three series: the first kernel measured in a
            // process (scale) ran at a quarter of its neighbours' rate on
            // the H200 in one series of 20.
            let s = median_time(3, iters, || {
                with_device(Device::Gpu, || memory_op(name, &x, &y))
            })?;
            let gbs = bytes as f64 / s.wall / 1e9;
            println!(
                "{name} {dtype} ({elements} elements): {gbs:.1} GB/s ({:.3} ms){}",
                s.wall * 1e3,
                s.gpu
                    .map(|g| format!(
                        "; GPU time {:.3} ms: {:.1} GB/s",
                        g * 1e3,
                        bytes as f64 / g / 1e9
                    ))
                    .unwrap_or_default()
            );
            results.push(serde_json::json!({
                "kind": "memory", "name": name, "elements": elements, "bytes": bytes,
                "seconds": s.wall, "gbs": gbs,
                "gpu_seconds": s.gpu, "gpu_gbs": s.gpu.map(|g| bytes as f64 / g / 1e9),
            }));
        }
    }
    if wanted("attention") {
        results.extend(attention_bench(dtype, div)?);
    }
    if wanted("block") {
        // One Llama-like block, forward and backward (gradients of every weight).
        let (t, d) = (511 / div, 256 / div);
        let mut p = vec![gpu_uniform(&[t, d], 10, 1.0, dtype)?];
        for (i, shape) in [[d, d], [d, d], [d, d], [d, d], [d, 2 * d], [2 * d, d]]
            .iter()
            .enumerate()
        {
            p.push(gpu_uniform(
                shape,
                11 + i as u64,
                (1.0 / d as f64).sqrt(),
                dtype,
            )?);
        }
        let argnums: Vec<usize> = (1..p.len()).collect();
        let iters = if small { 2 } else { 10 };
        let s = time(iters, || {
            with_device(Device::Gpu, || {
                let (loss, grads) = value_and_grad(block, &argnums)(&p)?;
                mlx_array::eval((&loss, &grads))?;
                Ok(loss)
            })
        })?;
        println!(
            "llama-like block {dtype} fwd+bwd (T={t}, D={d}, 4 heads, MLP 2D): {:.2} ms/step{}",
            s.wall * 1e3,
            s.gpu_note()
        );
        results.push(serde_json::json!({
            "kind": "block", "name": "llama-like block fwd+bwd", "t": t, "d": d,
            "seconds": s.wall, "gpu_seconds": s.gpu,
        }));
    }
    let summary = serde_json::json!({
        "adapter": adapter, "dtype": dtype.to_string(), "small": small, "results": results,
    });
    println!("RESULT {summary}");
    // MLX_PROFILE=1: per-primitive times (GPU execution from timestamp queries).
    if mlx_array::profile::enabled() {
        println!("{}", mlx_array::profile::report(20));
    }
    Ok(())
}
