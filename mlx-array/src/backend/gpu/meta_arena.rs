//! The meta arena: where a submission's dispatches find their parameter
//! words (`meta`, bound at 0: sizes, shapes and strides, a few dozen `u32`s).
//!
//! Made as a buffer of its own per dispatch (`create_buffer_init`), each
//! `meta` costs the host a buffer creation and, on a discrete GPU, a mapped
//! staging buffer and a copy; an H100 training step records about a
//! thousand dispatches, and the host's recording was on its critical path
//! (issue 38). Here every dispatch of a chunk (see `submission`) appends its
//! words to one host copy at an offset aligned to the device's
//! `min_storage_buffer_offset_alignment` and binds its slice of a page (a
//! storage buffer of [`PAGE`] bytes; a slice never straddles two), and the
//! chunk's words reach the pages with one `queue.write_buffer` per page used,
//! just before the chunk is submitted (words larger than a page get a
//! buffer of their own).
//!
//! Lifetime: the pages are reused by every chunk. A `write_buffer` runs on
//! the queue after every submission made before it and before the next
//! submission's commands (WebGPU's queue order, which wgpu keeps with
//! barriers), and the arena writes only in the submission of the chunk whose
//! words it holds: so the GPU reads a chunk's words after they were written
//! and before the next chunk's overwrite them.

use std::num::NonZeroU64;

/// Bytes per page: 256 dispatches (a full chunk) at the largest alignment
/// devices ask for (256 bytes), so a chunk usually writes one page.
pub(crate) const PAGE: u64 = 64 * 1024;

/// The pages and the words staged for the chunk being recorded.
pub(crate) struct MetaArena {
    /// Storage buffers of [`PAGE`] bytes, created as chunks need them and
    /// reused by every chunk (see the module docs).
    pages: Vec<wgpu::Buffer>,
    /// This chunk's words, page after page: bytes `i * PAGE..` go to page `i`.
    staged: Vec<u8>,
}

impl MetaArena {
    /// No pages yet.
    pub(crate) const fn new() -> MetaArena {
        MetaArena {
            pages: Vec::new(),
            staged: Vec::new(),
        }
    }

    /// Stages `meta` for the chunk being recorded at a multiple of `align`
    /// bytes (a power of two of at least 4) and returns the slice to bind;
    /// `None` when it is larger than a page (the caller makes it a buffer of
    /// its own). An empty `meta` binds 4 zero bytes (a binding is never empty).
    pub(crate) fn push(
        &mut self,
        device: &wgpu::Device,
        align: u64,
        meta: &[u32],
    ) -> Option<wgpu::BufferBinding<'_>> {
        let size = (meta.len() as u64 * 4).max(4);
        let at = place(self.staged.len() as u64, align, size)?;
        let page = (at / PAGE) as usize;
        while self.pages.len() <= page {
            self.pages
                .push(device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("meta arena"),
                    size: PAGE,
                    usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                }));
        }
        self.staged.resize(at as usize, 0);
        if meta.is_empty() {
            self.staged.extend_from_slice(&[0; 4]);
        } else {
            self.staged.extend_from_slice(bytemuck::cast_slice(meta));
        }
        Some(wgpu::BufferBinding {
            buffer: &self.pages[page],
            offset: at % PAGE,
            size: NonZeroU64::new(size),
        })
    }

    /// Queues the staged words' writes to their pages (call it just before
    /// submitting the chunk that binds them) and starts the next chunk's.
    pub(crate) fn upload(&mut self, queue: &wgpu::Queue) {
        for (page, bytes) in self.pages.iter().zip(self.staged.chunks(PAGE as usize)) {
            queue.write_buffer(page, 0, bytes);
        }
        self.staged.clear();
    }
}

/// Where `size` bytes go after `staged` bytes: the first multiple of
/// `align` from `staged` whose slice stays in one page, else the next
/// page's start; `None` when `size` exceeds a page.
fn place(staged: u64, align: u64, size: u64) -> Option<u64> {
    if size > PAGE {
        return None;
    }
    let at = staged.next_multiple_of(align);
    if at / PAGE == (at + size - 1) / PAGE {
        Some(at)
    } else {
        Some(at.next_multiple_of(PAGE))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn slices_follow_each_other_aligned_and_move_to_a_new_page_when_they_would_straddle() {
        assert_eq!(place(0, 256, 40), Some(0));
        assert_eq!(place(40, 256, 40), Some(256));
        assert_eq!(place(40, 16, 40), Some(48));
        // 65,280 + 512 would cross 65,536: the slice starts the next page;
        // 256 bytes there end the page exactly, as 512 from 65,024 do.
        assert_eq!(place(65_100, 256, 512), Some(PAGE));
        assert_eq!(place(65_100, 256, 256), Some(65_280));
        assert_eq!(place(65_000, 256, 512), Some(65_024));
        assert_eq!(place(0, 256, PAGE), Some(0));
        assert_eq!(place(4, 256, PAGE), Some(PAGE));
        assert_eq!(place(0, 256, PAGE + 4), None);
    }

    proptest! {
        #[test]
        fn every_placement_is_aligned_within_one_page_and_as_early_as_can_be(
            staged in 0u64..4 * PAGE,
            align_log in 2u32..9,
            words in 1u64..20_000,
        ) {
            let (align, size) = (1u64 << align_log, words * 4);
            match place(staged, align, size) {
                None => prop_assert!(size > PAGE),
                Some(at) => {
                    prop_assert!(size <= PAGE);
                    prop_assert!(at >= staged);
                    prop_assert_eq!(at % align, 0);
                    prop_assert_eq!(at / PAGE, (at + size - 1) / PAGE);
                    // No earlier aligned start would do: the first one
                    // straddles (or is the answer).
                    let first = staged.next_multiple_of(align);
                    prop_assert!(at == first || at == first.next_multiple_of(PAGE));
                    if at != first {
                        prop_assert_ne!(first / PAGE, (first + size - 1) / PAGE);
                    }
                }
            }
        }
    }
}
