//! The buffer pool the GPU context holds: storage buffers in power-of-two
//! size classes ([`BufferPool`]), each returned to its pool when dropped
//! ([`DeviceBuffer`]) and counted in [`crate::memory::cache`]. It takes
//! the device and its limits from its caller; the arrays made of its
//! buffers are `pool`'s.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use crate::memory::accounting;
use crate::{Error, Result};

/// Free storage buffers by size class, for reuse.
pub(crate) struct BufferPool {
    free: Mutex<HashMap<u64, Vec<wgpu::Buffer>>>,
}

impl BufferPool {
    /// An empty pool.
    pub(super) fn new() -> BufferPool {
        BufferPool {
            free: Mutex::new(HashMap::new()),
        }
    }

    /// The free buffers, taking the value of a lock a panicking thread
    /// poisoned.
    fn free(&self) -> MutexGuard<'_, HashMap<u64, Vec<wgpu::Buffer>>> {
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A storage buffer of at least `bytes` bytes, reused from the pool or
    /// made on `device` (whose `limits` bound it; `adapter` names it in
    /// errors).
    pub(super) fn buffer(
        &'static self,
        device: &wgpu::Device,
        limits: &wgpu::Limits,
        adapter: &str,
        bytes: usize,
    ) -> Result<DeviceBuffer> {
        let class = size_class(bytes);
        let max = limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size);
        if class > max {
            return Err(Error::gpu(format!(
                "an array of {bytes} bytes exceeds the largest storage buffer of `{adapter}` ({max} bytes)"
            )));
        }
        let reused = self.free().get_mut(&class).and_then(|v| v.pop());
        let buffer = match reused {
            Some(b) => {
                accounting::count_cached(class as usize, false);
                b
            }
            None => {
                let scope = device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
                let b = device.create_buffer(&wgpu::BufferDescriptor {
                    label: None,
                    size: class,
                    usage: wgpu::BufferUsages::STORAGE
                        | wgpu::BufferUsages::COPY_SRC
                        | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                if let Some(e) = pollster::block_on(scope.pop()) {
                    return Err(Error::gpu(format!(
                        "out of device memory allocating {bytes} bytes on `{adapter}`: {e}"
                    )));
                }
                b
            }
        };
        accounting::count_live(class as usize);
        Ok(DeviceBuffer {
            buffer: Some(buffer),
            class,
            pool: self,
        })
    }

    /// Returns every pooled buffer to the driver.
    pub(super) fn clear(&self) {
        for (class, buffers) in self.free().drain() {
            accounting::count_cached(class as usize * buffers.len(), false);
        }
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
    /// The pool it came from (the context's, which lives as long as the
    /// process).
    pool: &'static BufferPool,
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
        self.pool.free().entry(self.class).or_default().push(buffer);
        accounting::count_cached(self.class as usize, true);
    }
}
