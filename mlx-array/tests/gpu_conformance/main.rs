//! What the GPU backend does beyond computing each primitive right (which
//! `tests/conformance.rs` checks on every device from the primitives'
//! specifications): buffer pooling and accounting, fusion of elementwise
//! chains, donation, placement, clear errors for what it cannot do, and
//! safetensors I/O of GPU arrays.
//!
//! Without an adapter the suite skips with a printed reason, except when `CI`
//! or `MLX_REQUIRE_GPU` is set: there it fails (CI installs Mesa's lavapipe).

mod harness;

mod attention;
mod elementwise;
mod half;
mod linear_loss;
mod matmul;
mod misc;
mod norm;
mod readback;
mod reduce;
mod submission;
mod sums;
mod threads;

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
