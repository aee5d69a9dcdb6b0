//! Kernels written by other crates: the hook a [`crate::Primitive`] defined
//! outside mlx-array uses in its `eval_gpu` (the fused Adam(W) of
//! `mlx-optim`, for one).
//!
//! A custom kernel is WGSL with the backend's conventions: entry point
//! `main`, `@workgroup_size(256)` (or any size: the dispatch counts
//! workgroups), `params: array<u32>` (the caller's `meta`, read-only storage)
//! at binding 0, the inputs at 1.. (read-only storage, in the order given),
//! and the output, the one `read_write` buffer, last. Buffers are bound
//! whole: a view's offset (in elements, [`ArrayData::offset`]) goes in
//! `meta`. Workgroups are spread over a 2-D grid: number them
//! `wid.x + wid.y * nw.x` (for 256-wide groups, the thread
//! `gid.x + gid.y * nw.x * 256u`) and ignore numbers from `groups` on.
//! Pipelines are compiled once per `key`; the source is prefixed with the
//! backend's rounding helpers (so do not name functions `f16_bits`,
//! `bf16_bits`, `round_f16` or `round_bf16`), and where the adapter stores
//! `f16` natively with `enable f16;`. Inputs of any
//! dtype are declared with [`input`], which also defines their loads; a
//! kernel with several output buffers ([`dispatch_outputs`]) declares each
//! with [`output`], which defines its stores.

use super::codegen;
use super::device::context;
use super::dispatch::dispatch_groups;
use super::pool::alloc as alloc_array;
use crate::data::ArrayData;
use crate::{Dtype, Result};

/// A fresh, contiguous, uninitialised GPU array of `shape` and `dtype`, for
/// a custom kernel's output (several outputs may be views of one).
pub fn alloc(shape: &[usize], dtype: Dtype) -> Result<ArrayData> {
    alloc_array(shape, dtype)
}

/// WGSL declaring input `name` of dtype `d` at `binding` in the backend's
/// storage (`f16` packed two to a word where the adapter has no native
/// `f16`, `bf16` always packed), and `fn load_<name>(j: u32) -> T`
/// returning element `j` (from the buffer's start) in the type the dtype
/// computes in: `f32` for the float dtypes.
pub fn input(name: &str, binding: u32, d: Dtype) -> String {
    codegen::input(name, binding, d)
}

/// WGSL declaring output `name` of dtype `d` at `binding` in the backend's
/// storage, and `fn store_<name>(i: u32, v: T)` writing element `i` (from
/// the buffer's start) from the type the dtype computes in, rounded as a
/// cast to `d` rounds. Packed dtypes (`f16` where the adapter has no native
/// `f16`, `bf16`) are stored with atomic ORs: such an output must be the
/// last, cleared by the dispatch ([`dispatch_outputs`]'s `clear_last`).
pub fn output(name: &str, binding: u32, d: Dtype) -> String {
    codegen::output_named(name, binding, d)
}

/// The storage buffers one kernel may bind on this device, its `meta`
/// words included (at least 8, WebGPU's floor; 32 on lavapipe): how many
/// arrays a kernel that binds many per dispatch ([`dispatch_outputs`]) may
/// take at once.
pub fn storage_buffer_limit() -> Result<usize> {
    let limits = &context()?.limits;
    Ok(limits
        .max_storage_buffers_per_shader_stage
        .min(limits.max_bindings_per_bind_group) as usize)
}

/// True when elements of `d` share 32-bit words in GPU storage on this
/// adapter (see [`output`]).
pub fn packed(d: Dtype) -> bool {
    codegen::packed(d)
}

/// The pipeline of custom kernel `key`, its source after the backend's
/// helpers (the roundings [`output`]'s stores use).
fn compile(
    key: &str,
    source: impl FnOnce() -> String,
) -> Result<std::sync::Arc<wgpu::ComputePipeline>> {
    context()?.pipeline(&format!("custom:{key}"), || {
        format!("{}{}", codegen::PRELUDE, source())
    })
}

/// Records one dispatch of the WGSL kernel `source()` (compiled the first
/// time `key` is seen; `key` must name the source exactly, so include
/// everything that changes it) over `groups` workgroups, binding `meta` at
/// 0, `inputs` at 1.., and `output` last (see the module's conventions).
/// The work runs with the eval's other kernels, in recording order.
///
/// Fails when an input or the output lives on the CPU, when the kernel does
/// not compile (the error names `key`), or when the device failed.
pub fn dispatch(
    key: &str,
    source: impl FnOnce() -> String,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    groups: usize,
) -> Result<()> {
    dispatch_outputs(key, source, meta, inputs, &[output], None, groups)
}

/// [`dispatch`] with several output buffers, bound `read_write` after the
/// inputs in the order given; `clear_last` sets the last output's first
/// that many bytes to zero just before the kernel runs (a packed output's
/// atomic stores need it, and so does a kernel that only writes a flag
/// there when it has something to say).
pub fn dispatch_outputs(
    key: &str,
    source: impl FnOnce() -> String,
    meta: &[u32],
    inputs: &[&ArrayData],
    outputs: &[&ArrayData],
    clear_last: Option<usize>,
    groups: usize,
) -> Result<()> {
    let Some((last, first)) = outputs.split_last() else {
        return Err(crate::Error::gpu(format!(
            "custom kernel {key}: a dispatch needs an output"
        )));
    };
    let pipeline = compile(key, source)?;
    let bound: Vec<&ArrayData> = inputs.iter().chain(first).copied().collect();
    dispatch_groups(
        &pipeline,
        meta,
        &bound,
        last,
        clear_last.unwrap_or(0),
        clear_last.is_some(),
        groups,
    )
}
