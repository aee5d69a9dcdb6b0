//! Shared memory between two ranks on one host: a [`Link`] whose large
//! payloads move through a segment both processes map, while headers, small
//! frames and one-byte doorbells stay on the TCP connection.
//!
//! Over loopback TCP every byte is copied into the kernel by the sender and
//! out of it by the receiver, with the stack's work between; through the
//! segment it is copied once in and once out (and a reduction reads it where
//! it lies, see [`Link::recv_payload_with`]). The socket keeps everything
//! that makes the ring safe: the receiver blocks on it (no spinning) for the
//! header and then one doorbell byte per piece, so a dead peer is an end of
//! stream, a stalled one a timeout, and an abort frame arrives where a header
//! is expected.
//!
//! Each direction of a link has [`SLOTS`] slots of [`SLOT`] bytes. A frame
//! whose payload is at least [`MIN_PAYLOAD`] bytes is sent as its header on
//! the socket followed by its payload in slot-sized pieces: the sender waits
//! for a free slot (polling the receiver's counter with backoff, up to the
//! collective timeout), copies the piece in, publishes it and writes a doorbell
//! byte; the receiver reads the doorbell, takes the piece and frees the slot.
//! Both sides know the payload's length from the header, so the framing on
//! the socket is unambiguous.
//!
//! Who shares a segment is settled once per link, right after the handshake
//! ([`negotiate`]): the lower rank creates a segment under a random name and
//! writes a random nonce into it, and offers both over the link; the higher
//! rank maps it and checks the nonce. Ranks on different hosts (or with
//! `MLX_DIST_SHM=0` on either side) fail that check or decline, and keep the
//! plain TCP link. The name is removed as soon as the answer is in, so no
//! segment outlives its processes.

use std::fs::File;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::link::{Link, TcpLink};
use crate::wire::HEADER_LEN;

/// Bytes of one slot: the largest piece a payload is cut into (the ring's
/// default block, so each of its frames is one piece).
pub(crate) const SLOT: usize = 256 << 10;
/// Slots per direction: 4 MiB in flight.
pub(crate) const SLOTS: u64 = 16;
/// Payloads from this size go through the segment; smaller ones stay on the
/// socket, where one write moves them.
pub(crate) const MIN_PAYLOAD: usize = 64 << 10;
/// The byte that tells the receiver a piece is in its slot.
const DOORBELL: u8 = 0xDB;
/// The first page: the nonce, then one cache line per counter.
const CONTROL: usize = 4096;
const NONCE_LEN: usize = 16;

/// Offsets of the counters of direction `d` (0: creator to opener): slots
/// published by the sender, slots freed by the receiver.
fn head_at(d: usize) -> usize {
    64 + 128 * d
}
fn tail_at(d: usize) -> usize {
    128 + 128 * d
}

/// The bytes of a segment: the control page and both directions' slots.
const fn segment_len() -> usize {
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
    fn map(file: &File) -> io::Result<Segment> {
        let map = memmap2::MmapOptions::new()
            .len(segment_len())
            .map_raw(file)?;
        Ok(Segment { map })
    }

    fn counter(&self, at: usize) -> &AtomicU64 {
        debug_assert!(at.is_multiple_of(8) && at + 8 <= CONTROL);
        // SAFETY: in bounds, 8-byte aligned (the map is page aligned), and
        // only ever accessed atomically.
        unsafe { &*self.map.as_mut_ptr().add(at).cast::<AtomicU64>() }
    }

    /// The nonce at the start of the control page.
    fn nonce(&self) -> [u8; NONCE_LEN] {
        let mut n = [0u8; NONCE_LEN];
        // SAFETY: in bounds; written by the creator before it offers the
        // segment, read by the opener after.
        unsafe { std::ptr::copy_nonoverlapping(self.map.as_ptr(), n.as_mut_ptr(), NONCE_LEN) };
        n
    }

    fn write_nonce(&self, n: &[u8; NONCE_LEN]) {
        // SAFETY: in bounds; nobody else has the segment yet.
        unsafe { std::ptr::copy_nonoverlapping(n.as_ptr(), self.map.as_mut_ptr(), NONCE_LEN) };
    }

    /// Slot `i` of direction `d`.
    fn slot(&self, d: usize, i: u64) -> *mut u8 {
        let at = CONTROL + (d * SLOTS as usize + (i % SLOTS) as usize) * SLOT;
        // SAFETY: in bounds of the mapping by construction.
        unsafe { self.map.as_mut_ptr().add(at) }
    }
}

