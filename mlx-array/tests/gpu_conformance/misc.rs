//! The fused cross-entropy's gradient donating its logits buffer on the
//! GPU, and GPU arrays saved to safetensors.

use mlx_array::device::with_device;
use mlx_array::primitives::loss::CrossEntropyGrad;
use mlx_array::{Array, Device, Dtype};

use crate::elementwise::values_in;
use crate::harness::gpu;
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
