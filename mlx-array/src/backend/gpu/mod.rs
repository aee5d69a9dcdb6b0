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
mod codegen;
mod creation;
pub mod custom;
pub(crate) mod elementwise;
mod fragment;
pub(crate) mod fusion;
mod indexing;
mod loss;
mod matmul;
mod meta_arena;
mod norm;
pub(crate) mod readback;
mod reduce;
mod rope;
mod scan;
mod submission;
mod timestamps;
mod transfers;

pub use attention::{attention, attention_grad};
#[doc(hidden)]
pub use attention::{
    fragment_runs as attention_fragment_runs, kernel_sources as attention_kernel_sources,
    last_scalar_tiles as attention_last_scalar_tiles,
    quad_staged_runs as attention_quad_staged_runs,
    scalar_quad_staged_runs as attention_scalar_quad_staged_runs,
};
pub use creation::{arange, random_bits};
pub use elementwise::{astype, binary, copy_contiguous, row_view_reads, unary, where_};
pub use indexing::{concatenate, pad, scatter_add, slice_update, take, take_along_axis};
pub use loss::{
    cross_entropy, cross_entropy_grad, linear_cross_entropy, linear_cross_entropy_grad,
    linear_cross_entropy_value_and_grad, softmax,
};
pub use matmul::adds_in_kernel as product_adds_in_kernel;
#[doc(hidden)]
pub use matmul::kernel_sources as matmul_kernel_sources;
pub use matmul::{
    coop_product_count, last_coop_buffers, last_coop_staged, last_coop_subgroups,
    last_product_tile, matmul, matmul_adding, vector_operand_count,
};
pub use norm::{rms_norm, rms_norm_grad};
pub use reduce::{arg_reduce, reduce};
pub use rope::{rope, rope_quad_count};
pub use scan::cumsum;
pub use submission::submit_count;
pub use transfers::{Transfers, transfers};

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use wgpu::util::DeviceExt;

use crate::data::{ArrayData, Operand};
use crate::memory::Storage;
use crate::memory::accounting;
use crate::shape::contiguous_strides;
use crate::{Dtype, Error, Result};

/// The device, its queue, and the caches every kernel shares.
pub struct GpuContext {
    device: wgpu::Device,
    queue: wgpu::Queue,
    info: wgpu::AdapterInfo,
    limits: wgpu::Limits,
    /// `f16` arrays are stored as WGSL `f16` (the `shader-f16` feature).
    f16: bool,
    /// The device has cooperative matrices with a 16 x 16 x 16 f16 x f16 ->
    /// f32 configuration and subgroups of 32 ([`matmul`]'s tensor-core path).
    coopmat: bool,
    pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// Each pipeline's bind group layout, asked of wgpu once
    /// ([`crate::settings::gpu_layout_cache`]).
    layouts: Mutex<HashMap<wgpu::ComputePipeline, wgpu::BindGroupLayout>>,
    pool: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
    encoder: Mutex<submission::Recording>,
    /// GPU times for the profile: present when profiling was on as the
    /// device was made and the adapter has `TIMESTAMP_QUERY`. Locked after
    /// `encoder`, whose passes it lists.
    timestamps: Option<Mutex<timestamps::Timestamps>>,
    /// Timestamps of chunks submitted in mid-eval, read back at the eval's
    /// end (so profiling still waits once per eval). Locked after `encoder`.
    readbacks: Mutex<Vec<timestamps::Readback>>,
    /// The queue's newest submission (what a copy recorded before it waits for).
    last_submission: Mutex<Option<wgpu::SubmissionIndex>>,
    /// The first asynchronous failure (validation, device lost) not yet reported.
    failure: Arc<Mutex<Option<String>>>,
}

static CONTEXT: OnceLock<std::result::Result<GpuContext, String>> = OnceLock::new();

/// The GPU context, created on first use; an error when no adapter works.
pub fn context() -> Result<&'static GpuContext> {
    CONTEXT
        .get_or_init(|| {
            accounting::register_device_cache_clearer(clear_pool);
            GpuContext::new()
        })
        .as_ref()
        .map_err(|e| Error::gpu(e.clone()))
}

/// True when `f16` arrays live on the GPU as WGSL `f16`: the adapter has
/// the `shader-f16` feature and [`crate::settings::gpu_f16`] is on. Otherwise they
/// are packed two to a 32-bit word. False before the GPU is first used.
pub fn native_f16() -> bool {
    matches!(CONTEXT.get(), Some(Ok(c)) if c.f16)
}

/// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
pub fn adapter_name() -> Result<String> {
    let c = context()?;
    Ok(format!("{} ({:?})", c.info.name, c.info.backend))
}

impl GpuContext {
    fn new() -> std::result::Result<GpuContext, String> {
        let instance =
            wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            ..Default::default()
        }))
        .map_err(|e| {
            format!(
                "no GPU adapter found ({e}); on Linux install a Vulkan driver \
                 (Mesa's `mesa-vulkan-drivers` gives the software lavapipe), or use MLX_DEVICE=cpu"
            )
        })?;
        let info = adapter.get_info();
        let limits = adapter.limits();
        let f16 =
            adapter.features().contains(wgpu::Features::SHADER_F16) && crate::settings::gpu_f16();
        // Timestamps only while profiling, so that a device made without
        // it has exactly the features it had before they existed.
        let timed = if !crate::settings::profile().unwrap_or(false) {
            Err(
                "the GPU device was made while profiling was off (set MLX_PROFILE=1, or call \
                 settings::set_profile(true), before the GPU is first used)"
                    .to_string(),
            )
        } else if !adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY) {
            Err(format!(
                "the GPU adapter `{}` has no TIMESTAMP_QUERY",
                info.name
            ))
        } else {
            Ok(())
        };
        let coopmat = f16 && matmul::coopmat_usable(&adapter);
        let mut required_features = wgpu::Features::empty();
        if f16 {
            required_features |= wgpu::Features::SHADER_F16;
        }
        if coopmat {
            required_features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        if timed.is_ok() {
            required_features |= wgpu::Features::TIMESTAMP_QUERY;
        }
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("mlx-array"),
            required_features,
            required_limits: limits.clone(),
            // SAFETY: experimental features are enabled only for cooperative
            // matrices, used by the matmul kernels generated and validated
            // in `matmul::coop`; devices without them are made as before.
            experimental_features: if coopmat {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| format!("the GPU adapter `{}` refused a device: {e}", info.name))?;
        let failure = Arc::new(Mutex::new(None::<String>));
        let f = failure.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut slot = f.lock().unwrap_or_else(|p| p.into_inner());
            slot.get_or_insert_with(|| e.to_string());
        }));
        let f = failure.clone();
        device.set_device_lost_callback(move |reason, message| {
            let mut slot = f.lock().unwrap_or_else(|p| p.into_inner());
            *slot = Some(format!("the GPU device was lost ({reason:?}): {message}"));
        });
        let timestamps = match timed {
            Ok(()) => Some(Mutex::new(timestamps::Timestamps::new(
                queue.get_timestamp_period(),
            ))),
            Err(why) => {
                crate::timing::set_gpu_untimed(why);
                None
            }
        };
        Ok(GpuContext {
            device,
            queue,
            info,
            limits,
            f16,
            coopmat,
            pipelines: Mutex::new(HashMap::new()),
            layouts: Mutex::new(HashMap::new()),
            pool: Mutex::new(HashMap::new()),
            encoder: Mutex::new(submission::Recording::new()),
            timestamps,
            readbacks: Mutex::new(Vec::new()),
            last_submission: Mutex::new(None),
            failure,
        })
    }

    /// Fails with the first asynchronous error the device reported, if any.
    fn check(&self) -> Result<()> {
        match lock(&self.failure).take() {
            Some(e) => Err(Error::gpu(e)),
            None => Ok(()),
        }
    }

    /// The compiled pipeline for `key`, compiling `source()` the first time,
    /// with wgpu's runtime checks unless [`crate::settings::gpu_checks`]
    /// is `None` (each variant kept under its own key).
    pub(crate) fn pipeline(
        &self,
        key: &str,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        self.compile(key, false, source)
    }

    /// [`GpuContext::pipeline`] for a matrix product on `fragments`: on
    /// cooperative matrices (tensor cores) it is compiled without wgpu's
    /// runtime checks unless [`crate::settings::gpu_checks`] is `All`.
    /// Only the products take this path: every workgroup index of their
    /// template is a constant of its tiling plus the invocation's index
    /// (staged slices, fragments, the staging fragment), whatever the
    /// product's sizes, and their global accesses are guarded by the sizes
    /// in their meta words. (The attention kernels' were not audited, nor
    /// their gain measured: they keep the checks.)
    pub(crate) fn product_pipeline(
        &self,
        key: &str,
        fragments: fragment::Fragments,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        self.compile(key, fragments == fragment::Fragments::Cooperative, source)
    }

    fn compile(
        &self,
        key: &str,
        tensor_cores: bool,
        source: impl FnOnce() -> String,
    ) -> Result<Arc<wgpu::ComputePipeline>> {
        let checked = crate::settings::gpu_checks().checks(tensor_cores);
        let unchecked_key;
        let key = if !checked {
            unchecked_key = format!("{key}:unchecked");
            unchecked_key.as_str()
        } else {
            key
        };
        if let Some(p) = lock(&self.pipelines).get(key) {
            return Ok(p.clone());
        }
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let mut text = source();
        if self.f16 {
            text.insert_str(0, "enable f16;\n");
        }
        let desc = wgpu::ShaderModuleDescriptor {
            label: Some(key),
            source: wgpu::ShaderSource::Wgsl(text.into()),
        };
        let module = if checked {
            self.device.create_shader_module(desc)
        } else {
            UNCHECKED_PIPELINES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            // SAFETY: every kernel is generated by this backend, not taken
            // from users, and is written to bound its own indices:
            // workgroup arrays indexed within tiles whose sizes are
            // constants of the text, storage reads and writes guarded by
            // the sizes in its meta words, every loop a finite count
            // derived from those sizes. Storage accesses stay checked by
            // the driver where the device offers robust buffer access.
            // By default only the tensor-core matrix products take this
            // path (`settings::GpuChecks`, `Context::product_pipeline`):
            // they ran 1.42x faster without the checks on an H200, and the
            // conformance specs run their tiling, staging and edges on the
            // plain fragments, checked.
            unsafe {
                self.device
                    .create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked())
            }
        };
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(Error::gpu(format!("kernel `{key}` failed to compile: {e}")));
        }
        let p = Arc::new(pipeline);
        lock(&self.pipelines).insert(key.to_string(), p.clone());
        Ok(p)
    }

    /// A pooled storage buffer of at least `bytes` bytes.
    fn buffer(&self, bytes: usize) -> Result<DeviceBuffer> {
        let class = size_class(bytes);
        let max = self
            .limits
            .max_storage_buffer_binding_size
            .min(self.limits.max_buffer_size);
        if class > max {
            return Err(Error::gpu(format!(
                "an array of {bytes} bytes exceeds the largest storage buffer of `{}` ({max} bytes)",
                self.info.name
            )));
        }
        let reused = lock(&self.pool).get_mut(&class).and_then(|v| v.pop());
        let buffer = match reused {
            Some(b) => {
                accounting::count_cached(class as usize, false);
                b
            }
            None => {
                let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: class,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if let Some(e) = pollster::block_on(scope.pop()) {
                    return Err(Error::gpu(format!(
                        "out of device memory allocating {bytes} bytes on `{}`: {e}",
                        self.info.name
                    )));
                }
                b
            }
        };
        accounting::count_live(class as usize);
        Ok(DeviceBuffer {
            buffer: Some(buffer),
            class,
        })
    }

    /// Runs `record` on the eval's command encoder (created on first use),
    /// submitting it when its chunk is full.
    pub(crate) fn record(&self, record: impl FnOnce(&mut wgpu::CommandEncoder)) -> Result<()> {
        self.check()?;
        let mut slot = lock(&self.encoder);
        record(slot.encoder(&self.device));
        if slot.count() {
            self.submit_chunk(&mut slot);
        }
        Ok(())
    }

    /// Submits the encoder of `slot` (whose lock the caller holds), if any,
    /// after queueing its dispatches' meta words, resolving its passes'
    /// timestamps into a readback that the end of the eval
    /// ([`GpuContext::flush`]) finishes.
    fn submit_chunk(&self, slot: &mut submission::Recording) {
        if let Some(mut enc) = slot.take_encoder() {
            let readback = self
                .timestamps
                .as_ref()
                .and_then(|t| lock(t).resolve(&self.device, &mut enc));
            slot.meta.upload(&self.queue);
            let index = self.queue.submit([enc.finish()]);
            *lock(&self.last_submission) = Some(index);
            lock(&self.readbacks).extend(readback);
            slot.submitted();
        }
    }

    /// The bind group layout of `pipeline`'s group 0: kept per pipeline
    /// ([`crate::settings::gpu_layout_cache`]), or asked of wgpu each time.
    fn layout(&self, pipeline: &wgpu::ComputePipeline) -> wgpu::BindGroupLayout {
        if !crate::settings::gpu_layout_cache() {
            return pipeline.get_bind_group_layout(0);
        }
        lock(&self.layouts)
            .entry(pipeline.clone())
            .or_insert_with(|| pipeline.get_bind_group_layout(0))
            .clone()
    }

    /// Records one dispatch of `pipeline` over a `grid` of workgroups on the
    /// eval's command encoder, binding `meta` at 0 and `buffers` at 1..;
    /// `clear` first zeroes that many bytes of the last buffer (outside any
    /// pass). Consecutive dispatches share a compute pass
    /// ([`crate::settings::gpu_shared_passes`]; wgpu puts a barrier between
    /// dispatches that depend on each other, as between passes), except
    /// while profiling with timestamps: then the pass is the dispatch's own,
    /// and writes the GPU's clock as it begins and ends for the primitive
    /// the calling thread is evaluating.
    fn record_dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        meta: &[u32],
        buffers: &[&wgpu::Buffer],
        clear: Option<u64>,
        grid: (u32, u32),
    ) -> Result<()> {
        self.check()?;
        let layout = self.layout(pipeline);
        let mut slot = lock(&self.encoder);
        let slot = &mut *slot;
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(4);
        let staged = if crate::settings::gpu_meta_arena() {
            slot.meta.push(&self.device, align, meta)
        } else {
            None
        };
        // Without the arena, or for words larger than its page: a buffer
        // of their own.
        let own;
        let meta_binding = match staged {
            Some(slice) => wgpu::BindingResource::Buffer(slice),
            None => {
                own = self
                    .device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("meta"),
                        contents: bytemuck::cast_slice(meta),
                        usage: wgpu::BufferUsages::STORAGE,
                    });
                own.as_entire_binding()
            }
        };
        let entries: Vec<wgpu::BindGroupEntry> = std::iter::once(meta_binding)
            .chain(buffers.iter().map(|b| b.as_entire_binding()))
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource,
            })
            .collect();
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        if let (Some(bytes), Some(out)) = (clear, buffers.last()) {
            slot.encoder(&self.device).clear_buffer(out, 0, Some(bytes));
        }
        // Untagged work (recorded outside the evaluator, or with the profile
        // off) is not timed: there is no primitive to put it down to.
        let writes = self.timestamps.as_ref().and_then(|t| {
            let tag = crate::timing::current()?;
            Some(lock(t).next(&self.device, tag))
        });
        let run = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, 1);
        };
        if writes.is_none() && crate::settings::gpu_shared_passes() {
            run(slot.shared_pass(&self.device));
        } else {
            let mut pass =
                slot.encoder(&self.device)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: writes.as_ref().map(|(set, i)| {
                            wgpu::ComputePassTimestampWrites {
                                query_set: set,
                                beginning_of_pass_write_index: Some(*i),
                                end_of_pass_write_index: Some(i + 1),
                            }
                        }),
                    });
            run(&mut pass);
        }
        if slot.count() {
            self.submit_chunk(slot);
        }
        Ok(())
    }

    /// Submits the recorded work (the eval's last chunk); waits for it only
    /// when its passes were timed (to read the timestamps of this and the
    /// eval's earlier chunks back for the profile).
    fn flush(&self) -> Result<()> {
        let mut slot = lock(&self.encoder);
        // Resolved and submitted under the encoder's lock, so the passes
        // listed are exactly this encoder's, and work that any thread
        // records after it (and which may read its outputs, or reuse
        // buffers it freed) reaches the queue after it.
        self.submit_chunk(&mut slot);
        slot.restart();
        let readbacks = std::mem::take(&mut *lock(&self.readbacks));
        drop(slot);
        timestamps::finish(self, readbacks)?;
        self.check()
    }

    /// Maps every one of `buffers` (`MAP_READ` copy destinations of
    /// submitted work) for reading, waiting for the GPU once.
    fn map_read_all(&self, buffers: &[&wgpu::Buffer]) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(buffers.len());
        for buffer in buffers {
            let tx = tx.clone();
            buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        }
        let t0 = std::time::Instant::now();
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: Some(Duration::from_secs(120)),
            })
            .map_err(|e| Error::gpu(format!("waiting for the GPU failed: {e}")))?;
        transfers::waited(t0.elapsed());
        self.check()?;
        for _ in buffers {
            rx.recv()
                .map_err(|_| Error::gpu("the GPU never finished mapping a buffer"))?
                .map_err(|e| Error::gpu(format!("reading a GPU buffer failed: {e}")))?;
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Buffers come in power-of-two size classes from 256 bytes.
fn size_class(bytes: usize) -> u64 {
    (bytes.max(1).next_power_of_two() as u64).max(256)
}

/// A pooled GPU buffer; dropping it returns it to the pool.
pub struct DeviceBuffer {
    buffer: Option<wgpu::Buffer>,
    class: u64,
}

impl std::fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DeviceBuffer({} bytes)", self.class)
    }
}

