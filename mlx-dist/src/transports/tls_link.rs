//! The ring over TLS 1.3 (`Backend::Tls`): every TCP connection of the mesh
//! (data links and witnesses) carries a rustls session authenticated by the
//! job's certificate (see [`crate::transports::tls`]), after the HMAC handshake that
//! names the rank and link in the clear (it reveals no secret).
//!
//! Why not QUIC for encryption: QUIC moves every datagram through user space
//! (about 1,450 bytes each), while TLS over TCP keeps the kernel's
//! segmentation offloads and costs one AES-GCM pass per byte; on emulated
//! 10 Gbit/s links it reached several times QUIC's bandwidth (BENCHMARKS.md).
//!
//! A link is used by two threads at once, one sending and one receiving
//! (the threaded ring), while a rustls connection is one object for both
//! directions. The session sits behind a mutex that is held only while
//! rustls encrypts or decrypts, never across a socket wait: the sender
//! encrypts a chunk into a buffer of its own and writes it unlocked; the
//! receiver reads ciphertext unlocked and hands it to rustls. rustls
//! renews the traffic keys (KeyUpdate) before AES-GCM's limit on records.

use std::io::{self, Read};
use std::net::TcpStream;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::transports::link::{Link, TcpLink, with_lock_until};
use crate::wire::HEADER_LEN;

/// Plaintext encrypted per lock of the session: large enough to amortise
/// the locking, small enough to keep the receiver's waits short.
const CHUNK: usize = 256 << 10;

/// Ciphertext read from the socket per system call.
const READ_BUF: usize = 256 << 10;

/// One TCP link wrapped in TLS 1.3.
pub(crate) struct TlsLink {
    tcp: TcpLink,
    session: Mutex<rustls::Connection>,
    /// Serialises senders: a frame's records are written whole.
    sending: Mutex<Vec<u8>>,
    /// Serialises receivers; holds ciphertext read but not yet given to rustls.
    receiving: Mutex<Pending>,
    /// The collective timeout: the default deadline of every wait.
    timeout: Duration,
}

