//! `mlx-launch`: start a distributed program on N processes, locally or over ssh.
//!
//! ```text
//! mlx-launch -n 4 -- target/release/examples/all_sum
//! mlx-launch --hosts a,b --backend ring --env RUST_LOG=info -- ./train --steps 100
//! mlx-launch -n 2 --timeout 1800 --liveness-timeout 10 -- ./train
//! mlx-launch --check --hostfile hosts.json -- ./train
//! mlx-launch -n 2 --max-restarts 3 -- ./train --resume
//! ```
//!
//! With `--max-restarts K`, a job whose rank failed is stopped and started
//! again, whole, up to K times (after `--restart-backoff` seconds, doubling
//! up to 30 s); each restart is announced on stderr, and the ranks read the
//! attempt in `MLX_RESTART_COUNT`. Ctrl-C and SIGTERM are never restarted.
//!
//! Remote ranks run `mlx-launch --remote-agent` on their host (through
//! ssh), which receives the job's secrets on standard input; see
//! `mlx_dist::launch::agent`.
//!
//! Exit status: 0 when every rank of the last attempt succeeded; else that of the first rank that
//! failed on its own (its exit code, or 128 + signal), 128 + the signal when
//! interrupted (130 for Ctrl-C, 143 for SIGTERM, which the ranks get too),
//! 2 when the command line is wrong or the ranks cannot be started.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use mlx_dist::Backend;
use mlx_dist::launch::{self, LaunchSpec, RankHost, Restarts, parse_launcher_hostfile};