impl DeviceBuffer {
    /// Bytes reserved.
    pub fn capacity(&self) -> usize {
        self.class as usize
    }

    /// The wgpu buffer.
    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        self.buffer.as_ref().expect("present until dropped")
    }
}

impl crate::memory::DeviceAllocation for DeviceBuffer {
    fn capacity(&self) -> usize {
        DeviceBuffer::capacity(self)
    }
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let Some(buffer) = self.buffer.take() else {
            return;
        };
        accounting::count_dead(self.class as usize);
        if accounting::cache() + self.class as usize > accounting::cache_limit() {
            return; // wgpu frees it once no submitted work uses it
        }
        if let Some(Ok(c)) = CONTEXT.get() {
            lock(&c.pool).entry(self.class).or_default().push(buffer);
            accounting::count_cached(self.class as usize, true);
        }
    }
}

/// Returns every pooled GPU buffer to the driver.
fn clear_pool() {
    if let Some(Ok(c)) = CONTEXT.get() {
        for (class, buffers) in lock(&c.pool).drain() {
            accounting::count_cached(class as usize * buffers.len(), false);
        }
    }
}

/// Submits the work recorded since the last submit (the end of each `eval`).
pub fn submit() -> Result<()> {
    match CONTEXT.get() {
        Some(Ok(c)) => c.flush(),
        _ => Ok(()),
    }
}

