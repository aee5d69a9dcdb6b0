//! Core benchmarks: `cargo bench -p mlx-array --bench core`.
//!
//! Each figure is measured beside its ceiling in the same run: matmul through
//! `Array` beside the same GEMM called directly on raw buffers; elementwise ops
//! beside a plain memcpy of the same bytes; and the per-node cost of eval.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use mlx_array::{Array, Dtype, blas, eval, random};

/// (name, m, k, n, transpose a, transpose b): the forward and backward GEMMs
/// of the reference Llama's output projection and MLP (2044 = 4 x 511 tokens).
const SHAPES: &[(&str, usize, usize, usize, bool, bool)] = &[
    ("1024^3", 1024, 1024, 1024, false, false),
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
];

fn operand(rows: usize, cols: usize, transposed: bool, seed: u64) -> Array {
    let shape = if transposed {
        [cols, rows]
    } else {
        [rows, cols]
    };
    let x = random::uniform(&random::key(seed), -1.0, 1.0, &shape, Dtype::F32).unwrap();
    x.eval().unwrap();
    if transposed { x.t().unwrap() } else { x }
}

fn matmul(c: &mut Criterion) {
    eprintln!("GEMM in use: {}", blas::name());
    let mut g = c.benchmark_group("matmul_f32");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for &(name, m, k, n, ta, tb) in SHAPES {
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let a = operand(m, k, ta, 1);
        let b = operand(k, n, tb, 2);
        g.bench_function(BenchmarkId::new("array", name), |bch| {
            bch.iter(|| {
                let y = a.matmul(&b).unwrap();
                y.eval().unwrap();
                black_box(y);
            })
        });
        // The same GEMM on raw buffers: the ceiling.
        let (av, bv) = (a.contiguous().unwrap(), b.contiguous().unwrap());
        eval((&av, &bv)).unwrap();
        let (ad, bd) = (
            a.t().unwrap().contiguous().unwrap(),
            b.t().unwrap().contiguous().unwrap(),
        );
        eval((&ad, &bd)).unwrap();
        let pa = if ta {
            ad.data().unwrap()
        } else {
            av.data().unwrap()
        };
        let pb = if tb {
            bd.data().unwrap()
        } else {
            bv.data().unwrap()
        };
        let mut out = vec![0f32; m * n];
        g.bench_function(BenchmarkId::new("blas_direct", name), |bch| {
            bch.iter(|| unsafe {
                blas::sgemm(
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    pa.ptr::<f32>(),
                    if ta { m } else { k },
                    pb.ptr::<f32>(),
                    if tb { k } else { n },
                    0.0,
                    out.as_mut_ptr(),
                    n,
                );
                black_box(&out);
            })
        });
    }
    g.finish();
}

fn elementwise(c: &mut Criterion) {
    let n = 16 << 20;
    let mut g = c.benchmark_group("elementwise_16M_f32");
    g.sample_size(20).measurement_time(Duration::from_secs(3));
    let x = random::uniform(&random::key(3), -4.0, 4.0, &[n], Dtype::F32).unwrap();
    let y = random::uniform(&random::key(4), -4.0, 4.0, &[n], Dtype::F32).unwrap();
    eval((&x, &y)).unwrap();
    // Bytes that must move: memcpy and exp read 64 MiB and write 64 MiB; add reads 128 MiB.
    g.throughput(Throughput::Bytes((2 * 4 * n) as u64));
    let src = vec![1f32; n];
    let mut dst = vec![0f32; n];
    g.bench_function("memcpy", |b| {
        b.iter(|| {
            dst.copy_from_slice(black_box(&src));
            black_box(&dst);
        })
    });
    g.bench_function("exp", |b| {
        b.iter(|| {
            let z = x.exp().unwrap();
            z.eval().unwrap();
            black_box(z);
        })
    });
    g.throughput(Throughput::Bytes((3 * 4 * n) as u64));
    g.bench_function("add", |b| {
        b.iter(|| {
            let z = x.add(&y).unwrap();
            z.eval().unwrap();
            black_box(z);
        })
    });
    g.finish();
}

fn eval_overhead(c: &mut Criterion) {
    let mut g = c.benchmark_group("eval_overhead");
    g.sample_size(20);
    let nodes = 10_000;
    g.throughput(Throughput::Elements(nodes as u64));
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4]).unwrap();
    g.bench_function("10k_tiny_ops_build_and_eval", |b| {
        b.iter(|| {
            let mut y = x.clone();
            for _ in 0..nodes {
                y = y.add_scalar(1.0).unwrap();
            }
            y.eval().unwrap();
            black_box(y);
        })
    });
    g.finish();
}

/// The same products in bfloat16: on the AVX512_BF16 GEMM (where the CPU
/// has it), and converted to f32 for the BLAS (`MLX_CPU_TUNING=bf16=off`), beside
/// float32 through the BLAS.
fn matmul_bf16(c: &mut Criterion) {
    let mut g = c.benchmark_group("matmul_bf16");
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for &(name, m, k, n, ta, tb) in SHAPES {
        g.throughput(Throughput::Elements((2 * m * n * k) as u64));
        let (a, b) = (operand(m, k, ta, 1), operand(k, n, tb, 2));
        let (a16, b16) = (
            a.astype(Dtype::BF16).unwrap(),
            b.astype(Dtype::BF16).unwrap(),
        );
        eval((&a16, &b16)).unwrap();
        for (path, x, y, gemm) in [
            ("f32", &a, &b, true),
            ("bf16", &a16, &b16, true),
            ("bf16_via_f32", &a16, &b16, false),
        ] {
            mlx_array::settings::tune_cpu(|t| t.bf16 = gemm);
            g.bench_function(BenchmarkId::new(path, name), |bch| {
                bch.iter(|| {
                    let out = x.matmul(y).unwrap();
                    out.eval().unwrap();
                    black_box(out);
                })
            });
        }
        mlx_array::settings::tune_cpu(|t| t.bf16 = true);
    }
    g.finish();
}

criterion_group!(benches, matmul, matmul_bf16, elementwise, eval_overhead);
criterion_main!(benches);
