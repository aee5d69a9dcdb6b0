//! The accounting core: the byte counters behind [`crate::memory`] and the
//! host allocator with its reuse cache.
//!
//! Backends import this module to count their own buffers (the GPU pool
//! counts device bytes here too); it imports no backend, so the layers
//! point one way: [`crate::memory`]'s public functions may reach the
//! backends (to clear their pools), this core never does.

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
/// What [`clear_device_caches`] runs: each device backend's pool release,
/// registered by the backend when it starts (so memory names no backend).
static DEVICE_CACHE_CLEARERS: Mutex<Vec<fn()>> = Mutex::new(Vec::new());

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

/// Bytes of freed buffers kept for reuse (host and device).
pub fn cache() -> usize {
    CACHED.load(Ordering::Relaxed)
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

/// The most bytes the reuse caches may hold together.
pub(crate) fn cache_limit() -> usize {
    CACHE_LIMIT.load(Ordering::Relaxed)
}

/// Sets [`cache_limit`] and returns the previous limit (trimming is the caller's).
pub(crate) fn swap_cache_limit(bytes: usize) -> usize {
    CACHE_LIMIT.swap(bytes, Ordering::Relaxed)
}

/// Returns every cached host buffer to the system allocator.
/// Registers `clear`, a device backend's release of its pooled buffers, to
/// run on every [`crate::memory::clear_cache`] (once per function). The GPU
/// backend registers its own when it starts; a backend of your own whose
/// buffers are [`crate::memory::DeviceAllocation`]s does the same.
pub fn register_device_cache_clearer(clear: fn()) {
    let mut clearers = DEVICE_CACHE_CLEARERS
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if !clearers.contains(&clear) {
        clearers.push(clear);
    }
}

/// Runs every registered device backend's pool release.
pub(crate) fn clear_device_caches() {
    let clearers = DEVICE_CACHE_CLEARERS
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    for clear in clearers {
        clear();
    }
}

pub(crate) fn clear_host_cache() {
    let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
    for (class, ptrs) in std::mem::take(&mut *free) {
        for p in ptrs {
            // SAFETY: each cached pointer was allocated with this class's layout.
            unsafe { dealloc(p.0.as_ptr(), layout(class)) };
            count_cached(class, false);
        }
    }
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

/// 64-byte aligned host memory, counted in [`active`] while alive and
/// returned to the reuse cache (within `cache_limit`) when dropped.
pub struct HostBuffer {
    ptr: NonNull<u8>,
    class: usize,
}

// SAFETY: HostBuffer owns its allocation; writes happen only while a kernel holds
// the only reference (right after allocation), reads are shared.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Allocates at least `bytes` bytes (uninitialised), reusing a cached buffer
    /// of the same size class when there is one.
    pub fn new(bytes: usize) -> HostBuffer {
        if bytes == 0 {
            return HostBuffer {
                // A well-aligned, non-null address that is never dereferenced.
                ptr: NonNull::new(ALIGN as *mut u8).expect("non-null"),
                class: 0,
            };
        }
        let class = size_class(bytes);
        let reused = {
            let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
            free.get_mut(&class).and_then(|v| v.pop())
        };
        let ptr = match reused {
            Some(p) => {
                count_cached(class, false);
                p.0
            }
            None => {
                // SAFETY: class > 0 and the layout is valid.
                let raw = unsafe { alloc(layout(class)) };
                NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout(class)))
            }
        };
        count_live(class);
        HostBuffer { ptr, class }
    }

    /// Allocates and fills with zero bytes.
    pub fn zeroed(bytes: usize) -> HostBuffer {
        let b = HostBuffer::new(bytes);
        // SAFETY: the allocation holds at least `bytes` bytes.
        unsafe { std::ptr::write_bytes(b.ptr.as_ptr(), 0, bytes) };
        b
    }

    /// Bytes reserved (the size class, at least what was asked for).
    pub fn capacity(&self) -> usize {
        self.class
    }

    /// Base pointer of the allocation.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl std::fmt::Debug for HostBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "HostBuffer({} bytes)", self.capacity())
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if self.class == 0 {
            return;
        }
        count_dead(self.class);
        if cache() + self.class <= cache_limit() {
            let mut free = FREE.lock().unwrap_or_else(|e| e.into_inner());
            free.entry(self.class).or_default().push(SendPtr(self.ptr));
            count_cached(self.class, true);
        } else {
            // SAFETY: allocated with this layout in `new`.
            unsafe { dealloc(self.ptr.as_ptr(), layout(self.class)) };
        }
    }
}
