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
mod indexing;
mod misc;
mod reduce;

use std::collections::BTreeSet;

/// Primitives that have no GPU kernel yet. Each one fails at eval when
/// placed on the GPU (never a silent CPU fallback); adding a kernel means
/// adding its case to a family module and removing it here.
const NOT_YET_ON_GPU: &[&str] = &[
    "sum", "prod", "max", "min", "argmax", "argmin", "cumsum", "matmul",
];

#[test]
fn every_primitive_has_a_gpu_case_or_is_listed_as_missing() {
    let covered: BTreeSet<&str> = [
        elementwise::NAMES,
        reduce::NAMES,
        indexing::NAMES,
        misc::NAMES,
    ]
    .concat()
    .into_iter()
    .collect();
    let missing: BTreeSet<&str> = NOT_YET_ON_GPU.iter().copied().collect();
    for name in mlx_array::primitive_names() {
        match (covered.contains(name), missing.contains(name)) {
            (true, true) => panic!("`{name}` has a GPU case: remove it from NOT_YET_ON_GPU"),
            (false, false) => panic!("primitive `{name}` has no GPU conformance case"),
            _ => {}
        }
    }
}

#[test]
fn primitives_without_a_kernel_fail_loudly_on_the_gpu() {
    let Some(_gpu) = harness::gpu() else { return };
    // One representative: it must be an error naming the primitive, not a CPU fallback.
    if NOT_YET_ON_GPU.contains(&"sum") {
        let x = mlx_array::Array::ones(&[3], mlx_array::Dtype::F32);
        let y =
            mlx_array::device::with_device(mlx_array::Device::Gpu, || x.sum(&[0], false)).unwrap();
        let err = y.eval().unwrap_err().to_string();
        assert!(err.contains("`sum` has no GPU kernel"), "{err}");
    }
}
