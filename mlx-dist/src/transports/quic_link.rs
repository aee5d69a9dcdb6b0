//! A QUIC stream as a [`Link`]: quinn is asynchronous, so each blocking
//! call runs its future on the mesh's small tokio runtime from the calling
//! thread, with the collective timeout (or the caller's deadline) as limit.
//! The connection set-up is in [`crate::transports::quic`].

use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use crate::transports::link::{Link, with_lock_until};
use crate::wire::HEADER_LEN;

/// A QUIC stream as a blocking `Read + Write` (for the handshake and the link).
pub(crate) struct Stream {
    pub(crate) send: quinn::SendStream,
    pub(crate) recv: quinn::RecvStream,
}

pub(crate) struct BlockingStream<'a> {
    pub(crate) rt: &'a Runtime,
    pub(crate) s: &'a mut Stream,
    pub(crate) deadline: Instant,
}

/// Runs `fut` on `rt` from a plain thread, giving up after `d`.
pub(crate) fn timed<F: std::future::Future>(
    rt: &Runtime,
    d: Duration,
    fut: F,
) -> std::result::Result<F::Output, tokio::time::error::Elapsed> {
    let _g = rt.enter();
    rt.block_on(async move { tokio::time::timeout(d, fut).await })
}

fn timed_out() -> io::Error {
    io::ErrorKind::TimedOut.into()
}

impl Read for BlockingStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match timed(self.rt, left, self.s.recv.read(buf)) {
            Err(_) => Err(timed_out()),
            Ok(Ok(Some(n))) => Ok(n),
            Ok(Ok(None)) => Ok(0),
            Ok(Err(e)) => Err(e.into()),
        }
    }
}

impl Write for BlockingStream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        match timed(self.rt, left, self.s.send.write(buf)) {
            Err(_) => Err(timed_out()),
            Ok(r) => r.map_err(io::Error::from),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How long the last link to close waits for its endpoint to send the
/// closes (loopback and LAN peers acknowledge in milliseconds).
const CLOSE_WAIT: Duration = Duration::from_secs(1);

/// The rank's endpoint and its count of links not yet shut down. quinn
/// sends a connection's close from the endpoint's driver, which dies with
/// the process: a rank that exited right after closing left a peer still
/// flushing its own stream to it waiting for acknowledgements until that
/// peer's deadline (the liveness timeout, 5 s; seen in the suite, where a
/// rank then also missed heartbeats). So the last link to shut down waits,
/// briefly, until the endpoint has sent every close.
pub(crate) struct Closing {
    endpoint: quinn::Endpoint,
    open: AtomicUsize,
}

impl Closing {
    /// The closing of `links` links on `endpoint`.
    pub(crate) fn new(endpoint: quinn::Endpoint, links: usize) -> Arc<Closing> {
        Arc::new(Closing {
            endpoint,
            open: AtomicUsize::new(links),
        })
    }
}

/// One link: a bidirectional QUIC stream.
pub(crate) struct QuicLink {
    rt: Arc<Runtime>,
    conn: quinn::Connection,
    send: Mutex<quinn::SendStream>,
    recv: Mutex<quinn::RecvStream>,
    /// The collective timeout: the default deadline of every wait.
    timeout: Duration,
    closing: Arc<Closing>,
    /// Shut down already (a failure closes the data links first, then
    /// every link).
    closed: AtomicBool,
}

impl QuicLink {
    /// The link over `stream` of `conn`, one of the links `closing` counts.
    pub(crate) fn new(
        rt: Arc<Runtime>,
        conn: quinn::Connection,
        stream: Stream,
        timeout: Duration,
        closing: Arc<Closing>,
    ) -> QuicLink {
        QuicLink {
            rt,
            conn,
            send: Mutex::new(stream.send),
            recv: Mutex::new(stream.recv),
            timeout,
            closing,
            closed: AtomicBool::new(false),
        }
    }

    fn write(
        &self,
        s: &mut quinn::SendStream,
        parts: [&[u8]; 2],
        deadline: Instant,
    ) -> io::Result<()> {
        let left = deadline.saturating_duration_since(Instant::now());
        let fut = async {
            for p in parts {
                s.write_all(p).await?;
            }
            Ok::<(), quinn::WriteError>(())
        };
        match timed(&self.rt, left, fut) {
            Err(_) => Err(timed_out()),
            Ok(r) => r.map_err(io::Error::from),
        }
    }
}

impl Link for QuicLink {
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let mut s = self.send.lock().unwrap_or_else(|p| p.into_inner());
        self.write(&mut s, [header, payload], Instant::now() + self.timeout)
    }

    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool {
        with_lock_until(&self.send, deadline, |s| {
            self.write(s, [header, payload], deadline).is_ok()
        })
        .unwrap_or(false)
    }

    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        self.recv_exact_until(buf, Instant::now() + self.timeout)
    }

    fn recv_exact_until(&self, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        let mut r = self.recv.lock().unwrap_or_else(|p| p.into_inner());
        let left = deadline.saturating_duration_since(Instant::now());
        match timed(&self.rt, left, r.read_exact(buf)) {
            Err(_) => Err(timed_out()),
            Ok(Ok(())) => Ok(()),
            Ok(Err(quinn::ReadExactError::FinishedEarly(_))) => {
                Err(io::ErrorKind::UnexpectedEof.into())
            }
            Ok(Err(quinn::ReadExactError::ReadError(e))) => Err(e.into()),
        }
    }

    fn finish(&self, deadline: Instant) {
        // quinn keeps unsent data in this process: wait until the peer has
        // acknowledged all of it (or stopped the stream), so that closing
        // the connection or exiting loses nothing.
        with_lock_until(&self.send, deadline, |s| {
            if s.finish().is_ok() {
                let left = deadline.saturating_duration_since(Instant::now());
                let _ = timed(&self.rt, left, s.stopped());
            }
        });
    }

    fn shutdown(&self) {
        self.conn.close(1u32.into(), b"mlx-dist: closed");
        if !self.closed.swap(true, Ordering::SeqCst)
            && self.closing.open.fetch_sub(1, Ordering::SeqCst) == 1
        {
            let _ = timed(&self.rt, CLOSE_WAIT, self.closing.endpoint.wait_idle());
        }
    }
}
