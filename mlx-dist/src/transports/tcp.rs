//! Building the full mesh of TCP links: every pair of ranks gets
//! `2 * connections_per_peer` handshaken connections (one set per ring
//! direction) and one more, the pair's witness (heartbeats and the news of
//! failures and goodbyes, see [`crate::mesh::liveness`]).
//! The higher rank dials the lower one, retrying with backoff up to the
//! connect deadline; the lower rank accepts, refusing strangers with a logged reason.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::Connections;
use crate::config::Config;
use crate::error::{DistError, Result};
use crate::transports::admission::{ACCEPT_HANDSHAKE_DEADLINE, Admission, Slot};
use crate::transports::handshake::{self, HandshakeError, JobCredentials, PeerHello};
use crate::transports::link::{Link, TcpLink};
use crate::transports::shm::{self, ShmLink};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The credentials every connection of this job must show.
pub(crate) fn credentials(cfg: &Config) -> JobCredentials {
    JobCredentials {
        job_id: cfg.job_id,
        secret: cfg.secret.clone(),
        world: cfg.world() as u32,
        // The data links, then the witness.
        links: (2 * cfg.connections_per_peer + 1) as u32,
    }
}

fn resolve(addr: &str) -> std::io::Result<SocketAddr> {
    addr.to_socket_addrs()?.next().ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{addr} resolves to nothing"),
        )
    })
}

/// The sockets a rank accepts its peers' connections on.
pub(crate) struct Listeners(Vec<TcpListener>);

impl From<TcpListener> for Listeners {
    fn from(l: TcpListener) -> Listeners {
        Listeners(vec![l])
    }
}

/// The unspecified address (every interface) of `addr`'s family.
pub(crate) fn unspecified(addr: SocketAddr) -> std::net::IpAddr {
    if addr.is_ipv6() {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    }
}

/// Binds this rank's listening addresses: the address the host list names
/// for it, and each further one it lists, so that ranks on other networks
/// cannot reach it; every interface only when asked (`MLX_DIST_BIND_ALL`).
pub(crate) fn bind(cfg: &Config) -> Result<Listeners> {
    let me = &cfg.hosts[cfg.rank];
    let cant = |addr: &str, e: std::io::Error| {
        DistError::Config(format!(
            "rank {} cannot listen on {addr}: {e} (the host list must name an address of this host; {}=1 listens on every interface)",
            cfg.rank,
            crate::config::ENV_BIND_ALL
        ))
    };
    let addr = resolve(me)
        .map_err(|e| DistError::Config(format!("rank {} address {me}: {e}", cfg.rank)))?;
    if cfg.bind_all {
        let any = SocketAddr::new(unspecified(addr), addr.port());
        return Ok(TcpListener::bind(any).map_err(|e| cant(me, e))?.into());
    }
    let mut bound = vec![addr];
    let mut listeners = vec![TcpListener::bind(addr).map_err(|e| cant(me, e))?];
    for other in cfg.extra_addresses.get(cfg.rank).into_iter().flatten() {
        let a = resolve(other)
            .map_err(|e| DistError::Config(format!("rank {} address {other}: {e}", cfg.rank)))?;
        if !bound.contains(&a) {
            listeners.push(TcpListener::bind(a).map_err(|e| cant(other, e))?);
            bound.push(a);
        }
    }
    Ok(Listeners(listeners))
}

/// The address link `link` to `peer` dials: data links take the peer's
/// addresses in turn (one network interface each), the witness (the last
/// link) its first.
fn address_of(cfg: &Config, peer: usize, link: usize) -> &str {
    let extra = cfg.extra_addresses.get(peer).map_or(&[][..], |e| &e[..]);
    let witness = link == 2 * cfg.connections_per_peer;
    match link % (extra.len() + 1) {
        0 => &cfg.hosts[peer],
        _ if witness => &cfg.hosts[peer],
        i => &extra[i - 1],
    }
}

fn tune(s: &TcpStream, timeout: Duration) -> std::io::Result<()> {
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))
}

