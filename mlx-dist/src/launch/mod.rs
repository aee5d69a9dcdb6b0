//! The launcher behind the `mlx-launch` binary, as a library so that tools
//! (the collectives benchmark, tests) can start ranks the same way.
//!
//! It chooses an address per rank, a random job id and job secret, and
//! starts every rank (locally, or over ssh) with the environment described in
//! [`crate::config`]. Each rank's output is forwarded line by line with a
//! `[rank]` prefix, standard input goes to rank 0, Ctrl-C is forwarded to every
//! rank, and when one rank fails the others get a grace period to report their
//! own errors before they are terminated. Every wait blocks; nothing polls.
//! When the launcher's stderr is a terminal, the ranks report their progress
//! as events (`MLX_PROGRESS=events`, unless the user chose a mode) and the
//! launcher draws them as bars, one per rank and task (see `progress`).
//!
//! What the launcher guarantees:
//! - Each rank runs in a process group of its own, and every signal the
//!   launcher sends goes to the whole group, so a rank's children share its
//!   fate. SIGTERM is followed by SIGCONT (a stopped rank acts on it), and
//!   SIGKILL follows 2 s later. Processes a rank leaves behind in its group
//!   are killed when the launch ends (start them with `setsid` to keep them).
//! - Ranks die with the launcher, even when it is killed with SIGKILL: on
//!   Linux through `PR_SET_PDEATHSIG`, on macOS through [`watch_parent`],
//!   which the rank's `init` calls (local ranks only; see [`parent`]); and
//!   with each rank the whole of its process group, its children's children
//!   too, on both: a guard process in the group kills it when the pipe from
//!   the launcher ends (see `process::Guard`).
//! - On Ctrl-C, SIGTERM or SIGHUP the ranks get that signal, and the time
//!   they said they need to finish their step and write a checkpoint (see
//!   [`crate::report::step_took`]), at most [`LaunchSpec::grace`], before
//!   SIGKILL; the launcher then exits with 128 + the signal.
//! - A rank's output is read in lines of at most 256 KiB: a longer line
//!   comes in pieces, none lost, and the launcher's memory stays bounded.
//! - The failure reported is the first one the launcher did not cause
//!   itself: ranks it signalled (after another failed, or on Ctrl-C) are
//!   not blamed.
//! - The timeouts of the ranks come from the spec: [`LaunchSpec::collective_timeout`]
//!   (`MLX_DIST_TIMEOUT_MS`) and [`LaunchSpec::liveness_timeout`]
//!   (`MLX_DIST_LIVENESS_MS`).
//!
//! With [`run_with_restarts`] (`mlx-launch --max-restarts K`) a failed job
//! is started again, whole and with a fresh identity, up to K times; see
//! [`restart`].
//!
//! The MPI backend is launched by `mpirun` instead, with weaker guarantees:
//! see [`mpirun`].

#[cfg(feature = "launcher")]
pub mod agent;
#[cfg(feature = "launcher")]
pub mod check;
mod hosts;
#[cfg(feature = "launcher")]
pub(crate) mod lines;
#[cfg(feature = "launcher")]
pub mod mpirun;
pub mod parent;
#[cfg(feature = "launcher")]
mod process;
#[cfg(feature = "launcher")]
mod progress;
#[cfg(feature = "launcher")]
mod remote;
#[cfg(feature = "launcher")]
pub mod restart;
#[cfg(feature = "launcher")]
mod signals;
#[cfg(feature = "launcher")]
mod supervise;

pub use crate::config::parse_seconds;
pub use hosts::{
    DEFAULT_STARTING_PORT, HostfileEntry, RankHost, check_ssh_destination, parse_launcher_hostfile,
};
pub use parent::{ENV_PARENT_PID, watch_parent};
#[cfg(feature = "launcher")]
pub use remote::default_remote_launcher;
#[cfg(feature = "launcher")]
pub use restart::{Restarts, RestartsOutcome, run_with_restarts};
#[cfg(feature = "launcher")]
pub use supervise::{Blame, LaunchOutcome, run};

