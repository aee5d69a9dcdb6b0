//! How a rank learns its place in the job: the environment the launcher sets.
//!
//! | variable | meaning |
//! |---|---|
//! | `MLX_RANK` | this process's rank (as in MLX) |
//! | `MLX_WORLD_SIZE` | number of ranks (optional if a host list is given) |
//! | `MLX_HOSTFILE` | MLX-style JSON file: `[["ip:port"], ["ip:port"], ...]`, one entry per rank |
//! | `MLX_DIST_HOSTS` | the same list inline, comma separated (`ip:port,ip:port`); wins over the file |
//! | `MLX_DIST_JOB_ID` | 32 hex digits identifying the job |
//! | `MLX_DIST_JOB_SECRET` | hex secret every connection proves it knows (HMAC) |
//! | `MLX_DIST_BACKEND` | `ring`, `tls`, `quic` or `mpi` |
//! | `MLX_DIST_CONNECTIONS` | connections per peer and ring direction (default 1) |
//! | `MLX_DIST_TIMEOUT_MS` | collective timeout: how long a live peer that is late to a collective is waited for (default 600000, ten minutes, as NCCL) |
//! | `MLX_DIST_LIVENESS_MS` | liveness timeout: a peer whose heartbeats stop for this long is declared dead (default 5000) |
//! | `MLX_DIST_CONNECT_TIMEOUT_MS` | deadline to connect to every peer (default 60000) |
//! | `MLX_DIST_QUIC_CERT` | hex DER of the job's certificate (tls and quic backends) |
//! | `MLX_DIST_QUIC_KEY` | hex PKCS#8 DER of its private key |
//! | `MLX_DIST_QUIC_FINGERPRINT` | hex SHA-256 of the certificate: the only one a rank accepts |
//! | `MLX_DIST_SOCKET_BUFFER` | TCP send/receive buffer bytes asked for (default 0: the kernel's autotuning) |
//! | `MLX_DIST_THREADED_BYTES` | TCP ring messages at least this large use a sender and a receiver thread per lane (default 4 MiB) |
//! | `MLX_DIST_SHM` | `0`: ranks on one host do not share memory (the ring then moves every byte over TCP) |
//! | `MLX_RESTART_COUNT` | which attempt of the job this is: 0 on the first, `i` after the launcher's `i`-th restart (`mlx-launch --max-restarts`; torchrun's restart count) |
//!
//! Ranks started by hand with only `MLX_RANK` and `MLX_HOSTFILE`, as with MLX,
//! still work: the job id and secret are then derived from the host list and a
//! warning says that connections are not authenticated by a secret.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{DistError, Result};

/// Environment variable: this process's rank.
pub const ENV_RANK: &str = "MLX_RANK";
/// Environment variable: the world size.
pub const ENV_WORLD: &str = "MLX_WORLD_SIZE";
/// Environment variable: path of an MLX-style JSON host file.
pub const ENV_HOSTFILE: &str = "MLX_HOSTFILE";
/// Environment variable: comma-separated `host:port` per rank; a rank with
/// several network interfaces lists them joined by `|` (`10.0.0.1:5000|10.0.1.1:5000`).
pub const ENV_HOSTS: &str = "MLX_DIST_HOSTS";
/// Environment variable: job id, 32 hex digits.
pub const ENV_JOB_ID: &str = "MLX_DIST_JOB_ID";
/// Environment variable: job secret, hex.
pub const ENV_SECRET: &str = "MLX_DIST_JOB_SECRET";
/// Environment variable: backend name.
pub const ENV_BACKEND: &str = "MLX_DIST_BACKEND";
/// Environment variable: connections per peer and direction.
pub const ENV_CONNECTIONS: &str = "MLX_DIST_CONNECTIONS";
/// Environment variable: collective timeout in milliseconds.
pub const ENV_TIMEOUT_MS: &str = "MLX_DIST_TIMEOUT_MS";
/// Environment variable: liveness timeout in milliseconds.
pub const ENV_LIVENESS_MS: &str = "MLX_DIST_LIVENESS_MS";

