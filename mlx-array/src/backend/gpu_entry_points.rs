//! The GPU entry points, each declared once: the functions of
//! `backend::gpu` that the rest of the crate calls, in one table
//! (`gpu_entry_points!`) that both builds read.
//!
//! A row is an entry point's signature, where it lives in the wgpu backend
//! and what a machine without a GPU answers. With the `gpu` feature,
//! `gpu/mod.rs` applies `gpu_reexports!` to the table: each row becomes
//! the `pub use` of the backend's function (under its row's name) and a
//! compile-time check that the function has exactly the row's signature,
//! so a kernel's launcher can't drift from its row. Without the feature,
//! `no_gpu.rs` applies `no_gpu_stubs!`: each row becomes a function of
//! that signature, with the row's doc comment, that gives the row's
//! answer. Adding or changing an entry point is one row; the compiler
//! holds both builds to it. (Types such as `GpuContext`, and the wgpu
//! backend's test hooks that only the `gpu` build has, stay written out in
//! each file.)

/// The types the table's signatures name, besides the two that each build
/// defines itself (`GpuContext` at `backend::gpu`, `PendingDownload` in
/// `readback`): both callbacks bring them into scope for the rows.
pub(super) mod signature_types {
    pub(in crate::backend) use crate::backend::common::attention::AttentionDims;
    pub(in crate::backend) use crate::backend::common::elementwise::{BinaryOp, UnaryOp};
    pub(in crate::backend) use crate::backend::common::fusion::FusedChain;
    pub(in crate::backend) use crate::backend::common::loss::LceArgs;
    pub(in crate::backend) use crate::backend::common::reduce::ReduceOp;
    pub(in crate::backend) use crate::backend::common::rope::RopeSpec;
    pub(in crate::backend) use crate::data::{ArrayData, Operand};
    pub(in crate::backend) use crate::{Dtype, Result};
}

