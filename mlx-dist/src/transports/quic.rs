//! The QUIC transport (cargo feature `quic`): the same mesh and ring
//! algorithms as TCP, each link one bidirectional QUIC stream, all of a peer's
//! links on one connection. TLS 1.3 authenticates both ends with the job's
//! certificate: the launcher creates one self-signed certificate per job and
//! gives every rank its DER and key (`MLX_DIST_QUIC_CERT`, `MLX_DIST_QUIC_KEY`)
//! and its SHA-256 fingerprint (`MLX_DIST_QUIC_FINGERPRINT`); a peer is
//! accepted only if it presents exactly that certificate, so traffic is
//! encrypted and only the job's ranks can join. The HMAC handshake of
//! [`crate::transports::handshake`] then runs on every stream as on TCP.
//!
//! quinn is asynchronous; a small tokio runtime per mesh drives it and the
//! `Link` methods (in `quic_link.rs`) block on it with the collective timeout as deadline, so the
//! collectives run unchanged (on the threaded ring). One more stream per
//! peer is its witness, carrying heartbeats as over TCP (see
//! `crate::mesh::liveness`); QUIC's own idle timeout is twice the liveness
//! timeout, so a silent peer is named by the heartbeats first.

use std::collections::BTreeSet;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use tokio::runtime::Runtime;

use super::Connections;
use crate::config::{Config, QuicCert};
use crate::error::{DistError, Result};
use crate::transports::admission::{ACCEPT_HANDSHAKE_DEADLINE, Admission, Slot};
use crate::transports::handshake::{self, HandshakeError};
use crate::transports::link::Link;
use crate::transports::quic_link::{BlockingStream, Closing, QuicLink, Stream, timed};
use crate::transports::tls::{SERVER_NAME, install_crypto_provider};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

fn tls_configs(
    id: &QuicCert,
    idle: Duration,
    keep_alive: Duration,
) -> std::result::Result<(quinn::ServerConfig, quinn::ClientConfig), String> {
    let (server, client) = crate::transports::tls::rustls_configs(id)?;
    let mut transport = quinn::TransportConfig::default();
    transport
        .max_idle_timeout(Some(idle.try_into().map_err(|e| format!("{e}"))?))
        .keep_alive_interval(Some(keep_alive))
        .stream_receive_window((16u32 << 20).into())
        .receive_window((64u32 << 20).into())
        .send_window(64 << 20);
    let transport = Arc::new(transport);
    let mut sc = quinn::ServerConfig::with_crypto(Arc::new(
        quinn::crypto::rustls::QuicServerConfig::try_from(server).map_err(|e| e.to_string())?,
    ));
    sc.transport_config(transport.clone());
    let mut cc = quinn::ClientConfig::new(Arc::new(
        quinn::crypto::rustls::QuicClientConfig::try_from(client).map_err(|e| e.to_string())?,
    ));
    cc.transport_config(transport);
    Ok((sc, cc))
}

/// The UDP socket buffers asked for (the kernel caps them at
/// `net.core.rmem_max` / `wmem_max`).
const UDP_BUFFER: usize = 8 << 20;

/// The endpoint's UDP socket, bound to `addr`, with [`UDP_BUFFER`]-sized
/// buffers. With the kernel's default (208 KiB) a receiver that is not
/// scheduled for a moment drops datagrams (`UdpRcvbufErrors`): over a
/// 10 Gbit/s link about 1% of them were lost, each loss halving the
/// congestion window, and a 64 MiB all_sum moved 0.1 GB/s.
fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = std::net::UdpSocket::bind(addr)?;
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        let v = UDP_BUFFER as libc::c_int;
        for opt in [libc::SO_RCVBUF, libc::SO_SNDBUF] {
            // SAFETY: a valid socket and a correctly sized option value. A
            // failure leaves the default size, which works, only slower.
            unsafe {
                libc::setsockopt(
                    socket.as_raw_fd(),
                    libc::SOL_SOCKET,
                    opt,
                    (&v as *const libc::c_int).cast(),
                    std::mem::size_of::<libc::c_int>() as libc::socklen_t,
                );
            }
        }
    }
    Ok(socket)
}

