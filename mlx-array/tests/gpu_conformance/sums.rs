//! Adds whose term is a matrix product nothing else reads run in the
//! product's kernel (`eval::fusion`, `matmul_adding`): the same bits as the
//! product stored and then added, one kernel fewer, on every product path
//! (the f32 kernel's 64 and 128 tiles, the tensor-core template for f16,
//! split over the depth on either), f32 sums, half-precision sums (f16
//! stored natively, bf16 packed) and half-precision products added to f32
//! through their cast, with the addend read from any offset; and nothing
//! is fused where it must not be.

use mlx_array::backend::gpu::{dispatch_count, matmul_adding};
use mlx_array::device::with_device;
use mlx_array::settings::{GpuCoopmat, GpuTuning, tune_gpu};
use mlx_array::{Array, Device, Dtype, Result, SliceArg, reshape_to, value_and_grad};

use crate::harness::{bits, close, gpu, native_f16_or_skip};

/// `shape` of values in [-1, 1), varied by `seed`, evaluated on the GPU.
fn on_gpu(shape: &[usize], seed: usize) -> Array {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 + seed * 104729) % 211) as f32 / 105.5 - 1.0)
        .collect();
    let x = Array::from_slice(&v, shape).unwrap().to_device(Device::Gpu);
    x.eval().unwrap();
    x
}

/// `x` as `dtype`, evaluated on the GPU.
fn as_gpu(x: &Array, dtype: Dtype) -> Array {
    let y = with_device(Device::Gpu, || x.astype(dtype)).unwrap();
    y.eval().unwrap();
    y
}

/// Builds `f()` on the GPU, evaluates it, and returns it with the kernels
/// its eval dispatched.
fn run(f: impl FnOnce() -> Result<Array>) -> (Array, usize) {
    let y = with_device(Device::Gpu, f).unwrap();
    let before = dispatch_count();
    y.eval().unwrap();
    (y, dispatch_count() - before)
}

/// `x + a @ b` (and `a @ b + x`), fused, against the product evaluated
/// first and then added: equal bits, and no kernel beyond the product's.
/// A product of another dtype than `x` is cast to `x`'s first.
fn check_sum(what: &str, x: &Array, a: &Array, b: &Array) {
    let (product, product_kernels) = run(|| a.matmul(b));
    let term = |p: &Array| reshape_to(p, x.shape())?.astype(x.dtype());
    let (unfused, _) = run(|| x.add(&term(&product)?));
    for first in [false, true] {
        let (fused, kernels) = run(|| {
            let p = term(&a.matmul(b)?)?;
            if first { p.add(x) } else { x.add(&p) }
        });
        assert_eq!(
            kernels, product_kernels,
            "{what} (product first {first}): the add runs in the product's kernels"
        );
        assert_eq!(
            bits(&fused),
            bits(&unfused),
            "{what} (product first {first})"
        );
    }
}

#[test]
fn residual_adds_run_in_the_products_kernel() {
    let Some(_gpu) = gpu() else { return };
    // A linear layer's residual: [2, 8, 40] + ([16, 24] @ [24, 40]) viewed so,
    // the weight read transposed; shapes off every tile.
    let x = on_gpu(&[2, 8, 40], 1);
    let h = on_gpu(&[16, 24], 2);
    let w = on_gpu(&[40, 24], 3);
    let wt = with_device(Device::Gpu, || w.transpose(&[1, 0])).unwrap();
    check_sum("residual", &x, &h, &wt);
    // The addend at an offset into its buffer (a dense slice).
    let wide = on_gpu(&[645], 4);
    let x = with_device(Device::Gpu, || {
        wide.slice(&[SliceArg::range(5, 645)])?.reshape(&[16, 40])
    })
    .unwrap();
    x.eval().unwrap();
    check_sum("addend at an offset", &x, &h, &wt);
    // Batched products.
    let x = on_gpu(&[3, 17, 9], 5);
    check_sum(
        "batched",
        &x,
        &on_gpu(&[3, 17, 30], 6),
        &on_gpu(&[3, 30, 9], 7),
    );
}