#[derive(Default)]
struct Pending {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

fn tls_error(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

/// Runs the TLS 1.3 handshake on `stream` (blocking, within the stream's
/// timeouts) as the client (the rank that dialled) or the server.
pub(crate) fn handshake(
    mut stream: TcpStream,
    client: bool,
    configs: &(Arc<rustls::ServerConfig>, Arc<rustls::ClientConfig>),
) -> io::Result<(TcpStream, rustls::Connection)> {
    let mut conn: rustls::Connection = if client {
        let name = rustls::pki_types::ServerName::try_from(crate::transports::tls::SERVER_NAME)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
        rustls::ClientConnection::new(configs.1.clone(), name)
            .map_err(tls_error)?
            .into()
    } else {
        rustls::ServerConnection::new(configs.0.clone())
            .map_err(tls_error)?
            .into()
    };
    while conn.is_handshaking() {
        conn.complete_io(&mut stream)?;
    }
    // The client's last flight (its certificate and Finished) may still be queued.
    while conn.wants_write() {
        conn.write_tls(&mut stream)?;
    }
    conn.set_buffer_limit(None);
    Ok((stream, conn))
}

impl TlsLink {
    /// Wraps a stream whose TLS handshake is done (socket buffers of
    /// `buffer` bytes, 0: the kernel's); every wait on it is bounded by `timeout`.
    pub(crate) fn new(
        stream: TcpStream,
        session: rustls::Connection,
        timeout: Duration,
        buffer: usize,
    ) -> io::Result<TlsLink> {
        Ok(TlsLink {
            tcp: TcpLink::new(stream, timeout, buffer)?,
            session: Mutex::new(session),
            sending: Mutex::new(Vec::new()),
            receiving: Mutex::new(Pending::default()),
            timeout,
        })
    }

    fn session(&self) -> MutexGuard<'_, rustls::Connection> {
        self.session.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Encrypts `parts` chunk by chunk into `out` and writes each chunk's
    /// records to the socket (the session unlocked meanwhile).
    fn write_encrypted(
        &self,
        out: &mut Vec<u8>,
        parts: [&[u8]; 2],
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        use std::io::Write;
        let mut written = false;
        let mut pending: &[u8] = &[];
        let mut rest = parts.into_iter().filter(|p| !p.is_empty());
        loop {
            out.clear();
            {
                let mut s = self.session();
                let mut room = CHUNK;
                while room > 0 {
                    if pending.is_empty() {
                        match rest.next() {
                            Some(p) => pending = p,
                            None => break,
                        }
                    }
                    let n = pending.len().min(room);
                    s.writer().write_all(&pending[..n])?;
                    pending = &pending[n..];
                    room -= n;
                }
                while s.wants_write() {
                    s.write_tls(out)?;
                }
            }
            if out.is_empty() {
                return Ok(());
            }
            if let Err(e) = self.tcp.write_frame(&[], out, deadline) {
                if written {
                    self.tcp.mark_torn();
                }
                return Err(e);
            }
            written = true;
        }
    }

    fn send(&self, header: &[u8], payload: &[u8], deadline: Option<Instant>) -> io::Result<()> {
        let mut out = self.sending.lock().unwrap_or_else(|p| p.into_inner());
        self.write_encrypted(&mut out, [header, payload], deadline)
    }

    fn recv(&self, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        let mut p = self.receiving.lock().unwrap_or_else(|p| p.into_inner());
        if p.buf.is_empty() {
            p.buf = vec![0; READ_BUF];
        }
        while !buf.is_empty() {
            // Plaintext rustls already holds, then ciphertext already read.
            let mut eof = false;
            {
                let mut s = self.session();
                loop {
                    match s.reader().read(buf) {
                        Ok(0) => {
                            eof = true;
                            break;
                        }
                        Ok(n) => buf = &mut buf[n..],
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e),
                    }
                    if buf.is_empty() || p.start == p.end {
                        break;
                    }
                    let (start, end) = (p.start, p.end);
                    let n = s.read_tls(&mut &p.buf[start..end])?;
                    p.start += n;
                    s.process_new_packets().map_err(tls_error)?;
                }
            }
            if eof {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            if buf.is_empty() {
                break;
            }
            // Nothing left: read more ciphertext, the session unlocked.
            p.start = 0;
            p.end = 0;
            let n = loop {
                match self.tcp.try_read(&mut p.buf) {
                    Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                    Ok(n) => break n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        self.tcp.wait_readable(deadline)?;
                    }
                    Err(e) => return Err(e),
                }
            };
            p.end = n;
        }
        Ok(())
    }
}

impl Link for TlsLink {
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        self.send(header, payload, None)
    }

    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool {
        with_lock_until(&self.sending, deadline, |out| {
            !self.tcp.is_torn()
                && self
                    .write_encrypted(out, [header, payload], Some(deadline))
                    .is_ok()
        })
        .unwrap_or(false)
    }

    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        self.recv(buf, Instant::now() + self.timeout)
    }

    fn recv_exact_until(&self, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        self.recv(buf, deadline)
    }

    fn finish(&self, deadline: Instant) {
        with_lock_until(&self.sending, deadline, |out| {
            out.clear();
            let mut s = self.session();
            s.send_close_notify();
            while s.wants_write() {
                if s.write_tls(&mut *out).is_err() {
                    break;
                }
            }
            drop(s);
            let _ = self.tcp.write_frame(&[], out, Some(deadline));
        });
        self.tcp.finish(deadline);
    }

    fn shutdown(&self) {
        self.tcp.shutdown();
    }
}

