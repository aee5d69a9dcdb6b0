//! `backend::gpu` when mlx-array is built without its `gpu` feature: the
//! entry points of the wgpu backend that the rest of the crate calls, each
//! failing with [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE) (a link
//! written out: rustdoc reads this module's doc in `backend`) or giving the
//! answer of a machine with no GPU (nothing to submit, nothing pooled,
//! nothing to fuse). The primitives, the evaluator, devices and memory call
//! `gpu::...` the same way in both builds, so no `cfg` is needed outside
//! `backend/`. No array can live on the GPU in this build: nothing makes a
//! `Storage::Device`.

use crate::backend::common::attention::AttentionDims;
use crate::backend::common::elementwise::{BinaryOp, UnaryOp};
use crate::backend::common::loss::LceArgs;
use crate::backend::common::reduce::ReduceOp;
use crate::backend::common::rope::RopeSpec;
use crate::data::{ArrayData, Operand};
use crate::{Dtype, Error, Result};

/// Why every GPU entry point fails in this build.
pub const UNAVAILABLE: &str =
    "built without the `gpu` feature; rebuild mlx-array with `--features gpu`";

fn unavailable() -> Error {
    Error::gpu(UNAVAILABLE)
}

/// The GPU context; none exists in this build.
#[derive(Debug)]
pub enum GpuContext {}

/// Always [`UNAVAILABLE`].
pub fn context() -> Result<&'static GpuContext> {
    Err(unavailable())
}

/// Always [`UNAVAILABLE`].
pub fn adapter_name() -> Result<String> {
    Err(unavailable())
}

/// No GPU, so no product adds an addend on one: false.
pub fn product_adds_in_kernel(_dtype: Dtype) -> bool {
    false
}

/// No GPU, so no `f16` stored on one: false.
pub fn native_f16() -> bool {
    false
}

/// Nothing was recorded, so nothing to submit.
pub fn submit() -> Result<()> {
    Ok(())
}

/// No kernel ever ran: 0.
pub fn dispatch_count() -> usize {
    0
}

/// No product ever ran on cooperative matrices: 0.
pub fn coop_product_count() -> usize {
    0
}

/// No product ever staged an operand with vector loads: 0.
pub fn vector_operand_count() -> usize {
    0
}

/// Nothing was ever submitted: 0.
pub fn submit_count() -> usize {
    0
}

/// Always [`UNAVAILABLE`] (the wgpu backend returns the losses and the
/// flat gradients).
pub fn linear_cross_entropy_value_and_grad(
    a: &LceArgs<'_>,
    ct: &Operand<'_>,
) -> Result<(ArrayData, ArrayData)> {
    let _ = (a, ct);
    Err(unavailable())
}

// The same counters as the wgpu backend's (they stay at zero here).
#[allow(dead_code)]
#[path = "gpu/transfers.rs"]
mod transfers;
pub use transfers::{Transfers, transfers};

/// Kernels written by other crates: every entry point fails with
/// [`UNAVAILABLE`] (the signatures of the wgpu backend's `custom`).
pub mod custom {
    use super::unavailable;
    use crate::data::ArrayData;
    use crate::{Dtype, Result};

    /// Always [`super::UNAVAILABLE`].
    pub fn alloc(_shape: &[usize], _dtype: Dtype) -> Result<ArrayData> {
        Err(unavailable())
    }

    /// Always [`super::UNAVAILABLE`].
    pub fn dispatch(
        _key: &str,
        _source: impl FnOnce() -> String,
        _meta: &[u32],
        _inputs: &[&ArrayData],
        _output: &ArrayData,
        _groups: usize,
    ) -> Result<()> {
        Err(unavailable())
    }

    /// Always [`super::UNAVAILABLE`].
    pub fn dispatch_outputs(
        _key: &str,
        _source: impl FnOnce() -> String,
        _meta: &[u32],
        _inputs: &[&ArrayData],
        _outputs: &[&ArrayData],
        _clear_last: Option<usize>,
        _groups: usize,
    ) -> Result<()> {
        Err(unavailable())
    }