use std::path::PathBuf;
use std::time::Duration;

use crate::config::{self, Backend};

/// Everything `mlx-launch` was asked to do. Its `Debug` shows the names of
/// [`LaunchSpec::env`], not their values.
#[derive(Clone)]
pub struct LaunchSpec {
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Where each rank runs, indexed by rank.
    pub hosts: Vec<RankHost>,
    /// Transport the ranks should use.
    pub backend: Backend,
    /// Extra environment variables for every rank.
    pub env: Vec<(String, String)>,
    /// Working directory of the ranks: local ones inherit the launcher's
    /// when unset, and remote ones start in the same path (as with MLX).
    pub cwd: Option<PathBuf>,
    /// First port; rank `r` listens on `starting_port + r`. Local jobs pick free ports when unset.
    pub starting_port: Option<u16>,
    /// Connections per peer and ring direction.
    pub connections_per_peer: usize,
    /// Prefix every output line with `[rank]`.
    pub prefix_output: bool,
    /// The most the ranks may run on once the launcher asked them to stop
    /// (`--grace`; [`DEFAULT_GRACE`] by default). After one rank failed the
    /// others get the liveness timeout + 3 s of it ([`default_grace`]), to
    /// notice and report whom they blame, then SIGTERM. On Ctrl-C or
    /// SIGTERM they get that signal and that plus twice the longest stop time a
    /// rank reported (its last step plus checkpoint, see
    /// [`crate::report::step_took`]) before SIGKILL.
    pub grace: Duration,
    /// Collective timeout of the ranks (`MLX_DIST_TIMEOUT_MS`): how long a
    /// live peer that is late to a collective is waited for. `None` leaves
    /// the ranks' default (10 minutes).
    pub collective_timeout: Option<Duration>,
    /// Liveness timeout of the ranks (`MLX_DIST_LIVENESS_MS`): a peer whose
    /// heartbeats stop for this long is declared dead. `None` leaves the
    /// ranks' default (5 s).
    pub liveness_timeout: Option<Duration>,
    /// An ssh configuration file for the remote ranks (`ssh -F`).
    pub ssh_config: Option<PathBuf>,
    /// Path of `mlx-launch` on the remote hosts (see [`default_remote_launcher`]).
    pub remote_launcher: Option<String>,
    /// Extra arguments for `mpirun` (MPI backend).
    pub mpi_args: Vec<String>,
    /// Which attempt of the job this launch is, told to the ranks as
    /// `MLX_RESTART_COUNT` (0 on the first; `mlx-launch --max-restarts`).
    pub restart_count: u32,
    /// A folder for one log file per rank (`rank-<r>.log`, both streams,
    /// unprefixed; `rank-<r>.restart-<k>.log` for attempt k), written beside
    /// the prefixed output on the terminal (`mlx-launch --log-dir`).
    pub log_dir: Option<PathBuf>,
}

/// Environment variable: the rank's index among the job's ranks on its host.
pub const ENV_LOCAL_RANK: &str = "MLX_LOCAL_RANK";
/// Environment variable: how many of the job's ranks run on the rank's host.
pub const ENV_LOCAL_WORLD_SIZE: &str = "MLX_LOCAL_WORLD_SIZE";

/// Rank `rank`'s index among the ranks on its host, and how many run there
/// (ranks share a host when they have the same ssh destination, or none).
pub fn local_rank(hosts: &[RankHost], rank: usize) -> (usize, usize) {
    let here = &hosts[rank].ssh;
    let before = hosts[..rank].iter().filter(|h| &h.ssh == here).count();
    let all = hosts.iter().filter(|h| &h.ssh == here).count();
    (before, all)
}