/// Connects the full mesh for `cfg` and returns its connections; with `encrypted`, every
/// connection carries TLS 1.3 with the job's certificate (and shared memory
/// is not used).
pub(crate) fn connect_mesh(
    cfg: &Config,
    listeners: impl Into<Listeners>,
    encrypted: bool,
) -> Result<Connections> {
    let listeners = listeners.into();
    let world = cfg.world();
    let rank = cfg.rank;
    let nlinks = 2 * cfg.connections_per_peer + 1;
    let cred = credentials(cfg);
    let deadline = Instant::now() + cfg.connect_timeout;
    let mut slots: Vec<Vec<Option<TcpStream>>> = (0..world)
        .map(|_| (0..nlinks).map(|_| None).collect())
        .collect();

    std::thread::scope(|s| -> Result<()> {
        let cred2 = cred.clone();
        let acceptor = s.spawn(move || {
            accept_all(
                &listeners.0,
                &cred2,
                rank,
                world,
                nlinks,
                deadline,
                cfg.connect_timeout,
            )
        });
        let mut dialled = Vec::new();
        for peer in 0..rank {
            for link in 0..nlinks {
                dialled.push((peer, link, dial(cfg, &cred, peer, link, deadline)?));
            }
        }
        let accepted = acceptor.join().expect("acceptor thread panicked")?;
        for (peer, link, st) in dialled.into_iter().chain(accepted) {
            slots[peer][link] = Some(st);
        }
        Ok(())
    })?;

    // Every row but our own: the data links, then the witness.
    let mut streams: Vec<Vec<TcpStream>> = slots
        .into_iter()
        .map(|row| row.into_iter().flatten().collect())
        .collect();
    let witness_streams: Vec<Option<TcpStream>> = streams.iter_mut().map(|row| row.pop()).collect();
    // A peer may finish connecting to the others later than we do: wait for
    // its side of the negotiation as long as for a connection.
    for st in streams.iter().flatten() {
        tune(st, cfg.connect_timeout)
            .map_err(|e| DistError::Config(format!("socket options: {e}")))?;
    }
    if encrypted {
        return encrypted_mesh(cfg, streams, witness_streams);
    }
    let segments = shm::negotiate(rank, &mut streams, cfg.shared_memory)
        .map_err(|e| DistError::Config(format!("setting up shared memory with {e}")))?;
    let link = |st: TcpStream| {
        TcpLink::new(st, cfg.collective_timeout, cfg.socket_buffer)
            .map_err(|e| DistError::Config(format!("socket options: {e}")))
    };
    let mut links: Vec<Vec<Box<dyn Link>>> = Vec::with_capacity(world);
    let mut shared = 0;
    for (peer, (row, segs)) in streams.into_iter().zip(segments).enumerate() {
        let mut v: Vec<Box<dyn Link>> = Vec::new();
        for (st, seg) in row.into_iter().zip(segs) {
            let tcp = link(st)?;
            v.push(match seg {
                Some(seg) => {
                    shared += 1;
                    Box::new(ShmLink::new(tcp, seg, rank < peer, cfg.collective_timeout))
                }
                None => Box::new(tcp),
            });
        }
        links.push(v);
    }
    let mut witnesses: Vec<Option<Box<dyn Link>>> = Vec::with_capacity(world);
    for st in witness_streams {
        witnesses.push(match st {
            Some(st) => Some(Box::new(link(st)?)),
            None => None,
        });
    }
    tracing::debug!(rank, world, nlinks, shared, "mesh connected");
    Ok(Connections { links, witnesses })
}

#[cfg(feature = "tls")]
fn encrypted_mesh(
    cfg: &Config,
    streams: Vec<Vec<TcpStream>>,
    witnesses: Vec<Option<TcpStream>>,
) -> Result<Connections> {
    let (links, witnesses) = crate::transports::tls_link::wrap_mesh(cfg, streams, witnesses)?;
    tracing::debug!(rank = cfg.rank, world = cfg.world(), "tls mesh connected");
    Ok(Connections { links, witnesses })
}

#[cfg(not(feature = "tls"))]
fn encrypted_mesh(
    _: &Config,
    _: Vec<Vec<TcpStream>>,
    _: Vec<Option<TcpStream>>,
) -> Result<Connections> {
    Err(DistError::Unavailable {
        backend: "tls",
        reason: "this build has no TLS (build mlx-dist with the feature `tls`)".into(),
    })
}