    /// No WGSL: nothing can dispatch it in this build.
    pub fn input(_name: &str, _binding: u32, _d: Dtype) -> String {
        String::new()
    }

    /// No WGSL: nothing can dispatch it in this build.
    pub fn output(_name: &str, _binding: u32, _d: Dtype) -> String {
        String::new()
    }

    /// Nothing is stored on a GPU in this build.
    pub fn packed(_d: Dtype) -> bool {
        false
    }
}

/// Copies to the host that wait when read; none can start in this build.
pub(crate) mod readback {
    use super::{ArrayData, Result, unavailable};
    use crate::data::Operand;

    /// A copy on its way to the host; none exists in this build.
    pub(crate) enum PendingDownload {}

    /// Always [`UNAVAILABLE`](super::UNAVAILABLE).
    pub(crate) fn start(_x: &Operand<'_>) -> Result<PendingDownload> {
        Err(unavailable())
    }

    impl PendingDownload {
        /// Never called: no value of the type exists.
        pub(crate) fn finish(self) -> Result<ArrayData> {
            match self {}
        }
    }
}

/// Declares kernels that fail with [`UNAVAILABLE`], with the wgpu backend's signatures.
macro_rules! unavailable_kernels {
    ($($(#[$m:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?);)*) => {
        $(
            $(#[$m])*
            $vis fn $name($($arg: $ty),*) -> Result<ArrayData> {
                let _ = ($($arg,)*);
                Err(unavailable())
            }
        )*
    };
}

unavailable_kernels! {
    /// Always [`UNAVAILABLE`].
    pub(crate) fn upload(host: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub(crate) fn download(x: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn unary(op: UnaryOp, x: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn binary(op: BinaryOp, a: &Operand<'_>, b: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn where_(cond: &Operand<'_>, a: &Operand<'_>, b: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn astype(x: &Operand<'_>, to: Dtype);
    /// Always [`UNAVAILABLE`].
    pub fn copy_contiguous(x: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn arange(start: f64, step: f64, n: usize, dtype: Dtype);
    /// Always [`UNAVAILABLE`].
    pub fn random_bits(key: &Operand<'_>, shape: &[usize]);
    /// Always [`UNAVAILABLE`].
    pub fn reduce(op: ReduceOp, x: &Operand<'_>, axes: &[usize]);
    /// Always [`UNAVAILABLE`].
    pub fn arg_reduce(is_max: bool, x: &Operand<'_>, axis: usize);
    /// Always [`UNAVAILABLE`].
    pub fn cumsum(x: &Operand<'_>, axis: usize, reverse: bool, inclusive: bool);
    /// Always [`UNAVAILABLE`].
    pub fn matmul(a: &Operand<'_>, b: &Operand<'_>, out_shape: &[usize]);
    /// Always [`UNAVAILABLE`].
    pub fn matmul_adding(
        a: &Operand<'_>,
        b: &Operand<'_>,
        out_shape: &[usize],
        addend: &Operand<'_>,
    );
    /// Always [`UNAVAILABLE`].
    pub fn take(a: &Operand<'_>, idx: &Operand<'_>, axis: usize, out_shape: &[usize]);
    /// Always [`UNAVAILABLE`].
    pub fn take_along_axis(a: &Operand<'_>, idx: &Operand<'_>, axis: usize);
    /// Always [`UNAVAILABLE`].
    pub fn scatter_add(
        ct: &Operand<'_>,
        idx: &Operand<'_>,
        axis: usize,
        along_axis: bool,
        out_shape: &[usize],
    );
    /// Always [`UNAVAILABLE`].
    pub fn concatenate(parts: &[Operand<'_>], dtype: Dtype, axis: usize, out_shape: &[usize]);
    /// Always [`UNAVAILABLE`].
    pub fn pad(x: &Operand<'_>, low: &[usize], value: f64, out_shape: &[usize]);
    /// Always [`UNAVAILABLE`].
    pub fn slice_update(base: &Operand<'_>, upd: &Operand<'_>, start: &[usize], step: &[isize]);
    /// Always [`UNAVAILABLE`].
    pub fn softmax(x: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn cross_entropy(logits: &Operand<'_>, t: &Operand<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn cross_entropy_grad(
        logits: Operand<'_>,
        t: &Operand<'_>,
        ct: &Operand<'_>,
        donated: bool,
    );
    /// Always [`UNAVAILABLE`].
    pub fn linear_cross_entropy(a: &LceArgs<'_>);
    /// Always [`UNAVAILABLE`].
    pub fn linear_cross_entropy_grad(
        a: &LceArgs<'_>,
        ct: &Operand<'_>,
        loss: &Operand<'_>,
    );
    /// Always [`UNAVAILABLE`].
    pub fn attention_grad(
        q: &ArrayData,
        k: &ArrayData,
        v: &ArrayData,
        packed: &ArrayData,
        d_out: &Operand<'_>,
        dims: &AttentionDims,
        dtype: Dtype,
    );
    /// Always [`UNAVAILABLE`].
    pub fn rope(x: &Operand<'_>, spec: &RopeSpec, keep_order: bool);
    /// Always [`UNAVAILABLE`].
    pub fn rms_norm(x: &Operand<'_>, w: &Operand<'_>, eps: f32, out: Dtype);
}

/// Always [`UNAVAILABLE`].
pub fn rms_norm_grad(
    _x: &Operand<'_>,
    _w: &Operand<'_>,
    _ct: &Operand<'_>,
    _addend: Option<&Operand<'_>>,
    _eps: f32,
    _half: Option<Dtype>,
) -> Result<(ArrayData, Option<ArrayData>)> {
    Err(unavailable())
}

/// Always [`UNAVAILABLE`].
pub fn attention(
    _q: &ArrayData,
    _k: &ArrayData,
    _v: &ArrayData,
    _dims: &AttentionDims,
    _dtype: Dtype,
    _half: Option<Dtype>,
) -> Result<(ArrayData, Option<ArrayData>)> {
    Err(unavailable())
}

/// The fusion hooks of [`crate::Primitive::gpu_expression`]: no WGSL without a GPU.
pub(crate) mod elementwise {
    use super::unavailable;
    use crate::backend::common::elementwise::{BinaryOp, UnaryOp};
    use crate::data::ArrayData;
    use crate::{Dtype, Result};

    /// Always [`super::UNAVAILABLE`].
    pub(crate) fn unary_expression(_op: UnaryOp, _dtype: Dtype) -> Result<String> {
        Err(unavailable())
    }

    /// Always [`super::UNAVAILABLE`].
    pub(crate) fn binary_expression(_op: BinaryOp, _dtype: Dtype) -> Result<(String, Dtype)> {
        Err(unavailable())
    }

    /// Always [`super::UNAVAILABLE`].
    pub(crate) fn astype_expression(_from: Dtype, _to: Dtype) -> Result<String> {
        Err(unavailable())
    }

    /// Always [`super::UNAVAILABLE`].
    pub(crate) fn where_expression() -> Result<String> {
        Err(unavailable())
    }

    /// Always [`super::UNAVAILABLE`].
    pub(crate) fn map(
        _key: &str,
        _expr: &str,
        _shape: &[usize],
        _inputs: &[(&ArrayData, Dtype)],
        _out_dtype: Dtype,
    ) -> Result<ArrayData> {
        Err(unavailable())
    }
}

/// Runs the evaluator's fused chains: none in this build, where no node
/// is on the GPU.
pub(crate) mod fusion {
    use super::unavailable;
    use crate::Result;
    use crate::backend::common::fusion::FusedChain;
    use crate::data::ArrayData;

    /// Always [`super::UNAVAILABLE`].
    pub(crate) fn run(_chain: &FusedChain) -> Result<ArrayData> {
        Err(unavailable())
    }
}
