//! Reductions and matrix products on the GPU beyond their values: a chain
//! of GPU nodes stays on the GPU. Their values, views, long, empty and
//! NaN runs, ties and gradients on the GPU are checked by their
//! specifications (`tests/conformance.rs`, `sum::gpu`, `matmul::gpu`, ...).

use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype};

use crate::elementwise::values_in;
use crate::harness::gpu;
use mlx_array::conformance::{Layout, make};

/// Quarters in [-2, 2): products and their sums are exact in f32, and the
/// inputs in f16 and bf16.
fn quarters(shape: &[usize], seed: u64, d: Dtype) -> Array {
    let v = values_in(shape, seed, -8.0, 8.0, true).map(|x| x / 4.0);
    make(&v, d, Layout::Dense)
}

#[test]
fn a_reduction_of_a_gpu_product_stays_on_the_gpu() {
    let Some(_gpu) = gpu() else { return };
    let a = quarters(&[8, 8], 90, Dtype::F32);
    let s = with_device(Device::Gpu, || a.matmul(&a)?.sum_all()).unwrap();
    assert_eq!(s.device(), Device::Gpu);
    let c = with_device(Device::Cpu, || a.matmul(&a)?.sum_all()).unwrap();
    assert_eq!(s.item::<f32>().unwrap(), c.item::<f32>().unwrap());
}