fn resolve(addr: &str) -> io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("{addr} resolves to nothing"),
        )
    })
}

fn hs_err(who: String, e: impl std::fmt::Display) -> DistError {
    DistError::Handshake {
        who,
        reason: e.to_string(),
    }
}

/// Connects the full mesh of QUIC links for `cfg`.
pub(crate) fn connect_mesh(cfg: &Config) -> Result<Connections> {
    install_crypto_provider();
    let unavailable = |reason: String| DistError::Unavailable {
        backend: "quic",
        reason,
    };
    let id = cfg.quic.clone().ok_or_else(|| {
        unavailable(
            "no job certificate: start the ranks with `mlx-launch --backend quic` \
             (MLX_DIST_QUIC_CERT, MLX_DIST_QUIC_KEY, MLX_DIST_QUIC_FINGERPRINT)"
                .into(),
        )
    })?;
    let (world, rank) = (cfg.world(), cfg.rank);
    // The data links, then the witness.
    let nlinks = 2 * cfg.connections_per_peer + 1;
    let cred = crate::transports::tcp::credentials(cfg);
    let deadline = Instant::now() + cfg.connect_timeout;
    // The heartbeats name a silent peer after the liveness timeout; QUIC's
    // keep-alives hold the connection open meanwhile, and its idle timeout
    // (twice as long) only ends a connection nobody closed.
    let idle = 2 * cfg.liveness_timeout;
    let keep_alive = crate::config::heartbeat_interval(cfg.liveness_timeout);
    let (server_cfg, client_cfg) = tls_configs(&id, idle, keep_alive).map_err(unavailable)?;
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| unavailable(format!("tokio runtime: {e}")))?,
    );
    let me = &cfg.hosts[rank];
    let addr =
        resolve(me).map_err(|e| DistError::Config(format!("rank {rank} address {me}: {e}")))?;
    let endpoint = {
        let _g = rt.enter();
        // The rank's own address, unless asked for every interface
        // (`MLX_DIST_BIND_ALL`).
        let listen = if cfg.bind_all {
            SocketAddr::new(crate::transports::tcp::unspecified(addr), addr.port())
        } else {
            addr
        };
        udp_socket(listen)
            .and_then(|socket| {
                quinn::Endpoint::new(
                    quinn::EndpointConfig::default(),
                    Some(server_cfg),
                    socket,
                    Arc::new(quinn::TokioRuntime),
                )
            })
            .map_err(|e| {
                DistError::Config(format!("rank {rank} cannot listen (UDP) on {me}: {e}"))
            })?
    };
    let mut endpoint = endpoint;
    endpoint.set_default_client_config(client_cfg);

    let closing = Closing::new(endpoint.clone(), (world - 1) * nlinks);
    let mut links: Vec<Vec<Option<QuicLink>>> = (0..world)
        .map(|_| (0..nlinks).map(|_| None).collect())
        .collect();
    let accepted = std::thread::scope(|s| -> Result<Vec<(usize, usize, QuicLink)>> {
        let acceptor = s.spawn(|| {
            accept_all(
                &rt, &endpoint, &cred, rank, world, nlinks, deadline, cfg, &closing,
            )
        });
        for (peer, row) in links.iter_mut().enumerate().take(rank) {
            let conn = dial(&rt, &endpoint, cfg, peer, deadline)?;
            for (link, slot) in row.iter_mut().enumerate() {
                let who = format!("rank {peer} at {}", cfg.hosts[peer]);
                let (send, recv) = timed(&rt, HANDSHAKE_TIMEOUT, conn.open_bi())
                    .map_err(|_| hs_err(who.clone(), "timed out opening a stream"))?
                    .map_err(|e| hs_err(who.clone(), e))?;
                let mut st = Stream { send, recv };
                let mut b = BlockingStream {
                    rt: &rt,
                    s: &mut st,
                    deadline: Instant::now() + HANDSHAKE_TIMEOUT,
                };
                handshake::client(&mut b, &cred, rank as u32, peer as u32, link as u32)
                    .map_err(|e| hs_err(who.clone(), e))?;
                *slot = Some(QuicLink::new(
                    rt.clone(),
                    conn.clone(),
                    st,
                    cfg.collective_timeout,
                    closing.clone(),
                ));
            }
        }
        acceptor.join().expect("acceptor thread panicked")
    })?;
    for (peer, link, l) in accepted {
        links[peer][link] = Some(l);
    }
    let mut witnesses: Vec<Option<Box<dyn Link>>> = Vec::with_capacity(world);
    let links = links
        .into_iter()
        .enumerate()
        .map(|(p, row)| {
            let mut row: Vec<Box<dyn Link>> = row
                .into_iter()
                .flatten()
                .map(|l| Box::new(l) as Box<dyn Link>)
                .collect();
            witnesses.push(if p == rank { None } else { row.pop() });
            row
        })
        .collect();
    tracing::debug!(rank, world, nlinks, "quic mesh connected");
    Ok(Connections { links, witnesses })
}