#[test]
fn split_and_large_products_add_in_their_last_pass() {
    let Some(_gpu) = gpu() else { return };
    // Split over the depth on 64 x 64 tiles: the slices' summing pass adds.
    let (a, b) = (on_gpu(&[37, 3001], 1), on_gpu(&[3001, 45], 2));
    assert_eq!(run(|| a.matmul(&b)).1, 2, "split: product and sum");
    check_sum("split-K", &on_gpu(&[37, 45], 3), &a, &b);
    // Split on 128 x 128 tiles (a wave of 16 64 x 64 workgroups).
    tune_gpu(|t| t.split_wave = 16);
    let (a, b) = (on_gpu(&[250, 2100], 4), on_gpu(&[2100, 256], 5));
    assert_eq!(run(|| a.matmul(&b)).1, 2, "split on 128 tiles");
    assert_eq!(mlx_array::backend::gpu::last_product_tile(), Some(128));
    check_sum("split on 128 tiles", &on_gpu(&[250, 256], 6), &a, &b);
    tune_gpu(|t| t.split_wave = GpuTuning::default().split_wave);
    // Whole on 128 x 128 tiles: 272 of them.
    let (a, b) = (on_gpu(&[2100, 40], 7), on_gpu(&[40, 2000], 8));
    let (_, kernels) = run(|| a.matmul(&b));
    assert_eq!(
        (kernels, mlx_array::backend::gpu::last_product_tile()),
        (1, Some(128))
    );
    check_sum("128 x 128 tiles", &on_gpu(&[2100, 2000], 9), &a, &b);
}

/// f16 products on the tensor-core template (plain fragments) and on the
/// f32-compute kernel storing f16, and bf16 products (stored packed, two
/// to a word): half-precision sums, and f32 sums of their casts (a
/// half-precision projection added to an f32 residual stream), whole and
/// split over the depth.
#[test]
fn half_precision_products_add_in_their_kernel() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    let h = as_gpu(&on_gpu(&[16, 24], 2), Dtype::F16);
    let w = as_gpu(&on_gpu(&[24, 40], 3), Dtype::F16);
    let (deep_a, deep_b) = (
        as_gpu(&on_gpu(&[37, 3001], 4), Dtype::F16),
        as_gpu(&on_gpu(&[3001, 45], 5), Dtype::F16),
    );
    for coopmat in [GpuCoopmat::Plain, GpuCoopmat::Off] {
        tune_gpu(|t| t.coopmat = coopmat);
        for dtype in [Dtype::F16, Dtype::F32] {
            let what = format!("{coopmat:?}, f16 product, {dtype} sum");
            check_sum(&what, &as_gpu(&on_gpu(&[2, 8, 40], 1), dtype), &h, &w);
            check_sum(
                &format!("{what}, split-K"),
                &as_gpu(&on_gpu(&[37, 45], 6), dtype),
                &deep_a,
                &deep_b,
            );
        }
        assert_eq!(run(|| deep_a.matmul(&deep_b)).1, 2, "{coopmat:?}: split");
    }
    assert!(mlx_array::backend::gpu::coop_product_count() > 0);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
    let bf = |x: &Array| as_gpu(x, Dtype::BF16);
    for dtype in [Dtype::BF16, Dtype::F32] {
        let what = format!("bf16 product, {dtype} sum");
        check_sum(
            &what,
            &as_gpu(&on_gpu(&[2, 8, 40], 1), dtype),
            &bf(&h),
            &bf(&w),
        );
        check_sum(
            &format!("{what}, split-K"),
            &as_gpu(&on_gpu(&[37, 45], 6), dtype),
            &bf(&deep_a),
            &bf(&deep_b),
        );
    }
}

#[test]
fn sums_of_products_need_no_add_kernel() {
    let Some(_gpu) = gpu() else { return };
    // A gradient's sum over three projections: `a @ b + c @ d + e @ f`.
    let t: Vec<Array> = (0..6)
        .map(|i| on_gpu(if i % 2 == 0 { &[33, 20] } else { &[20, 18] }, i))
        .collect();
    let products: Vec<Array> = (0..3)
        .map(|i| run(|| t[2 * i].matmul(&t[2 * i + 1])).0)
        .collect();
    let (unfused, _) = run(|| products[0].add(&products[1])?.add(&products[2]));
    let (fused, kernels) = run(|| {
        t[0].matmul(&t[1])?
            .add(&t[2].matmul(&t[3])?)?
            .add(&t[4].matmul(&t[5])?)
    });
    assert_eq!(kernels, 3, "three products, no add kernel");
    assert_eq!(bits(&fused), bits(&unfused));
}