// Creating, opening and removing named segments: files in `/dev/shm` (a
// memory file system) on Linux, POSIX `shm_open` objects on macOS.
#[cfg(not(target_os = "macos"))]
use dev_shm as named;
#[cfg(target_os = "macos")]
use posix_shm as named;

/// Segments as files in `/dev/shm` (the temporary directory without it).
#[cfg(not(target_os = "macos"))]
mod dev_shm {
    use std::fs::{File, OpenOptions};
    use std::io;
    use std::os::unix::fs::OpenOptionsExt;
    use std::path::PathBuf;

    fn path(name: &str) -> PathBuf {
        let shm = std::path::Path::new("/dev/shm");
        let dir = if shm.is_dir() {
            shm.to_path_buf()
        } else {
            std::env::temp_dir()
        };
        dir.join(name)
    }

    /// Creates the segment `name` of `len` bytes, readable by this user only;
    /// returns it and what the peer passes to [`open`]. The memory is
    /// reserved now: a full `/dev/shm` (64 MiB in a default Docker
    /// container) is then a refusal here, and the link keeps TCP, instead
    /// of a `SIGBUS` when a page is first touched mid-collective.
    pub fn create(name: &str, len: usize) -> io::Result<(File, String)> {
        use std::os::fd::AsRawFd;
        let p = path(name);
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&p)?;
        let handle = p.to_string_lossy().into_owned();
        // SAFETY: a valid descriptor; the range is the segment.
        let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len as libc::off_t) };
        if r != 0 {
            remove(&handle);
            return Err(io::Error::from_raw_os_error(r));
        }
        Ok((f, handle))
    }

    pub fn open(handle: &str) -> io::Result<File> {
        OpenOptions::new().read(true).write(true).open(handle)
    }

    pub fn remove(handle: &str) {
        let _ = std::fs::remove_file(handle);
    }
}

/// Segments as POSIX shared memory objects (`shm_open`): macOS's way, and
/// compiled everywhere so that its tests run on Linux too.
#[cfg_attr(not(target_os = "macos"), allow(dead_code))]
mod posix_shm {
    use std::ffi::CString;
    use std::fs::File;
    use std::io;
    use std::os::fd::FromRawFd;

