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
//! | `MLX_DIST_SOCKET_BUFFER` | TCP send/receive buffer bytes asked for (default 0: the kernel's autotuning; else at least 32768) |
//! | `MLX_DIST_THREADED_BYTES` | TCP ring messages at least this large use a sender and a receiver thread per lane (default 4 MiB) |
//! | `MLX_DIST_SHM` | `0`: ranks on one host do not share memory (the ring then moves every byte over TCP) |
//! | `MLX_RESTART_COUNT` | which attempt of the job this is: 0 on the first, `i` after the launcher's `i`-th restart (`mlx-launch --max-restarts`; torchrun's restart count) |
//!
//! | `MLX_DIST_JOB_SECRET_FILE` | path of a file holding the hex secret, readable by its owner only (mode 0600): how ranks started by Slurm or by hand get theirs |
//! | `MLX_DIST_INSECURE_DERIVED_SECRET` | `1`: with no secret, derive one from the host list, which anyone who sees the host list can do (ranks then do not authenticate each other) |
//! | `MLX_DIST_BIND_ALL` | `1`: listen on every interface (0.0.0.0 or ::) instead of the rank's own address |
//!
//! A job of several ranks needs a secret of at least [`MIN_SECRET_BYTES`]
//! bytes: `mlx-launch` makes a random one per job; ranks started by Slurm or
//! by hand read it from `MLX_DIST_JOB_SECRET` or `MLX_DIST_JOB_SECRET_FILE`.
//! Without either a rank refuses to start, unless
//! `MLX_DIST_INSECURE_DERIVED_SECRET=1` asks for the old behaviour (as MLX's
//! ring: the secret derived from the host list, which anyone can read).
//! [`Config::from_env`] takes the secret and the QUIC key out of the
//! process's environment once read, so the rank's children do not inherit them.

use std::time::Duration;

use sha2::{Digest, Sha256};

use crate::error::{DistError, Result};

mod hex;
mod hostfile;
pub(crate) mod slurm;
mod vars;

pub use hex::{hex_decode, hex_encode};
pub use hostfile::parse_hostfile;
use hostfile::split_addresses;
// The variables' names live in `vars`, below both this file and `slurm`.
pub use vars::*;

/// The shortest job secret accepted, in bytes (32 hex digits).
pub const MIN_SECRET_BYTES: usize = 16;
/// The smallest `MLX_DIST_SOCKET_BUFFER` accepted (other than 0, the
/// kernel's autotuning). The direct path of small collectives (up to
/// [`Config::small_bytes`], 64 KiB by default) has both ends of a link write
/// their whole message before either reads, so what is in flight one way
/// must fit in the sender's and the receiver's socket buffers together.
/// Measured on Linux loopback (2026-11-26, world 2, shared memory off, a
/// 64 KiB all_sum): 16 KiB carried it, 8 KiB and 4 KiB stalled until the
/// collective timeout; 32 KiB keeps a factor of two for other kernels and
/// links.
pub const MIN_SOCKET_BUFFER: u64 = 32 * 1024;

/// The default collective timeout: ten minutes, as NCCL's.
pub const DEFAULT_COLLECTIVE_TIMEOUT: Duration = Duration::from_secs(600);
/// The default liveness timeout.
pub const DEFAULT_LIVENESS_TIMEOUT: Duration = Duration::from_secs(5);

