//! The fused cross-entropy's gradient donating its logits buffer on the
//! GPU, GPU arrays saved to safetensors, and the rotary embedding of
//! attention heads read in place (explicit frequencies too).

use mlx_array::device::with_device;
use mlx_array::primitives::loss::CrossEntropyGrad;
use mlx_array::{Array, Device, Dtype};

use crate::elementwise::values_in;
use crate::harness::{close, compare, gpu, tol};
use mlx_array::conformance::{Layout, make, values};

fn logits(shape: &[usize], seed: u64, d: Dtype, layout: Layout) -> Array {
    make(&values_in(shape, seed, -4.0, 4.0, false), d, layout)
}

/// The values of the fused cross-entropy and its gradient on the GPU are
/// checked by their specifications (`tests/conformance.rs`); here, the
/// gradient written over its own (donated) logits buffer.
#[test]
fn cross_entropy_gradient_donates_on_the_gpu() {
    let Some(_gpu) = gpu() else { return };
    let l = logits(&[3, 20], 34, Dtype::F32, Layout::Dense);
    let t = Array::from_slice(&[1i32, 19, 0], &[3]).unwrap();
    let c = Array::from_slice(&[1.0f32, -0.5, 2.0], &[3]).unwrap();
    let cpu = with_device(Device::Cpu, || {
        Array::from_primitive(
            CrossEntropyGrad,
            vec![l.clone(), t.clone(), c.clone()],
            vec![3, 20],
            Dtype::F32,
        )
    });
    let expected = values(&cpu);
    let g = with_device(Device::Gpu, || {
        // Built from a GPU-only temporary that nobody else holds.
        let owned = l.to_device(Device::Gpu).mul_scalar(1.0).unwrap();
        Array::from_primitive(
            CrossEntropyGrad,
            vec![owned, t.clone(), c.clone()],
            vec![3, 20],
            Dtype::F32,
        )
    });
    g.eval().unwrap();
    let got = values(&g);
    for (i, (a, b)) in expected.iter().zip(&got).enumerate() {
        assert!(
            (a - b).abs() <= 1e-5 * a.abs().max(1.0),
            "{i}: gpu {b} cpu {a}"
        );
    }
}

