//! The GPU conformance suite: every primitive runs on the GPU and must match
//! the CPU backend (itself checked against an f64 reference in
//! `tests/conformance.rs`), across dtypes and strided, transposed, reversed
//! and broadcast views; gradients are compared the same way.
//!
//! Without an adapter the suite skips with a printed reason, except when `CI`
//! or `MLX_REQUIRE_GPU` is set: there it fails (CI installs Mesa's lavapipe).

#[path = "../common/mod.rs"]
mod common;
mod harness;

mod elementwise;
mod misc;
mod reduce;

use std::collections::BTreeSet;

/// Every primitive must have a case in a family module, or a conformance
/// specification that runs on the GPU (`tests/conformance.rs`,
/// `<name>::gpu`): one without a GPU kernel fails here rather than at a
/// user's eval.
#[test]
fn every_primitive_has_a_gpu_case() {
    let specified = mlx_array::conformance::specs()
        .into_iter()
        .filter(|s| s.devices().contains(&mlx_array::Device::Gpu))
        .map(|s| s.name());
    let covered: BTreeSet<&str> = [elementwise::NAMES, reduce::NAMES, misc::NAMES]
        .concat()
        .into_iter()
        .chain(specified)
        .collect();
    for name in mlx_array::primitive_names() {
        assert!(
            covered.contains(name),
            "primitive `{name}` has no GPU conformance case"
        );
    }
}

/// A primitive with a CPU kernel only (as another crate may define): placing
/// it on the GPU must fail at eval.
#[derive(Debug)]
struct CpuOnly;

impl mlx_array::Primitive for CpuOnly {
    fn name(&self) -> &'static str {
        "cpu_only"
    }
    fn eval_cpu(
        &self,
        inputs: &[mlx_array::Array],
        _out: &mlx_array::Array,
    ) -> mlx_array::Result<mlx_array::ArrayData> {
        inputs[0].data()
    }
}

#[test]
fn primitives_without_a_kernel_fail_loudly_on_the_gpu() {
    let Some(_gpu) = harness::gpu() else { return };
    use mlx_array::{Array, Device, Dtype, device::with_device};
    // An error naming the primitive at eval, not a silent CPU fallback.
    let x = Array::ones(&[3], Dtype::F32);
    let y = with_device(Device::Gpu, || {
        Array::from_primitive(CpuOnly, vec![x.clone()], vec![3], Dtype::F32)
    });
    assert_eq!(y.device(), Device::Gpu);
    let err = y.eval().unwrap_err().to_string();
    assert!(err.contains("`cpu_only` has no GPU kernel"), "{err}");
    // The same primitive on the CPU works.
    let z = Array::from_primitive(CpuOnly, vec![x], vec![3], Dtype::F32);
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![1.0; 3]);
}
