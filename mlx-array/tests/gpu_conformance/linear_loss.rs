//! The fused output projection + cross-entropy with f16 hidden states and
//! weight on the tensor-core kernel (through its plain-WGSL fragments,
//! forced as CI's lavapipe has no cooperative matrices): the loss and both
//! gradients against the CPU's f32 kernel over the same f16 values, within
//! a bound derived from rounding the gradient of the logits to f16.

use mlx_array::backend::gpu::coop_product_count;
use mlx_array::device::with_device;
use mlx_array::primitives::loss::LinearCrossEntropyOptions;
use mlx_array::settings::{GpuCoopmat, tune_gpu};
use mlx_array::{Array, Device, Dtype, Result};

use crate::harness::{gpu, native_f16_or_skip};

const ROWS: usize = 37;
const DIMS: usize = 48;
const VOCAB: usize = 1000;
const IGNORE: i32 = -100;

/// Values in [-1.5, 1.5) of `n` elements, varied by `seed`.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7919 + seed * 104729) % 211) as f32 / 105.5 - 1.0) * 1.5)
        .collect()
}

/// The loss (and its gradient with respect to `h` and `w`) of one case:
/// the one-pass `linear_cross_entropy_sum` or the separate forward and
/// backward, times the cotangent `scale`.
fn value_and_grads(
    h: &Array,
    w: &Array,
    t: &Array,
    rw: &Array,
    one_pass: bool,
    scale: f32,
    opts: &LinearCrossEntropyOptions,
) -> Result<(Array, Vec<Array>)> {
    let loss = |x: &[Array]| {
        let l = if one_pass {
            mlx_array::linear_cross_entropy_sum(&x[0], &x[1], t, rw, opts)?
        } else {
            mlx_array::linear_cross_entropy(&x[0], &x[1], t, opts)?
                .multiply(rw)?
                .sum_all()?
        };
        l.multiply(&Array::scalar(scale))
    };
    let (value, grads) = mlx_array::value_and_grad(loss, &[0, 1])(&[h.clone(), w.clone()])?;
    value.eval()?;
    for g in &grads {
        g.eval()?;
    }
    Ok((value, grads))
}

fn f32s(x: &Array) -> Vec<f32> {
    x.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Per row, the gradient of the loss with respect to its logits, in f64
/// from the f16 values (`hv`, `wv`): `ct (softmax - (1 - s) onehot - s/V)`.
fn logit_grads(hv: &[f32], wv: &[f32], t: &[i32], ct: &[f64], s: f64) -> Vec<f64> {
    let mut g = vec![0.0; ROWS * VOCAB];
    for r in 0..ROWS {
        if t[r] == IGNORE {
            continue;
        }
        let z: Vec<f64> = (0..VOCAB)
            .map(|j| {
                (0..DIMS)
                    .map(|d| hv[r * DIMS + d] as f64 * wv[j * DIMS + d] as f64)
                    .sum()
            })
            .collect();
        let m = z.iter().cloned().fold(f64::MIN, f64::max);
        let sum: f64 = z.iter().map(|v| (v - m).exp()).sum();
        for j in 0..VOCAB {
            let target = if j as i32 == t[r] { 1.0 - s } else { 0.0 };
            g[r * VOCAB + j] = ct[r] * ((z[j] - m).exp() / sum - target - s / VOCAB as f64);
        }
    }
    g
}

/// Checks `gpu` against `cpu` element by element within `bound[i]`.
fn within(what: &str, gpu: &[f32], cpu: &[f32], bound: &[f64]) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: lengths");
    let mut worst = 0f64;
    for (i, ((&g, &c), &b)) in gpu.iter().zip(cpu).zip(bound).enumerate() {
        let err = (g as f64 - c as f64).abs();
        assert!(
            err <= b,
            "{what}: element {i}: gpu {g}, cpu {c}, bound {b:e}"
        );
        worst = worst.max(err / b);
    }
    eprintln!("{what}: largest error {worst:.2} of its bound");
}

