//! Running the same function on both devices and comparing.

use std::sync::{Mutex, MutexGuard};

use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result};

use mlx_array::conformance::values;

static SERIAL: Mutex<()> = Mutex::new(());

/// The values' bits, read as f32 (half-precision values widened exactly).
pub fn bits(x: &Array) -> Vec<u32> {
    x.astype(Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .into_iter()
        .map(f32::to_bits)
        .collect()
}

/// A guard (tests here run one at a time, so memory counters are theirs)
/// when a GPU adapter is usable. Without one: a printed skip, or a failure
/// when `CI` or `MLX_REQUIRE_GPU` says a GPU is expected.
pub fn gpu() -> Option<MutexGuard<'static, ()>> {
    mlx_array::conformance::gpu_or_skip().then(|| SERIAL.lock().unwrap_or_else(|e| e.into_inner()))
}

/// Whether the GPU stores `f16` natively (what the tensor-core template
/// stages): the first product makes the device, then a printed skip when
/// the adapter has no `shader-f16` (the f32 kernels run there instead).
pub fn native_f16_or_skip() -> bool {
    let probe = Array::from_slice(&[1.0f32], &[1, 1]).unwrap();
    with_device(Device::Gpu, || probe.matmul(&probe))
        .unwrap()
        .eval()
        .unwrap();
    let native = mlx_array::backend::gpu::native_f16();
    if !native {
        eprintln!("skipped: this adapter has no shader-f16");
    }
    native
}

/// Relative tolerance between the two backends for results in `dtype`
/// (WGSL's exp, log and friends are not correctly rounded).
pub fn tol(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => 1e-5,
        Dtype::F16 => 2e-3,
        Dtype::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

pub fn close(what: &str, cpu: &[f64], gpu: &[f64], rel: f64) {
    assert_eq!(cpu.len(), gpu.len(), "{what}: lengths");
    for (i, (&c, &g)) in cpu.iter().zip(gpu).enumerate() {
        let ok = if c.is_nan() {
            g.is_nan()
        } else if c.is_infinite() {
            g == c
        } else {
            (g - c).abs() <= rel * c.abs().max(1.0)
        };
        assert!(
            ok,
            "{what}: element {i}: gpu {g}, cpu {c}\n gpu {gpu:?}\n cpu {cpu:?}"
        );
    }
}

/// Builds `f(inputs)` on each device and checks the GPU result against
/// the CPU one: same shape and dtype, values within `rel`.
pub fn compare(what: &str, inputs: &[Array], f: impl Fn(&[Array]) -> Result<Array>, rel: f64) {
    let c = with_device(Device::Cpu, || f(inputs)).unwrap_or_else(|e| panic!("{what} (cpu): {e}"));
    let g = with_device(Device::Gpu, || f(inputs)).unwrap_or_else(|e| panic!("{what} (gpu): {e}"));
    if inputs.iter().all(|x| x.id() != g.id()) {
        assert_eq!(g.device(), Device::Gpu, "{what}: not placed on the GPU");
    }
    g.eval()
        .unwrap_or_else(|e| panic!("{what} (gpu eval): {e}"));
    assert_eq!(c.shape(), g.shape(), "{what}: shape");
    assert_eq!(c.dtype(), g.dtype(), "{what}: dtype");
    close(what, &values(&c), &values(&g), rel.max(tol(c.dtype())));
}

/// Parses the WGSL `src`, validates it with every capability and compiles
/// it to SPIR-V through naga (the version wgpu uses), panicking with
/// `what` and the reason if any step fails.
pub fn spirv(what: &str, src: &str) {
    let module = naga::front::wgsl::parse_str(src)
        .unwrap_or_else(|e| panic!("{what}: {}", e.emit_to_string(src)));
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("{what}: {e:?}"));
    let options = naga::back::spv::Options {
        lang_version: (1, 6),
        ..Default::default()
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, None)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(words.len() > 100, "{what}: {} SPIR-V words", words.len());
}