    fn shm_open(handle: &str, flags: libc::c_int) -> io::Result<File> {
        let c = CString::new(handle).map_err(|_| io::ErrorKind::InvalidInput)?;
        // SAFETY: a valid C string; the mode is passed as the variadic
        // argument `shm_open` reads when it creates.
        let fd = unsafe { libc::shm_open(c.as_ptr(), flags, 0o600 as libc::c_uint) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: a descriptor we own from here on.
        Ok(unsafe { File::from_raw_fd(fd) })
    }

    /// Creates the object `/name` (names are at most 31 bytes there).
    pub fn create(name: &str, len: usize) -> io::Result<(File, String)> {
        let handle = format!("/{name}");
        let f = shm_open(&handle, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)?;
        f.set_len(len as u64)?;
        Ok((f, handle))
    }

    pub fn open(handle: &str) -> io::Result<File> {
        shm_open(handle, libc::O_RDWR)
    }

    pub fn remove(handle: &str) {
        if let Ok(c) = CString::new(handle) {
            // SAFETY: a valid C string.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
    }
}

/// Random bytes for names and nonces.
fn random<const N: usize>() -> io::Result<[u8; N]> {
    let mut b = [0u8; N];
    getrandom::fill(&mut b).map_err(|e| io::Error::other(e.to_string()))?;
    Ok(b)
}

use crate::config::hex_encode as hex;

const OFFER: u8 = b'S';
const DECLINE: u8 = b'N';
const ACCEPT: u8 = b'Y';

/// The creating side's half of a negotiation, between sending the offer and reading the answer.
struct Offer {
    seg: Option<(Segment, String)>,
}

/// Sends the offer of a new segment over `stream` (or a refusal when
/// `enabled` is false or the segment cannot be made): the lower rank's first half.
fn offer(stream: &mut TcpStream, enabled: bool) -> io::Result<Offer> {
    let made = if enabled {
        (|| -> io::Result<(Segment, String, [u8; NONCE_LEN])> {
            let name = format!("mlxd{}", hex(&random::<12>()?));
            let (file, handle) = named::create(&name, segment_len())?;
            // The offer gives the handle's length in one byte (a long
            // temporary directory's path may not fit).
            let seg = u8::try_from(handle.len())
                .map_err(|_| io::Error::other(format!("segment path too long: {handle}")))
                .and_then(|_| Segment::map(&file))
                .inspect_err(|_| named::remove(&handle))?;
            let nonce = random::<NONCE_LEN>()?;
            seg.write_nonce(&nonce);
            Ok((seg, handle, nonce))
        })()
        .inspect_err(
            |e| tracing::warn!(error = %e, "no shared memory segment; this link keeps TCP"),
        )
        .ok()
    } else {
        None
    };
    match made {
        Some((seg, handle, nonce)) => {
            let mut msg = vec![OFFER, handle.len() as u8];
            msg.extend_from_slice(handle.as_bytes());
            msg.extend_from_slice(&nonce);
            if let Err(e) = stream.write_all(&msg) {
                named::remove(&handle);
                return Err(e);
            }
            Ok(Offer {
                seg: Some((seg, handle)),
            })
        }
        None => {
            stream.write_all(&[DECLINE])?;
            Ok(Offer { seg: None })
        }
    }
}

impl Offer {
    /// Reads the peer's answer and removes the segment's name; the segment
    /// if the peer mapped it.
    fn settle(mut self, stream: &mut TcpStream) -> io::Result<Option<Segment>> {
        let Some((seg, handle)) = self.seg.take() else {
            return Ok(None);
        };
        let mut a = [0u8; 1];
        let r = stream.read_exact(&mut a);
        named::remove(&handle);
        r?;
        Ok((a[0] == ACCEPT).then_some(seg))
    }
}

impl Drop for Offer {
    /// An offer given up unsettled (another link's negotiation failed) still removes its name.
    fn drop(&mut self) {
        if let Some((_, handle)) = &self.seg {
            named::remove(handle);
        }
    }
}

/// Reads the lower rank's offer and answers it: the higher rank's half. The
/// segment when it could be mapped and holds the offered nonce (the same host).
fn answer(stream: &mut TcpStream, enabled: bool) -> io::Result<Option<Segment>> {
    let mut kind = [0u8; 1];
    stream.read_exact(&mut kind)?;
    match kind[0] {
        DECLINE => return Ok(None),
        OFFER => {}
        other => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("expected a shared memory offer, got byte {other:#04x}"),
            ));
        }
    }
    let mut n = [0u8; 1];
    stream.read_exact(&mut n)?;
    let mut handle = vec![0u8; n[0] as usize];
    stream.read_exact(&mut handle)?;
    let mut nonce = [0u8; NONCE_LEN];
    stream.read_exact(&mut nonce)?;
    let seg = if enabled {
        String::from_utf8(handle)
            .ok()
            .and_then(|h| named::open(&h).ok())
            .and_then(|f| Segment::map(&f).ok())
            .filter(|s| s.nonce() == nonce)
    } else {
        None
    };
    stream.write_all(&[if seg.is_some() { ACCEPT } else { DECLINE }])?;
    Ok(seg)
}

/// Settles, for every data link of this rank, whether it shares a segment
/// with its peer: `streams[peer][link]` (handshaken, blocking, with
/// timeouts; an empty row for this rank); returns the segments in the same
/// shape, or the first failure naming the peer. Offers go out to every
/// higher rank first, then offers from lower ranks are answered, then the
/// answers read, so no two ranks wait on each other.
pub(crate) fn negotiate(
    rank: usize,
    streams: &mut [Vec<TcpStream>],
    enabled: bool,
) -> io::Result<Vec<Vec<Option<Segment>>>> {
    let with_peer =
        |peer: usize| move |e: io::Error| io::Error::new(e.kind(), format!("rank {peer}: {e}"));
    let mut offers: Vec<Vec<Offer>> = Vec::new();
    for (peer, row) in streams.iter_mut().enumerate().skip(rank + 1) {
        offers.push(
            row.iter_mut()
                .map(|s| offer(s, enabled).map_err(with_peer(peer)))
                .collect::<io::Result<_>>()?,
        );
    }
    let mut segs: Vec<Vec<Option<Segment>>> = Vec::with_capacity(streams.len());
    for (peer, row) in streams.iter_mut().enumerate().take(rank) {
        segs.push(
            row.iter_mut()
                .map(|s| answer(s, enabled).map_err(with_peer(peer)))
                .collect::<io::Result<_>>()?,
        );
    }
    segs.push(Vec::new());
    for ((peer, row), offers) in streams.iter_mut().enumerate().skip(rank + 1).zip(offers) {
        segs.push(
            row.iter_mut()
                .zip(offers)
                .map(|(s, o)| o.settle(s).map_err(with_peer(peer)))
                .collect::<io::Result<_>>()?,
        );
    }
    Ok(segs)
}

