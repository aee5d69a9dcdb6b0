//! The launcher behind the `mlx-launch` binary, as a library so that tools
//! (the collectives benchmark, tests) can start ranks the same way.
//!
//! It chooses an address per rank, a random job id and job secret, and
//! starts every rank (locally, or over ssh) with the environment described in
//! [`crate::config`]. Each rank's output is forwarded line by line with a
//! `[rank]` prefix, standard input goes to rank 0, Ctrl-C is forwarded to every
//! rank, and when one rank fails the others get a grace period to report their
//! own errors before they are terminated. Every wait blocks; nothing polls.

mod hosts;
pub mod mpirun;
mod supervise;

pub use hosts::{RankHost, parse_launcher_hostfile};
pub use supervise::{LaunchOutcome, run};

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{self, Backend};

/// Everything `mlx-launch` was asked to do.
#[derive(Clone, Debug)]
pub struct LaunchSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Where each rank runs, indexed by rank.
    pub hosts: Vec<RankHost>,
    /// Transport the ranks should use.
    pub backend: Backend,
    /// Extra environment variables for every rank.
    pub env: Vec<(String, String)>,
    /// Working directory of the ranks.
    pub cwd: Option<PathBuf>,
    /// First port; rank `r` listens on `starting_port + r`. Local jobs pick free ports when unset.
    pub starting_port: Option<u16>,
    /// Connections per peer and ring direction.
    pub connections_per_peer: usize,
    /// Prefix every output line with `[rank]`.
    pub prefix_output: bool,
    /// How long the other ranks may run on after one failed before they are terminated.
    pub grace: Duration,
    /// Stall timeout passed to the ranks (`MLX_DIST_TIMEOUT_MS`).
    pub stall_timeout: Option<Duration>,
}

impl LaunchSpec {
    /// `n` local ranks running `command`, with the defaults for everything else.
    pub fn local(n: usize, command: Vec<String>) -> LaunchSpec {
        LaunchSpec {
            command,
            hosts: (0..n).map(|_| RankHost::local()).collect(),
            backend: Backend::Ring,
            env: Vec::new(),
            cwd: None,
            starting_port: None,
            connections_per_peer: 1,
            prefix_output: true,
            grace: Duration::from_secs(5),
            stall_timeout: None,
        }
    }
}

/// The identity of one launch: a random job id and secret.
#[derive(Clone, Debug)]
pub struct JobIdentity {
    /// 16 random bytes.
    pub id: [u8; 16],
    /// 32 random bytes.
    pub secret: [u8; 32],
    /// A self-signed certificate for this job (QUIC backend only).
    pub quic: Option<config::QuicCert>,
}

impl JobIdentity {
    /// Fresh random identity.
    pub fn random() -> JobIdentity {
        let mut id = [0u8; 16];
        let mut secret = [0u8; 32];
        getrandom::fill(&mut id).expect("the operating system's random source failed");
        getrandom::fill(&mut secret).expect("the operating system's random source failed");
        JobIdentity {
            id,
            secret,
            quic: None,
        }
    }

    /// Adds a fresh per-job certificate (for the QUIC backend).
    #[cfg(feature = "quic")]
    pub fn with_quic_certificate(mut self) -> Result<JobIdentity, String> {
        let (cert_der, key_der) = crate::quic::generate_job_certificate()?;
        let fingerprint = crate::quic::fingerprint(&cert_der);
        self.quic = Some(config::QuicCert {
            cert_der,
            key_der,
            fingerprint,
        });
        Ok(self)
    }
}

/// The environment of rank `rank` (see [`crate::config`] for the meaning of each variable).
pub fn rank_env(
    spec: &LaunchSpec,
    job: &JobIdentity,
    addrs: &[String],
    rank: usize,
    hostfile: Option<&std::path::Path>,
) -> Vec<(String, String)> {
    let mut env = vec![
        (config::ENV_RANK.to_string(), rank.to_string()),
        (config::ENV_WORLD.to_string(), addrs.len().to_string()),
        (config::ENV_HOSTS.to_string(), addrs.join(",")),
        (config::ENV_JOB_ID.to_string(), config::hex_encode(&job.id)),
        (
            config::ENV_SECRET.to_string(),
            config::hex_encode(&job.secret),
        ),
        (
            config::ENV_BACKEND.to_string(),
            spec.backend.name().to_string(),
        ),
        (
            config::ENV_CONNECTIONS.to_string(),
            spec.connections_per_peer.to_string(),
        ),
    ];
    if let Some(q) = &job.quic {
        env.push((
            config::ENV_QUIC_CERT.to_string(),
            config::hex_encode(&q.cert_der),
        ));
        env.push((
            config::ENV_QUIC_KEY.to_string(),
            config::hex_encode(&q.key_der),
        ));
        env.push((
            config::ENV_QUIC_FINGERPRINT.to_string(),
            config::hex_encode(&q.fingerprint),
        ));
    }
    if let Some(t) = spec.stall_timeout {
        env.push((
            config::ENV_TIMEOUT_MS.to_string(),
            t.as_millis().to_string(),
        ));
    }
    if let Some(h) = hostfile {
        env.push((config::ENV_HOSTFILE.to_string(), h.display().to_string()));
    }
    env.extend(thread_env(spec, rank));
    env.extend(spec.env.iter().cloned());
    env
}

/// Variables that size the thread pools of math libraries.
const THREAD_VARS: [&str; 5] = [
    "RAYON_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
];

/// For ranks started on this machine, splits its cores evenly between them
/// (as torchrun does), so that N ranks with their own thread pools do not
/// oversubscribe the cores, and names OpenBLAS's kernel family for this CPU
/// (`OPENBLAS_CORETYPE`). A variable already set in the launcher's
/// environment, or given with `--env`, wins.
fn thread_env(spec: &LaunchSpec, rank: usize) -> Vec<(String, String)> {
    if spec.hosts[rank].ssh.is_some() {
        return vec![];
    }
    let local = spec.hosts.iter().filter(|h| h.ssh.is_none()).count().max(1);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = (cores / local).max(1).to_string();
    let mut env: Vec<(String, String)> = THREAD_VARS
        .iter()
        .filter(|v| std::env::var_os(v).is_none())
        .map(|v| (v.to_string(), share.clone()))
        .collect();
    // OpenBLAS may not recognise a CPU newer than itself and fall back to
    // slow generic kernels; name the family this CPU runs.
    if std::env::var_os("OPENBLAS_CORETYPE").is_none()
        && let Some(core) = mlx_array::blas::openblas_coretype_for_cpu()
    {
        env.push(("OPENBLAS_CORETYPE".into(), core.into()));
    }
    env
}
