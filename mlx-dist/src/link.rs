//! A link: one ordered, reliable byte stream to a peer that the algorithms use
//! from two threads at once (one sending, one receiving). Transports implement it.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Mutex;
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
    /// Closes both directions, waking any thread blocked on the link.
    fn shutdown(&self);
}

/// A TCP connection.
pub(crate) struct TcpLink {
    stream: TcpStream,
    write_lock: Mutex<()>,
}

impl TcpLink {
    /// Wraps a connected, handshaken stream.
    pub(crate) fn new(stream: TcpStream) -> TcpLink {
        TcpLink {
            stream,
            write_lock: Mutex::new(()),
        }
    }

    fn write_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let mut bufs = [IoSlice::new(header), IoSlice::new(payload)];
        let mut bufs: &mut [IoSlice<'_>] = &mut bufs;
        let mut w = &self.stream;
        while !bufs.is_empty() {
            match w.write_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

impl Link for TcpLink {
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let _g = self.write_lock.lock().unwrap_or_else(|p| p.into_inner());
        self.write_frame(header, payload)
    }

    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool {
        loop {
            if let Ok(_g) = self.write_lock.try_lock() {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = self
                    .stream
                    .set_write_timeout(Some(left.max(Duration::from_millis(1))));
                return self.write_frame(header, payload).is_ok();
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        (&self.stream).read_exact(buf)
    }

    fn shutdown(&self) {
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}