#[test]
fn gpu_arrays_save_to_safetensors_and_load_on_the_host() {
    let Some(_gpu) = gpu() else { return };
    let x = Array::from_slice(&[1.5f32, -2.0, 3.25, 4.0, 5.0, -6.5], &[2, 3]).unwrap();
    let (y, z) = with_device(Device::Gpu, || {
        let y = x.mul_scalar(2.0).unwrap();
        // A transposed view at an offset, as the optimizer hands out.
        let z = y.transpose(&[1, 0]).unwrap().slice_axis(0, 1, 3).unwrap();
        (y, z)
    });
    assert_eq!(y.device(), Device::Gpu);
    let dir = std::env::temp_dir().join(format!("mlx-gpu-save-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("w.safetensors");
    // Saved from inside a GPU scope, as a trainer on the GPU does.
    with_device(Device::Gpu, || {
        mlx_array::save_safetensors(
            &path,
            &[("y".into(), y.clone()), ("z".into(), z.clone())],
            None,
        )
    })
    .unwrap();
    let (loaded, _) = mlx_array::load_safetensors(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(
        loaded["y"].to_vec::<f32>().unwrap(),
        y.to_vec::<f32>().unwrap()
    );
    assert_eq!(loaded["z"].shape(), &[2, 2]);
    assert_eq!(
        loaded["z"].to_vec::<f32>().unwrap(),
        vec![-4.0, 10.0, 6.5, -13.0]
    );
}

/// The rotary embedding of attention heads (halves or adjacent pairs over
/// the whole head, a multiple of 8 wide) rotates by quads, reading the
/// heads' strided view in place: `[B, L, H, d]` viewed as `[B, H, L, d]`,
/// with a position offset, and its gradient (the inverse rotation of a
/// cotangent viewed the same way), in f32 and both half dtypes, against
/// the CPU. The gradient keeps the cotangent's `[B, L, H, d]` order, so
/// that the transpose and reshape back to `[B, L, H * d]` are views (no
/// kernel). A pass-through tail and rows off the quads take the element
/// kernel, with the CPU's values too.
#[test]
fn rope_of_head_views_rotates_by_quads_in_place() {
    let Some(_gpu) = gpu() else { return };
    for d in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        for (width, traditional) in [
            (8usize, false),
            (16, false),
            (64, false),
            (8, true),
            (64, true),
        ] {
            let what = format!("{d} width {width} traditional {traditional}");
            let x = logits(&[2, 5, 3, width], 70 + width as u64, d, Layout::Dense);
            let ct = logits(&[2, 5, 3, width], 71 + width as u64, d, Layout::Dense);
            let before = mlx_array::backend::gpu::rope_quad_count();
            compare(
                &format!("rope of heads {what}"),
                std::slice::from_ref(&x),
                move |v| {
                    mlx_array::rope(&v[0].swapaxes(1, 2)?, width, traditional, 10000.0, 1.0, 3)
                },
                tol(d) * 4.0,
            );
            // The gradient: the cotangent arrives as a view of `[B, L, H, d]`.
            let gradient = move |v: &[Array]| {
                let f = |a: &[Array]| -> mlx_array::Result<Vec<Array>> {
                    Ok(vec![mlx_array::rope(
                        &a[0],
                        width,
                        traditional,
                        500.0,
                        0.5,
                        0,
                    )?])
                };
                let (_, g) = mlx_array::vjp(f, &[v[0].swapaxes(1, 2)?], &[v[1].swapaxes(1, 2)?])?;
                Ok(g[0].clone())
            };
            compare(
                &format!("rope gradient of heads {what}"),
                &[x.clone(), ct.clone()],
                gradient,
                tol(d) * 4.0,
            );
            let quads = mlx_array::backend::gpu::rope_quad_count() - before;
            assert!(quads >= 2, "{what}: {quads} rotations by quads");
            let g = with_device(Device::Gpu, || gradient(&[x.clone(), ct.clone()])).unwrap();
            g.eval().unwrap();
            let merged = with_device(Device::Gpu, || {
                g.swapaxes(1, 2)
                    .and_then(|t| t.reshape(&[2, 5, 3 * width as i64]))
            })
            .unwrap();
            let dispatches = mlx_array::backend::gpu::dispatch_count();
            merged.eval().unwrap();
            assert_eq!(
                mlx_array::backend::gpu::dispatch_count(),
                dispatches,
                "{what}: the gradient merged back to [B, L, H * d] by views"
            );
            let want = with_device(Device::Cpu, || {
                gradient(&[x.clone(), ct.clone()])?
                    .swapaxes(1, 2)?
                    .reshape(&[2, 5, 3 * width as i64])
            })
            .unwrap();
            close(&what, &values(&want), &values(&merged), tol(d) * 4.0);
        }
        let x = logits(&[2, 5, 3, 12], 80, d, Layout::Dense);
        let before = mlx_array::backend::gpu::rope_quad_count();
        for (dims, traditional) in [(12, true), (8, false), (12, false), (8, true)] {
            compare(
                &format!("rope {d} dims {dims} traditional {traditional}"),
                std::slice::from_ref(&x),
                move |v| mlx_array::rope(&v[0].swapaxes(1, 2)?, dims, traditional, 100.0, 1.0, 1),
                tol(d) * 4.0,
            );
        }
        assert_eq!(mlx_array::backend::gpu::rope_quad_count(), before, "{d}");
    }
}

/// Explicit inverse frequencies (`rope_with_freqs`, the table among the
/// kernel's parameter words) on attention heads: by quads in place, for
/// halves and pairs, forward and gradient, and by elements with a
/// pass-through tail, in f32 and both half dtypes, against the CPU.
#[test]
fn rope_with_freqs_of_head_views_matches_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    let table = |n: usize| -> Vec<f32> { (0..n).map(|i| 0.9f32.powi(i as i32 * 3)).collect() };
    for d in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        for (width, traditional) in [(16usize, false), (16, true)] {
            let what = format!("{d} width {width} traditional {traditional}");
            let x = logits(&[2, 5, 3, width], 90 + width as u64, d, Layout::Dense);
            let ct = logits(&[2, 5, 3, width], 91 + width as u64, d, Layout::Dense);
            let freqs = table(width / 2);
            let before = mlx_array::backend::gpu::rope_quad_count();
            let f = freqs.clone();
            compare(
                &format!("rope_with_freqs of heads {what}"),
                std::slice::from_ref(&x),
                move |v| mlx_array::rope_with_freqs(&v[0].swapaxes(1, 2)?, &f, traditional, 3),
                tol(d) * 4.0,
            );
            let f = freqs.clone();
            compare(
                &format!("rope_with_freqs gradient of heads {what}"),
                &[x.clone(), ct.clone()],
                move |v| {
                    let rotate = |a: &[Array]| -> mlx_array::Result<Vec<Array>> {
                        Ok(vec![mlx_array::rope_with_freqs(&a[0], &f, traditional, 7)?])
                    };
                    let (_, g) =
                        mlx_array::vjp(rotate, &[v[0].swapaxes(1, 2)?], &[v[1].swapaxes(1, 2)?])?;
                    Ok(g[0].clone())
                },
                tol(d) * 4.0,
            );
            let quads = mlx_array::backend::gpu::rope_quad_count() - before;
            assert!(quads >= 2, "{what}: {quads} rotations by quads");
        }
        let x = logits(&[2, 5, 3, 12], 95, d, Layout::Dense);
        let before = mlx_array::backend::gpu::rope_quad_count();
        for traditional in [true, false] {
            let f = table(4);
            compare(
                &format!("rope_with_freqs {d} 8 of 12 traditional {traditional}"),
                std::slice::from_ref(&x),
                move |v| mlx_array::rope_with_freqs(&v[0].swapaxes(1, 2)?, &f, traditional, 1),
                tol(d) * 4.0,
            );
        }
        assert_eq!(mlx_array::backend::gpu::rope_quad_count(), before, "{d}");
    }
}
