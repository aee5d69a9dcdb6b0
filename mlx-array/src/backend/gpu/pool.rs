//! The buffer pool: storage buffers in power-of-two size classes, returned
//! to the pool when dropped (and counted in [`crate::memory::cache`]), and
//! the arrays made of them.

use std::sync::Arc;

use super::device::{CONTEXT, GpuContext, context, lock};
use crate::data::ArrayData;
use crate::memory::Storage;
use crate::memory::accounting;
use crate::shape::contiguous_strides;
use crate::{Dtype, Error, Result};

impl GpuContext {
    /// A pooled storage buffer of at least `bytes` bytes.
    pub(super) fn buffer(&self, bytes: usize) -> Result<DeviceBuffer> {
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
pub(super) fn clear_pool() {
    if let Some(Ok(c)) = CONTEXT.get() {
        for (class, buffers) in lock(&c.pool).drain() {
            accounting::count_cached(class as usize * buffers.len(), false);
        }
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
