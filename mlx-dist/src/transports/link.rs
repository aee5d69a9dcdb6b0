//! A link: one ordered, reliable byte stream to a peer that the algorithms use
//! from two threads at once (one sending, one receiving). Transports implement it.
//!
//! TCP links are non-blocking sockets: blocking calls wait in `poll(2)` with the
//! collective timeout as deadline, and the ring drives every link of an operation
//! from one thread with partial reads and writes (see `ring::run_polled`), so
//! a collective costs no thread hand-offs.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::wire::HEADER_LEN;

/// A duplex byte stream to one peer.
pub(crate) trait Link: Send + Sync {
    /// Writes a frame header and its payload; frames from different threads never interleave.
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()>;
    /// Like `send_frame` but gives up at `deadline` (waiting for another
    /// writer to finish its frame, or for room in the stream).
    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool;
    /// Reads exactly `buf.len()` bytes.
    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()>;
    /// Reads exactly `buf.len()` bytes, giving up at `deadline` (`TimedOut`).
    fn recv_exact_until(&self, buf: &mut [u8], deadline: Instant) -> io::Result<()>;
    /// Ends this side of the stream once what was written is delivered
    /// (TCP: a half-close, the kernel delivers the rest; QUIC: the stream is
    /// finished and its acknowledgement awaited), giving up at `deadline`.
    fn finish(&self, deadline: Instant);
    /// Reads the payload of a frame whose header was just read (the shared
    /// memory link takes large payloads from its segment; a stream reads them).
    fn recv_payload(&self, buf: &mut [u8]) -> io::Result<()> {
        self.recv_exact(buf)
    }
    /// Hands the `len`-byte payload of a frame whose header was just read to
    /// `f` piece by piece, as `(offset, bytes)`, for a caller that only reads
    /// it (a reduction): a stream reads it into `scratch` first; the shared
    /// memory link passes its segment, saving a copy.
    fn recv_payload_with(
        &self,
        len: usize,
        scratch: &mut [u8],
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        let buf = &mut scratch[..len];
        self.recv_payload(buf)?;
        f(0, buf);
        Ok(())
    }
    /// Closes both directions, waking any thread blocked on the link.
    fn shutdown(&self);
    /// Whether large payloads go through shared memory.
    fn is_shared(&self) -> bool {
        false
    }
    /// The TCP link behind this link, for the single-threaded polled ring.
    fn as_tcp(&self) -> Option<&TcpLink> {
        None
    }
}

/// A TCP connection (non-blocking; waits go through `poll`).
pub(crate) struct TcpLink {
    stream: TcpStream,
    write_lock: Mutex<()>,
    /// The collective timeout: the default deadline of every wait.
    timeout: Duration,
    /// A frame was left half written: no abort frame may follow on this link.
    torn: AtomicBool,
}

/// Runs `f` on what `lock` guards once it is free, or gives up at
/// `deadline` (`None`): a frame sent while the failure machinery runs must
/// not wait behind a writer that is itself stuck.
pub(crate) fn with_lock_until<T, R>(
    lock: &Mutex<T>,
    deadline: Instant,
    f: impl FnOnce(&mut T) -> R,
) -> Option<R> {
    loop {
        if let Ok(mut g) = lock.try_lock() {
            return Some(f(&mut g));
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Waits until one of `fds` is ready or `deadline` passes; returns the number
/// of ready descriptors (0 on timeout). Retries on `EINTR`.
pub(crate) fn poll_until(fds: &mut [libc::pollfd], deadline: Instant) -> io::Result<usize> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let ms = left.as_micros().div_ceil(1000).min(i32::MAX as u128) as libc::c_int;
        // SAFETY: `fds` is a valid, exclusively borrowed array of pollfd.
        let r = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if r == 0 {
            if Instant::now() >= deadline {
                return Ok(0);
            }
            continue;
        }
        return Ok(r as usize);
    }
}

fn set_buffer(fd: RawFd, opt: libc::c_int, bytes: usize) {
    let v = bytes as libc::c_int;
    // SAFETY: a valid socket and a correctly sized option value.
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            opt,
            (&v as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        );
    }
}

/// Frames from this size on are pushed out whole once written
/// ([`push_now`]); smaller ones spare the system call (2-3 us of a 40 us
/// four-rank sum on loopback), as nothing was seen held back among them.
const PUSH_BYTES: usize = 16 << 10;

/// Sends what `stream` holds back at once. Linux's autocorking keeps a
/// write's last, short segment while earlier segments of the socket still
/// wait below TCP (in a shaped link's queue), even with `TCP_NODELAY`, and
/// sends it when they leave: across 4 hosts on 1 Gbit/s links that held
/// some frames for 25-170 ms, and a 256 KiB bf16 sum over the owners took
/// three times the ring's time. Setting `TCP_NODELAY` again pushes what is
/// pending. Other systems have no autocorking.
fn push_now(stream: &TcpStream) {
    #[cfg(target_os = "linux")]
    let _ = stream.set_nodelay(true);
    #[cfg(not(target_os = "linux"))]
    let _ = stream;
}

