//! The GPU backend: WGSL kernels through wgpu (Vulkan, Metal or DX12).
//!
//! One process-wide `GpuContext` holds the device, a pipeline cache keyed
//! by kernel and dtypes, and a buffer pool with size classes (freed buffers
//! are reused and counted in [`crate::memory::cache`]). Kernels record their
//! dispatches into a command encoder that is submitted in chunks while an
//! eval records (so the GPU runs the first kernels while the host records
//! the rest: see `submission`) and by `submit` at the end of each `eval`;
//! consecutive dispatches share a compute pass, and their parameter words
//! go to the GPU once per chunk (`meta_arena`), to keep the host's cost per
//! dispatch small;
//! the only CPU-GPU round trip is a transfer to the CPU (and, while
//! profiling with GPU times, the end of every eval: see `timestamps`).
//! Threads (ranks in one process, a trainer's helpers) share that encoder,
//! so one thread's eval may submit another's kernels; the encoder is
//! submitted before its lock is released, so the queue runs work in the
//! order it was recorded whichever thread submits it.
//!
//! Storage layout on the GPU matches the CPU's byte for byte (so transfers
//! are plain copies): 32-bit types natively; `f16` natively too where the
//! adapter has the `shader-f16` feature (read and written as WGSL `f16`,
//! computed in `f32`); elsewhere `f16`, and always `bf16` (WGSL has no such
//! type), two to a `u32`, and `bool` four to a `u32`, read with shifts,
//! computed in 32 bits, and written with atomic ORs into a cleared output.
//! `i64` has no WGSL type and is refused with an error naming it.
//!
//! Half-precision values are computed in `f32` (products accumulated in
//! `f32`, as PyTorch's and MLX's GPU kernels do): WGSL has no `f16` multiply
//! with an `f32` accumulator, and `f16` products of gradient-sized values
//! underflow. For the correctly rounded operations (`+ - * /`, `sqrt`)
//! computing in `f32` and rounding once gives the `f16` result exactly.

mod attention;
mod buffers;
mod codegen;
mod creation;
pub mod custom;
mod device;
mod dispatch;
pub(crate) mod elementwise;
mod fragment;
pub(crate) mod fusion;
mod host;
mod indexing;
mod loss;
mod matmul;
mod meta_arena;
mod norm;
mod pipeline;
mod pool;
pub(crate) mod readback;
mod reduce;
mod rope;
mod scan;
mod stats;
mod submission;
mod timestamps;
mod transfers;

// The entry points the rest of the crate calls, from the table that the
// no-GPU build's stubs come from too (each checked against its row's
// signature; see `backend/gpu_entry_points.rs`).
gpu_entry_points!(gpu_reexports);

// Only this build has these: the wgpu backend's test hooks, for the GPU
// conformance tests (`tests/gpu_conformance`).
#[doc(hidden)]
pub use attention::{
    fragment_runs as attention_fragment_runs, kernel_sources as attention_kernel_sources,
    last_scalar_tiles as attention_last_scalar_tiles,
    quad_staged_runs as attention_quad_staged_runs,
    scalar_quad_staged_runs as attention_scalar_quad_staged_runs,
};
pub use device::workgroup_memory_limit;
pub use elementwise::row_view_reads;
#[doc(hidden)]
pub use matmul::kernel_sources as matmul_kernel_sources;
pub use matmul::{last_coop_buffers, last_coop_staged, last_coop_subgroups, last_product_tile};
pub use rope::rope_quad_count;
pub use stats::{pipeline_count, unchecked_pipeline_count};

pub use buffers::DeviceBuffer;
pub use device::GpuContext;
pub use transfers::{Transfers, transfers};