/// The fused loss with f16 `h` and `w` on the tensor-core path, in both of
/// its GPU forms (one pass in blocks of 13, 13 and 11 rows; forward and
/// backward in chunks of 700 and 300 classes), with and without a loss
/// scale on the cotangent, label smoothing and an ignored row, shapes off
/// every tile (37 rows, 48 features, 1000 classes), against the CPU's f32
/// kernel over the same f16 values.
///
/// The logits are f16 x f16 products (exact in f32) summed in f32, so the
/// loss agrees with the CPU to f32 summation order (1e-4 relative). The
/// gradient `g` of the logits is rounded to f16 before its products: each
/// element moves by at most 2^-11 of itself (2^-25 absolute below f16's
/// normal range), so `dh[r, d] = sum_j g[r, j] w[j, d]` moves by at most
/// `2^-11 sum_j |g[r, j] w[j, d]| + 2^-25 sum_j |w[j, d]|` (likewise `dw`
/// over rows), plus 2^-11 of the result for its own rounding to f16 and
/// 1e-4 of the absolute sum for both sides' f32 sums and exponentials.
/// The bounds are computed from the same values in f64.
#[test]
fn f16_loss_on_the_tensor_core_path_agrees_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    let h16 = Array::from_slice(&values(ROWS * DIMS, 1), &[ROWS, DIMS])
        .unwrap()
        .astype(Dtype::F16)
        .unwrap();
    let w16 = Array::from_slice(&values(VOCAB * DIMS, 2), &[VOCAB, DIMS])
        .unwrap()
        .astype(Dtype::F16)
        .unwrap();
    let (h32, w32) = (
        h16.astype(Dtype::F32).unwrap(),
        w16.astype(Dtype::F32).unwrap(),
    );
    let (hv, wv) = (f32s(&h16), f32s(&w16));
    let tv: Vec<i32> = (0..ROWS as i32)
        .map(|i| {
            if i == 5 {
                IGNORE
            } else {
                (i * 379) % VOCAB as i32
            }
        })
        .collect();
    let t = Array::from_slice(&tv, &[ROWS]).unwrap();
    let rwv: Vec<f32> = (0..ROWS).map(|i| 0.25 + (i % 3) as f32).collect();
    let rw = Array::from_slice(&rwv, &[ROWS]).unwrap();
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    for (one_pass, scale, smoothing, products) in [
        (true, 1.0, 0.0, 9),
        (true, 1024.0, 0.1, 9),
        (false, 1.0, 0.1, 8),
        (false, 1024.0, 0.0, 8),
    ] {
        let what = format!("one pass {one_pass}, scale {scale}, smoothing {smoothing}");
        let opts = LinearCrossEntropyOptions {
            ignore_index: Some(IGNORE as i64),
            label_smoothing: smoothing,
            chunk: 700,
            block_rows: 16,
        };
        let (cv, cg) = with_device(Device::Cpu, || {
            value_and_grads(&h32, &w32, &t, &rw, one_pass, scale, &opts)
        })
        .unwrap();
        let before = coop_product_count();
        let (gv, gg) = with_device(Device::Gpu, || {
            value_and_grads(&h16, &w16, &t, &rw, one_pass, scale, &opts)
        })
        .unwrap();
        // Logits, dh and dw per block (three blocks); or the forward's and
        // the backward's logits and the backward's dh and dw per chunk (two).
        assert_eq!(
            coop_product_count() - before,
            products,
            "{what}: products on the tensor-core template"
        );
        assert_eq!(gg[0].dtype(), Dtype::F16, "{what}: dh dtype");
        assert_eq!(gg[1].dtype(), Dtype::F16, "{what}: dw dtype");
        let (c, g) = (cv.item::<f32>().unwrap(), gv.item::<f32>().unwrap());
        assert!(
            (c - g).abs() <= 1e-4 * c.abs().max(1.0),
            "{what}: loss gpu {g}, cpu {c}"
        );
        let ct: Vec<f64> = rwv.iter().map(|&r| r as f64 * scale as f64).collect();
        let lg = logit_grads(&hv, &wv, &tv, &ct, smoothing as f64);
        let (cdh, cdw) = (f32s(&cg[0]), f32s(&cg[1]));
        let (half, sub) = (2f64.powi(-11), 2f64.powi(-25));
        // Per element of `dh` or `dw`: `g` rounded to f16 in every term of
        // `sum |g| |x|` (b), f16's subnormal step in every term of
        // `sum |x|` (s), the final cast of `result`, and the f32 sums.
        let bound_of = |b: f64, s: f64, result: f32| {
            (half + 1e-4) * b + sub * s + half * result.abs() as f64 + 1e-7
        };
        let mut bound = vec![0.0; ROWS * DIMS];
        for r in 0..ROWS {
            for d in 0..DIMS {
                let (mut b, mut s) = (0.0, 0.0);
                for j in 0..VOCAB {
                    let a = wv[j * DIMS + d].abs() as f64;
                    b += lg[r * VOCAB + j].abs() * a;
                    s += a;
                }
                let i = r * DIMS + d;
                bound[i] = bound_of(b, s, cdh[i]);
            }
        }
        within(&format!("{what}: dh"), &f32s(&gg[0]), &cdh, &bound);
        let mut bound = vec![0.0; VOCAB * DIMS];
        for j in 0..VOCAB {
            for d in 0..DIMS {
                let (mut b, mut s) = (0.0, 0.0);
                for r in 0..ROWS {
                    let a = hv[r * DIMS + d].abs() as f64;
                    b += lg[r * VOCAB + j].abs() * a;
                    s += a;
                }
                let i = j * DIMS + d;
                bound[i] = bound_of(b, s, cdw[i]);
            }
        }
        within(&format!("{what}: dw"), &f32s(&gg[1]), &cdw, &bound);
    }
    // No rows: `dw`'s products have depth 0 (not split) and write zeros.
    let h0 = Array::zeros(&[0, DIMS], Dtype::F16);
    let (t0, rw0) = (
        Array::zeros(&[0], Dtype::I32),
        Array::zeros(&[0], Dtype::F32),
    );
    for one_pass in [false, true] {
        let opts = LinearCrossEntropyOptions::default();
        let (v, g) = with_device(Device::Gpu, || {
            value_and_grads(&h0, &w16, &t0, &rw0, one_pass, 1.0, &opts)
        })
        .unwrap();
        assert_eq!(
            v.item::<f32>().unwrap(),
            0.0,
            "no rows, one pass {one_pass}"
        );
        assert_eq!(g[0].shape(), &[0, DIMS]);
        assert!(f32s(&g[1]).iter().all(|&x| x == 0.0), "no rows: dw");
    }
    // f32 operands never take the f16 template, even where it is forced.
    let before = coop_product_count();
    let opts = LinearCrossEntropyOptions::default();
    with_device(Device::Gpu, || {
        value_and_grads(&h32, &w32, &t, &rw, true, 1.0, &opts)
    })
    .unwrap();
    assert_eq!(coop_product_count(), before, "f32 operands");
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}