/// A TCP link whose large payloads go through a shared segment.
pub(crate) struct ShmLink {
    tcp: TcpLink,
    seg: Segment,
    /// The direction this side sends on (0 for the creator, the lower rank).
    out: usize,
    /// The collective timeout: how long a sender waits for a free slot.
    timeout: Duration,
    closed: AtomicBool,
}

impl ShmLink {
    /// `lower`: whether this side created the segment (the lower rank).
    pub(crate) fn new(tcp: TcpLink, seg: Segment, lower: bool, timeout: Duration) -> ShmLink {
        ShmLink {
            tcp,
            seg,
            out: usize::from(!lower),
            timeout,
            closed: AtomicBool::new(false),
        }
    }

    /// Waits until slot `head` of our direction is free (the receiver has
    /// taken slot `head - SLOTS`): spins briefly, then sleeps with backoff,
    /// giving up when the link closes, the peer goes away or the collective
    /// timeout passes without the receiver taking anything. The receiver's
    /// counter lives in memory the peer writes: a value that runs ahead of
    /// what was published is an error, never an overflow.
    fn wait_for_slot(&self, head: u64) -> io::Result<()> {
        let tail = self.seg.counter(tail_at(self.out));
        let mut seen = tail.load(Ordering::Acquire);
        let mut deadline = Instant::now() + self.timeout;
        let mut round = 0u32;
        loop {
            let in_flight = head.checked_sub(seen).ok_or_else(|| {
                out_of_step(format!(
                    "the receiver freed slot {seen}, past the {head} published"
                ))
            })?;
            if in_flight < SLOTS {
                return Ok(());
            }
            if self.closed.load(Ordering::Relaxed) {
                return Err(io::ErrorKind::NotConnected.into());
            }
            round += 1;
            if round < 100 {
                std::hint::spin_loop();
            } else if round < 120 {
                std::thread::yield_now();
            } else {
                if self.tcp.peer_closed() {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                let us = 10u64 << (round - 120).min(6);
                std::thread::sleep(Duration::from_micros(us));
            }
            let now = tail.load(Ordering::Acquire);
            if now != seen {
                seen = now;
                deadline = Instant::now() + self.timeout;
            }
        }
    }

    /// Sends a large payload: the header, then each piece into a slot with its doorbell.
    fn send_pieces(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let head = self.seg.counter(head_at(self.out));
        for (i, piece) in payload.chunks(SLOT).enumerate() {
            let h = head.load(Ordering::Relaxed);
            self.wait_for_slot(h)?;
            // SAFETY: slot `h` is free (the receiver freed it) and only this
            // thread, holding the write lock, fills our direction's slots.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    self.seg.slot(self.out, h),
                    piece.len(),
                )
            };
            head.store(h.wrapping_add(1), Ordering::Release);
            // The first doorbell travels with the header.
            let hdr: &[u8] = if i == 0 { header } else { &[] };
            self.tcp.write_frame(hdr, &[DOORBELL], None)?;
        }
        Ok(())
    }
}

