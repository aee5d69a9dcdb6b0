//! The layout of a shared segment (a control page with the nonce and each
//! direction's two counters, then each direction's slots) and its mapping.

use std::fs::File;
use std::io;
use std::sync::atomic::AtomicU64;

/// Bytes of one slot: the largest piece a payload is cut into (the ring's
/// default block, so each of its frames is one piece).
pub(crate) const SLOT: usize = 256 << 10;
/// Slots per direction: 4 MiB in flight.
pub(crate) const SLOTS: u64 = 16;
/// The first page: the nonce, then one cache line per counter.
const CONTROL: usize = 4096;
pub(super) const NONCE_LEN: usize = 16;

/// Offsets of the counters of direction `d` (0: creator to opener): slots
/// published by the sender, slots freed by the receiver.
pub(super) fn head_at(d: usize) -> usize {
    64 + 128 * d
}
pub(super) fn tail_at(d: usize) -> usize {
    128 + 128 * d
}

/// The bytes of a segment: the control page and both directions' slots.
pub(super) const fn segment_len() -> usize {
    CONTROL + 2 * SLOTS as usize * SLOT
}

/// A mapped segment.
pub(crate) struct Segment {
    map: memmap2::MmapRaw,
}

// SAFETY: the mapping is plain shared memory; every access to it goes
// through atomics or through slots that the protocol gives to one thread
// (the sender before publishing, the receiver until it frees them).
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Maps `file`, refusing one shorter than [`segment_len`]: its pages
    /// past the end would fault with `SIGBUS` when touched.
    pub(super) fn map(file: &File) -> io::Result<Segment> {
        let have = file.metadata()?.len();
        if have < segment_len() as u64 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "the shared memory segment is {have} bytes, {} are needed",
                    segment_len()
                ),
            ));
        }
        let map = memmap2::MmapOptions::new()
            .len(segment_len())
            .map_raw(file)?;
        Ok(Segment { map })
    }

    pub(super) fn counter(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at.is_multiple_of(8) && at + 8 <= CONTROL);
        // SAFETY: in bounds, 8-byte aligned (the map is page aligned), and
        // only ever accessed atomically.
        unsafe { &*self.map.as_mut_ptr().add(at).cast::<AtomicU64>() }
    }

    /// The nonce at the start of the control page.
    pub(super) fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        // SAFETY: in bounds; written by the creator before it offers the
        // segment, read by the opener after.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr(), n.as_mut_ptr(), NONCE_LEN) };
        n
    }

    pub(super) fn write_nonce(&self, n: &[u8; NONCE_LEN]) {
        // SAFETY: in bounds; nobody else has the segment yet.
        unsafe { std::ptr::copy_nonoverlapping(n.as_ptr(), self.map.as_mut_ptr(), NONCE_LEN) };
    }

    /// Slot `i` of direction `d`.
    pub(super) fn slot(&self, d: usize, i: u64) -> *mut u8 {
        let at = CONTROL + (d * SLOTS as usize + (i % SLOTS) as usize) * SLOT;
        // SAFETY: in bounds of the mapping by construction.
        unsafe { self.map.as_mut_ptr().add(at) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_segment_shorter_than_the_layout_is_refused_before_mapping() {
        let f = tempfile_of(4096);
        let e = Segment::map(&f)
            .err()
            .expect("a short file must not be mapped");
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        assert!(e.to_string().contains("4096 bytes"), "{e}");
        let f = tempfile_of(segment_len() as u64);
        assert!(Segment::map(&f).is_ok());
    }

    fn tempfile_of(len: u64) -> File {
        let p = std::env::temp_dir().join(format!(
            "mlx-seg-{}-{len}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        std::fs::remove_file(&p).unwrap();
        f.set_len(len).unwrap();
        f
    }
}
