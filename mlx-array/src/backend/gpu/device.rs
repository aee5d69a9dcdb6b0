//! The adapter, the device and the context every kernel shares: made on
//! first use ([`context`]), with the features the backend asks for (native
//! `f16`, cooperative matrices, timestamps while profiling) and the first
//! asynchronous failure the device reports kept for the next call.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use super::buffers::BufferPool;
use super::{submission, timestamps};
use crate::memory::accounting;
use crate::{Error, Result};

/// The device, its queue, and the caches every kernel shares.
pub struct GpuContext {
    pub(super) device: wgpu::Device,
    pub(super) queue: wgpu::Queue,
    pub(super) info: wgpu::AdapterInfo,
    pub(super) limits: wgpu::Limits,
    /// `f16` arrays are stored as WGSL `f16` (the `shader-f16` feature).
    pub(super) f16: bool,
    /// The device has cooperative matrices with a 16 x 16 x 16 f16 x f16 ->
    /// f32 configuration and subgroups of 32 ([`matmul`]'s tensor-core path).
    pub(super) coopmat: bool,
    pub(super) pipelines: Mutex<HashMap<String, Arc<wgpu::ComputePipeline>>>,
    /// Each pipeline's bind group layout, asked of wgpu once.
    pub(super) layouts: Mutex<HashMap<wgpu::ComputePipeline, wgpu::BindGroupLayout>>,
    /// Free storage buffers, for reuse.
    pub(super) pool: BufferPool,
    pub(super) encoder: Mutex<submission::Recording>,
    /// GPU times for the profile: present when profiling was on as the
    /// device was made and the adapter has `TIMESTAMP_QUERY`. Locked after
    /// `encoder`, whose passes it lists.
    pub(super) timestamps: Option<Mutex<timestamps::Timestamps>>,
    /// Timestamps of chunks submitted in mid-eval, read back at the eval's
    /// end (so profiling still waits once per eval). Locked after `encoder`.
    pub(super) readbacks: Mutex<Vec<timestamps::Readback>>,
    /// The queue's newest submission (what a copy recorded before it waits for).
    pub(super) last_submission: Mutex<Option<wgpu::SubmissionIndex>>,
    /// The first asynchronous failure (validation, device lost) not yet reported.
    pub(super) failure: Arc<Mutex<Option<String>>>,
}

pub(super) static CONTEXT: OnceLock<std::result::Result<GpuContext, String>> = OnceLock::new();

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

/// Returns every pooled GPU buffer to the driver.
fn clear_pool() {
    if let Some(Ok(c)) = CONTEXT.get() {
        c.pool.clear();
    }
}

/// True when `f16` arrays live on the GPU as WGSL `f16`: the adapter has
/// the `shader-f16` feature and the tuning's
/// [`f16`](crate::settings::GpuTuning::f16) is on. Otherwise they
/// are packed two to a 32-bit word. False before the GPU is first used.
pub fn native_f16() -> bool {
    matches!(CONTEXT.get(), Some(Ok(c)) if c.f16)
}

/// The adapter's name and backend, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) (Vulkan)`.
pub fn adapter_name() -> Result<String> {
    let c = context()?;
    Ok(format!("{} ({:?})", c.info.name, c.info.backend))
}

/// Whether `adapter` can run the tensor-core kernel: it offers
/// `EXPERIMENTAL_COOPERATIVE_MATRIX` and `SHADER_F16`, a 16 x 16 x 16
/// configuration with f16 operands and an f32 accumulator, and subgroups
/// of exactly 32 invocations (the kernel's subgroups are 32 consecutive
/// invocations of a workgroup).
fn coopmat_usable(adapter: &wgpu::Adapter) -> bool {
    use wgpu::wgt::CooperativeScalarType as S;
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    let info = adapter.get_info();
    adapter.features().contains(needed)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == S::F16
                && p.cr_type == S::F32
        })
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
        let f16 = adapter.features().contains(wgpu::Features::SHADER_F16)
            && crate::settings::gpu_tuning().f16;
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
        let coopmat = f16 && coopmat_usable(&adapter);
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
            pool: BufferPool::new(),
            encoder: Mutex::new(submission::Recording::new()),
            timestamps,
            readbacks: Mutex::new(Vec::new()),
            last_submission: Mutex::new(None),
            failure,
        })
    }

    /// Fails with the first asynchronous error the device reported, if any.
    pub(super) fn check(&self) -> Result<()> {
        match lock(&self.failure).take() {
            Some(e) => Err(Error::gpu(e)),
            None => Ok(()),
        }
    }
}

/// Locks `m`, taking the value of a lock a panicking thread poisoned.
pub(super) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The device's workgroup memory per workgroup, in bytes (what decides
/// which tilings the kernels take).
pub fn workgroup_memory_limit() -> Result<usize> {
    Ok(context()?.limits.max_compute_workgroup_storage_size as usize)
}