/// The table of GPU entry points: `gpu_entry_points!(callback, part)`
/// invokes `callback!` with one part of the table, and
/// `gpu_entry_points!(callback)` with every part in turn.
///
/// The part `gpu` holds the functions `backend::gpu` re-exports, grouped
/// by the module of the wgpu backend that defines them
/// (`use elementwise { … }`); the other parts are modules that callers
/// name themselves (`gpu::custom::alloc`), one `mod custom { … }` each. A
/// row reads
///
/// ```text
/// /// The doc comment of the no-GPU build's function.
/// pub fn name(arg: Type, …) -> Return => answer;
/// ```
///
/// where `answer` is `unavailable` (fails with `UNAVAILABLE`) or what a
/// machine without a GPU answers (`false`, `0`, `{ Ok(()) }`). The doc
/// comment's links are read where the stub is (a row in a `mod` part
/// writes `crate::backend::gpu::UNAVAILABLE` in full). `name as alias`
/// re-exports the function under another name. `[generic]` after the
/// return type marks a function with an `impl Trait` parameter, which no
/// function pointer can hold: its check calls it with the row's arguments
/// instead (which a parameter that the argument coerces to would pass). A
/// new part goes in the list of the first rule too, so that the `gpu` build
/// checks it.
macro_rules! gpu_entry_points {
    ($apply:ident) => {
        gpu_entry_points!($apply, gpu);
        gpu_entry_points!($apply, custom);
        gpu_entry_points!($apply, readback);
        gpu_entry_points!($apply, elementwise);
        gpu_entry_points!($apply, fusion);
    };
    ($apply:ident, gpu) => {
        $apply! {
            use device {
                /// Always [`UNAVAILABLE`].
                pub fn context() -> Result<&'static GpuContext> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn adapter_name() -> Result<String> => unavailable;
                /// No GPU, so no `f16` stored on one: false.
                pub fn native_f16() -> bool => false;
            }
            use dispatch {
                /// Nothing was recorded, so nothing to submit.
                pub fn submit() -> Result<()> => { Ok(()) };
            }
            use stats {
                /// No kernel ever ran: 0.
                pub fn dispatch_count() -> usize => 0;
            }
            use submission {
                /// Nothing was ever submitted: 0.
                pub fn submit_count() -> usize => 0;
            }
            use host {
                /// Always [`UNAVAILABLE`].
                pub(crate) fn upload(host: &Operand<'_>) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub(crate) fn download(x: &Operand<'_>) -> Result<ArrayData> => unavailable;
            }
            use elementwise {
                /// Always [`UNAVAILABLE`].
                pub fn unary(op: UnaryOp, x: &Operand<'_>) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn binary(op: BinaryOp, a: &Operand<'_>, b: &Operand<'_>) -> Result<ArrayData>
                    => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn where_(cond: &Operand<'_>, a: &Operand<'_>, b: &Operand<'_>)
                    -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn astype(x: &Operand<'_>, to: Dtype) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn copy_contiguous(x: &Operand<'_>) -> Result<ArrayData> => unavailable;
            }
            use creation {
                /// Always [`UNAVAILABLE`].
                pub fn arange(start: f64, step: f64, n: usize, dtype: Dtype) -> Result<ArrayData>
                    => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn random_bits(key: &Operand<'_>, shape: &[usize]) -> Result<ArrayData>
                    => unavailable;
            }
            use reduce {
                /// Always [`UNAVAILABLE`].
                pub fn reduce(op: ReduceOp, x: &Operand<'_>, axes: &[usize]) -> Result<ArrayData>
                    => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn arg_reduce(is_max: bool, x: &Operand<'_>, axis: usize) -> Result<ArrayData>
                    => unavailable;
            }
            use scan {
                /// Always [`UNAVAILABLE`].
                pub fn cumsum(x: &Operand<'_>, axis: usize, reverse: bool, inclusive: bool)
                    -> Result<ArrayData> => unavailable;
            }
            use matmul {
                /// Always [`UNAVAILABLE`].
                pub fn matmul(a: &Operand<'_>, b: &Operand<'_>, out_shape: &[usize])
                    -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn matmul_adding(
                    a: &Operand<'_>,
                    b: &Operand<'_>,
                    out_shape: &[usize],
                    addend: &Operand<'_>,
                ) -> Result<ArrayData> => unavailable;
                /// No GPU, so no product adds an addend on one: false.
                pub fn adds_in_kernel as product_adds_in_kernel(dtype: Dtype) -> bool => false;
                /// No product ever ran on cooperative matrices: 0.
                pub fn coop_product_count() -> usize => 0;
                /// No product ever staged an operand with vector loads: 0.
                pub fn vector_operand_count() -> usize => 0;
            }
            use indexing {
                /// Always [`UNAVAILABLE`].
                pub fn take(a: &Operand<'_>, idx: &Operand<'_>, axis: usize, out_shape: &[usize])
                    -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn take_along_axis(a: &Operand<'_>, idx: &Operand<'_>, axis: usize)
                    -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn scatter_add(
                    ct: &Operand<'_>,
                    idx: &Operand<'_>,
                    axis: usize,
                    along_axis: bool,
                    out_shape: &[usize],
                ) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn concatenate(
                    parts: &[Operand<'_>],
                    dtype: Dtype,
                    axis: usize,
                    out_shape: &[usize],
                ) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn pad(x: &Operand<'_>, low: &[usize], value: f64, out_shape: &[usize])
                    -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn slice_update(
                    base: &Operand<'_>,
                    upd: &Operand<'_>,
                    start: &[usize],
                    step: &[isize],
                ) -> Result<ArrayData> => unavailable;
            }
            use loss {
                /// Always [`UNAVAILABLE`].
                pub fn softmax(x: &Operand<'_>) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn cross_entropy(logits: &Operand<'_>, t: &Operand<'_>) -> Result<ArrayData>
                    => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn cross_entropy_grad(
                    logits: Operand<'_>,
                    t: &Operand<'_>,
                    ct: &Operand<'_>,
                    donated: bool,
                ) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn linear_cross_entropy(a: &LceArgs<'_>) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn linear_cross_entropy_grad(
                    a: &LceArgs<'_>,
                    ct: &Operand<'_>,
                    loss: &Operand<'_>,
                ) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`] (the wgpu backend returns the losses and the
                /// flat gradients).
                pub fn linear_cross_entropy_value_and_grad(a: &LceArgs<'_>, ct: &Operand<'_>)
                    -> Result<(ArrayData, ArrayData)> => unavailable;
            }
            use attention {
                /// Always [`UNAVAILABLE`].
                pub fn attention(
                    q: &ArrayData,
                    k: &ArrayData,
                    v: &ArrayData,
                    dims: &AttentionDims,
                    dtype: Dtype,
                    half: Option<Dtype>,
                ) -> Result<(ArrayData, Option<ArrayData>)> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn attention_grad(
                    q: &ArrayData,
                    k: &ArrayData,
                    v: &ArrayData,
                    packed: &ArrayData,
                    d_out: &Operand<'_>,
                    dims: &AttentionDims,
                    dtype: Dtype,
                ) -> Result<ArrayData> => unavailable;
            }
            use rope {
                /// Always [`UNAVAILABLE`].
                pub fn rope(x: &Operand<'_>, spec: &RopeSpec, keep_order: bool) -> Result<ArrayData>
                    => unavailable;
            }
            use norm {
                /// Always [`UNAVAILABLE`].
                pub fn rms_norm(x: &Operand<'_>, w: &Operand<'_>, eps: f32, dtype: Dtype)
                    -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`].
                pub fn rms_norm_grad(
                    x: &Operand<'_>,
                    w: &Operand<'_>,
                    ct: &Operand<'_>,
                    addend: Option<&Operand<'_>>,
                    eps: f32,
                    half: Option<Dtype>,
                ) -> Result<(ArrayData, Option<ArrayData>)> => unavailable;
            }
        }
    };
    ($apply:ident, custom) => {
        $apply! {
            mod custom {
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub fn alloc(shape: &[usize], dtype: Dtype) -> Result<ArrayData> => unavailable;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub fn dispatch(
                    key: &str,
                    source: impl FnOnce() -> String,
                    meta: &[u32],
                    inputs: &[&ArrayData],
                    output: &ArrayData,
                    groups: usize,
                ) -> Result<()> [generic] => unavailable;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub fn dispatch_outputs(
                    key: &str,
                    source: impl FnOnce() -> String,
                    meta: &[u32],
                    inputs: &[&ArrayData],
                    outputs: &[&ArrayData],
                    clear_last: Option<usize>,
                    groups: usize,
                ) -> Result<()> [generic] => unavailable;
                /// No WGSL: nothing can dispatch it in this build.
                pub fn input(name: &str, binding: u32, d: Dtype) -> String => { String::new() };
                /// No WGSL: nothing can dispatch it in this build.
                pub fn output(name: &str, binding: u32, d: Dtype) -> String => { String::new() };
                /// Nothing is stored on a GPU in this build.
                pub fn packed(d: Dtype) -> bool => false;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub fn storage_buffer_limit() -> Result<usize> => unavailable;
            }
        }
    };
    ($apply:ident, readback) => {
        $apply! {
            mod readback {
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn start(x: &Operand<'_>) -> Result<PendingDownload> => unavailable;
            }
        }
    };
    ($apply:ident, elementwise) => {
        $apply! {
            mod elementwise {
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn unary_expression(op: UnaryOp, dtype: Dtype) -> Result<String>
                    => unavailable;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn binary_expression(op: BinaryOp, dtype: Dtype)
                    -> Result<(String, Dtype)> => unavailable;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn astype_expression(from: Dtype, to: Dtype) -> Result<String>
                    => unavailable;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn where_expression() -> Result<String> => unavailable;
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn map(
                    key: &str,
                    expr: &str,
                    shape: &[usize],
                    inputs: &[(&ArrayData, Dtype)],
                    out_dtype: Dtype,
                ) -> Result<ArrayData> => unavailable;
            }
        }
    };
    ($apply:ident, fusion) => {
        $apply! {
            mod fusion {
                /// Always [`UNAVAILABLE`](crate::backend::gpu::UNAVAILABLE).
                pub(crate) fn run(chain: &FusedChain) -> Result<ArrayData> => unavailable;
            }
        }
    };
}

/// The `gpu` build's callback of `gpu_entry_points!`: for a `use module`
/// group, each row's `pub use module::name` (`as alias`); for every row, a
/// constant that holds the backend's function as a function pointer of
/// the row's signature, which compiles only when the two are the same.
#[cfg(feature = "gpu")]
macro_rules! gpu_reexports {
    ($(use $module:ident { $($rows:tt)* })*) => {
        $(gpu_reexports!(@use $module $($rows)*);)*
    };
    (mod $module:ident { $($rows:tt)* }) => {
        const _: () = {
            #[allow(unused_imports)]
            use $crate::backend::gpu_entry_points::signature_types::*;
            #[allow(unused_imports)]
            use $module::*;
            gpu_reexports!(@checks $module $($rows)*);
        };
    };
    (@use $module:ident $(
        $(#[$meta:meta])*
        $vis:vis fn $name:ident $(as $alias:ident)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            $([$generic:ident])? => $answer:tt;
    )*) => {
        $($vis use $module::$name $(as $alias)?;)*
        const _: () = {
            #[allow(unused_imports)]
            use $crate::backend::gpu_entry_points::signature_types::*;
            $(gpu_reexports!(@check $module $name [$($generic)?] ($($arg: $ty),*) -> $ret);)*
        };
    };
    (@checks $module:ident $(
        $(#[$meta:meta])*
        $vis:vis fn $name:ident ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            $([$generic:ident])? => $answer:tt;
    )*) => {
        $(gpu_reexports!(@check $module $name [$($generic)?] ($($arg: $ty),*) -> $ret);)*
    };
    (@check $module:ident $name:ident [] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        const _: fn($($ty),*) -> $ret = $module::$name;
    };
    (@check $module:ident $name:ident [generic] ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        #[allow(dead_code, clippy::too_many_arguments)]
        fn $name($($arg: $ty),*) -> $ret {
            $module::$name($($arg),*)
        }
    };
}

/// The callback of `gpu_entry_points!` without the `gpu` feature: each
/// row becomes a function of its signature and doc comment that gives its
/// answer (`unavailable`: `Err` with `UNAVAILABLE`), where the table is
/// applied (`no_gpu.rs` for the part `gpu`, its module for the others).
#[cfg(not(feature = "gpu"))]
macro_rules! no_gpu_stubs {
    ($(use $module:ident { $($rows:tt)* })*) => {
        #[allow(unused_imports)]
        use $crate::backend::gpu_entry_points::signature_types::*;
        $(no_gpu_stubs!(@rows $($rows)*);)*
    };
    (mod $module:ident { $($rows:tt)* }) => {
        #[allow(unused_imports)]
        use $crate::backend::gpu_entry_points::signature_types::*;
        no_gpu_stubs!(@rows $($rows)*);
    };
    (@rows $(
        $(#[$meta:meta])*
        $vis:vis fn $name:ident $(as $alias:ident)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty
            $([$generic:ident])? => $answer:tt;
    )*) => {
        $(no_gpu_stubs!(@stub [$name $(as $alias)?] [$(#[$meta])*] [$vis] ($($arg: $ty),*) -> $ret
            => $answer);)*
    };
    (@stub [$name:ident as $alias:ident] $($rest:tt)*) => {
        no_gpu_stubs!(@stub [$alias] $($rest)*);
    };
    (@stub [$name:ident] [$(#[$meta:meta])*] [$vis:vis] ($($arg:ident: $ty:ty),*) -> $ret:ty
        => $answer:tt) => {
        $(#[$meta])*
        #[allow(unused_variables)]
        $vis fn $name($($arg: $ty),*) -> $ret {
            no_gpu_stubs!(@answer $answer)
        }
    };
    (@answer unavailable) => {
        Err($crate::backend::gpu::unavailable())
    };
    (@answer { $($answer:tt)* }) => {
        $($answer)*
    };
    (@answer $answer:tt) => {
        $answer
    };
}
