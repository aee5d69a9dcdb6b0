//! `mlx-launch`: start a distributed program on N processes, locally or over ssh.
//!
//! ```text
//! mlx-launch -n 4 -- target/release/examples/all_sum
//! mlx-launch --hosts a,b --backend ring --env RUST_LOG=info -- ./train --steps 100
//! ```

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Parser;
use mlx_dist::Backend;
use mlx_dist::launch::{self, LaunchSpec, RankHost, parse_launcher_hostfile};

/// Start a distributed mlx-dist program on several processes.
#[derive(Parser, Debug)]
#[command(name = "mlx-launch", version, about)]
struct Args {
    /// Number of processes (per host when --hosts or --hostfile is given).
    #[arg(short = 'n', long = "nproc")]
    n: Option<usize>,
    /// Comma-separated hosts to start ranks on over ssh (localhost runs locally).
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// JSON host file: MLX's [{"ssh": "host", "ips": ["10.0.0.1"]}, ...] or ["host", ...].
    #[arg(long)]
    hostfile: Option<PathBuf>,
    /// Transport: ring (TCP), quic or mpi.
    #[arg(long, default_value = "ring")]
    backend: String,
    /// Extra environment variable for every rank, K=V (repeatable).
    #[arg(long = "env", value_name = "K=V")]
    env: Vec<String>,
    /// Working directory of the ranks.
    #[arg(long)]
    cwd: Option<PathBuf>,
    /// First port; rank r listens on starting-port + r (free ports are chosen for local jobs otherwise).
    #[arg(long)]
    starting_port: Option<u16>,
    /// TCP connections per peer and ring direction.
    #[arg(long, default_value_t = 1)]
    connections_per_peer: usize,
    /// Stall timeout for the ranks, in seconds (default 30).
    #[arg(long)]
    timeout: Option<f64>,
    /// Seconds the other ranks may run on after one fails.
    #[arg(long, default_value_t = 5.0)]
    grace: f64,
    /// Do not prefix output lines with `[rank]`.
    #[arg(long)]
    no_prefix: bool,
    /// Log what the launcher does.
    #[arg(short, long)]
    verbose: bool,
    /// The program and its arguments.
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
    command: Vec<String>,
}

fn spec(a: Args) -> anyhow::Result<LaunchSpec> {
    let backend = Backend::from_name(&a.backend)
        .with_context(|| format!("unknown backend {:?}", a.backend))?;
    let per_host = a.n.unwrap_or(1);
    let hosts: Vec<RankHost> = if let Some(f) = &a.hostfile {
        let text =
            std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let hs =
            parse_launcher_hostfile(&text).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
        hs.iter()
            .flat_map(|h| std::iter::repeat_n(h.clone(), per_host))
            .collect()
    } else if !a.hosts.is_empty() {
        a.hosts
            .iter()
            .flat_map(|h| std::iter::repeat_n(RankHost::on(h), per_host))
            .collect()
    } else {
        let n =
            a.n.context("say how many processes with -n N (or give --hosts / --hostfile)")?;
        (0..n).map(|_| RankHost::local()).collect()
    };
    if hosts.is_empty() {
        bail!("no ranks to launch");
    }
    let env = a
        .env
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .with_context(|| format!("--env {kv:?} is not K=V"))
        })
        .collect::<anyhow::Result<_>>()?;
    Ok(LaunchSpec {
        command: a.command,
        hosts,
        backend,
        env,
        cwd: a.cwd,
        starting_port: a.starting_port,
        connections_per_peer: a.connections_per_peer.max(1),
        prefix_output: !a.no_prefix,
        grace: Duration::from_secs_f64(a.grace.max(0.0)),
        stall_timeout: a.timeout.map(|t| Duration::from_secs_f64(t.max(0.001))),
    })
}

fn main() {
    let args = Args::parse();
    let level = if args.verbose { "debug" } else { "warn" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("MLX_LAUNCH_LOG")
                .unwrap_or_else(|_| level.into()),
        )
        .with_target(false)
        .without_time()
        .with_writer(std::io::stderr)
        .init();
    let spec = match spec(args) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("mlx-launch: {e:#}");
            std::process::exit(2);
        }
    };
    if spec.backend == Backend::Mpi {
        // mpirun supervises the ranks and reports a failing one itself.
        match launch::mpirun::run(&spec) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("mlx-launch: {e:#}");
                std::process::exit(2);
            }
        }
    }
    let result = launch::run(&spec);
    match result {
        Ok(outcome) => {
            if let Some((rank, how)) = &outcome.first_failure {
                eprintln!("mlx-launch: rank {rank} failed ({how})");
            }
            std::process::exit(outcome.exit_code());
        }
        Err(e) => {
            eprintln!("mlx-launch: {e:#}");
            std::process::exit(2);
        }
    }
}
