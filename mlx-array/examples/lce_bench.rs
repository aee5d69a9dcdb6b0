//! Times the reference model's output projection and loss at its shape
//! (2044 rows of 256 features, 50,257 classes): the fused
//! `linear_cross_entropy` forward and backward beside the plain GEMMs of the
//! same size, and reports peak memory above the inputs.
//!
//! `cargo run --release -p mlx-array --example lce_bench -- [rows] [reps] [chunk] [block] [only] [bf16]`
//! (chunk: classes per chunk, 0 = the default of about 16 MiB of logits;
//! block: rows per block of `linear_cross_entropy_sum`, 0 = equal blocks of
//! at most 50 MiB or a ninth of the rows, whichever is more; only: 1 times
//! the one-pass `linear_cross_entropy_sum` alone, for profiling it; `bf16`
//! anywhere: `h` and `w` in bfloat16, as a `--dtype bf16` model has them).
//! `MLX_DEVICE=gpu` runs it on the GPU. On an AVX-512 CPU the one-pass
//! loss (`linear_cross_entropy_sum`) runs its own kernels; `MLX_CPU_TUNING=loss=blas`
//! runs it through the BLAS instead, for comparison.

use std::time::Instant;

use mlx_array::device::with_device;
use mlx_array::primitives::loss::LinearCrossEntropyOptions;
use mlx_array::{
    Array, Device, Dtype, eval, linear_cross_entropy, linear_cross_entropy_sum, memory, random,
    value_and_grad,
};

fn main() -> mlx_array::Result<()> {
    // SAFETY: the first statement of main; no other thread exists yet.
    unsafe { mlx_array::blas::prefer_native_openblas_kernels() };
    println!("GEMM: {}", mlx_array::blas::name());
    let words: Vec<String> = std::env::args().skip(1).collect();
    let args: Vec<usize> = words.iter().filter_map(|a| a.parse().ok()).collect();
    let dtype = if words.iter().any(|a| a == "bf16") {
        Dtype::BF16
    } else {
        Dtype::F32
    };
    let rows = args.first().copied().unwrap_or(2044);
    let reps = args.get(1).copied().unwrap_or(3);
    let (d, v) = (256, 50257);
    // Inputs made on the CPU (randint needs i64), then moved to the default device.
    let device = mlx_array::default_device();
    println!("device: {device}, inputs in {dtype:?}");
    let (h, w, t) = with_device(Device::Cpu, || -> mlx_array::Result<_> {
        Ok((
            random::normal(&random::key(1), &[rows, d], Dtype::F32)?.mul_scalar(0.1)?,
            random::normal(&random::key(2), &[v, d], Dtype::F32)?.mul_scalar(0.1)?,
            random::randint(&random::key(3), 0, v as i64, &[rows], Dtype::I32)?,
        ))
    })?;
    let (h, w, t) = (
        h.astype(dtype)?.to_device(device),
        w.astype(dtype)?.to_device(device),
        t.to_device(device),
    );
    eval((&h, &w, &t))?;
    let gflop = 2.0 * (rows * d * v) as f64 / 1e9;
    let time = |what: &str, gemms: f64, f: &dyn Fn() -> mlx_array::Result<Vec<Array>>| {
        let (mut best, mut peak) = (f64::MAX, 0usize);
        for _ in 0..reps.max(1) {
            memory::reset_peak();
            let base = memory::active();
            let t0 = Instant::now();
            let out = f().expect("the graph builds");
            eval(&out).expect("it evaluates");
            if device == Device::Gpu {
                // eval only submits GPU work: wait for it by reading one element back.
                let one = vec![mlx_array::SliceArg::range(0, 1); out[0].ndim()];
                let first = with_device(Device::Gpu, || out[0].slice(&one)).expect("a slice");
                first.to_device(Device::Cpu).eval().expect("it reads back");
            }
            best = best.min(t0.elapsed().as_secs_f64());
            peak = memory::peak() - base;
        }
        println!(
            "{what:<40} {:>8.1} ms {:>6.1} GFLOP/s ({gemms} GEMMs), peak {:>5.0} MiB above the inputs",
            best * 1e3,
            gemms * gflop / best,
            peak as f64 / (1 << 20) as f64
        );
    };
    let opts = LinearCrossEntropyOptions {
        chunk: args.get(2).copied().unwrap_or(0),
        block_rows: args.get(3).copied().unwrap_or(0),
        ..Default::default()
    };
    let only = args.get(4).is_some_and(|&o| o == 1);
    if !only {
        time("gemm h @ w^T", 1.0, &|| Ok(vec![h.matmul(&w.t()?)?]));
        time("linear_cross_entropy forward", 1.0, &|| {
            Ok(vec![linear_cross_entropy(&h, &w, &t, &opts)?])
        });
    }
    let ones = Array::ones(t.shape(), Dtype::F32);
    time("linear_cross_entropy_sum value+grad", 3.0, &|| {
        let f = |x: &[Array]| linear_cross_entropy_sum(&x[0], &x[1], &t, &ones, &opts);
        let (l, g) = value_and_grad(f, &[0, 1])(&[h.clone(), w.clone()])?;
        Ok(vec![l, g[0].clone(), g[1].clone()])
    });
    if only {
        return Ok(());
    }
    time("linear_cross_entropy forward+backward", 4.0, &|| {
        let f = |x: &[Array]| linear_cross_entropy(&x[0], &x[1], &t, &opts)?.sum_all();
        let (l, g) = value_and_grad(f, &[0, 1])(&[h.clone(), w.clone()])?;
        Ok(vec![l, g[0].clone(), g[1].clone()])
    });
    time("unfused matmul + cross_entropy fwd+bwd", 3.0, &|| {
        let f = |x: &[Array]| mlx_array::cross_entropy(&x[0].matmul(&x[1].t()?)?, &t)?.sum_all();
        let (l, g) = value_and_grad(f, &[0, 1])(&[h.clone(), w.clone()])?;
        Ok(vec![l, g[0].clone(), g[1].clone()])
    });
    Ok(())
}