/// Whether a QUIC transport error code is a TLS failure (wrong certificate).
fn is_tls_refusal(code: &str) -> bool {
    code.contains("CRYPTO") || code.contains("cryptographic")
}

fn dial(
    rt: &Runtime,
    endpoint: &quinn::Endpoint,
    cfg: &Config,
    peer: usize,
    deadline: Instant,
) -> Result<quinn::Connection> {
    let addr_s = &cfg.hosts[peer];
    let mut backoff = Duration::from_millis(5);
    loop {
        let attempt = (|| -> std::result::Result<quinn::Connection, (bool, String)> {
            let addr = resolve(addr_s).map_err(|e| (false, e.to_string()))?;
            let _g = rt.enter();
            let connecting = endpoint
                .connect(addr, SERVER_NAME)
                .map_err(|e| (true, e.to_string()))?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .clamp(Duration::from_millis(10), Duration::from_secs(2));
            match timed(rt, left, connecting) {
                Err(_) => Err((false, "no answer".into())),
                Ok(Ok(c)) => Ok(c),
                // A TLS refusal (wrong certificate) is final; anything else is retried.
                // (quinn's code displays as "the cryptographic handshake failed: error N".)
                Ok(Err(quinn::ConnectionError::TransportError(e)))
                    if is_tls_refusal(&e.code.to_string()) =>
                {
                    Err((true, e.to_string()))
                }
                Ok(Err(e)) => Err((false, e.to_string())),
            }
        })();
        match attempt {
            Ok(c) => return Ok(c),
            Err((true, e)) => return Err(hs_err(format!("rank {peer} at {addr_s}"), e)),
            Err((false, e)) => {
                if Instant::now() >= deadline {
                    return Err(DistError::ConnectTimeout {
                        peer,
                        addr: addr_s.clone(),
                        timeout: cfg.connect_timeout,
                        last: e,
                    });
                }
                tracing::trace!(rank = cfg.rank, peer, error = %e, "quic connect retry");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
        }
    }
}

/// What an accepted connection's thread hands the acceptor: link `.1` of
/// rank `.0`, authenticated.
type Accepted = (usize, usize, QuicLink);

/// What every accepted connection's thread shares with the acceptor.
#[derive(Clone)]
struct Acceptor {
    rt: Arc<Runtime>,
    cred: handshake::JobCredentials,
    rank: usize,
    nlinks: usize,
    collective_timeout: Duration,
    closing: Arc<Closing>,
    missing: Arc<Mutex<BTreeSet<(usize, usize)>>>,
    admission: Arc<Admission>,
}

/// Accepts the higher ranks' connections until every link of theirs is in,
/// handshaking each connection on a thread of its own under the limits of
/// [`crate::transports::admission`]: a connection stalled in its TLS or
/// HMAC handshake (a flood, a stranger) holds one slot for at most the
/// short authentication deadline and never delays the others.
#[allow(clippy::too_many_arguments)]
fn accept_all(
    rt: &Arc<Runtime>,
    endpoint: &quinn::Endpoint,
    cred: &handshake::JobCredentials,
    rank: usize,
    world: usize,
    nlinks: usize,
    deadline: Instant,
    cfg: &Config,
    closing: &Arc<Closing>,
) -> Result<Vec<(usize, usize, QuicLink)>> {
    let wanted = world.saturating_sub(rank + 1) * nlinks;
    let missing: BTreeSet<(usize, usize)> = (rank + 1..world)
        .flat_map(|p| (0..nlinks).map(move |l| (p, l)))
        .collect();
    let acceptor = Acceptor {
        rt: rt.clone(),
        cred: cred.clone(),
        rank,
        nlinks,
        collective_timeout: cfg.collective_timeout,
        closing: closing.clone(),
        missing: Arc::new(Mutex::new(missing)),
        admission: Admission::new(),
    };
    let (tx, rx) = mpsc::channel();
    let mut out = Vec::new();
    while out.len() < wanted {
        let now = Instant::now();
        if now >= deadline {
            let m = lock(&acceptor.missing);
            let mut m: Vec<usize> = m.iter().map(|(p, _)| *p).collect();
            m.dedup();
            let (turned_away, no_slot) = acceptor.admission.turned_away();
            return Err(DistError::AcceptTimeout {
                rank,
                missing: m,
                timeout: cfg.connect_timeout,
                turned_away,
                no_slot,
            });
        }
        // Short waits, so that the links the threads hand in are collected.
        let wait = (deadline - now).min(Duration::from_millis(20));
        match timed(rt, wait, endpoint.accept()) {
            Ok(Some(incoming)) => {
                let from = incoming.remote_address();
                match acceptor.admission.admit(from.ip()) {
                    // Refused at once: a rank's dialler retries.
                    None => incoming.refuse(),
                    Some(slot) => {
                        let (a, tx) = (acceptor.clone(), tx.clone());
                        let spawned = std::thread::Builder::new()
                            .name("mlx-dist-quic-handshake".into())
                            .spawn(move || serve_connection(&a, incoming, slot, &tx));
                        if let Err(e) = spawned {
                            // The connection went with the closure: its dialler retries.
                            tracing::warn!(rank, %from, error = %e, "no thread for a handshake");
                        }
                    }
                }
            }
            Ok(None) => {
                return Err(DistError::Config(format!(
                    "rank {rank}: the QUIC endpoint closed while accepting"
                )));
            }
            Err(_) => {}
        }
        out.extend(rx.try_iter());
    }
    acceptor.admission.warn_if_turned_away(rank);
    Ok(out)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// One accepted connection: its TLS handshake and its first stream's HMAC
/// handshake within [`ACCEPT_HANDSHAKE_DEADLINE`] (holding `slot` until
/// then), then the rest of the peer's links, each handed to the acceptor
/// over `tx` as it authenticates.
fn serve_connection(
    a: &Acceptor,
    incoming: quinn::Incoming,
    slot: Slot,
    tx: &mpsc::Sender<Accepted>,
) {
    let rank = a.rank;
    let from = incoming.remote_address();
    let mut slot = Some(slot);
    let authenticate_by = Instant::now() + ACCEPT_HANDSHAKE_DEADLINE;
    let conn = match timed(
        &a.rt,
        ACCEPT_HANDSHAKE_DEADLINE,
        async move { incoming.await },
    ) {
        Ok(Ok(c)) => c,
        Ok(Err(e)) => {
            a.admission.refused();
            tracing::warn!(rank, %from, reason = %e, "refused QUIC connection");
            return;
        }
        Err(_) => {
            a.admission.refused();
            tracing::debug!(rank, %from, "QUIC connection dropped: no TLS handshake in time");
            return;
        }
    };
    // Every link of this peer arrives on this connection.
    for _ in 0..a.nlinks {
        let until = match slot {
            Some(_) => authenticate_by,
            None => Instant::now() + HANDSHAKE_TIMEOUT,
        };
        let left = until.saturating_duration_since(Instant::now());
        let (send, recv) = match timed(&a.rt, left, conn.accept_bi()) {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::warn!(rank, %from, reason = %e, "QUIC connection lost during set-up");
                break;
            }
            Err(_) => {
                tracing::warn!(rank, %from, "no stream opened in time");
                break;
            }
        };
        let mut st = Stream { send, recv };
        let mut b = BlockingStream {
            rt: &a.rt,
            s: &mut st,
            deadline: until,
        };
        let mut claimed = None;
        let admit = |h: handshake::PeerHello| {
            let key = (h.rank as usize, h.link as usize);
            if h.rank as usize <= rank || !lock(&a.missing).remove(&key) {
                return Err(HandshakeError::Unexpected {
                    rank: h.rank,
                    link: h.link,
                });
            }
            claimed = Some(key);
            Ok(())
        };
        let r = handshake::server(&mut b, &a.cred, rank as u32, admit);
        if let (Err(_), Some(key)) = (&r, claimed) {
            // The last reply failed: the link is still to come.
            lock(&a.missing).insert(key);
        }
        match r {
            Ok(hello) => {
                // Authenticated: the slot is for strangers-to-be.
                slot = None;
                let link = QuicLink::new(
                    a.rt.clone(),
                    conn.clone(),
                    st,
                    a.collective_timeout,
                    a.closing.clone(),
                );
                let _ = tx.send((hello.rank as usize, hello.link as usize, link));
            }
            Err(e @ HandshakeError::Unexpected { .. }) => {
                tracing::warn!(rank, %from, reason = %e, "refused stream");
            }
            Err(e) => {
                if slot.is_some() {
                    a.admission.refused();
                }
                tracing::warn!(rank, %from, reason = %e, "refused stream");
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transports::tls::test_certificate as job_cert;

    fn free_udp_ports(n: usize) -> Vec<String> {
        let socks: Vec<_> = (0..n)
            .map(|_| std::net::UdpSocket::bind("127.0.0.1:0").unwrap())
            .collect();
        socks
            .iter()
            .map(|s| s.local_addr().unwrap().to_string())
            .collect()
    }

    /// Rank 0 of a real job waits for rank 1; a stranger with `cert` and
    /// `secret` dials it as rank 1. Returns (the stranger's error and how long
    /// it took, rank 0's error).
    fn stranger(cert: QuicCert, secret: &[u8]) -> (DistError, Duration, DistError) {
        let hosts = free_udp_ports(2);
        let mut cfg0 = Config::new(0, hosts.clone(), [5; 16], b"job secret".to_vec());
        cfg0.quic = Some(job_cert());
        cfg0.connect_timeout = Duration::from_secs(4);
        let mut cfg1 = Config::new(1, hosts, [5; 16], secret.to_vec());
        cfg1.quic = Some(cert);
        cfg1.connect_timeout = Duration::from_secs(4);
        let rank0 = std::thread::spawn(move || connect_mesh(&cfg0).map(|_| ()));
        let t = Instant::now();
        let e1 = connect_mesh(&cfg1).map(|_| ()).unwrap_err();
        let took = t.elapsed();
        let e0 = rank0.join().unwrap().unwrap_err();
        (e1, took, e0)
    }

    #[test]
    fn a_stranger_with_another_certificate_is_refused_not_hung() {
        let (e1, took, e0) = stranger(job_cert(), b"job secret");
        // TLS refuses it at once (each side pins the job's fingerprint), and
        // the refusal is final: no retries until the connect deadline.
        assert!(
            matches!(&e1, DistError::Handshake { reason, .. } if reason.contains("certificate")),
            "{e1}"
        );
        assert!(
            took < Duration::from_secs(3),
            "refused after {took:?}: {e1}"
        );
        // The real rank never lets it in and says who is missing.
        assert!(
            matches!(&e0, DistError::AcceptTimeout { missing, .. } if missing == &[1]),
            "{e0}"
        );
    }

    #[test]
    fn a_stranger_with_the_wrong_secret_is_refused_over_quic() {
        // Even with the job's certificate, the HMAC handshake on every stream
        // refuses a peer that does not know the job secret.
        let hosts_cert = job_cert();
        let hosts = free_udp_ports(2);
        let mut cfg0 = Config::new(0, hosts.clone(), [5; 16], b"job secret".to_vec());
        cfg0.quic = Some(hosts_cert.clone());
        cfg0.connect_timeout = Duration::from_secs(4);
        let mut cfg1 = Config::new(1, hosts, [5; 16], b"wrong secret".to_vec());
        cfg1.quic = Some(hosts_cert);
        cfg1.connect_timeout = Duration::from_secs(4);
        let rank0 = std::thread::spawn(move || connect_mesh(&cfg0).map(|_| ()));
        let t = Instant::now();
        let e1 = connect_mesh(&cfg1).map(|_| ()).unwrap_err();
        assert!(matches!(e1, DistError::Handshake { .. }), "{e1}");
        assert!(t.elapsed() < Duration::from_secs(4), "{e1}");
        let e0 = rank0.join().unwrap().unwrap_err();
        assert!(
            matches!(&e0, DistError::AcceptTimeout { missing, .. } if missing == &[1]),
            "{e0}"
        );
    }

    /// `n` QUIC Initial packets, each opening a connection of its own, as a
    /// client of the job (its certificate) sends them: replayed from another
    /// address, each starts a TLS handshake that nobody finishes.
    fn captured_initials(n: usize) -> Vec<Vec<u8>> {
        install_crypto_provider();
        let capture = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        capture
            .set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let to = capture.local_addr().unwrap();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let (_, client) =
            tls_configs(&job_cert(), Duration::from_secs(10), Duration::from_secs(1)).unwrap();
        let mut got = Vec::new();
        let _g = rt.enter();
        let mut ep = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
        ep.set_default_client_config(client);
        let mut connecting = Vec::new();
        let mut buf = [0u8; 2048];
        while got.len() < n {
            connecting.push(ep.connect(to, SERVER_NAME).unwrap());
            match capture.recv(&mut buf) {
                Ok(len) => got.push(buf[..len].to_vec()),
                Err(e) => panic!("no Initial captured: {e}"),
            }
        }
        drop(connecting);
        ep.close(0u32.into(), b"");
        got
    }

    /// Before: the acceptor took one incoming connection at a time and
    /// waited up to 10 s on each TLS handshake, so that a flood of stalled
    /// handshakes (64 sockets of another address, a fresh one every 2 ms)
    /// kept rank 1 out until both ranks failed at the connect timeout.
    #[test]
    fn a_quic_job_forms_under_a_flood_of_stalled_handshakes() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let initials = captured_initials(200);
        let hosts = free_udp_ports(2);
        let cert = job_cert();
        let cfg = |rank| {
            let mut c = Config::new(rank, hosts.clone(), [9; 16], b"job secret".to_vec());
            c.quic = Some(cert.clone());
            c.connect_timeout = Duration::from_secs(30);
            c
        };
        let c0 = cfg(0);
        let rank0 = std::thread::spawn(move || connect_mesh(&c0));
        let target: SocketAddr = hosts[0].parse().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flood = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut sockets = std::collections::VecDeque::new();
                let mut sent = 0usize;
                while !stop.load(Ordering::Relaxed) {
                    // The oldest of the 64 gives way to a fresh one.
                    if sockets.len() == 64 {
                        sockets.pop_front();
                    }
                    let s = std::net::UdpSocket::bind("127.0.0.2:0").unwrap();
                    let _ = s.send_to(&initials[sent % initials.len()], target);
                    sockets.push_back(s);
                    sent += 1;
                    std::thread::sleep(Duration::from_millis(2));
                }
                sent
            })
        };
        // Rank 1 starts 3 s late, into the flood.
        std::thread::sleep(Duration::from_secs(3));
        let t = Instant::now();
        let joined = connect_mesh(&cfg(1));
        let formed = t.elapsed();
        stop.store(true, Ordering::Relaxed);
        let sent = flood.join().unwrap();
        eprintln!("formed {formed:.1?} after rank 1 started; {sent} stalled handshakes begun");
        // Rank 1's links to rank 0 (its own row is empty), then rank 0's.
        let links = |c: Connections| (c.links[0].len(), c.links[1].len());
        assert_eq!(joined.map(links).unwrap(), (2, 0));
        assert_eq!(rank0.join().unwrap().map(links).unwrap(), (0, 2));
    }
}
