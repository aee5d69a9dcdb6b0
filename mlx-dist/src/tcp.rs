//! Building the full mesh of TCP links: every pair of ranks gets
//! `2 * connections_per_peer` handshaken connections (one set per ring
//! direction) and one more, the pair's witness (heartbeats and the news of
//! failures and goodbyes, see [`crate::liveness`]).
//! The higher rank dials the lower one, retrying with backoff up to the
//! connect deadline; the lower rank accepts, refusing strangers with a logged reason.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::{DistError, Result};
use crate::handshake::{self, HandshakeError, JobCredentials};
use crate::link::{Link, TcpLink};
use crate::mesh::Mesh;
use crate::shm::{self, ShmLink};

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

/// Binds this rank's listening address (falling back to all interfaces on
/// its port); a rank with several addresses listens on all interfaces.
pub(crate) fn bind(cfg: &Config) -> Result<TcpListener> {
    let me = &cfg.hosts[cfg.rank];
    let addr = resolve(me)
        .map_err(|e| DistError::Config(format!("rank {} address {me}: {e}", cfg.rank)))?;
    let any = SocketAddr::new(
        if addr.is_ipv6() {
            std::net::Ipv6Addr::UNSPECIFIED.into()
        } else {
            std::net::Ipv4Addr::UNSPECIFIED.into()
        },
        addr.port(),
    );
    let several = cfg
        .extra_addresses
        .get(cfg.rank)
        .is_some_and(|e| !e.is_empty());
    let bound = if several {
        TcpListener::bind(any)
    } else {
        TcpListener::bind(addr).or_else(|_| TcpListener::bind(any))
    };
    bound.map_err(|e| DistError::Config(format!("rank {} cannot listen on {me}: {e}", cfg.rank)))
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

/// Connects the full mesh for `cfg` and returns it; with `encrypted`, every
/// connection carries TLS 1.3 with the job's certificate (and shared memory
/// is not used).
pub(crate) fn connect_mesh(cfg: &Config, listener: TcpListener, encrypted: bool) -> Result<Mesh> {
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
                &listener,
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
    Ok(Mesh::new(cfg, links, witnesses))
}

#[cfg(feature = "tls")]
fn encrypted_mesh(
    cfg: &Config,
    streams: Vec<Vec<TcpStream>>,
    witnesses: Vec<Option<TcpStream>>,
) -> Result<Mesh> {
    let (links, witnesses) = crate::tls_link::wrap_mesh(cfg, streams, witnesses)?;
    tracing::debug!(rank = cfg.rank, world = cfg.world(), "tls mesh connected");
    Ok(Mesh::new(cfg, links, witnesses))
}

#[cfg(not(feature = "tls"))]
fn encrypted_mesh(_: &Config, _: Vec<Vec<TcpStream>>, _: Vec<Option<TcpStream>>) -> Result<Mesh> {
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

fn accept_all(
    listener: &TcpListener,
    cred: &JobCredentials,
    rank: usize,
    world: usize,
    nlinks: usize,
    deadline: Instant,
    timeout: Duration,
) -> Result<Vec<(usize, usize, TcpStream)>> {
    let mut missing: BTreeSet<(usize, usize)> = (rank + 1..world)
        .flat_map(|p| (0..nlinks).map(move |l| (p, l)))
        .collect();
    let mut out = Vec::new();
    if missing.is_empty() {
        return Ok(out);
    }
    listener
        .set_nonblocking(true)
        .map_err(|e| DistError::Config(format!("listener: {e}")))?;
    let (tx, rx) = mpsc::channel();
    let mut pending = 0usize;
    while !missing.is_empty() {
        match listener.accept() {
            Ok((st, from)) => {
                let tx = tx.clone();
                let cred = cred.clone();
                pending += 1;
                std::thread::spawn(move || {
                    let r = (|| {
                        st.set_nonblocking(false)?;
                        tune(&st, HANDSHAKE_TIMEOUT)?;
                        let mut st2 = st;
                        let hello = handshake::server(&mut st2, &cred, rank as u32)?;
                        Ok::<_, HandshakeError>((hello, st2))
                    })();
                    let _ = tx.send((from, r));
                });
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => tracing::warn!(rank, error = %e, "accept failed"),
        }
        while let Ok((from, r)) = rx.try_recv() {
            pending -= 1;
            match r {
                Ok((hello, st)) => {
                    let key = (hello.rank as usize, hello.link as usize);
                    if hello.rank as usize <= rank || !missing.remove(&key) {
                        tracing::warn!(rank, %from, peer = hello.rank, link = hello.link, "refused connection: duplicate or unexpected link");
                        continue;
                    }
                    out.push((key.0, key.1, st));
                }
                Err(e) => tracing::warn!(rank, %from, reason = %e, "refused connection"),
            }
        }
        if Instant::now() >= deadline {
            let mut m: Vec<usize> = missing.iter().map(|(p, _)| *p).collect();
            m.dedup();
            return Err(DistError::AcceptTimeout {
                rank,
                missing: m,
                timeout,
            });
        }
        // Start-up only: a short sleep between polls of the non-blocking listener.
        std::thread::sleep(Duration::from_millis(if pending > 0 { 1 } else { 3 }));
    }
    Ok(out)
}