fn dial(
    cfg: &Config,
    cred: &JobCredentials,
    peer: usize,
    link: usize,
    deadline: Instant,
) -> Result<TcpStream> {
    let addr_s = address_of(cfg, peer, link);
    let mut backoff = Duration::from_millis(5);
    loop {
        let attempt = (|| -> std::result::Result<TcpStream, String> {
            let addr = resolve(addr_s).map_err(|e| e.to_string())?;
            let left = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(10));
            let mut st = TcpStream::connect_timeout(&addr, left.min(Duration::from_secs(5)))
                .map_err(|e| e.to_string())?;
            tune(&st, HANDSHAKE_TIMEOUT).map_err(|e| e.to_string())?;
            match handshake::client(&mut st, cred, cfg.rank as u32, peer as u32, link as u32) {
                Ok(()) => Ok(st),
                Err(e @ (HandshakeError::Io(_) | HandshakeError::Refused(_)))
                    if is_transient(&e) =>
                {
                    Err(e.to_string())
                }
                Err(e) => Err(format!("FATAL:{e}")),
            }
        })();
        match attempt {
            Ok(st) => return Ok(st),
            Err(e) if e.starts_with("FATAL:") => {
                return Err(DistError::Handshake {
                    who: format!("rank {peer} at {addr_s}"),
                    reason: e["FATAL:".len()..].to_string(),
                });
            }
            Err(e) => {
                if Instant::now() >= deadline {
                    return Err(DistError::ConnectTimeout {
                        peer,
                        addr: addr_s.to_string(),
                        timeout: cfg.connect_timeout,
                        last: e,
                    });
                }
                tracing::trace!(rank = cfg.rank, peer, error = %e, "connect retry");
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_millis(250));
            }
        }
    }
}

fn is_transient(e: &HandshakeError) -> bool {
    // A closed connection during the handshake (peer restarting its listener) is retried;
    // an explicit refusal never is.
    matches!(e, HandshakeError::Io(_))
}

/// A stream whose reads and writes all end by `until`: a per-call timeout
/// alone would let a peer sending a byte at a time hold it for ever.
struct Deadlined {
    stream: TcpStream,
    until: Instant,
}

impl Deadlined {
    fn left(&self) -> std::io::Result<Duration> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "handshake deadline passed",
            ));
        }
        Ok(left)
    }
}

impl std::io::Read for Deadlined {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.stream.set_read_timeout(Some(self.left()?))?;
        self.stream.read(buf)
    }
}

impl std::io::Write for Deadlined {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.stream.set_write_timeout(Some(self.left()?))?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.stream.flush()
    }
}

/// The server side of one accepted connection: handshakes it, claiming its
/// link in `missing` (a link already claimed is refused as a duplicate, and
/// the client told so); gives the claim back if the last reply fails.
fn serve_one(
    st: TcpStream,
    cred: &JobCredentials,
    rank: usize,
    missing: &std::sync::Mutex<BTreeSet<(usize, usize)>>,
) -> std::result::Result<(PeerHello, TcpStream), HandshakeError> {
    st.set_nonblocking(false)?;
    st.set_nodelay(true)?;
    let mut d = Deadlined {
        stream: st,
        until: Instant::now() + ACCEPT_HANDSHAKE_DEADLINE,
    };
    let mut claimed = None;
    let admit = |h: PeerHello| {
        let key = (h.rank as usize, h.link as usize);
        let mut m = missing.lock().unwrap_or_else(|p| p.into_inner());
        if h.rank as usize <= rank || !m.remove(&key) {
            return Err(HandshakeError::Unexpected {
                rank: h.rank,
                link: h.link,
            });
        }
        claimed = Some(key);
        Ok(())
    };
    let r = handshake::server(&mut d, cred, rank as u32, admit);
    if r.is_err()
        && let Some(key) = claimed
    {
        missing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key);
    }
    Ok((r?, d.stream))
}

