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

use std::alloc::{Layout, alloc, dealloc};
use std::collections::BTreeMap;
use std::ptr::NonNull;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

const ALIGN: usize = 64;
/// Buffers below this many bytes are rounded to 64 bytes, larger ones to 16 KiB.
const SMALL: usize = 16 * 1024;

static ACTIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static CACHED: AtomicUsize = AtomicUsize::new(0);
static CACHE_LIMIT: AtomicUsize = AtomicUsize::new(usize::MAX);
static FREE: Mutex<BTreeMap<usize, Vec<SendPtr>>> = Mutex::new(BTreeMap::new());

struct SendPtr(NonNull<u8>);
// SAFETY: the pointer is an exclusively owned heap allocation sitting in the cache.
unsafe impl Send for SendPtr {}

/// Bytes held by live array buffers.
pub fn active() -> usize {
    ACTIVE.load(Ordering::Relaxed)
}

/// The largest value [`active`] has reached since start or the last [`reset_peak`].
pub fn peak() -> usize {
    PEAK.load(Ordering::Relaxed)
}

/// Sets the peak back to the current active bytes.
pub fn reset_peak() {
    PEAK.store(active(), Ordering::Relaxed);
}

/// Bytes of freed buffers kept for reuse.
pub fn cache() -> usize {
    CACHED.load(Ordering::Relaxed)
}

/// Returns every cached buffer to the system allocator.
pub fn clear_cache() {
    #[cfg(feature = "gpu")]
    crate::backend::gpu::clear_pool();
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    for (class, ptrs) in std::mem::take(&mut *free) {
        for p in ptrs {
            // SAFETY: each cached pointer was allocated with this class's layout.
            unsafe { dealloc(p.0.as_ptr(), layout(class)) };
            CACHED.fetch_sub(class, Ordering::Relaxed);
        }
    }
}

/// Caps the bytes kept in the cache (freed buffers beyond it go back to the
/// system) and returns the previous limit. Lowering it trims the cache now.
pub fn set_cache_limit(bytes: usize) -> usize {
    let old = CACHE_LIMIT.swap(bytes, Ordering::Relaxed);
    if cache() > bytes {
        clear_cache();
    }
    old
}

fn size_class(bytes: usize) -> usize {
    if bytes <= SMALL {
        bytes.next_multiple_of(ALIGN)
    } else {
        bytes.next_multiple_of(SMALL)
    }
}

fn layout(class: usize) -> Layout {
    Layout::from_size_align(class, ALIGN).expect("size classes are valid layouts")
}

/// One contiguous allocation shared by the arrays that view it: 64-byte
/// aligned host memory, or (with the `gpu` feature) a buffer on the GPU.
pub struct Storage {
    ptr: NonNull<u8>,
    class: usize,
    #[cfg(feature = "gpu")]
    gpu: Option<crate::backend::gpu::DeviceBuffer>,
}

/// Counts `bytes` newly live (a pool miss or a reuse) toward [`active`] and [`peak`].
pub(crate) fn count_live(bytes: usize) {
    let now = ACTIVE.fetch_add(bytes, Ordering::Relaxed) + bytes;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

/// Counts `bytes` no longer live.
pub(crate) fn count_dead(bytes: usize) {
    ACTIVE.fetch_sub(bytes, Ordering::Relaxed);
}

/// Adjusts the bytes held in a reuse cache (host or device).
pub(crate) fn count_cached(bytes: usize, added: bool) {
    if added {
        CACHED.fetch_add(bytes, Ordering::Relaxed);
    } else {
        CACHED.fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// The cache limit set by [`set_cache_limit`].
pub(crate) fn cache_limit() -> usize {
    CACHE_LIMIT.load(Ordering::Relaxed)
}

// SAFETY: Storage owns its allocation; writes happen only while a kernel holds the
// only reference (right after allocation), reads are shared.
unsafe impl Send for Storage {}
unsafe impl Sync for Storage {}

impl Storage {
    /// Allocates at least `bytes` bytes (uninitialised), reusing a cached buffer
    /// of the same size class when there is one.
    pub fn new(bytes: usize) -> Storage {
        if bytes == 0 {
            return Storage {
                // A well-aligned, non-null address that is never dereferenced.
                ptr: NonNull::new(ALIGN as *mut u8).expect("non-null"),
                class: 0,
                #[cfg(feature = "gpu")]
                gpu: None,
            };
        }
        let class = size_class(bytes);
        let reused = {
            let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
            free.get_mut(&class).and_then(|v| v.pop())
        };
        let ptr = match reused {
            Some(p) => {
                CACHED.fetch_sub(class, Ordering::Relaxed);
                p.0
            }
            None => {
                // SAFETY: class > 0 and the layout is valid.
                let raw = unsafe { alloc(layout(class)) };
                NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout(class)))
            }
        };
        count_live(class);
        Storage {
            ptr,
            class,
            #[cfg(feature = "gpu")]
            gpu: None,
        }
    }

    /// Storage for a GPU buffer (which does its own accounting).
    #[cfg(feature = "gpu")]
    pub(crate) fn device(buffer: crate::backend::gpu::DeviceBuffer) -> Storage {
        Storage {
            ptr: NonNull::new(ALIGN as *mut u8).expect("non-null"),
            class: buffer.capacity(),
            gpu: Some(buffer),
        }
    }

    /// The GPU buffer, when this storage lives on the GPU.
    #[cfg(feature = "gpu")]
    pub(crate) fn device_buffer(&self) -> Option<&crate::backend::gpu::DeviceBuffer> {
        self.gpu.as_ref()
    }

    /// True when the bytes live on the GPU (kernels on the host cannot read them).
    pub fn is_device(&self) -> bool {
        #[cfg(feature = "gpu")]
        {
            self.gpu.is_some()
        }
        #[cfg(not(feature = "gpu"))]
        {
            false
        }
    }

    /// Allocates and fills with zero bytes.
    pub fn zeroed(bytes: usize) -> Storage {
        let s = Storage::new(bytes);
        // SAFETY: the allocation holds at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(s.ptr.as_ptr(), 0, bytes) };
        s
    }

    /// Bytes reserved (the size class, at least what was asked for).
    pub fn capacity(&self) -> usize {
        self.class
    }

    /// Base pointer of the allocation.
    ///
    /// # Panics
    /// On GPU storage: host kernels only ever see host data (the graph moves
    /// arrays between devices with explicit transfer nodes).
    pub fn as_ptr(&self) -> *mut u8 {
        assert!(
            !self.is_device(),
            "host code read an array that lives on the GPU; move it with `to_device(Device::Cpu)` first"
        );
        self.ptr.as_ptr()
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        if self.class == 0 || self.is_device() {
            return;
        }
        count_dead(self.class);
        if cache() + self.class <= CACHE_LIMIT.load(Ordering::Relaxed) {
            let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
            free.entry(self.class).or_default().push(SendPtr(self.ptr));
            CACHED.fetch_add(self.class, Ordering::Relaxed);
        } else {
            // SAFETY: allocated with this layout in `new`.
            unsafe { dealloc(self.ptr.as_ptr(), layout(self.class)) };
        }
    }
}