/// The mesh's streams (data links per peer, and each peer's witness), each
/// after a TLS handshake with the job's certificate, as links. The rank
/// that dialled a connection (the higher one) is its TLS client. The
/// handshakes run at once, one thread per connection.
#[allow(clippy::type_complexity)]
pub(crate) fn wrap_mesh(
    cfg: &crate::config::Config,
    streams: Vec<Vec<TcpStream>>,
    witnesses: Vec<Option<TcpStream>>,
) -> crate::error::Result<(Vec<Vec<Box<dyn Link>>>, Vec<Option<Box<dyn Link>>>)> {
    use crate::error::DistError;
    let id = cfg.quic.as_ref().ok_or_else(|| DistError::Unavailable {
        backend: "tls",
        reason: "no job certificate: start the ranks with `mlx-launch --backend tls` \
                 (MLX_DIST_QUIC_CERT, MLX_DIST_QUIC_KEY, MLX_DIST_QUIC_FINGERPRINT)"
            .into(),
    })?;
    crate::transports::tls::install_crypto_provider();
    let (server, client) =
        crate::transports::tls::rustls_configs(id).map_err(|reason| DistError::Unavailable {
            backend: "tls",
            reason,
        })?;
    let configs = (Arc::new(server), Arc::new(client));
    let rank = cfg.rank;
    let timeout = cfg.collective_timeout;
    let wrap = |peer: usize, st: TcpStream| -> crate::error::Result<Box<dyn Link>> {
        let (st, session) =
            handshake(st, peer < rank, &configs).map_err(|e| DistError::Handshake {
                who: format!("rank {peer} at {}", cfg.hosts[peer]),
                reason: format!("TLS: {e}"),
            })?;
        let link = TlsLink::new(st, session, timeout, cfg.socket_buffer)
            .map_err(|e| DistError::Config(format!("socket options: {e}")))?;
        Ok(Box::new(link))
    };
    std::thread::scope(|s| {
        let links: Vec<Vec<_>> = streams
            .into_iter()
            .enumerate()
            .map(|(peer, row)| {
                row.into_iter()
                    .map(|st| s.spawn(move || wrap(peer, st)))
                    .collect()
            })
            .collect();
        let wit: Vec<_> = witnesses
            .into_iter()
            .enumerate()
            .map(|(peer, st)| st.map(|st| s.spawn(move || wrap(peer, st))))
            .collect();
        let join = |h: std::thread::ScopedJoinHandle<'_, _>| {
            h.join().expect("TLS handshake thread panicked")
        };
        let links = links
            .into_iter()
            .map(|row| row.into_iter().map(join).collect())
            .collect::<crate::error::Result<_>>()?;
        let wit = wit
            .into_iter()
            .map(|h| h.map(join).transpose())
            .collect::<crate::error::Result<_>>()?;
        Ok((links, wit))
    })
}

#[cfg(test)]
mod tests {
    use std::net::{TcpListener, TcpStream};
    use std::sync::{Arc, Mutex};

    use crate::config::Config;
    use crate::error::DistError;
    use crate::inproc_tests::with_world_on;
    use crate::transports::tls::test_certificate as job_cert;