/// A fresh, contiguous GPU array of `shape` and `dtype`.
pub(crate) fn alloc(shape: &[usize], dtype: Dtype) -> Result<ArrayData> {
    supported(dtype)?;
    let bytes = crate::shape::size_of_shape(shape) * dtype.size_of();
    let buffer = context()?.buffer(bytes)?;
    Ok(ArrayData::new(
        Arc::new(Storage::Device(Box::new(buffer))),
        contiguous_strides(shape),
        0,
    ))
}

/// `x`'s data itself when it is dense for its shape from its offset (as
/// kernels that index `offset + i` need), else a dense copy.
pub(crate) fn dense(x: &Operand<'_>) -> Result<ArrayData> {
    if codegen::is_dense(&x.data, x.shape) {
        Ok(x.data.clone())
    } else {
        copy_contiguous(x)
    }
}

/// Fails for dtypes the GPU backend cannot hold.
pub(crate) fn supported(dtype: Dtype) -> Result<()> {
    if dtype == Dtype::I64 {
        return Err(Error::gpu(
            "i64 has no WGSL type (it would need the `shader-int64` feature, which this backend \
             does not use); cast to i32 or build the op on the CPU",
        ));
    }
    Ok(())
}

/// The GPU buffer behind `data` (which must live on the GPU).
pub(crate) fn buffer_of(data: &ArrayData) -> Result<&wgpu::Buffer> {
    data.storage()
        .device_buffer::<DeviceBuffer>()
        .map(DeviceBuffer::raw)
        .ok_or_else(|| Error::gpu("a GPU kernel was given an array that lives on the CPU"))
}

