//! `f16` on the GPU in both of its storage modes: native WGSL `f16` where
//! the adapter has `shader-f16` (lavapipe has), two to a 32-bit word
//! elsewhere, or when `MLX_GPU_TUNING=f16=off` forces it. Both compute in `f32` and
//! round once, so the correctly rounded operations (casts, `+ - *`, max,
//! copies to any offset) must equal the CPU's results bit for bit, infinities,
//! NaNs, subnormals and signed zeros included; the rest within `f16`'s
//! tolerance.

use mlx_array::backend::gpu::native_f16;
use mlx_array::conformance::values;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result, SliceArg, value_and_grad};

use crate::harness::{compare, gpu, tol};

/// Floats whose `f16` roundings probe every case: overflow to infinity at
/// 65520 but not 65519, subnormals, ties, signed zeros, NaN, infinities.
const EDGES: [f32; 16] = [
    0.1,
    -1.0 / 3.0,
    65504.0,
    65519.0,
    65520.0,
    -70000.0,
    1e-7,
    -3e-8,
    6.1e-5,
    2049.0, // a tie between 2048 and 2050: to even, 2048
    -0.0,
    0.0,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1.0 + 1.0 / 1024.0,
];

/// `f(inputs)` on both devices, equal bit for bit (as f64, which holds every
/// f16 exactly; NaNs equal NaNs).
fn exact(what: &str, inputs: &[Array], f: impl Fn(&[Array]) -> Result<Array>) {
    let c = with_device(Device::Cpu, || f(inputs)).unwrap_or_else(|e| panic!("{what} (cpu): {e}"));
    let g = with_device(Device::Gpu, || f(inputs)).unwrap_or_else(|e| panic!("{what} (gpu): {e}"));
    g.eval()
        .unwrap_or_else(|e| panic!("{what} (gpu eval): {e}"));
    assert_eq!(g.device(), Device::Gpu, "{what}: not placed on the GPU");
    assert_eq!((c.shape(), c.dtype()), (g.shape(), g.dtype()), "{what}");
    let key = |v: f64| if v.is_nan() { u64::MAX } else { v.to_bits() };
    let (cv, gv) = (values(&c), values(&g));
    let (ck, gk): (Vec<u64>, Vec<u64>) = (
        cv.iter().map(|&v| key(v)).collect(),
        gv.iter().map(|&v| key(v)).collect(),
    );
    assert_eq!(gk, ck, "{what}:\n gpu {gv:?}\n cpu {cv:?}");
}

fn f16_of(values: &[f32], shape: &[usize]) -> Array {
    Array::from_slice(values, shape)
        .unwrap()
        .astype(Dtype::F16)
        .unwrap()
}

/// Smooth values in (-2, 2), `n` of them.
fn ramp(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 37 + seed * 11) % 101) as f32 / 25.0 - 2.0) * 0.97)
        .collect()
}

#[test]
fn f16_kernels_agree_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    let x = Array::from_slice(&EDGES, &[16]).unwrap();
    exact("cast f32 -> f16", std::slice::from_ref(&x), |v| {
        v[0].astype(Dtype::F16)
    });
    let mode = if native_f16() { "native" } else { "packed" };
    eprintln!("f16 storage on the GPU: {mode}");
    if !mlx_array::settings::gpu_tuning().f16 {
        assert!(!native_f16(), "MLX_GPU_TUNING=f16=off must pack f16");
    }

    let a = f16_of(&EDGES, &[4, 4]);
    let b = f16_of(&ramp(16, 1), &[4, 4]).mul_scalar(3e4).unwrap();
    let pair = [a.clone(), b.clone()];
    exact("add", &pair, |v| v[0].add(&v[1]));
    exact("multiply", &pair, |v| v[0].mul(&v[1]));
    exact("subtract, transposed", &pair, |v| v[0].t()?.sub(&v[1]));
    exact("maximum", &pair, |v| v[0].maximum(&v[1]));
    exact("cast f16 -> f32", &pair, |v| v[0].astype(Dtype::F32));
    // Writes at odd offsets: a packed output shares words between neighbours.
    let odd = f16_of(&ramp(7 * 3, 2), &[7, 3]);
    let three = [odd.clone(), f16_of(&ramp(5 * 3, 3), &[5, 3])];
    exact("concatenate", &three, |v| {
        mlx_array::concatenate(&[v[0].clone(), v[1].clone()], 0)
    });
    exact("slice_update", &three, |v| {
        mlx_array::slice_update(
            &v[0],
            &v[1].slice(&[SliceArg::range(1, 4), SliceArg::range(0, 3)])?,
            &[SliceArg::range(3, 6), SliceArg::range(0, 3)],
        )
    });
    exact("pad", &three, |v| {
        mlx_array::pad(&v[0], &[(1, 2), (0, 1)], 0.5)
    });
    let idx = Array::from_slice(&[6i32, 0, 3, 3, 5], &[5]).unwrap();
    exact("take", &[odd.clone(), idx.clone()], |v| v[0].take(&v[1], 0));

    // Sums and transcendentals: within f16's tolerance of the CPU.
    let m = f16_of(&ramp(17 * 33, 4), &[17, 33]);
    let n = f16_of(&ramp(33 * 9, 5), &[33, 9]);
    let rel = tol(Dtype::F16);
    compare(
        "matmul",
        &[m.clone(), n.clone()],
        |v| v[0].matmul(&v[1]),
        rel,
    );
    compare(
        "matmul, transposed",
        std::slice::from_ref(&m),
        |v| v[0].matmul(&v[0].t()?),
        rel,
    );
    compare("exp", std::slice::from_ref(&m), |v| v[0].exp(), rel);
    compare(
        "divide",
        &[m.clone(), m.add_scalar(3.0).unwrap()],
        |v| v[0].div(&v[1]),
        rel,
    );
    compare(
        "sum",
        std::slice::from_ref(&m),
        |v| v[0].sum(&[1], false),
        rel,
    );
    compare(
        "softmax",
        std::slice::from_ref(&m),
        |v| v[0].softmax(&[-1]),
        rel,
    );
    // The GPU's scan rounds its running sums to f16 at every step (see
    // `backend::gpu::scan`): 33 steps of half an ulp each, at most.
    compare(
        "cumsum",
        std::slice::from_ref(&m),
        |v| v[0].cumsum(1, false, true),
        1e-2,
    );
    compare(
        "rms_norm",
        &[m.clone(), f16_of(&ramp(33, 6), &[33])],
        |v| mlx_array::rms_norm(&v[0], Some(&v[1]), 1e-5),
        rel,
    );
    // A gradient through take: scattered sums into an f16 gradient.
    compare(
        "gradient of take",
        &[odd, idx],
        |v| {
            let idx = v[1].clone();
            let f = move |p: &[Array]| p[0].take(&idx, 0)?.square()?.sum_all();
            let (_, g) = value_and_grad(f, &[0])(&v[..1])?;
            Ok(g[0].clone())
        },
        rel,
    );
}

/// The packed mode, whatever this adapter has: the test above again in a
/// child process with `MLX_GPU_TUNING=f16=off`.
#[test]
fn f16_kernels_agree_with_the_cpu_when_packed() {
    let Some(_gpu) = gpu() else { return };
    let stderr = mlx_array::conformance::rerun_with_env(
        "half::f16_kernels_agree_with_the_cpu",
        &[("MLX_GPU_TUNING", "f16=off"), ("MLX_REQUIRE_GPU", "1")],
    );
    assert!(
        stderr.contains("f16 storage on the GPU: packed"),
        "{stderr}"
    );
}