/// The default collective timeout: ten minutes, as NCCL's.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);
/// The default liveness timeout.
pub const DEFAULT_LIVENESS_TIMEOUT: Duration = Duration::from_secs(5);
/// Environment variable: connect deadline in milliseconds.
pub const ENV_CONNECT_TIMEOUT_MS: &str = "MLX_DIST_CONNECT_TIMEOUT_MS";

/// Environment variable: the job's QUIC certificate (hex DER).
pub const ENV_QUIC_CERT: &str = "MLX_DIST_QUIC_CERT";
/// Environment variable: the QUIC certificate's private key (hex PKCS#8 DER).
pub const ENV_QUIC_KEY: &str = "MLX_DIST_QUIC_KEY";
/// Environment variable: SHA-256 fingerprint of the QUIC certificate (hex).
pub const ENV_QUIC_FINGERPRINT: &str = "MLX_DIST_QUIC_FINGERPRINT";

/// The job's TLS identity for the QUIC backend: one self-signed certificate
/// shared by the job's ranks, pinned by its fingerprint.
#[derive(Clone)]
pub struct QuicCert {
    /// DER certificate.
    pub cert_der: Vec<u8>,
    /// PKCS#8 DER private key.
    pub key_der: Vec<u8>,
    /// SHA-256 of `cert_der`: the only certificate a rank accepts from a peer.
    pub fingerprint: [u8; 32],
}

impl std::fmt::Debug for QuicCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QuicCert(sha256 {})", hex_encode(&self.fingerprint))
    }
}

/// Environment variable: TCP socket buffer size in bytes (0 keeps the kernel's autotuning).
pub const ENV_SOCKET_BUFFER: &str = "MLX_DIST_SOCKET_BUFFER";

/// Environment variable: message size from which the TCP ring uses threads per lane.
pub const ENV_THREADED_BYTES: &str = "MLX_DIST_THREADED_BYTES";

/// Environment variable: `0` keeps ranks on one host from sharing memory
/// (every byte then goes over TCP); anything else, or unset, allows it.
pub const ENV_SHM: &str = "MLX_DIST_SHM";

/// Environment variable: how many times the launcher restarted the job
/// before this attempt (0 on the first; see [`restart_count`]).
pub const ENV_RESTART_COUNT: &str = "MLX_RESTART_COUNT";

/// This process's attempt: [`ENV_RESTART_COUNT`], 0 when unset (a first
/// attempt, or a program started without the launcher); an error names a
/// value that is not a whole number.
pub fn restart_count() -> Result<u32> {
    match std::env::var(ENV_RESTART_COUNT) {
        Err(_) => Ok(0),
        Ok(v) => v.trim().parse().map_err(|_| {
            DistError::Config(format!(
                "{ENV_RESTART_COUNT}={v:?} is not a restart count (a whole number)"
            ))
        }),
    }
}

/// Parses a number of seconds given on the command line: a finite,
/// non-negative number, and at least a millisecond when `timeout` (the
/// ranks count timeouts in whole milliseconds). The error says what is wrong
/// with the value; clap adds the flag and the value.
pub fn parse_seconds(text: &str, timeout: bool) -> Result<Duration, String> {
    let secs: f64 = text
        .trim()
        .parse()
        .map_err(|_| "expected a number of seconds".to_string())?;
    if !secs.is_finite() {
        return Err("expected a finite number of seconds".into());
    }
    if secs < 0.0 {
        return Err("expected a non-negative number of seconds".into());
    }
    let d = Duration::try_from_secs_f64(secs).map_err(|e| format!("{e}"))?;
    if timeout && d < Duration::from_millis(1) {
        return Err("a timeout must be at least 0.001 seconds".into());
    }
    Ok(d)
}

/// Which transport carries the collectives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Backend {
    /// Whatever the launcher chose (`MLX_DIST_BACKEND`), else the ring.
    Any,
    /// Ring algorithms over TCP.
    Ring,
    /// The same algorithms over QUIC (TLS 1.3).
    Quic,
    /// The ring over TCP with TLS 1.3 on every connection (encrypted,
    /// the kernel's TCP offloads kept).
    Tls,
    /// MPI (cargo feature `mpi`).
    Mpi,
}