/// Copies host `data` (contiguous from its offset: the caller makes a
/// strided view dense on the host first) into a new contiguous GPU array.
pub(crate) fn upload(host: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, host) = (host.shape, host.dtype, &host.data);
    supported(dtype)?;
    if !host.is_contiguous(shape) {
        return Err(Error::gpu(
            "upload needs a contiguous host view; copy it with the CPU backend first",
        ));
    }
    let c = context()?;
    let n = crate::shape::size_of_shape(shape) * dtype.size_of();
    let out = alloc(shape, dtype)?;
    if n > 0 {
        let mut bytes = host
            .as_bytes(dtype, crate::shape::size_of_shape(shape))
            .to_vec();
        bytes.resize(n.next_multiple_of(4), 0);
        // Staged through the encoder (not queue.write_buffer) so the copy is
        // ordered after recorded work that still reads a reused buffer.
        let staging = c
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("upload"),
                contents: &bytes,
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let dst = buffer_of(&out)?;
        c.record(|enc| enc.copy_buffer_to_buffer(&staging, 0, dst, 0, bytes.len() as u64))?;
    }
    transfers::uploaded(n);
    Ok(out)
}

/// Copies GPU data `x` (any view) into a new contiguous host array,
/// waiting for the GPU (see [`readback`] for the copy that waits later).
pub(crate) fn download(x: &Operand<'_>) -> Result<ArrayData> {
    readback::start(x)?.finish()
}