impl Link for ShmLink {
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let _g = self.tcp.lock_writes();
        if payload.len() < MIN_PAYLOAD {
            return self.tcp.write_frame(header, payload, None);
        }
        self.send_pieces(header, payload).inspect_err(|_| {
            // The peer may be inside this frame: no abort frame can follow.
            self.tcp.mark_torn();
        })
    }

    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool {
        // Only abort frames come this way: small, on the socket.
        self.tcp.send_frame_until(header, payload, deadline)
    }

    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        self.tcp.recv_exact(buf)
    }

    fn recv_exact_until(&self, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        self.tcp.recv_exact_until(buf, deadline)
    }

    fn finish(&self, deadline: Instant) {
        self.tcp.finish(deadline)
    }

    fn recv_payload(&self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() < MIN_PAYLOAD {
            return self.tcp.recv_exact(buf);
        }
        let len = buf.len();
        self.recv_pieces(len, &mut |at, piece| {
            buf[at..at + piece.len()].copy_from_slice(piece)
        })
    }

    fn recv_payload_with(
        &self,
        len: usize,
        scratch: &mut [u8],
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        if len < MIN_PAYLOAD {
            return self.tcp.recv_payload_with(len, scratch, f);
        }
        self.recv_pieces(len, f)
    }

    fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.tcp.shutdown();
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn as_tcp(&self) -> Option<&TcpLink> {
        Some(&self.tcp)
    }
}

/// The error of a shared memory link whose counters or doorbells disagree.
fn out_of_step(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("shared memory link out of step: {what}"),
    )
}

