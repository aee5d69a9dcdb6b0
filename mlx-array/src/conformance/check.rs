//! What a value check sees: the device under test, a proptest runner sized
//! for it, and comparisons against the reference with the device's slack.

use proptest::test_runner::{Config, TestRunner};

use super::inputs::values;
use super::reference::Nd;
use crate::{Array, Device, Dtype, device::with_device};

/// Relative tolerance for results computed in `dtype` on the CPU.
pub fn tol(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => 2e-5,
        Dtype::F16 => 2e-3,
        Dtype::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// How far the GPU may stray from the CPU in `dtype`, relatively (WGSL's
/// exp, log and friends are not correctly rounded).
pub fn gpu_slack(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => 1e-4,
        Dtype::F16 => 2e-3,
        Dtype::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// The device a value check runs on, with helpers that know it.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    device: Device,
}

impl Ctx {
    /// A context for `device`.
    pub fn new(device: Device) -> Ctx {
        Ctx { device }
    }

    /// The device under test.
    pub fn device(&self) -> Device {
        self.device
    }

    /// A proptest runner: 24 random cases on the CPU, 6 on the GPU (Mesa's
    /// software Vulkan in CI is slow, and the CPU run already explores).
    pub fn runner(&self) -> TestRunner {
        TestRunner::new(Config {
            cases: match self.device {
                Device::Cpu => 24,
                Device::Gpu => 6,
            },
            failure_persistence: None,
            ..Config::default()
        })
    }

    /// Runs `f` with the ops it builds placed on the device under test.
    pub fn on<T>(&self, f: impl FnOnce() -> T) -> T {
        with_device(self.device, f)
    }

    /// Whether the device has kernels for `dtype` (the GPU has no 64-bit
    /// integers: WGSL lacks them without `shader-int64`).
    pub fn supports(&self, dtype: Dtype) -> bool {
        self.device == Device::Cpu || dtype != Dtype::I64
    }

    /// The dtypes of `dtypes` the device supports.
    pub fn dtypes(&self, dtypes: &[Dtype]) -> Vec<Dtype> {
        dtypes
            .iter()
            .copied()
            .filter(|&d| self.supports(d))
            .collect()
    }

    /// The relative tolerance `rel` (meant for the CPU) widened by the
    /// device's slack for `dtype`.
    pub fn rel(&self, rel: f64, dtype: Dtype) -> f64 {
        match self.device {
            Device::Cpu => rel,
            Device::Gpu => rel + gpu_slack(dtype),
        }
    }

    /// Asserts that `got` lives on the device under test and has `want`'s
    /// shape, the dtype `dtype`, and values within `rel` (widened for the
    /// device) of `want`.
    pub fn check(&self, got: &Array, want: &Nd, dtype: Dtype, rel: f64, what: &str) {
        let what = format!("{what} on {}", self.device);
        assert_eq!(
            got.device(),
            self.device,
            "{what}: placed on {}",
            got.device()
        );
        assert_close(got, want, dtype, self.rel(rel, dtype), &what);
    }
}

/// Asserts that `a` has `want`'s shape, the dtype `dtype`, and values within
/// `rel` (relative, with a 1e-6 absolute floor when `rel > 0`).
pub fn assert_close(a: &Array, want: &Nd, dtype: Dtype, rel: f64, what: &str) {
    assert_eq!(a.shape(), &want.shape[..], "{what}: shape");
    assert_eq!(a.dtype(), dtype, "{what}: dtype");
    let got = values(a);
    for (i, (&g, &w)) in got.iter().zip(&want.v).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= rel * w.abs().max(1.0) + if rel > 0.0 { 1e-6 } else { 0.0 }
        };
        assert!(
            ok,
            "{what}: element {i} is {g}, expected {w} (got {got:?}, want {:?})",
            want.v
        );
    }
}