/// The log file of rank `rank` in attempt `restart` under `dir`.
pub fn rank_log_path(dir: &std::path::Path, rank: usize, restart: u32) -> PathBuf {
    if restart == 0 {
        dir.join(format!("rank-{rank}.log"))
    } else {
        dir.join(format!("rank-{rank}.restart-{restart}.log"))
    }
}

impl std::fmt::Debug for LaunchSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LaunchSpec")
            .field("command", &self.command)
            .field("hosts", &self.hosts)
            .field("backend", &self.backend)
            .field("env", &RedactedEnv(&self.env))
            .field("cwd", &self.cwd)
            .field("starting_port", &self.starting_port)
            .field("connections_per_peer", &self.connections_per_peer)
            .field("prefix_output", &self.prefix_output)
            .field("grace", &self.grace)
            .field("collective_timeout", &self.collective_timeout)
            .field("liveness_timeout", &self.liveness_timeout)
            .field("ssh_config", &self.ssh_config)
            .field("remote_launcher", &self.remote_launcher)
            .field("mpi_args", &self.mpi_args)
            .field("restart_count", &self.restart_count)
            .finish()
    }
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
            grace: DEFAULT_GRACE,
            collective_timeout: None,
            liveness_timeout: None,
            ssh_config: None,
            remote_launcher: None,
            mpi_args: Vec::new(),
            restart_count: 0,
            log_dir: None,
        }
    }
}

/// Refuses an environment variable name that is not an identifier
/// (`[A-Za-z_][A-Za-z0-9_]*`): names reach a remote shell and `env`.
pub fn check_env_key(key: &str) -> Result<(), String> {
    let mut b = key.bytes();
    let ok = b
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "environment variable name {key:?} is not an identifier (letters, digits and '_', not starting with a digit)"
        ))
    }
}

/// The variables `names` (`mlx-launch --env-from NAME`) with their values
/// in the launcher's environment (`lookup`), for every rank: a value that
/// should not show on a command line (`ps`) reaches remote ranks this way.
/// An unset or non-identifier name is an error naming it.
pub fn env_from(
    names: &[String],
    lookup: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, String> {
    names
        .iter()
        .map(|k| {
            check_env_key(k).map_err(|e| format!("--env-from: {e}"))?;
            let v = lookup(k).ok_or_else(|| {
                format!("--env-from {k}: {k} is not set in mlx-launch's environment")
            })?;
            Ok((k.clone(), v))
        })
        .collect()
}

/// The default of [`LaunchSpec::grace`], the most the ranks may run on once
/// asked to stop: ten minutes, the collective timeout's default (a rank
/// held up longer would fail anyway).
pub const DEFAULT_GRACE: Duration = Duration::from_secs(600);

/// The time survivors need to detect a silent rank (the liveness timeout,
/// `liveness` or the default) and report it: that timeout plus 3 s. The
/// others get it after a failure, and ranks that said nothing of their
/// stop time get it on Ctrl-C (both at most [`LaunchSpec::grace`]).
pub fn default_grace(liveness: Option<Duration>) -> Duration {
    liveness.unwrap_or(config::DEFAULT_LIVENESS_TIMEOUT) + Duration::from_secs(3)
}

/// The identity of one launch: a random job id and secret. Its `Debug`
/// shows no secret.
#[derive(Clone)]
pub struct JobIdentity {
    /// 16 random bytes.
    pub id: [u8; 16],
    /// 32 random bytes.
    pub secret: [u8; 32],
    /// A self-signed certificate for this job (QUIC backend only).
    pub quic: Option<config::QuicCert>,
}

impl std::fmt::Debug for JobIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobIdentity")
            .field("id", &config::hex_encode(&self.id))
            .field("secret", &"<redacted>")
            .field("quic", &self.quic)
            .finish()
    }
}

/// Environment variables as `Debug` shows them: names only, as their values
/// may be secrets.
pub(crate) struct RedactedEnv<'a>(pub &'a [(String, String)]);