impl ShmLink {
    /// Takes a large payload piece by piece: each doorbell, then the slot.
    fn recv_pieces(&self, len: usize, f: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let d = 1 - self.out;
        let (head, tail) = (self.seg.counter(head_at(d)), self.seg.counter(tail_at(d)));
        for at in (0..len).step_by(SLOT) {
            let n = SLOT.min(len - at);
            let mut bell = [0u8; 1];
            self.tcp.recv_exact(&mut bell)?;
            let t = tail.load(Ordering::Relaxed);
            let h = head.load(Ordering::Acquire);
            if bell[0] != DOORBELL {
                return Err(out_of_step(format!(
                    "byte {:#04x} where a doorbell was due",
                    bell[0]
                )));
            }
            // Both counters live in memory the peer can write: a slot is
            // taken only if it was published and not more than SLOTS ahead.
            if h <= t || h - t > SLOTS {
                return Err(out_of_step(format!(
                    "{h} slots published, {t} taken (at most {SLOTS} in flight)"
                )));
            }
            // SAFETY: the sender published slot `t` (head > t) and will not
            // touch it again until we free it below.
            let piece = unsafe { std::slice::from_raw_parts(self.seg.slot(d, t), n) };
            f(at, piece);
            tail.store(t + 1, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    /// Two ends of a loopback connection, each as a shared memory link.
    fn pair(stall: Duration) -> (ShmLink, ShmLink) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let o = offer(&mut a, true).unwrap();
        let sb = answer(&mut b, true).unwrap().expect("same host");
        let sa = o.settle(&mut a).unwrap().expect("accepted");
        let a = TcpLink::new(a, stall, 0).unwrap();
        let b = TcpLink::new(b, stall, 0).unwrap();
        (
            ShmLink::new(a, sa, true, stall),
            ShmLink::new(b, sb, false, stall),
        )
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn frames_of_every_size_arrive_whole_and_in_order_both_ways() {
        let (a, b) = pair(Duration::from_secs(10));
        // Small (socket), exactly the threshold, several slots, more than all slots.
        let sizes = [
            0,
            1,
            1000,
            MIN_PAYLOAD - 1,
            MIN_PAYLOAD,
            SLOT + 3,
            40 * SLOT + 7,
        ];
        std::thread::scope(|s| {
            for (link, peer, seed) in [(&a, &b, 1u8), (&b, &a, 2u8)] {
                s.spawn(move || {
                    for (k, &n) in sizes.iter().enumerate() {
                        let h = [k as u8; HEADER_LEN];
                        link.send_frame(&h, &pattern(n, seed + k as u8)).unwrap();
                    }
                });
                s.spawn(move || {
                    for (k, &n) in sizes.iter().enumerate() {
                        let mut h = [0u8; HEADER_LEN];
                        peer.recv_exact(&mut h).unwrap();
                        assert_eq!(h, [k as u8; HEADER_LEN]);
                        let mut got = vec![0u8; n];
                        if k % 2 == 0 {
                            peer.recv_payload(&mut got).unwrap();
                        } else {
                            let mut scratch = vec![0u8; n];
                            let mut seen = 0;
                            peer.recv_payload_with(n, &mut scratch, &mut |at, p| {
                                assert_eq!(at, seen, "pieces come in order");
                                got[at..at + p.len()].copy_from_slice(p);
                                seen += p.len();
                            })
                            .unwrap();
                            assert_eq!(seen, n);
                        }
                        assert!(got == pattern(n, seed + k as u8), "frame {k} of {n} bytes");
                    }
                });
            }
        });
    }

    #[test]
    fn a_sender_with_no_free_slot_fails_when_the_peer_goes_away_or_stalls() {
        let (a, b) = pair(Duration::from_millis(300));
        let big = vec![7u8; (SLOTS as usize + 2) * SLOT];
        let t = Instant::now();
        let e = a.send_frame(&[0; HEADER_LEN], &big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "nobody reads: {e}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        let (a, b2) = pair(Duration::from_secs(30));
        drop(b);
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                drop(b2);
            });
            let e = a.send_frame(&[0; HEADER_LEN], &big).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                ),
                "{e}"
            );
        });
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "far within the collective timeout"
        );
    }

    /// The counters live in memory the peer writes: a receiver counter that
    /// runs ahead of what was published, or a publisher counter too far
    /// ahead, is an error on the link, never a panic or an overflow.
    #[test]
    fn counters_a_peer_corrupts_are_errors_not_panics() {
        let (a, b) = pair(Duration::from_secs(5));
        // The receiver of a's direction "freed" slots a never published.
        a.seg
            .counter(tail_at(a.out))
            .store(u64::MAX, Ordering::Release);
        let e = a
            .send_frame(&[0; HEADER_LEN], &pattern(SLOT, 1))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // A doorbell arrives for a slot whose publisher counter ran far ahead.
        let (a, b2) = pair(Duration::from_secs(5));
        drop(b);
        b2.seg
            .counter(head_at(1 - b2.out))
            .store(u64::MAX / 2, Ordering::Release);
        a.tcp.write_frame(&[], &[DOORBELL], None).unwrap();
        let mut buf = vec![0u8; MIN_PAYLOAD];
        let e = b2.recv_payload(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn ranks_that_disable_it_or_cannot_map_it_keep_tcp() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        for (offering, answering) in [(false, true), (true, false)] {
            let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
            let (mut b, _) = l.accept().unwrap();
            let o = offer(&mut a, offering).unwrap();
            assert!(answer(&mut b, answering).unwrap().is_none());
            assert!(o.settle(&mut a).unwrap().is_none());
        }
        // An offer of a segment with the wrong nonce (another host's namesake) is declined.
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let o = offer(&mut a, true).unwrap();
        if let Some((seg, _)) = &o.seg {
            let mut n = seg.nonce();
            n[0] ^= 1;
            seg.write_nonce(&n);
        }
        assert!(answer(&mut b, true).unwrap().is_none());
        let handle = o.seg.as_ref().unwrap().1.clone();
        assert!(o.settle(&mut a).unwrap().is_none());
        assert!(named::open(&handle).is_err(), "the name is removed");
        // An offer given up before its answer (another link failed) removes its name too.
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let o = offer(&mut a, true).unwrap();
        let handle = o.seg.as_ref().unwrap().1.clone();
        assert!(named::open(&handle).is_ok());
        drop(o);
        assert!(named::open(&handle).is_err(), "the name is removed on drop");
    }

    #[test]
    fn posix_shared_memory_objects_are_made_shared_and_removed() {
        // macOS's segments, exercised wherever the tests run.
        let name = format!("mlxd{}", hex(&random::<12>().unwrap()));
        assert!(name.len() < 31, "macOS limits names to 31 bytes");
        let (f, handle) = posix_shm::create(&name, segment_len()).unwrap();
        let a = Segment::map(&f).unwrap();
        let b = Segment::map(&posix_shm::open(&handle).unwrap()).unwrap();
        let n = random::<NONCE_LEN>().unwrap();
        a.write_nonce(&n);
        assert_eq!(b.nonce(), n, "both maps see one memory");
        a.counter(head_at(1)).store(7, Ordering::Release);
        assert_eq!(b.counter(head_at(1)).load(Ordering::Acquire), 7);
        posix_shm::remove(&handle);
        assert!(posix_shm::open(&handle).is_err(), "the name is removed");
        let (_f, again) = posix_shm::create(&name, 4096).expect("the name is free again");
        posix_shm::remove(&again);
    }
}