#[test]
fn terms_read_elsewhere_or_of_other_kinds_are_not_fused() {
    let Some(_gpu) = gpu() else { return };
    let (a, b) = (on_gpu(&[16, 24], 1), on_gpu(&[24, 40], 2));
    let x = on_gpu(&[16, 40], 3);
    let expected: Vec<f32> = {
        let p = run(|| a.matmul(&b)).0.to_vec::<f32>().unwrap();
        let x = x.to_vec::<f32>().unwrap();
        x.iter().zip(&p).map(|(x, p)| x + p).collect()
    };
    // The caller holds the product: it is computed and kept.
    let p = with_device(Device::Gpu, || a.matmul(&b)).unwrap();
    let y = with_device(Device::Gpu, || x.add(&p)).unwrap();
    let before = dispatch_count();
    mlx_array::eval((&y, &p)).unwrap();
    assert_eq!(dispatch_count() - before, 2, "product, then add");
    assert!(p.is_evaluated());
    assert_eq!(y.to_vec::<f32>().unwrap(), expected);
    // The product read twice.
    let (y, kernels) = run(|| {
        let p = a.matmul(&b)?;
        x.add(&p)?.add(&p)
    });
    assert_eq!(kernels, 2, "product, then one fused add of both reads");
    let twice: Vec<f32> = {
        let p = run(|| a.matmul(&b)).0.to_vec::<f32>().unwrap();
        let x = x.to_vec::<f32>().unwrap();
        x.iter().zip(&p).map(|(x, p)| x + p + p).collect()
    };
    assert_eq!(y.to_vec::<f32>().unwrap(), twice);
    // A broadcast addend: an add kernel.
    let row = on_gpu(&[40], 4);
    let (y, kernels) = run(|| row.add(&a.matmul(&b)?));
    assert_eq!(kernels, 2, "broadcast addend");
    let p = run(|| a.matmul(&b)).0.to_vec::<f32>().unwrap();
    let r = row.to_vec::<f32>().unwrap();
    let want: Vec<f32> = p.iter().enumerate().map(|(i, p)| r[i % 40] + p).collect();
    assert_eq!(y.to_vec::<f32>().unwrap(), want);
}

#[test]
fn gradients_through_fused_sums_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    // A residual block's loss: sum((x + (x @ w1) @ w2)^2); its backward
    // pass sums products into the residual's gradient.
    let f = |p: &[Array]| -> Result<Array> {
        let y = p[0].add(&p[0].matmul(&p[1])?.matmul(&p[2])?)?;
        y.multiply(&y)?.sum(&[0, 1], false)
    };
    let params = [
        on_gpu(&[24, 32], 1),
        on_gpu(&[32, 48], 2),
        on_gpu(&[48, 32], 3),
    ];
    let cpu: Vec<Array> = params.iter().map(|p| p.to_device(Device::Cpu)).collect();
    let (loss_c, grads_c) = value_and_grad(f, &[0, 1, 2])(&cpu).unwrap();
    let (loss_g, grads_g) =
        with_device(Device::Gpu, || value_and_grad(f, &[0, 1, 2])(&params)).unwrap();
    mlx_array::eval((&loss_g, &grads_g)).unwrap();
    let values = |a: &Array| -> Vec<f64> {
        a.to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    };
    close("loss", &values(&loss_c), &values(&loss_g), 1e-5);
    // Gradients of a few hundred, some entries cancelling to about 1: the
    // two devices' summation orders differ by a few f32 roundings of the
    // large terms.
    for (i, (c, g)) in grads_c.iter().zip(&grads_g).enumerate() {
        close(&format!("gradient {i}"), &values(c), &values(g), 1e-3);
    }
}

#[test]
fn a_product_with_an_addend_checks_its_addend() {
    let Some(_gpu) = gpu() else { return };
    let (a, b) = (on_gpu(&[4, 6], 1), on_gpu(&[6, 5], 2));
    // The error of `a @ b + addend` into a [4, 5] output.
    let refused = |addend: &Array| {
        let (a, b) = (a.operand().unwrap(), b.operand().unwrap());
        matmul_adding(&a, &b, &[4, 5], &addend.operand().unwrap())
            .unwrap_err()
            .to_string()
    };
    let strided = with_device(Device::Gpu, || on_gpu(&[5, 4], 3).transpose(&[1, 0])).unwrap();
    strided.eval().unwrap();
    let err = refused(&strided);
    assert!(err.contains("must be dense with 20 elements"), "{err}");
    let err = refused(&on_gpu(&[19], 4));
    assert!(err.contains("must be dense with 20 elements"), "{err}");
    // An f32 product takes no f16 addend (its sum would be f32).
    let err = refused(&as_gpu(&on_gpu(&[4, 5], 5), Dtype::F16));
    assert!(
        err.contains("takes float operands of one dtype and an addend of that dtype or f32"),
        "{err}"
    );
}