impl std::fmt::Debug for RedactedEnv<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| Redacted(k)))
            .finish()
    }
}

/// One variable's name, shown with its value redacted.
struct Redacted<'a>(&'a str);

impl std::fmt::Debug for Redacted<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=<redacted>", self.0)
    }
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
    #[cfg(feature = "tls")]
    pub fn with_quic_certificate(mut self) -> Result<JobIdentity, String> {
        let (cert_der, key_der) = crate::transports::tls::generate_job_certificate()?;
        let fingerprint = crate::transports::tls::fingerprint(&cert_der);
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
        (
            config::ENV_RESTART_COUNT.to_string(),
            spec.restart_count.to_string(),
        ),
    ];
    let (local, local_world) = local_rank(&spec.hosts, rank);
    env.push((ENV_LOCAL_RANK.to_string(), local.to_string()));
    env.push((ENV_LOCAL_WORLD_SIZE.to_string(), local_world.to_string()));
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
    for (key, t) in [
        (config::ENV_TIMEOUT_MS, spec.collective_timeout),
        (config::ENV_LIVENESS_MS, spec.liveness_timeout),
    ] {
        if let Some(t) = t {
            // The ranks count whole milliseconds and refuse 0.
            env.push((key.to_string(), t.as_millis().max(1).to_string()));
        }
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

/// For ranks started on this machine: see [`thread_vars`]. Remote ranks get
/// theirs from their agent, which counts the cores of their host.
fn thread_env(spec: &LaunchSpec, rank: usize) -> Vec<(String, String)> {
    if spec.hosts[rank].ssh.is_some() {
        return vec![];
    }
    let local = spec.hosts.iter().filter(|h| h.ssh.is_none()).count();
    thread_vars(local, &[])
}

/// Splits this machine's cores evenly between the `ranks_here` ranks it
/// runs (as torchrun does), so that ranks with their own thread pools do
/// not oversubscribe the cores, and names OpenBLAS's kernel family for this
/// CPU (`OPENBLAS_CORETYPE`). A variable already set in this process's
/// environment, or in `given` (the job's `--env`), wins.
pub(crate) fn thread_vars(ranks_here: usize, given: &[(String, String)]) -> Vec<(String, String)> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let share = (cores / ranks_here.max(1)).max(1).to_string();
    let unset = |v: &str| std::env::var_os(v).is_none() && !given.iter().any(|(k, _)| k == v);
    let mut env: Vec<(String, String)> = THREAD_VARS
        .iter()
        .filter(|v| unset(v))
        .map(|v| (v.to_string(), share.clone()))
        .collect();
    // OpenBLAS may not recognise a CPU newer than itself and fall back to
    // slow generic kernels; name the family this CPU runs.
    if unset("OPENBLAS_CORETYPE")
        && let Some(core) = mlx_array::blas::openblas_coretype_for_cpu()
    {
        env.push(("OPENBLAS_CORETYPE".into(), core.into()));
    }
    env
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_finite_and_non_negative() {
        assert_eq!(parse_seconds("1.5", true), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_seconds("0", false), Ok(Duration::ZERO));
        for bad in ["inf", "-inf", "nan", "NaN", "-1", "abc", "", "1e400"] {
            assert!(parse_seconds(bad, false).is_err(), "{bad}");
        }
        assert!(parse_seconds("0", true).is_err());
        assert!(parse_seconds("0.0001", true).is_err());
        assert!(
            parse_seconds("1e30", false).is_err(),
            "too large for a Duration"
        );
    }

    #[test]
    fn environment_names_are_identifiers() {
        for ok in ["A", "_x1", "MLX_DIST_SHM"] {
            assert!(check_env_key(ok).is_ok(), "{ok}");
        }
        for bad in ["", "1A", "A-B", "A B", "A;rm", "$(x)", "A=B"] {
            assert!(check_env_key(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn cores_are_shared_and_given_values_win() {
        let given = vec![("OMP_NUM_THREADS".to_string(), "7".to_string())];
        let v = thread_vars(1, &given);
        assert!(!v.iter().any(|(k, _)| k == "OMP_NUM_THREADS"));
        let cores = std::thread::available_parallelism().unwrap().get();
        if std::env::var_os("RAYON_NUM_THREADS").is_none() {
            let rayon = |n| {
                thread_vars(n, &[])
                    .into_iter()
                    .find(|(k, _)| k == "RAYON_NUM_THREADS")
                    .unwrap()
                    .1
            };
            assert_eq!(rayon(1), cores.to_string());
            assert_eq!(rayon(cores * 4), "1");
        }
    }

    #[test]
    fn local_ranks_count_the_ranks_of_each_host() {
        let mut spec = LaunchSpec::local(5, vec!["p".into()]);
        spec.hosts[1] = RankHost::on("a").unwrap();
        spec.hosts[3] = RankHost::on("a").unwrap();
        let job = JobIdentity::random();
        let addrs: Vec<String> = (0..5).map(|r| format!("h:{r}")).collect();
        let got: Vec<(String, String)> = (0..5)
            .map(|r| {
                let env = rank_env(&spec, &job, &addrs, r, None);
                let get = |k: &str| env.iter().find(|(n, _)| n == k).unwrap().1.clone();
                (get(ENV_LOCAL_RANK), get(ENV_LOCAL_WORLD_SIZE))
            })
            .collect();
        let want = [("0", "3"), ("0", "2"), ("1", "3"), ("1", "2"), ("2", "3")];
        for (r, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!((g.0.as_str(), g.1.as_str()), w, "rank {r}");
        }
    }

    #[test]
    fn timeouts_reach_the_ranks() {
        let mut spec = LaunchSpec::local(2, vec!["p".into()]);
        let job = JobIdentity::random();
        let addrs = ["a:1".to_string(), "b:2".to_string()];
        let env = rank_env(&spec, &job, &addrs, 1, None);
        assert!(!env.iter().any(|(k, _)| k == config::ENV_TIMEOUT_MS));
        spec.collective_timeout = Some(Duration::from_secs(600));
        spec.liveness_timeout = Some(Duration::from_micros(10));
        let env = rank_env(&spec, &job, &addrs, 1, None);
        let get = |key: &str| env.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
        assert_eq!(get(config::ENV_TIMEOUT_MS), Some("600000"));
        assert_eq!(get(config::ENV_LIVENESS_MS), Some("1"));
    }

    #[test]
    fn debug_output_holds_no_secret() {
        let job = JobIdentity::random();
        let mut spec = LaunchSpec::local(2, vec!["p".into()]);
        spec.env.push(("API_TOKEN".into(), "hunter2hunter2".into()));
        let secret = config::hex_encode(&job.secret);
        let text = format!("{job:?} {job:#?} {spec:?} {spec:#?}");
        assert!(
            !text.contains(&secret[..8]) && !text.contains("hunter2"),
            "{text}"
        );
        let bytes = format!("{:?}", &job.secret[..4]);
        assert!(!text.contains(&bytes[1..bytes.len() - 1]), "{text}");
        assert!(text.contains("API_TOKEN") && text.contains(&config::hex_encode(&job.id)));
    }

    #[test]
    fn env_from_takes_values_from_the_launchers_environment_by_name() {
        let lookup = |k: &str| (k == "HF_TOKEN").then(|| "s3cr3t".to_string());
        assert_eq!(
            env_from(&["HF_TOKEN".into()], lookup),
            Ok(vec![("HF_TOKEN".to_string(), "s3cr3t".to_string())])
        );
        let e = env_from(&["HF_TOKEN".into(), "NOT_SET".into()], lookup).unwrap_err();
        assert!(e.contains("NOT_SET") && e.contains("not set"), "{e}");
        assert!(env_from(&["A=B".into()], lookup).is_err());
    }
}