/// Start a distributed mlx-dist program on several processes.
///
/// Runs N copies of PROGRAM (locally, or over ssh with --hosts/--hostfile),
/// each told its rank and the job's addresses and secret, prefixes their
/// output with `[rank]`, forwards Ctrl-C, and stops them all when one fails.
#[derive(Parser, Debug)]
#[command(name = "mlx-launch", version)]
struct Args {
    /// Number of processes, 1 by default (per host when --hosts or
    /// --hostfile is given; with an MPI-style host file, it replaces every
    /// host's slots).
    #[arg(short = 'n', long = "nproc")]
    n: Option<usize>,
    /// Comma-separated hosts to start ranks on over ssh (localhost runs locally).
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// Host file: MLX's JSON [{"ssh": "host", "ips": ["10.0.0.1", ...]}, ...]
    /// (the ring uses every IP), or MPI's text (`host slots=N` per line).
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// Check that the hosts are ready instead of launching: ssh in batch
    /// mode, the same mlx-launch and program everywhere, free ports, names
    /// resolving alike. Prints what to fix; exits 1 if anything is wrong.
    #[arg(long)]
    check: bool,
    /// ssh configuration file for the remote ranks (ssh -F).
    #[arg(long, env = "MLX_LAUNCH_SSH_CONFIG", value_name = "FILE")]
    ssh_config: Option<PathBuf>,
    /// Path of mlx-launch on the remote hosts (default: this program's path,
    /// as on hosts that share a file system).
    #[arg(long, value_name = "PATH")]
    remote_launcher: Option<String>,
    /// Extra argument for mpirun (MPI backend; repeatable), e.g. --mpi-arg=--bind-to --mpi-arg=core.
    #[arg(long = "mpi-arg", value_name = "ARG", allow_hyphen_values = true)]
    mpi_args: Vec<String>,
    /// Transport: ring (TCP), quic or mpi.
    #[arg(long, default_value = "ring")]
    backend: String,
    /// Extra environment variable for every rank, K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Variable NAME of this program's environment, with its value, for
    /// every rank (repeatable): the value stays off command lines, where
    /// `ps` shows it.
    #[arg(long = "env-from", value_name = "NAME")]
    env_from: Vec<String>,
    /// Working directory of the ranks (default: this one, on every host).
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// First port; rank r listens on starting-port + r (free ports are chosen for local jobs otherwise).
    #[arg(long)]
    starting_port: Option<u16>,
    /// TCP connections per peer and ring direction.
    #[arg(long, default_value_t = 1)]
    connections_per_peer: usize,
    /// Collective timeout, in seconds: how long a live rank that is late to a
    /// collective is waited for (default 600, as NCCL's). Sets MLX_DIST_TIMEOUT_MS.
    #[arg(long, value_name = "SECS", value_parser = timeout_secs, allow_negative_numbers = true)]
    timeout: Option<Duration>,
    /// Liveness timeout, in seconds: a rank whose heartbeats stop for this long
    /// is declared dead (default 5). Sets MLX_DIST_LIVENESS_MS.
    #[arg(long, value_name = "SECS", value_parser = timeout_secs, allow_negative_numbers = true)]
    liveness_timeout: Option<Duration>,
    /// The most seconds the ranks may run on once asked to stop (default
    /// 600). After one rank fails, the others get the liveness timeout
    /// plus 3 s of it to notice and report whom they blame, then SIGTERM,
    /// and SIGKILL 2 s later. On Ctrl-C or SIGTERM the ranks get that signal
    /// and the time they need to finish their step and write a checkpoint, as
    /// they reported it (mlx-llama does; see mlx_dist::report::step_took):
    /// twice their last step plus checkpoint, plus the liveness timeout and
    /// 3 s, at most this; then SIGKILL. A second Ctrl-C kills at once.
    #[arg(long, value_name = "SECS", value_parser = grace_secs, allow_negative_numbers = true)]
    grace: Option<Duration>,
    /// When a rank fails, stop the others and start the whole job again, up
    /// to this many times (the ranks see the attempt in MLX_RESTART_COUNT).
    /// Not with --backend mpi.
    #[arg(long, value_name = "K", default_value_t = 0)]
    max_restarts: u32,
    /// Seconds to wait before the first restart; the wait doubles for each
    /// further one, up to 30 s.
    #[arg(long, value_name = "SECS", value_parser = grace_secs, allow_negative_numbers = true, default_value = "1")]
    restart_backoff: Duration,
    /// Do not prefix output lines with `[rank]`.
    #[arg(long)]
    no_prefix: bool,
    /// Also write each rank's output (both streams, unprefixed) to
    /// `DIR/rank-<r>.log` (`rank-<r>.restart-<k>.log` after a restart); the
    /// terminal still shows it. Not with --backend mpi.
    #[arg(long, value_name = "DIR")]
    log_dir: Option<PathBuf>,
    /// Log what the launcher does.
    #[arg(short, long)]
    verbose: bool,
    /// The program and its arguments (after `--` when an argument of the
    /// program could be taken for one of mlx-launch's). An unknown option
    /// before the program is an error, not the program.
    #[arg(required = true, trailing_var_arg = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

fn timeout_secs(s: &str) -> Result<Duration, String> {
    launch::parse_seconds(s, true)
}

fn grace_secs(s: &str) -> Result<Duration, String> {
    launch::parse_seconds(s, false)
}

fn spec(a: Args) -> anyhow::Result<(LaunchSpec, Restarts)> {
    let backend = Backend::from_name(&a.backend)
        .with_context(|| format!("unknown backend {:?}", a.backend))?;
    if a.max_restarts > 0 && backend == Backend::Mpi {
        bail!(
            "--max-restarts is not supported with --backend mpi (mpirun supervises those ranks); use the ring, tls or quic backend"
        );
    }
    let restarts = Restarts {
        max_restarts: a.max_restarts,
        backoff: a.restart_backoff,
        max_backoff: launch::restart::MAX_BACKOFF.max(a.restart_backoff),
    };
    if a.log_dir.is_some() && backend == Backend::Mpi {
        bail!(
            "--log-dir is not supported with --backend mpi (mpirun forwards the output; use --mpi-arg=--output-filename --mpi-arg=DIR)"
        );
    }
    if a.n == Some(0) {
        bail!("-n 0: there must be at least one process");
    }
    let per_host = a.n.unwrap_or(1);
    let hosts: Vec<RankHost> = if let Some(f) = &a.hostfile {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let entries =
            parse_launcher_hostfile(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        entries
            .iter()
            .flat_map(|e| std::iter::repeat_n(e.host.clone(), a.n.or(e.slots).unwrap_or(1)))
            .collect()
    } else if !a.hosts.is_empty() {
        let hs = a
            .hosts
            .iter()
            .map(|h| RankHost::on(h).map_err(|e| anyhow::anyhow!("--hosts: {e}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        hs.iter()
            .flat_map(|h| std::iter::repeat_n(h.clone(), per_host))
            .collect()
    } else {
        // One process by default, as mlx.launch and torchrun.
        (0..per_host).map(|_| RankHost::local()).collect()
    };
    if hosts.is_empty() {
        bail!("no ranks to launch");
    }
    let mut env: Vec<(String, String)> = a
        .env
        .iter()
        .map(|kv| {
            let (k, v) = kv
                .split_once('=')
                .with_context(|| format!("--env {kv:?} is not K=V"))?;
            launch::check_env_key(k).map_err(|e| anyhow::anyhow!("--env: {e}"))?;
            Ok((k.to_string(), v.to_string()))
        })
        .collect::<anyhow::Result<_>>()?;
    env.extend(
        launch::env_from(&a.env_from, |k| std::env::var(k).ok()).map_err(anyhow::Error::msg)?,
    );
    let spec = LaunchSpec {
        command: a.command,
        hosts,
        backend,
        env,
        cwd: a.cwd,
        starting_port: a.starting_port,
        connections_per_peer: a.connections_per_peer.max(1),
        prefix_output: !a.no_prefix,
        grace: a.grace.unwrap_or(launch::DEFAULT_GRACE),
        collective_timeout: a.timeout,
        liveness_timeout: a.liveness_timeout,
        ssh_config: a.ssh_config,
        remote_launcher: a.remote_launcher,
        mpi_args: a.mpi_args,
        restart_count: 0,
        log_dir: a.log_dir,
    };
    Ok((spec, restarts))
}

/// The launcher's log lines as its other lines: `mlx-launch: warning: ...`,
/// so that each line says whose it is among the ranks' `[r]` lines.
struct Prefixed;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Prefixed
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut writer: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = match *event.metadata().level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            tracing::Level::INFO => "info",
            tracing::Level::DEBUG => "debug",
            tracing::Level::TRACE => "trace",
        };
        write!(writer, "mlx-launch: {level}: ")?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

fn main() {
    // The remote end of a launch, started by another mlx-launch over ssh:
    // everything it needs comes on standard input.
    let argv: Vec<String> = std::env::args().skip(1).collect();
    match argv.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        [launch::agent::AGENT_FLAG] => std::process::exit(launch::agent::run_agent()),
        [launch::check::PROBE_FLAG] => std::process::exit(launch::check::run_probe()),
        _ => {}
    }
    let args = Args::parse();
    let checking = args.check;
    let level = if args.verbose { "debug" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MLX_LAUNCH_LOG")
                .unwrap_or_else(|_| level.into()),
        )
        .event_format(Prefixed)
        .with_writer(mlx_progress::stderr)
        .init();
    let (spec, restarts) = match spec(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mlx-launch: {e:#}");
            std::process::exit(2);
        }
    };
    if checking {
        let ready = launch::check::check(&spec, &mut std::io::stdout().lock());
        std::process::exit(match ready {
            Ok(true) => 0,
            Ok(false) => 1,
            Err(e) => {
                eprintln!("mlx-launch --check: {e}");
                2
            }
        });
    }
    if spec.backend == Backend::Mpi {
        if spec.collective_timeout.is_some() || spec.liveness_timeout.is_some() {
            eprintln!(
                "mlx-launch: warning: the MPI backend has no collective or liveness timeout; --timeout and --liveness-timeout are ignored"
            );
        }
        // mpirun supervises the ranks and reports a failing one itself.
        match launch::mpirun::run(&spec) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("mlx-launch: {e:#}");
                std::process::exit(2);
            }
        }
    }
    let result = launch::run_with_restarts(&spec, &restarts, &mut |line| {
        eprintln!("mlx-launch: {line}")
    });
    match result {
        Ok(outcome) => {
            if let Some(line) = outcome.report() {
                eprintln!("mlx-launch: {line}");
            }
            std::process::exit(outcome.exit_code());
        }
        Err(e) => {
            eprintln!("mlx-launch: {e:#}");
            std::process::exit(2);
        }
    }
}