/// How often heartbeats go out for a liveness `timeout`: a fifth of it,
/// from 10 ms to 1 s.
pub(crate) fn heartbeat_interval(timeout: Duration) -> Duration {
    (timeout / 5).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

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
/// [`Config::from_env`] or by hand (tests, benchmarks). Its `Debug` shows
/// no secret.
#[derive(Clone)]
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
    /// Listen on every interface rather than on this rank's own address
    /// (`MLX_DIST_BIND_ALL`); a rank with several addresses listens on each.
    pub bind_all: bool,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("rank", &self.rank)
            .field("hosts", &self.hosts)
            .field("extra_addresses", &self.extra_addresses)
            .field("job_id", &hex_encode(&self.job_id))
            .field(
                "secret",
                &format_args!("<{} bytes, redacted>", self.secret.len()),
            )
            .field("connections_per_peer", &self.connections_per_peer)
            .field("connect_timeout", &self.connect_timeout)
            .field("collective_timeout", &self.collective_timeout)
            .field("liveness_timeout", &self.liveness_timeout)
            .field("block_bytes", &self.block_bytes)
            .field("small_bytes", &self.small_bytes)
            .field("quic", &self.quic)
            .field("shared_memory", &self.shared_memory)
            .field("threaded_bytes", &self.threaded_bytes)
            .field("socket_buffer", &self.socket_buffer)
            .field("bind_all", &self.bind_all)
            .finish()
    }
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
            bind_all: false,
        }
    }

    /// The world size.
    pub fn world(&self) -> usize {
        self.hosts.len()
    }

    /// Reads the launcher's environment: `Ok(None)` when there is none (a
    /// single process), an error when it is present but inconsistent.
    /// The job secret and the QUIC key are taken out of the environment
    /// once read (and kept for later calls), so that programs the rank
    /// starts do not inherit them.
    pub fn from_env() -> Result<Option<(Config, Option<Backend>)>> {
        for k in SECRET_VARIABLES {
            take_secret_variable(k);
        }
        Self::from_lookup(|k| {
            if SECRET_VARIABLES.contains(&k) {
                take_secret_variable(k)
            } else {
                std::env::var(k).ok()
            }
        })
    }

    /// [`Config::from_env`] over any variable lookup (testable).
    pub fn from_lookup(
        get: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<(Config, Option<Backend>)>> {
        // Ranks started by Slurm's srun: Slurm's variables stand for the
        // launcher's rank, hosts and job id; the rest is read as below.
        if let Some(slurm) = crate::config::slurm::launcher_variables(&get)? {
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
        let (job_id, secret) = job_identity(&get, rank, &hosts)?;
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
            if b != 0 && b < MIN_SOCKET_BUFFER {
                return Err(DistError::Config(format!(
                    "{ENV_SOCKET_BUFFER}={b} is too small: small collectives can deadlock below {MIN_SOCKET_BUFFER} bytes; use at least {MIN_SOCKET_BUFFER}, or 0 for the kernel's autotuning"
                )));
            }
            cfg.socket_buffer = b as usize;
        }
        cfg.bind_all = flag(&get, ENV_BIND_ALL)?;
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

/// Whether the on/off variable `key` is on (unset is off).
fn flag(get: &impl Fn(&str) -> Option<String>, key: &str) -> Result<bool> {
    match get(key).as_deref().map(str::trim) {
        None | Some("" | "0" | "off" | "false") => Ok(false),
        Some("1" | "on" | "true") => Ok(true),
        Some(v) => Err(DistError::Config(format!(
            "{key}={v:?} is not understood: use 1 or 0"
        ))),
    }
}

/// The job id and secret: from `MLX_DIST_JOB_ID` and `MLX_DIST_JOB_SECRET`
/// (or `MLX_DIST_JOB_SECRET_FILE`); without a secret, a job of one rank, or
/// one whose user asked for it (`MLX_DIST_INSECURE_DERIVED_SECRET=1`),
/// derives both from the host list, and any other is refused.
fn job_identity(
    get: &impl Fn(&str) -> Option<String>,
    rank: usize,
    hosts: &[String],
) -> Result<([u8; 16], Vec<u8>)> {
    let d = Sha256::digest(hosts.join(",").as_bytes());
    let derived_id: [u8; 16] = d[..16].try_into().expect("sha256 has 32 bytes");
    let id = match get(ENV_JOB_ID) {
        Some(id) => hex_decode(&id)
            .and_then(|v| v.try_into().ok())
            .ok_or_else(|| DistError::Config(format!("{ENV_JOB_ID} must be 32 hex digits")))?,
        None => derived_id,
    };
    let secret = match (get(ENV_SECRET), get(ENV_SECRET_FILE)) {
        (Some(_), Some(_)) => {
            return Err(DistError::Config(format!(
                "both {ENV_SECRET} and {ENV_SECRET_FILE} are set: give the job secret one way"
            )));
        }
        (Some(hex), None) => Some(parse_secret(&hex, ENV_SECRET)?),
        (None, Some(path)) => Some(read_secret_file(&path)?),
        (None, None) => None,
    };
    if let Some(secret) = secret {
        return Ok((id, secret));
    }
    if hosts.len() > 1 && !flag(get, ENV_INSECURE_SECRET)? {
        return Err(DistError::Config(format!(
            "no job secret: ranks started without mlx-launch (by Slurm or by hand) need one, or anyone who can reach their ports can join the job. \
             Write {MIN_SECRET_BYTES} or more random bytes as hex to a file only you can read \
             (umask 077; openssl rand -hex 32 > ~/.mlx-job-secret) and set {ENV_SECRET_FILE} to its path \
             (or {ENV_SECRET} to the hex), the same for every rank; \
             {ENV_INSECURE_SECRET}=1 derives a secret from the host list instead, which anyone who can see the host list can derive too"
        )));
    }
    if hosts.len() > 1 {
        tracing::warn!(
            rank,
            "{ENV_INSECURE_SECRET}=1: the job secret is derived from the host list; anyone who can read the host list can join the job"
        );
    }
    Ok((id, d[16..].to_vec()))
}

/// A job secret given as hex by `source`: at least [`MIN_SECRET_BYTES`] bytes.
fn parse_secret(hex: &str, source: &str) -> Result<Vec<u8>> {
    let secret = hex_decode(hex)
        .ok_or_else(|| DistError::Config(format!("{source}: the job secret must be hex")))?;
    if secret.len() < MIN_SECRET_BYTES {
        return Err(DistError::Config(format!(
            "{source}: the job secret has {} bytes; at least {MIN_SECRET_BYTES} random bytes ({} hex digits) are needed",
            secret.len(),
            2 * MIN_SECRET_BYTES
        )));
    }
    Ok(secret)
}

/// The secret in the file at `path` (hex, surrounding white space ignored),
/// refused when group or others may read the file.
fn read_secret_file(path: &str) -> Result<Vec<u8>> {
    let source = format!("{ENV_SECRET_FILE}={path}");
    let file = std::fs::File::open(path)
        .map_err(|e| DistError::Config(format!("{source}: cannot open: {e}")))?;
    let meta = file
        .metadata()
        .map_err(|e| DistError::Config(format!("{source}: {e}")))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            return Err(DistError::Config(format!(
                "{source}: the file's mode is {:o}, so others can read the job secret; chmod 600 it",
                mode & 0o777
            )));
        }
    }
    // A secret is a few dozen hex digits: a larger file is not one.
    if meta.len() > 4096 {
        return Err(DistError::Config(format!(
            "{source}: {} bytes is too long for a hex job secret",
            meta.len()
        )));
    }
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(file, 4096), &mut text)
        .map_err(|e| DistError::Config(format!("{source}: cannot read: {e}")))?;
    parse_secret(&text, &source)
}

