//! bfloat16 matrix products: on CPUs with AMX they take the `tdpbf16ps`
//! tiles (`MLX_CPU_TUNING`'s `amx`, on by default; the suite runs again with it off), on
//! CPUs with AVX512_BF16 the `vdpbf16ps` GEMM (`MLX_CPU_TUNING`'s `bf16`, on by
//! default), elsewhere f32 `sgemm` on converted operands. Either way each element is the float32 sum of
//! the exact products of the bfloat16 inputs, rounded to bfloat16 once:
//! checked against a float64 reference, with odd sizes, transposed and
//! strided views, batches and an empty `k`.

use half::bf16;
use mlx_array::conformance::values;
use mlx_array::{Array, Dtype, random};

/// A `rows x cols` bfloat16 operand, or the transpose of a `cols x rows` one.
fn operand(rows: usize, cols: usize, transposed: bool, seed: u64) -> Array {
    let shape = if transposed {
        [cols, rows]
    } else {
        [rows, cols]
    };
    let x = random::uniform(&random::key(seed), -2.0, 2.0, &shape, Dtype::F32)
        .unwrap()
        .astype(Dtype::BF16)
        .unwrap();
    if transposed { x.t().unwrap() } else { x }
}

/// Checks `a @ b` (2-d) against float64: within the rounding to bfloat16
/// (half an ulp, at most 2^-8 relative) plus float32's error in a sum of
/// `k` products (`k * 2^-24` of the sum of their magnitudes).
fn check(a: &Array, b: &Array, what: &str) {
    let (m, k, n) = (a.shape()[0], a.shape()[1], b.shape()[1]);
    let got = a.matmul(b).unwrap();
    assert_eq!(got.dtype(), Dtype::BF16, "{what}");
    assert_eq!(got.shape(), &[m, n], "{what}");
    let (av, bv, gv) = (values(a), values(b), values(&got));
    for i in 0..m {
        for j in 0..n {
            let (mut exact, mut magnitude) = (0f64, 0f64);
            for p in 0..k {
                exact += av[i * k + p] * bv[p * n + j];
                magnitude += (av[i * k + p] * bv[p * n + j]).abs();
            }
            let tol = exact.abs() * 2f64.powi(-8) + magnitude * k as f64 * 2f64.powi(-24);
            let g = gv[i * n + j];
            assert!(
                (g - exact).abs() <= tol,
                "{what}: [{i}, {j}] is {g}, float64 says {exact}"
            );
            assert_eq!(bf16::from_f64(g).to_f64(), g, "{what}: a bfloat16 value");
        }
    }
}

#[test]
fn bf16_products_equal_float64_rounded_once() {
    let shapes = [
        (1, 1, 1),
        (12, 2, 32),
        (13, 7, 33),
        (40, 130, 70),
        (200, 515, 300),
        (5, 1025, 3),
        // Large enough to pack per task rather than whole (more than 8M
        // elements of operands), with an odd k spanning five panels.
        (17, 2051, 4100),
    ];
    for gemm in [true, false] {
        mlx_array::settings::tune_cpu(|t| t.bf16 = gemm);
        for (s, &(m, k, n)) in shapes.iter().enumerate() {
            for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
                let a = operand(m, k, ta, 2 * s as u64);
                let b = operand(k, n, tb, 2 * s as u64 + 1);
                check(
                    &a,
                    &b,
                    &format!("gemm {gemm}: {m}x{k} @ {k}x{n}, transposed {ta}/{tb}"),
                );
            }
        }
    }
    mlx_array::settings::tune_cpu(|t| t.bf16 = true);
    eprintln!(
        "bfloat16 products: {:?}",
        mlx_array::backend::cpu::bf16_products()
    );
}

/// The test above in a child process with `MLX_CPU_TUNING=amx=off`: the AVX512_BF16
/// kernels, on a CPU with AMX too.
#[test]
fn bf16_products_equal_float64_rounded_once_without_amx() {
    mlx_array::conformance::rerun_without_amx("bf16_products_equal_float64_rounded_once");
}

#[test]
fn bf16_batches_strided_views_and_empty_sums() {
    // A batch of 3 and a broadcast right operand.
    let a = operand(3 * 20, 45, false, 7).reshape(&[3, 20, 45]).unwrap();
    let b = operand(45, 17, false, 8);
    let got = a.matmul(&b).unwrap();
    assert_eq!(got.shape(), &[3, 20, 17]);
    for i in 0..3 {
        let ai = a
            .slice_axis(0, i, i + 1)
            .unwrap()
            .reshape(&[20, 45])
            .unwrap();
        let gi = got
            .slice_axis(0, i, i + 1)
            .unwrap()
            .reshape(&[20, 17])
            .unwrap();
        check(&ai, &b, "batch");
        assert_eq!(values(&gi), values(&ai.matmul(&b).unwrap()), "batch {i}");
    }
    // Every other column of a wider matrix: copied, then multiplied.
    let wide = operand(30, 80, false, 9);
    let every_other = wide
        .reshape(&[30, 40, 2])
        .unwrap()
        .slice_axis(2, 0, 1)
        .unwrap()
        .reshape(&[30, 40])
        .unwrap();
    check(&every_other, &operand(40, 9, false, 10), "strided");
    // k = 0: zeros.
    let z = Array::zeros(&[4, 0], Dtype::BF16)
        .matmul(&Array::zeros(&[0, 5], Dtype::BF16))
        .unwrap();
    assert_eq!(values(&z), vec![0.0; 20]);
}