impl TcpLink {
    /// Wraps a connected, handshaken stream: non-blocking, `TCP_NODELAY`,
    /// socket buffers of `buffer` bytes (the kernel may cap them; 0 keeps
    /// its autotuning, which measured no worse than a fixed 4 MiB on
    /// loopback and may grow further); every wait on it is bounded by `timeout`.
    pub(crate) fn new(stream: TcpStream, timeout: Duration, buffer: usize) -> io::Result<TcpLink> {
        stream.set_nodelay(true)?;
        stream.set_nonblocking(true)?;
        let fd = stream.as_raw_fd();
        let size = buffer;
        if size > 0 {
            set_buffer(fd, libc::SO_SNDBUF, size);
            set_buffer(fd, libc::SO_RCVBUF, size);
        }
        Ok(TcpLink {
            stream,
            write_lock: Mutex::new(()),
            timeout,
            torn: AtomicBool::new(false),
        })
    }

    /// The socket's descriptor, for `poll`.
    pub(crate) fn fd(&self) -> RawFd {
        self.stream.as_raw_fd()
    }

    /// Takes the write side for a whole operation (the polled ring writes frames piecewise).
    pub(crate) fn lock_writes(&self) -> std::sync::MutexGuard<'_, ()> {
        self.write_lock.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks the link as holding a half-written frame (no abort frame can follow).
    pub(crate) fn mark_torn(&self) {
        self.torn.store(true, Ordering::SeqCst);
    }

    /// One non-blocking vectored write.
    pub(crate) fn try_write(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&self.stream).write_vectored(bufs)
    }

    /// One non-blocking read.
    pub(crate) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        (&self.stream).read(buf)
    }

    /// Waits until the socket has something to read, up to `deadline` (`TimedOut`).
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn wait_readable(&self, deadline: Instant) -> io::Result<()> {
        self.wait(libc::POLLIN, deadline)
    }

    /// Whether a frame was left half written.
    #[cfg_attr(not(feature = "tls"), allow(dead_code))]
    pub(crate) fn is_torn(&self) -> bool {
        self.torn.load(Ordering::SeqCst)
    }

    fn wait(&self, events: libc::c_short, deadline: Instant) -> io::Result<()> {
        let mut p = [libc::pollfd {
            fd: self.fd(),
            events,
            revents: 0,
        }];
        if poll_until(&mut p, deadline)? == 0 {
            return Err(io::ErrorKind::TimedOut.into());
        }
        if p[0].revents & libc::POLLNVAL != 0 {
            return Err(io::ErrorKind::NotConnected.into());
        }
        Ok(())
    }

    /// Writes a header and its payload whole, waiting for room up to
    /// `deadline` (else the collective timeout); a failure after the first byte
    /// marks the link torn.
    pub(crate) fn write_frame(
        &self,
        header: &[u8],
        payload: &[u8],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let mut bufs = [IoSlice::new(header), IoSlice::new(payload)];
        let mut bufs: &mut [IoSlice<'_>] = &mut bufs;
        let mut written = 0usize;
        while !bufs.is_empty() {
            match (&self.stream).write_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => {
                    written += n;
                    IoSlice::advance_slices(&mut bufs, n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let d = deadline.unwrap_or_else(|| Instant::now() + self.timeout);
                    if let Err(e) = self.wait(libc::POLLOUT, d) {
                        if written > 0 {
                            self.mark_torn();
                        }
                        return Err(e);
                    }
                }
                Err(e) => {
                    if written > 0 {
                        self.mark_torn();
                    }
                    return Err(e);
                }
            }
        }
        if payload.len() >= PUSH_BYTES {
            push_now(&self.stream);
        }
        Ok(())
    }

    /// Whether the peer closed its end (a non-consuming look at the socket,
    /// safe beside a thread that reads it).
    pub(crate) fn peer_closed(&self) -> bool {
        let mut b = [0u8; 1];
        // SAFETY: a valid socket and a one-byte buffer.
        let r = unsafe {
            libc::recv(
                self.fd(),
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        r == 0
            || (r < 0 && {
                let e = io::Error::last_os_error().kind();
                e != io::ErrorKind::WouldBlock && e != io::ErrorKind::Interrupted
            })
    }
}

impl Link for TcpLink {
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let _g = self.lock_writes();
        self.write_frame(header, payload, None)
    }

    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool {
        with_lock_until(&self.write_lock, deadline, |_| {
            !self.is_torn() && self.write_frame(header, payload, Some(deadline)).is_ok()
        })
        .unwrap_or(false)
    }

    fn recv_exact(&self, mut buf: &mut [u8]) -> io::Result<()> {
        while !buf.is_empty() {
            match (&self.stream).read(buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(libc::POLLIN, Instant::now() + self.timeout)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn recv_exact_until(&self, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        while !buf.is_empty() {
            match (&self.stream).read(buf) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => buf = &mut buf[n..],
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.wait(libc::POLLIN, deadline)?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    fn finish(&self, _deadline: Instant) {
        let _ = self.stream.shutdown(Shutdown::Write);
    }

    fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn as_tcp(&self) -> Option<&TcpLink> {
        Some(self)
    }
}