fn accept_all(
    listeners: &[TcpListener],
    cred: &JobCredentials,
    rank: usize,
    world: usize,
    nlinks: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<(usize, usize, TcpStream)>> {
    let wanted = world.saturating_sub(rank + 1) * nlinks;
    let missing: BTreeSet<(usize, usize)> = (rank + 1..world)
        .flat_map(|p| (0..nlinks).map(move |l| (p, l)))
        .collect();
    let missing = std::sync::Arc::new(std::sync::Mutex::new(missing));
    let mut out = Vec::new();
    if wanted == 0 {
        return Ok(out);
    }
    for listener in listeners {
        listener
            .set_nonblocking(true)
            .map_err(|e| DistError::Config(format!("listener: {e}")))?;
    }
    let admission = Admission::new();
    let (tx, rx) = mpsc::channel::<(SocketAddr, Slot, _)>();
    while out.len() < wanted {
        for listener in listeners {
            loop {
                let (st, from) = match listener.accept() {
                    Ok(c) => c,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) => {
                        tracing::warn!(rank, error = %e, "accept failed");
                        break;
                    }
                };
                // Beyond the limits the connection is closed at once.
                let Some(slot) = admission.admit(from.ip()) else {
                    tracing::trace!(rank, %from, "closed a connection: no handshake slot for it");
                    continue;
                };
                let (tx, cred, missing) = (tx.clone(), cred.clone(), missing.clone());
                let spawned = std::thread::Builder::new()
                    .name("mlx-dist-handshake".into())
                    .spawn(move || {
                        let _ = tx.send((from, slot, serve_one(st, &cred, rank, &missing)));
                    });
                // Without a thread the connection and its slot went with the
                // closure: its dialler retries.
                if let Err(e) = spawned {
                    tracing::warn!(rank, %from, error = %e, "no thread for a handshake");
                }
            }
        }
        while let Ok((from, slot, r)) = rx.try_recv() {
            drop(slot);
            match r {
                Ok((hello, st)) => out.push((hello.rank as usize, hello.link as usize, st)),
                Err(e) => {
                    admission.refused();
                    // An idle or closed connection is a flood's; a stranger
                    // speaking our protocol is worth a warning.
                    if matches!(e, HandshakeError::Io(_)) {
                        tracing::debug!(rank, %from, reason = %e, "dropped connection");
                    } else {
                        tracing::warn!(rank, %from, reason = %e, "refused connection");
                    }
                }
            }
        }
        if out.len() < wanted && Instant::now() >= deadline {
            let m = missing.lock().unwrap_or_else(|p| p.into_inner());
            let mut m: Vec<usize> = m.iter().map(|(p, _)| *p).collect();
            m.dedup();
            let (turned_away, no_slot) = admission.turned_away();
            return Err(DistError::AcceptTimeout {
                rank,
                missing: m,
                timeout,
                turned_away,
                no_slot,
            });
        }
        // Start-up only: a short sleep between polls of the non-blocking listener.
        let busy = admission.pending() > 0;
        std::thread::sleep(Duration::from_millis(if busy { 1 } else { 3 }));
    }
    admission.warn_if_turned_away(rank);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    #[test]
    fn a_rank_listens_on_its_own_address_unless_asked_for_all() {
        let port = free_port();
        let hosts = vec![format!("127.0.0.1:{port}"), "127.0.0.1:1".to_string()];
        let mut cfg = Config::new(0, hosts, [1; 16], vec![7; 32]);
        let l = bind(&cfg).unwrap();
        assert_eq!(l.0.len(), 1);
        assert_eq!(
            l.0[0].local_addr().unwrap(),
            format!("127.0.0.1:{port}").parse().unwrap()
        );
        // Another loopback address of this host does not reach it.
        assert!(TcpStream::connect(("127.0.0.2", port)).is_err());
        drop(l);
        cfg.bind_all = true;
        let l = bind(&cfg).unwrap();
        assert!(l.0[0].local_addr().unwrap().ip().is_unspecified());
        drop(l);
        // An address that is not this host's is an error, not all interfaces.
        cfg.bind_all = false;
        cfg.hosts[0] = format!("192.0.2.1:{port}");
        let e = bind(&cfg).err().expect("192.0.2.1 is not ours").to_string();
        assert!(
            e.contains("192.0.2.1") && e.contains("MLX_DIST_BIND_ALL"),
            "{e}"
        );
        // Several addresses: one listener on each.
        cfg.hosts[0] = format!("127.0.0.1:{port}");
        cfg.extra_addresses[0] = vec![format!("127.0.0.3:{port}")];
        let l = bind(&cfg).unwrap();
        let ips: Vec<String> =
            l.0.iter()
                .map(|l| l.local_addr().unwrap().ip().to_string())
                .collect();
        assert_eq!(ips, ["127.0.0.1", "127.0.0.3"]);
    }

    #[test]
    fn a_duplicate_link_fails_the_dialler_s_handshake() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let cfg = Config::new(
            1,
            vec![addr.clone(), "127.0.0.1:1".into()],
            [1; 16],
            vec![7; 32],
        );
        let mut cred = credentials(&cfg);
        cred.links = 2;
        let deadline = Instant::now() + Duration::from_secs(10);
        let cred2 = cred.clone();
        let server = std::thread::spawn(move || {
            accept_all(&[l], &cred2, 0, 2, 2, deadline, Duration::from_secs(10))
        });
        let dial = |link: u32| {
            let mut st = TcpStream::connect(&addr).unwrap();
            st.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            handshake::client(&mut st, &cred, 1, 0, link).map(|()| st)
        };
        let first = dial(0).unwrap();
        let again = dial(0);
        assert!(
            matches!(&again, Err(HandshakeError::Refused(r)) if r.contains("duplicate")),
            "{:?}",
            again.map(|_| ())
        );
        let second = dial(1).unwrap();
        let got = server.join().unwrap().unwrap();
        let mut links: Vec<(usize, usize)> = got.iter().map(|(p, l, _)| (*p, *l)).collect();
        links.sort();
        assert_eq!(links, [(1, 0), (1, 1)]);
        drop((first, second));
    }
}
