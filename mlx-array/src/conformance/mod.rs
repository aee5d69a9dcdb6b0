//! The conformance harness (feature `conformance`): each primitive's
//! specification — how to build test inputs, an f64 reference, whether and
//! how it is differentiated, which devices it runs on — sits next to the
//! primitive, and [`main`] turns a list of them into one named test per
//! primitive and device, as candle's `test_device!` does.
//!
//! The harness knows no primitive: it is handed the list. mlx-array's is
//! [`crate::primitives::specs`], which names each family's `spec.rs`;
//! crates that add primitives pass theirs the same way, from a test target
//! with `harness = false` whose `main` is
//!
//! ```no_run
//! // tests/conformance.rs, with `[[test]] name = "conformance" harness = false`
//! mlx_array::conformance::main(
//!     mlx_array::primitives::specs(), // or your crate's own list
//!     &[concat!(env!("CARGO_MANIFEST_DIR"), "/src")],
//! )
//! ```
//!
//! A specification for a new unary function is a value check that compares
//! the op with a reference, and a gradient case:
//!
//! ```
//! use mlx_array::conformance::{Ctx, GradCase, Nd, Spec, fill, make, tol, uniform, Layout};
//! use mlx_array::{Dtype, primitives::elementwise::Unary};
//!
//! let spec = Spec::new::<Unary>(
//!     "exp",
//!     |cx: &Ctx| {
//!         let x = fill(&[2, 3], Dtype::F32, -2.0, 2.0, 7);
//!         let got = cx.on(|| make(&x, Dtype::F32, Layout::Transposed).exp()).unwrap();
//!         cx.check(&got, &x.map(f64::exp), Dtype::F32, tol(Dtype::F32), "exp");
//!     },
//!     || GradCase::new(vec![uniform(1, &[2, 3], -2.0, 2.0)], &[0], |a| a[0].exp()),
//! );
//! assert_eq!(spec.name(), "exp");
//! ```

mod check;
mod gpu;
mod gradient;
mod inputs;
mod reference;
mod rerun;
mod suite;

use std::sync::Arc;

pub use check::{Ctx, assert_close, gpu_slack, tol};
pub use gpu::{gpu_or_skip, gpu_required};
pub use gradient::{Apply, Expect, GradCase};
pub use inputs::{
    FLOATS, LAYOUTS, Layout, NUMERIC, dim, fill, ints, layout, make, nonempty_shape, shape, spread,
    typed, uniform, values,
};
pub use reference::{Nd, broadcast, for_each_index, quantize, size, wrap, zip};
pub use rerun::{rerun_with_env, rerun_without_amx};
pub use suite::main;

use crate::{Device, Primitive};

/// A value check: builds inputs, runs the primitive on the context's device
/// and compares with a reference; panics on a mismatch.
pub type ValueCheck = Arc<dyn Fn(&Ctx) + Send + Sync>;

/// Builds the gradient case of a primitive.
pub type GradBuilder = Arc<dyn Fn() -> GradCase + Send + Sync>;

/// One primitive's specification: its name, the type implementing it, the
/// devices with kernels, a value check and a gradient case. Both checks are
/// required, so a primitive cannot be registered untested.
#[derive(Clone)]
pub struct Spec {
    name: &'static str,
    type_name: &'static str,
    devices: Vec<Device>,
    values: ValueCheck,
    gradient: GradBuilder,
}

impl Spec {
    /// The specification of the primitive `P` named `name` (its
    /// [`Primitive::name`]), with kernels on the CPU and the GPU.
    pub fn new<P: Primitive>(
        name: &'static str,
        values: impl Fn(&Ctx) + Send + Sync + 'static,
        gradient: impl Fn() -> GradCase + Send + Sync + 'static,
    ) -> Spec {
        Spec {
            name,
            type_name: std::any::type_name::<P>(),
            devices: vec![Device::Cpu, Device::Gpu],
            values: Arc::new(values),
            gradient: Arc::new(gradient),
        }
    }

    /// The same specification for a primitive that runs on these devices only.
    pub fn on(mut self, devices: &[Device]) -> Spec {
        self.devices = devices.to_vec();
        self
    }

    /// The primitive's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// The devices its tests run on.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }
}

impl std::fmt::Debug for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Spec")
            .field("name", &self.name)
            .field("type", &self.type_name)
            .field("devices", &self.devices)
            .finish()
    }
}