static DISPATCHES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// The device's workgroup memory per workgroup, in bytes (what decides
/// which tilings the kernels take).
pub fn workgroup_memory_limit() -> Result<usize> {
    Ok(context()?.limits.max_compute_workgroup_storage_size as usize)
}

/// Kernels compiled, each variant once, since the process started (for
/// tests that check which variants were built).
pub fn pipeline_count() -> Result<usize> {
    Ok(lock(&context()?.pipelines).len())
}

/// Kernels compiled without wgpu's runtime checks since the process
/// started (see [`crate::settings::GpuChecks`]).
pub fn unchecked_pipeline_count() -> usize {
    UNCHECKED_PIPELINES.load(std::sync::atomic::Ordering::Relaxed)
}

static UNCHECKED_PIPELINES: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Kernel dispatches recorded since the process started (for profiling and
/// for tests that check fusion).
pub fn dispatch_count() -> usize {
    DISPATCHES.load(std::sync::atomic::Ordering::Relaxed)
}

/// Records one dispatch of `pipeline` over `threads` invocations (in
/// workgroups of [`codegen::WORKGROUP`]), binding `meta` at 0, the inputs
/// at 1.., and the output last. `clear_output` zeroes the output first
/// (packed outputs are written with atomic ORs).
pub(crate) fn dispatch(
    pipeline: &wgpu::ComputePipeline,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    output_bytes: usize,
    clear_output: bool,
    threads: usize,
) -> Result<()> {
    let groups = threads.div_ceil(codegen::WORKGROUP as usize);
    dispatch_groups(
        pipeline,
        meta,
        inputs,
        output,
        output_bytes,
        clear_output,
        groups,
    )
}

/// [`dispatch_groups`] of a kernel whose f32 `output` (not cleared) may
/// have a half-precision copy beside it ([`codegen::store_with_half`]):
/// `half` is that buffer, its dtype and its elements, bound after
/// `output` and cleared first where its dtype is packed into words.
pub(crate) fn dispatch_groups_with_half(
    pipeline: &wgpu::ComputePipeline,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    output_bytes: usize,
    half: Option<(&ArrayData, Dtype, usize)>,
    groups: usize,
) -> Result<()> {
    let Some((copy, dtype, len)) = half else {
        return dispatch_groups(pipeline, meta, inputs, output, output_bytes, false, groups);
    };
    let bound: Vec<&ArrayData> = inputs.iter().copied().chain([output]).collect();
    let (bytes, clear) = (len * dtype.size_of(), codegen::packed(dtype));
    dispatch_groups(pipeline, meta, &bound, copy, bytes, clear, groups)
}

/// Like [`dispatch`], but over `groups` workgroups of whatever size and
/// shape the kernel declares (one per reduced row, one per output tile).
/// They are spread over a 2-D grid: kernels number them
/// `wid.x + wid.y * nw.x` ([`codegen::GROUP_INDEX`]) and must ignore
/// numbers from `groups` on.
pub(crate) fn dispatch_groups(
    pipeline: &wgpu::ComputePipeline,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    output_bytes: usize,
    clear_output: bool,
    groups: usize,
) -> Result<()> {
    let c = context()?;
    if groups == 0 {
        return Ok(());
    }
    let mut buffers = Vec::with_capacity(inputs.len() + 1);
    for d in inputs {
        buffers.push(buffer_of(d)?);
    }
    buffers.push(buffer_of(output)?);
    let max = c.limits.max_compute_workgroups_per_dimension as usize;
    let (x, y) = if groups <= max {
        (groups, 1)
    } else {
        (max, groups.div_ceil(max))
    };
    if y > max {
        return Err(Error::gpu(format!(
            "{groups} workgroups exceed one dispatch"
        )));
    }
    DISPATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let clear = clear_output.then(|| (output_bytes.next_multiple_of(4) as u64).max(4));
    c.record_dispatch(pipeline, meta, &buffers, clear, (x as u32, y as u32))
}