/// The variables that hold secrets, taken out of the environment by [`Config::from_env`].
const SECRET_VARIABLES: [&str; 2] = [ENV_SECRET, ENV_QUIC_KEY];

/// The value of secret variable `key`: taken out of the process's
/// environment the first time, and kept here for later calls.
fn take_secret_variable(key: &str) -> Option<String> {
    static TAKEN: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());
    let mut taken = TAKEN.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(v) = std::env::var_os(key) {
        // SAFETY: `remove_var` races with threads that read the environment
        // at the same moment (getenv in C code). A rank reads its
        // configuration at start-up, before its collectives start threads;
        // leaving the secret for every child to inherit is the worse risk.
        unsafe { std::env::remove_var(key) };
        taken.retain(|(k, _)| k != key);
        taken.push((key.to_string(), v.to_string_lossy().into_owned()));
    }
    taken.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const SECRET_HEX: &str = "0123456789abcdef0123456789abcdef";

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
            (ENV_SECRET, SECRET_HEX.into()),
            (ENV_BACKEND, "ring".into()),
            (ENV_CONNECTIONS, "2".into()),
        ]
        .into_iter()
        .collect();
        let (c, b) = Config::from_lookup(|k| env.get(k).cloned())
            .unwrap()
            .unwrap();
        assert_eq!((c.rank, c.world(), c.connections_per_peer), (1, 2, 2));
        assert_eq!(c.secret, hex_decode(SECRET_HEX).unwrap());
        assert_eq!(b, Some(Backend::Ring));
    }

    #[test]
    fn transport_knobs_are_read_and_bad_values_refused() {
        let base = |extra: &[(&'static str, &str)]| {
            let mut env: HashMap<&str, String> = [
                (ENV_RANK, "0".to_string()),
                (ENV_HOSTS, "127.0.0.1:5000,127.0.0.1:5001".into()),
                (ENV_SECRET, SECRET_HEX.into()),
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
            (ENV_SOCKET_BUFFER, "16384"),
            (ENV_BIND_ALL, "everywhere"),
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
            ENV_INSECURE_SECRET => Some("1".to_string()),
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

    /// `from_lookup` over `pairs`, with a world of two ranks.
    fn two_ranks(pairs: &[(&str, &str)]) -> Result<Config> {
        let mut env: HashMap<String, String> = [
            (ENV_RANK.to_string(), "0".to_string()),
            (
                ENV_HOSTS.to_string(),
                "127.0.0.1:5000,127.0.0.1:5001".into(),
            ),
        ]
        .into_iter()
        .collect();
        env.extend(pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        Config::from_lookup(|k| env.get(k).cloned()).map(|c| c.unwrap().0)
    }

    #[test]
    fn socket_buffers_too_small_to_work_are_refused() {
        let e = two_ranks(&[(ENV_SECRET, SECRET_HEX), (ENV_SOCKET_BUFFER, "32767")])
            .unwrap_err()
            .to_string();
        assert!(e.contains(ENV_SOCKET_BUFFER) && e.contains("32768"), "{e}");
        for ok in ["0", "32768", "4194304"] {
            let c = two_ranks(&[(ENV_SECRET, SECRET_HEX), (ENV_SOCKET_BUFFER, ok)]).unwrap();
            assert_eq!(c.socket_buffer.to_string(), ok);
        }
    }

    #[test]
    fn a_job_without_a_real_secret_is_refused() {
        // None at all: the error says how to give one and how to opt out.
        let e = two_ranks(&[]).unwrap_err().to_string();
        for word in [ENV_SECRET_FILE, ENV_SECRET, ENV_INSECURE_SECRET] {
            assert!(e.contains(word), "{e}");
        }
        // Empty or short.
        for short in ["", "ab", &SECRET_HEX[..30]] {
            let e = two_ranks(&[(ENV_SECRET, short)]).unwrap_err().to_string();
            assert!(e.contains(ENV_SECRET) && e.contains("16"), "{short:?}: {e}");
        }
        assert!(two_ranks(&[(ENV_SECRET, "zz")]).is_err());
        // The explicit opt-out derives one; one rank alone needs none.
        let derived = two_ranks(&[(ENV_INSECURE_SECRET, "1")]).unwrap();
        assert_eq!(derived.secret.len(), 16);
        let single = Config::from_lookup(|k| match k {
            ENV_RANK => Some("0".into()),
            ENV_WORLD => Some("1".into()),
            _ => None,
        });
        assert!(single.unwrap().is_some());
        assert!(two_ranks(&[(ENV_INSECURE_SECRET, "maybe")]).is_err());
    }

    #[cfg(unix)]
    #[test]
    fn a_secret_file_is_read_only_when_no_one_else_can_read_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("mlx-dist-secret-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("secret");
        std::fs::write(&path, format!("{SECRET_HEX}\n")).unwrap();
        let p = path.to_str().unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let c = two_ranks(&[(ENV_SECRET_FILE, p)]).unwrap();
        assert_eq!(c.secret, hex_decode(SECRET_HEX).unwrap());
        for mode in [0o640, 0o604] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = two_ranks(&[(ENV_SECRET_FILE, p)]).unwrap_err().to_string();
            assert!(
                e.contains(ENV_SECRET_FILE) && e.contains("chmod 600"),
                "{e}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "abcd").unwrap();
        let e = two_ranks(&[(ENV_SECRET_FILE, p)]).unwrap_err().to_string();
        assert!(e.contains("at least 16"), "{e}");
        let both = two_ranks(&[(ENV_SECRET_FILE, p), (ENV_SECRET, SECRET_HEX)]);
        assert!(both.unwrap_err().to_string().contains("both"));
        let missing = two_ranks(&[(ENV_SECRET_FILE, "/nonexistent/secret")]);
        assert!(
            missing
                .unwrap_err()
                .to_string()
                .contains("/nonexistent/secret")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let mut c = Config::new(0, vec!["a:1".into(), "b:2".into()], [1; 16], vec![0x5e; 32]);
        c.quic = Some(QuicCert {
            cert_der: vec![1, 2, 3],
            key_der: vec![0x6b; 40],
            fingerprint: [9; 32],
        });
        let text = format!("{c:?} {c:#?}");
        assert!(!text.contains(&hex_encode(&[0x5e; 16])), "{text}");
        assert!(!text.contains("94, 94"), "{text}");
        assert!(
            !text.contains("107, 107") && !text.contains("6b6b"),
            "{text}"
        );
        assert!(text.contains("redacted") && text.contains("a:1"), "{text}");
    }
}
