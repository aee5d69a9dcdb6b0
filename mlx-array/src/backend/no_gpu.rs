//! `backend::gpu` when mlx-array is built without its `gpu` feature: the
//! entry points of the wgpu backend that the rest of the crate calls, each
//! failing with [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE) (a link
//! written out: rustdoc reads this module's doc in `backend`) or giving the
//! answer of a machine with no GPU (nothing to submit, nothing pooled,
//! nothing to fuse). The primitives, the evaluator, devices and memory call
//! `gpu::...` the same way in both builds, so no `cfg` is needed outside
//! `backend/`. No array can live on the GPU in this build: nothing makes a
//! `Storage::Device`.
//!
//! Every function here comes from the table in `gpu_entry_points.rs`, the
//! one declaration of each entry point that the wgpu backend is checked
//! against too; this file writes out only the types.

use crate::Error;

/// Why every GPU entry point fails in this build.
pub const UNAVAILABLE: &str =
    "built without the `gpu` feature; rebuild mlx-array with `--features gpu`";

fn unavailable() -> Error {
    Error::gpu(UNAVAILABLE)
}

/// The GPU context; none exists in this build.
#[derive(Debug)]
pub enum GpuContext {}

gpu_entry_points!(no_gpu_stubs, gpu);

// The same counters as the wgpu backend's (they stay at zero here).
#[allow(dead_code)]
#[path = "gpu/transfers.rs"]
mod transfers;
pub use transfers::{Transfers, transfers};

/// Kernels written by other crates: every entry point fails with
/// [`UNAVAILABLE`] (the signatures of the wgpu backend's `custom`).
pub mod custom {
    gpu_entry_points!(no_gpu_stubs, custom);
}

/// Copies to the host that wait when read; none can start in this build.
pub(crate) mod readback {
    use crate::Result;
    use crate::data::ArrayData;

    /// A copy on its way to the host; none exists in this build.
    pub(crate) enum PendingDownload {}

    impl PendingDownload {
        /// Never called: no value of the type exists.
        pub(crate) fn finish(self) -> Result<ArrayData> {
            match self {}
        }
    }

    gpu_entry_points!(no_gpu_stubs, readback);
}

/// The fusion hooks of [`crate::Primitive::gpu_expression`]: no WGSL without a GPU.
pub(crate) mod elementwise {
    gpu_entry_points!(no_gpu_stubs, elementwise);
}

/// Runs the evaluator's fused chains: none in this build, where no node
/// is on the GPU.
pub(crate) mod fusion {
    gpu_entry_points!(no_gpu_stubs, fusion);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    #[test]
    fn the_stubs_give_their_rows_answers() {
        let unavailable = |e: Error| assert!(matches!(e, Error::Gpu(m) if m == UNAVAILABLE));
        unavailable(context().unwrap_err());
        unavailable(adapter_name().unwrap_err());
        unavailable(arange(0.0, 1.0, 4, Dtype::F32).unwrap_err());
        unavailable(custom::alloc(&[2], Dtype::F32).unwrap_err());
        unavailable(elementwise::where_expression().unwrap_err());
        assert!(!native_f16());
        assert!(!product_adds_in_kernel(Dtype::F32));
        assert!(submit().is_ok());
        let counts = [
            dispatch_count(),
            coop_product_count(),
            vector_operand_count(),
            submit_count(),
        ];
        assert_eq!(counts, [0; 4]);
        assert_eq!(custom::input("x", 1, Dtype::F32), "");
        assert_eq!(custom::output("y", 2, Dtype::F32), "");
        assert!(!custom::packed(Dtype::F32));
    }
}