impl Backend {
    /// The name used on the command line and in `MLX_DIST_BACKEND`.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Any => "any",
            Backend::Ring => "ring",
            Backend::Quic => "quic",
            Backend::Tls => "tls",
            Backend::Mpi => "mpi",
        }
    }

    /// Parses a backend name.
    pub fn from_name(s: &str) -> Option<Backend> {
        Some(match s.to_ascii_lowercase().as_str() {
            "any" => Backend::Any,
            "ring" | "tcp" => Backend::Ring,
            "quic" => Backend::Quic,
            "tls" => Backend::Tls,
            "mpi" => Backend::Mpi,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Everything a rank needs to join a job; built from the environment by
/// [`Config::from_env`] or by hand (tests, benchmarks).
#[derive(Clone, Debug)]
pub struct Config {
    /// This rank.
    pub rank: usize,
    /// `host:port` each rank listens on, indexed by rank: the address that
    /// carries the control traffic (handshakes, heartbeats).
    pub hosts: Vec<String>,
    /// Further `host:port` addresses of each rank, indexed by rank (other
    /// network interfaces, on the same port): the ring spreads its data
    /// connections over a rank's addresses. Usually empty.
    pub extra_addresses: Vec<Vec<String>>,
    /// Job id.
    pub job_id: [u8; 16],
    /// Job secret.
    pub secret: Vec<u8>,
    /// Connections per peer and ring direction.
    pub connections_per_peer: usize,
    /// How long to keep trying to reach every peer at start-up.
    pub connect_timeout: Duration,
    /// How long a live peer that is late to a collective is waited for (a
    /// collective that makes no progress for this long fails, naming the
    /// ranks that have not reached it).
    pub collective_timeout: Duration,
    /// How long a peer may send no heartbeat before it is declared dead
    /// (frozen, stopped, or its host or network gone). Heartbeats go every
    /// fifth of it from a thread of their own, whatever the rank computes.
    pub liveness_timeout: Duration,
    /// Pipelining granularity of the ring, in bytes.
    pub block_bytes: usize,
    /// Messages up to this many bytes take the direct low-latency path.
    pub small_bytes: usize,
    /// The job's certificate for the QUIC backend.
    pub quic: Option<QuicCert>,
    /// Whether ranks on one host move large payloads through shared memory
    /// (ring backend; `MLX_DIST_SHM=0` turns it off).
    pub shared_memory: bool,
    /// Messages at least this large run on the threaded ring even over TCP
    /// (a sender and a receiver thread per lane; `MLX_DIST_THREADED_BYTES`).
    pub threaded_bytes: usize,
    /// The socket buffer size asked for on every TCP link; 0: the kernel's
    /// autotuning (`MLX_DIST_SOCKET_BUFFER`).
    pub socket_buffer: usize,
}

impl Config {
    /// A configuration with the defaults for everything but the job's identity.
    pub fn new(rank: usize, hosts: Vec<String>, job_id: [u8; 16], secret: Vec<u8>) -> Config {
        Config {
            rank,
            extra_addresses: vec![Vec::new(); hosts.len()],
            hosts,
            job_id,
            secret,
            connections_per_peer: 1,
            connect_timeout: Duration::from_secs(60),
            collective_timeout: DEFAULT_COLLECTIVE_TIMEOUT,
            liveness_timeout: DEFAULT_LIVENESS_TIMEOUT,
            block_bytes: 256 * 1024,
            small_bytes: 64 * 1024,
            quic: None,
            shared_memory: true,
            threaded_bytes: 4 << 20,
            socket_buffer: 0,
        }
    }

    /// The world size.
    pub fn world(&self) -> usize {
        self.hosts.len()
    }

    /// Reads the launcher's environment: `Ok(None)` when there is none (a
    /// single process), an error when it is present but inconsistent.
    pub fn from_env() -> Result<Option<(Config, Option<Backend>)>> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// [`Config::from_env`] over any variable lookup (testable).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<(Config, Option<Backend>)>> {
        // Ranks started by Slurm's srun: Slurm's variables stand for the
        // launcher's rank, hosts and job id; the rest is read as below.
        if let Some(slurm) = crate::slurm::launcher_variables(&get)? {
            let get = move |k: &str| {
                let own = slurm.iter().find(|(v, _)| *v == k);
                own.map(|(_, x)| x.clone()).or_else(|| get(k))
            };
            return Self::from_lookup(&get as &dyn Fn(&str) -> Option<String>);
        }
        let Some(rank) = get(ENV_RANK) else {
            return Ok(None);
        };
        let rank: usize = rank
            .trim()
            .parse()
            .map_err(|_| DistError::Config(format!("{ENV_RANK}={rank:?} is not a rank")))?;
        let hosts = if let Some(h) = get(ENV_HOSTS) {
            h.split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect()
        } else if let Some(path) = get(ENV_HOSTFILE) {
            let text = std::fs::read_to_string(&path).map_err(|e| {
                DistError::Config(format!("cannot read {ENV_HOSTFILE}={path}: {e}"))
            })?;
            parse_hostfile(&text)
                .map_err(|e| DistError::Config(format!("{ENV_HOSTFILE}={path}: {e}")))?
        } else {
            let world = get(ENV_WORLD).unwrap_or_default();
            if world.trim() == "1" {
                vec!["127.0.0.1:0".to_string()]
            } else {
                return Err(DistError::Config(format!(
                    "{ENV_RANK} is set but neither {ENV_HOSTS} nor {ENV_HOSTFILE} says where the ranks are"
                )));
            }
        };
        if let Some(w) = get(ENV_WORLD) {
            let w: usize = w
                .trim()
                .parse()
                .map_err(|_| DistError::Config(format!("{ENV_WORLD}={w:?} is not a number")))?;
            if w != hosts.len() {
                return Err(DistError::Config(format!(
                    "{ENV_WORLD}={w} but the host list has {} entries",
                    hosts.len()
                )));
            }
        }
        if rank >= hosts.len() {
            return Err(DistError::Config(format!(
                "{ENV_RANK}={rank} but the world has {} ranks",
                hosts.len()
            )));
        }
        let (job_id, secret) = match (get(ENV_JOB_ID), get(ENV_SECRET)) {
            (Some(id), Some(secret)) => {
                let id = hex_decode(&id).filter(|v| v.len() == 16).ok_or_else(|| {
                    DistError::Config(format!("{ENV_JOB_ID} must be 32 hex digits"))
                })?;
                let secret = hex_decode(&secret)
                    .ok_or_else(|| DistError::Config(format!("{ENV_SECRET} must be hex")))?;
                (id.try_into().expect("length checked"), secret)
            }
            (id, _) => {
                tracing::warn!(
                    rank,
                    "no {ENV_SECRET}: deriving the job identity from the host list; connections are not authenticated by a secret"
                );
                let d = Sha256::digest(hosts.join(",").as_bytes());
                // A job id given without a secret (Slurm's) is kept.
                let id = id.and_then(|id| hex_decode(&id)?.try_into().ok());
                (
                    id.unwrap_or_else(|| d[..16].try_into().expect("sha256 has 32 bytes")),
                    d[16..].to_vec(),
                )
            }
        };
        let (hosts, extra_addresses) = split_addresses(hosts);
        let mut cfg = Config::new(rank, hosts, job_id, secret);
        cfg.extra_addresses = extra_addresses;
        let num = |k: &str| -> Result<Option<u64>> {
            get(k)
                .map(|v| {
                    v.trim()
                        .parse::<u64>()
                        .map_err(|_| DistError::Config(format!("{k}={v:?} is not a number")))
                })
                .transpose()
        };
        if let Some(c) = num(ENV_CONNECTIONS)? {
            cfg.connections_per_peer = (c as usize).clamp(1, 16);
        }
        if let Some(t) = num(ENV_TIMEOUT_MS)? {
            cfg.collective_timeout = positive_ms(ENV_TIMEOUT_MS, t)?;
        }
        if let Some(t) = num(ENV_LIVENESS_MS)? {
            cfg.liveness_timeout = positive_ms(ENV_LIVENESS_MS, t)?;
        }
        if let Some(t) = num(ENV_CONNECT_TIMEOUT_MS)? {
            cfg.connect_timeout = Duration::from_millis(t.max(1));
        }
        if let Some(v) = get(ENV_SHM) {
            cfg.shared_memory = match v.trim() {
                "" | "1" | "on" | "true" => true,
                "0" | "off" | "false" => false,
                _ => {
                    return Err(DistError::Config(format!(
                        "{ENV_SHM}={v:?} is not understood: use 1 or 0"
                    )));
                }
            };
        }
        if let Some(b) = num(ENV_THREADED_BYTES)? {
            cfg.threaded_bytes = b as usize;
        }
        if let Some(b) = num(ENV_SOCKET_BUFFER)? {
            cfg.socket_buffer = b as usize;
        }
        if let Some(cert) = get(ENV_QUIC_CERT) {
            let bad = |k: &str| DistError::Config(format!("{k} must be hex"));
            let cert_der = hex_decode(&cert).ok_or_else(|| bad(ENV_QUIC_CERT))?;
            let key_der = get(ENV_QUIC_KEY)
                .and_then(|k| hex_decode(&k))
                .ok_or_else(|| bad(ENV_QUIC_KEY))?;
            let fingerprint: [u8; 32] = get(ENV_QUIC_FINGERPRINT)
                .and_then(|f| hex_decode(&f))
                .and_then(|f| f.try_into().ok())
                .ok_or_else(|| {
                    DistError::Config(format!("{ENV_QUIC_FINGERPRINT} must be 64 hex digits"))
                })?;
            let actual: [u8; 32] = Sha256::digest(&cert_der).into();
            if actual != fingerprint {
                return Err(DistError::Config(format!(
                    "{ENV_QUIC_CERT} does not match {ENV_QUIC_FINGERPRINT}"
                )));
            }
            cfg.quic = Some(QuicCert {
                cert_der,
                key_der,
                fingerprint,
            });
        }
        let backend = match get(ENV_BACKEND) {
            Some(b) => Some(Backend::from_name(&b).ok_or_else(|| {
                DistError::Config(format!("{ENV_BACKEND}={b:?} is not ring, tls, quic or mpi"))
            })?),
            None => None,
        };
        Ok(Some((cfg, backend)))
    }
}

/// A timeout of `ms` milliseconds from variable `key`: zero is an error.
fn positive_ms(key: &str, ms: u64) -> Result<Duration> {
    if ms == 0 {
        return Err(DistError::Config(format!(
            "{key}=0: a timeout must be at least 1 ms"
        )));
    }
    Ok(Duration::from_millis(ms))
}

/// Splits each rank's entry (`ip:port`, or several joined by `|`) into its
/// first address and the others.
fn split_addresses(entries: Vec<String>) -> (Vec<String>, Vec<Vec<String>>) {
    entries
        .iter()
        .map(|e| {
            let mut all = e.split('|').map(|a| a.trim().to_string());
            let first = all.next().unwrap_or_default();
            (first, all.filter(|a| !a.is_empty()).collect())
        })
        .unzip()
}

/// Parses an MLX-style host file: a JSON list with, per rank, either a list of
/// `"ip:port"` strings (one per network interface) or one such string. Each
/// rank's entry is returned as its addresses joined by `|`, the form
/// `MLX_DIST_HOSTS` takes.
pub fn parse_hostfile(text: &str) -> std::result::Result<Vec<String>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let arr = v
        .as_array()
        .ok_or("expected a JSON list with one entry per rank")?;
    arr.iter()
        .enumerate()
        .map(|(i, e)| match e {
            serde_json::Value::String(s) => Ok(s.clone()),
            serde_json::Value::Array(a) => {
                let all: Option<Vec<&str>> = a.iter().map(|s| s.as_str()).collect();
                match all {
                    Some(all) if !all.is_empty() => Ok(all.join("|")),
                    _ => Err(format!("entry {i} is not a list of \"ip:port\" strings")),
                }
            }
            _ => Err(format!(
                "entry {i} is neither a string nor a list of strings"
            )),
        })
        .collect()
}

/// Lower-case hex of bytes.
pub fn hex_encode(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Bytes of a hex string, or `None` if it is not hex.
pub fn hex_decode(s: &str) -> Option<Vec<u8>> {
    let s = s.trim();
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn no_environment_means_single_process() {
        assert!(Config::from_lookup(|_| None).unwrap().is_none());
    }

    #[test]
    fn launcher_environment_is_parsed() {
        let env: HashMap<&str, String> = [
            (ENV_RANK, "1".to_string()),
            (ENV_HOSTS, "127.0.0.1:5000,127.0.0.1:5001".into()),
            (ENV_JOB_ID, "00112233445566778899aabbccddeeff".into()),
            (ENV_SECRET, "abcd".into()),
            (ENV_BACKEND, "ring".into()),
            (ENV_CONNECTIONS, "2".into()),
        ]
        .into_iter()
        .collect();
        let (c, b) = Config::from_lookup(|k| env.get(k).cloned())
            .unwrap()
            .unwrap();
        assert_eq!((c.rank, c.world(), c.connections_per_peer), (1, 2, 2));
        assert_eq!(c.secret, vec![0xab, 0xcd]);
        assert_eq!(b, Some(Backend::Ring));
    }

    #[test]
    fn transport_knobs_are_read_and_bad_values_refused() {
        let base = |extra: &[(&'static str, &str)]| {
            let mut env: HashMap<&str, String> = [
                (ENV_RANK, "0".to_string()),
                (ENV_HOSTS, "127.0.0.1:5000,127.0.0.1:5001".into()),
            ]
            .into_iter()
            .collect();
            env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
            Config::from_lookup(|k| env.get(k).cloned()).map(|c| c.unwrap().0)
        };
        let d = base(&[]).unwrap();
        assert_eq!(
            (d.threaded_bytes, d.socket_buffer, d.shared_memory),
            (4 << 20, 0, true)
        );
        let c = base(&[
            (ENV_THREADED_BYTES, "1048576"),
            (ENV_SOCKET_BUFFER, "65536"),
            (ENV_SHM, "0"),
        ])
        .unwrap();
        assert_eq!(
            (c.threaded_bytes, c.socket_buffer, c.shared_memory),
            (1 << 20, 65536, false)
        );
        for (k, v) in [
            (ENV_THREADED_BYTES, "4M"),
            (ENV_SOCKET_BUFFER, "-1"),
            (ENV_SHM, "no way"),
        ] {
            let e = base(&[(k, v)]).unwrap_err().to_string();
            assert!(e.contains(k) && e.contains(v), "{e}");
        }
    }

    #[test]
    fn mlx_hostfile_and_errors() {
        assert_eq!(
            parse_hostfile(r#"[["127.0.0.1:1"], ["127.0.0.1:2", "x:2"], "h:3"]"#).unwrap(),
            vec!["127.0.0.1:1", "127.0.0.1:2|x:2", "h:3"]
        );
        let env = |k: &str| match k {
            ENV_RANK => Some("1".to_string()),
            ENV_HOSTS => Some("a:1,b:2|c:2".to_string()),
            _ => None,
        };
        let (cfg, _) = Config::from_lookup(env).unwrap().unwrap();
        assert_eq!(cfg.hosts, vec!["a:1", "b:2"]);
        assert_eq!(cfg.extra_addresses, vec![vec![], vec!["c:2".to_string()]]);
        assert!(parse_hostfile("[[]]").is_err());
        assert!(parse_hostfile("{}").is_err());
        let bad = Config::from_lookup(|k| (k == ENV_RANK).then(|| "0".to_string()));
        assert!(matches!(bad, Err(DistError::Config(_))));
        assert_eq!(
            hex_decode(&hex_encode(&[0, 255, 16])),
            Some(vec![0, 255, 16])
        );
        assert_eq!(hex_decode("zz"), None);
    }
}