    /// Copies `from` to `to`, appending every byte to `seen`.
    fn pump(mut from: TcpStream, mut to: TcpStream, seen: Arc<Mutex<Vec<u8>>>) {
        use std::io::{Read, Write};
        let mut buf = vec![0u8; 64 << 10];
        loop {
            match from.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    seen.lock().unwrap().extend_from_slice(&buf[..n]);
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = to.shutdown(std::net::Shutdown::Write);
    }

    /// Runs an all_sum at world 2 with rank 1 reaching rank 0 through a
    /// proxy that records the bytes both ways; returns the sums and the bytes.
    fn all_sum_through_a_proxy(encrypted: bool, value: f32) -> (Vec<Vec<f32>>, Vec<u8>) {
        let proxy = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy_addr = proxy.local_addr().unwrap().to_string();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let cert = job_cert();
        let seen2 = seen.clone();
        let sums = with_world_on(
            2,
            encrypted,
            move |hosts| {
                let target = hosts[0].clone();
                std::thread::spawn(move || {
                    for c in proxy.incoming() {
                        let Ok(c) = c else { break };
                        let Ok(up) = TcpStream::connect(&target) else {
                            break;
                        };
                        let (c2, up2) = (c.try_clone().unwrap(), up.try_clone().unwrap());
                        let (s1, s2) = (seen2.clone(), seen2.clone());
                        std::thread::spawn(move || pump(c, up, s1));
                        std::thread::spawn(move || pump(up2, c2, s2));
                    }
                });
            },
            |c: &mut Config| {
                c.quic = Some(cert.clone());
                c.shared_memory = false;
                if c.rank == 1 {
                    c.hosts[0] = proxy_addr.clone();
                }
            },
            |g| {
                let mut x = vec![value * (g.rank() + 1) as f32; 100_000];
                g.all_sum(&mut x).unwrap();
                x
            },
        );
        let bytes = seen.lock().unwrap().clone();
        (sums, bytes)
    }

    fn contains(hay: &[u8], needle: &[u8]) -> bool {
        hay.windows(needle.len()).any(|w| w == needle)
    }

    #[test]
    fn the_wire_carries_no_plaintext_and_the_sums_are_right() {
        let v = 1234.5678f32;
        // Four of rank 0's values in a row, as its chunk crosses the wire.
        let needle: Vec<u8> = [v; 4].iter().flat_map(|x| x.to_le_bytes()).collect();
        let (plain_sums, plain) = all_sum_through_a_proxy(false, v);
        assert!(
            contains(&plain, &needle),
            "the control run must show the values in the clear"
        );
        let (sums, wire) = all_sum_through_a_proxy(true, v);
        assert!(wire.len() > 400_000, "only {} bytes crossed", wire.len());
        assert!(!contains(&wire, &needle), "plaintext on the wire");
        for s in sums.iter().chain(&plain_sums) {
            assert!(s.iter().all(|&x| x == v + 2.0 * v), "wrong sum");
        }
    }

    #[test]
    fn a_stranger_with_another_certificate_is_refused() {
        let listeners: Vec<TcpListener> = (0..2)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let hosts: Vec<String> = listeners
            .iter()
            .map(|l| l.local_addr().unwrap().to_string())
            .collect();
        let errors: Vec<DistError> = std::thread::scope(|s| {
            let hs: Vec<_> = listeners
                .into_iter()
                .enumerate()
                .map(|(r, l)| {
                    let mut cfg = Config::new(r, hosts.clone(), [5; 16], b"job secret".to_vec());
                    // Each side has a certificate of its own: neither is the other's job.
                    cfg.quic = Some(job_cert());
                    cfg.connect_timeout = std::time::Duration::from_secs(4);
                    s.spawn(move || crate::transports::tcp::connect_mesh(&cfg, l, true).map(|_| ()))
                })
                .collect();
            hs.into_iter()
                .map(|h| h.join().unwrap().unwrap_err())
                .collect()
        });
        for (r, e) in errors.iter().enumerate() {
            let peer = 1 - r;
            assert!(
                matches!(e, DistError::Handshake { who, reason }
                    if who.starts_with(&format!("rank {peer}")) && reason.contains("TLS")),
                "rank {r}: {e}"
            );
        }
    }

    #[test]
    fn without_a_certificate_the_error_says_how_to_get_one() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let a = l.local_addr().unwrap().to_string();
        let mut cfg = Config::new(0, vec![a.clone(), a], [5; 16], b"s".to_vec());
        cfg.connect_timeout = std::time::Duration::from_millis(200);
        let e = crate::transports::tls_link::wrap_mesh(&cfg, vec![], vec![])
            .map(|_| ())
            .unwrap_err();
        assert!(e.to_string().contains("--backend tls"), "{e}");
    }
}
