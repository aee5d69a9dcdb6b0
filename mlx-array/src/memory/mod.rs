//! Buffer allocation with MLX-style accounting and a reuse cache.
//!
//! Every array buffer comes from here. [`active`] counts the bytes of live
//! buffers, [`peak`] the most that were ever live at once, and [`cache`] the
//! bytes of freed buffers kept for reuse (released by [`clear_cache`]).
//!
//! ```
//! use mlx_array::{memory, Array};
//! let before = memory::active();
//! let x = mlx_array::arange(0.0, 1024.0, 1.0, mlx_array::Dtype::F32).unwrap();
//! x.eval().unwrap();
//! assert!(memory::active() >= before + 4096);
//! ```
//!
//! The counters and the host allocator live in `accounting`, which the
//! backends import and which imports no backend; a device backend registers
//! there how to release its pooled buffers, which [`clear_cache`] runs, so
//! this module names no backend either. [`Storage`] holds
//! either a host buffer or a device backend's buffer, which it sees only as a
//! [`DeviceAllocation`], so memory names no backend type.

pub(crate) mod accounting;

pub use accounting::{HostBuffer, active, cache, peak, register_device_cache_clearer, reset_peak};

use std::any::Any;

/// Returns every cached buffer to the system allocator (and every pooled
/// GPU buffer to the driver).
pub fn clear_cache() {
    accounting::clear_device_caches();
    accounting::clear_host_cache();
}

/// Caps the bytes kept in the cache (freed buffers beyond it go back to the
/// system) and returns the previous limit. Lowering it trims the cache now.
pub fn set_cache_limit(bytes: usize) -> usize {
    let old = accounting::swap_cache_limit(bytes);
    if cache() > bytes {
        clear_cache();
    }
    old
}

/// One contiguous allocation shared by the arrays that view it.
#[derive(Debug)]
pub enum Storage {
    /// 64-byte aligned host memory.
    Host(HostBuffer),
    /// A buffer on the GPU (none exists without the `gpu` feature); the GPU
    /// backend counts it in [`active`] and pools it itself.
    Device(Box<dyn DeviceAllocation>),
}

/// A buffer a device backend allocated: memory holds it for the arrays that
/// view it, and the backend reads it back through [`Storage::device_buffer`].
pub trait DeviceAllocation: Send + Sync + std::fmt::Debug + 'static {
    /// Bytes reserved.
    fn capacity(&self) -> usize;
    /// The backend's own type, for it to downcast.
    fn as_any(&self) -> &dyn Any;
}

impl Storage {
    /// Allocates at least `bytes` bytes of host memory (uninitialised),
    /// reusing a cached buffer of the same size class when there is one.
    pub fn new(bytes: usize) -> Storage {
        Storage::Host(HostBuffer::new(bytes))
    }

    /// Allocates host memory and fills it with zero bytes.
    pub fn zeroed(bytes: usize) -> Storage {
        Storage::Host(HostBuffer::zeroed(bytes))
    }

    /// True when the bytes live on the GPU (kernels on the host cannot read them).
    pub fn is_device(&self) -> bool {
        matches!(self, Storage::Device(_))
    }

    /// The device buffer, when this storage lives on a device and its
    /// backend's type is `T`.
    pub fn device_buffer<T: 'static>(&self) -> Option<&T> {
        match self {
            Storage::Device(b) => b.as_any().downcast_ref::<T>(),
            Storage::Host(_) => None,
        }
    }

    /// Bytes reserved (the size class, at least what was asked for).
    pub fn capacity(&self) -> usize {
        match self {
            Storage::Host(b) => b.capacity(),
            Storage::Device(b) => b.capacity(),
        }
    }

    /// Base pointer of the host allocation.
    ///
    /// # Panics
    /// On GPU storage: host kernels only ever see host data (the graph moves
    /// arrays between devices with explicit transfer nodes).
    pub fn as_ptr(&self) -> *mut u8 {
        match self {
            Storage::Host(b) => b.as_ptr(),
            Storage::Device(_) => panic!(
                "host code read an array that lives on the GPU; move it with `to_device(Device::Cpu)` first"
            ),
        }
    }
}
