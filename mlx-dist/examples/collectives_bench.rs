//! Collective benchmark: all_sum and all_gather from 1 KiB to 256 MiB at world
//! 2 and 4 on loopback, against a plain single-stream TCP copy of the same
//! bytes as the ceiling. `cargo xtask bench collectives` runs it for every
//! backend (building it with `--features mpi` when Open MPI is there) and
//! writes the tables into a run folder; by hand:
//!
//! ```text
//! cargo run --release -p mlx-dist --example collectives_bench
//! cargo run --release -p mlx-dist --example collectives_bench -- --max-bytes 67108864 --worlds 2
//! cargo run --release -p mlx-dist --features mpi --example collectives_bench -- --backends mpi
//! ```
//!
//! Ring and QUIC ranks are started the way `mlx-launch` starts them; MPI
//! ranks through `mpirun` (as `mlx-launch --backend mpi` does). With
//! `--hosts h0,h1,...` (and `--ssh-config`) the ranks run on those hosts over
//! ssh, one per host, and `--ceiling-gbs` gives the ceiling measured apart;
//! `--tcp-recv ADDR` / `--tcp-send ADDR` are the two ends of a one-stream
//! measurement between hosts (`cargo xtask bench collectives --hosts 4` runs
//! all of this on emulated hosts). `--json PATH`
//! writes every figure (and every skipped or failed run with its reason) for
//! tools. A failed run is reported and the others still run; the exit status
//! is then non-zero.
//!
//! Time per operation is the mean over back-to-back repetitions on rank 0
//! (after a warm-up and a barrier; a barrier closes the timed loop). Bus
//! bandwidth follows the NCCL convention: `algbw * 2(n-1)/n` for all_sum,
//! `algbw * (n-1)/n` for all_gather (bytes = the gathered output), so it is
//! directly comparable with the bytes one link can move.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use mlx_dist::launch::{self, LaunchSpec};
use mlx_dist::{Backend, init};
use serde_json::{Value, json};

/// Set for the ranks: the ceiling's seconds per size, comma-separated.
const ENV_CEILING: &str = "BENCH_CEILING";
/// Set for the ranks when `--json` is given: where rank 0 appends its rows (JSON lines).
const ENV_ROWS: &str = "BENCH_ROWS";

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Largest message in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Smallest message in bytes.
    #[arg(long, default_value_t = 1024)]
    min_bytes: usize,
    /// Operations to time (all_sum, all_gather, sum_scatter; all_sum_bf16
    /// and sum_scatter_bf16: the same bytes of bfloat16, whose sums over
    /// more than two ranks are summed at each block's owner).
    #[arg(long, value_delimiter = ',', default_value = "all_sum,all_gather")]
    ops: Vec<String>,
    /// World sizes to run.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    worlds: Vec<usize>,
    /// Connections per peer and ring direction.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Backends to run (ring, tls, quic, mpi); unavailable ones are reported and skipped.
    #[arg(long, value_delimiter = ',', default_value = "ring,tls,quic,mpi")]
    backends: Vec<String>,
    /// Write every figure as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Start the ranks over ssh on these hosts, one rank per host (world `w`
    /// takes the first `w`), through mlx-launch's library as `mlx-launch
    /// --hosts` does; the remote hosts must share this file system.
    #[arg(long, value_delimiter = ',')]
    hosts: Vec<String>,
    /// ssh configuration file for `--hosts` (`ssh -F`).
    #[arg(long)]
    ssh_config: Option<PathBuf>,
    /// The ceiling in GB/s for every size (e.g. one TCP stream between two
    /// hosts, measured apart); without it, a loopback TCP copy of each size.
    #[arg(long)]
    ceiling_gbs: Option<f64>,
    /// Extra argument for mpirun (repeatable), e.g.
    /// `--mpi-arg=--mca --mpi-arg=btl_tcp_if_include --mpi-arg=10.0.0.0/24`.
    #[arg(long, allow_hyphen_values = true)]
    mpi_arg: Vec<String>,
    /// Time each size for about this many seconds (at least 3 repetitions,
    /// at most the default count) instead of moving about 256 MiB.
    #[arg(long)]
    seconds_per_size: Option<f64>,
    /// Extra environment variable for every rank, K=V (repeatable), e.g.
    /// `--env MLX_DIST_SOCKET_BUFFER=4194304`.
    #[arg(long)]
    env: Vec<String>,
    /// One-stream mode, no ranks: accept one connection on ADDR, read what
    /// the sender sends and acknowledge each transfer (see `--tcp-send`).
    #[arg(long, value_name = "ADDR")]
    tcp_recv: Option<String>,
    /// One-stream mode, no ranks: send `--tcp-bytes` to ADDR `--tcp-reps`
    /// times over one TCP connection, each time waiting for the receiver's
    /// acknowledgement, and print the median GB/s as JSON (the first
    /// transfer is a warm-up and not counted).
    #[arg(long, value_name = "ADDR")]
    tcp_send: Option<String>,
    /// Bytes per transfer of `--tcp-send`.
    #[arg(long, default_value_t = 256 << 20)]
    tcp_bytes: usize,
    /// Transfers of `--tcp-send`, the warm-up included.
    #[arg(long, default_value_t = 4)]
    tcp_reps: usize,
}

/// Message sizes: powers of 4 times `min` up to `max`.
fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = vec![];
    let mut s = min.max(1024);
    while s <= max {
        v.push(s);
        s *= 4;
    }
    v
}

/// Timed repetitions for one size: about 256 MiB moved, 3 to 2000 times.
fn iters(bytes: usize) -> usize {
    ((256usize << 20) / bytes).clamp(3, 2000)
}

/// Seconds to move `bytes` over one loopback TCP stream (median of a few copies).
fn tcp_copy(bytes: usize) -> anyhow::Result<f64> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    let addr = l.local_addr()?;
    let reps = iters(bytes).min(200);
    let rx = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut s, _) = l.accept()?;
        s.set_nodelay(true)?;
        let mut buf = vec![0u8; bytes];
        for _ in 0..reps + 1 {
            s.read_exact(&mut buf)?;
            s.write_all(&[1])?;
        }
        Ok(())
    });
    let mut s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    let buf = vec![7u8; bytes];
    let mut ack = [0u8];
    let mut times = Vec::new();
    for i in 0..reps + 1 {
        let t = Instant::now();
        s.write_all(&buf)?;
        s.read_exact(&mut ack)?;
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    rx.join()
        .map_err(|_| anyhow::anyhow!("the TCP copy's receiver panicked"))??;
    times.sort_by(|a, b| a.total_cmp(b));
    Ok(times[times.len() / 2])
}

/// `--tcp-recv`: reads transfers announced by an 8-byte length and
/// acknowledges each with one byte, until the sender closes.
fn tcp_recv(addr: &str) -> anyhow::Result<()> {
    let l = TcpListener::bind(addr).with_context(|| format!("listening on {addr}"))?;
    // Ready: the sender may connect (it retries until then anyway).
    println!("listening on {addr}");
    std::io::stdout().flush()?;
    let (mut s, _) = l.accept()?;
    s.set_nodelay(true)?;
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let mut len = [0u8; 8];
        match s.read_exact(&mut len) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e.into()),
        }
        let mut left = u64::from_le_bytes(len) as usize;
        while left > 0 {
            let k = buf.len().min(left);
            s.read_exact(&mut buf[..k])?;
            left -= k;
        }
        s.write_all(&[1])?;
    }
}

/// `--tcp-send`: the one-stream rate to `addr` (see [`Args::tcp_send`]).
fn tcp_send(addr: &str, bytes: usize, reps: usize) -> anyhow::Result<()> {
    anyhow::ensure!(
        reps >= 2,
        "--tcp-reps must be at least 2 (the first is a warm-up)"
    );
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut s = loop {
        match TcpStream::connect(addr) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e).with_context(|| format!("connecting to {addr}")),
        }
    };
    s.set_nodelay(true)?;
    let buf = vec![7u8; (4 << 20).min(bytes.max(1))];
    let mut ack = [0u8];
    let mut times = Vec::new();
    for i in 0..reps {
        let t = Instant::now();
        s.write_all(&(bytes as u64).to_le_bytes())?;
        let mut left = bytes;
        while left > 0 {
            let k = buf.len().min(left);
            s.write_all(&buf[..k])?;
            left -= k;
        }
        s.read_exact(&mut ack)?;
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    let mut sorted = times.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let median = sorted[sorted.len() / 2];
    let gbs: Vec<f64> = times.iter().map(|t| bytes as f64 / t / 1e9).collect();
    println!(
        "{}",
        json!({"bytes": bytes, "reps": reps - 1, "median_s": median,
               "gbs": bytes as f64 / median / 1e9, "each_gbs": gbs})
    );
    Ok(())
}

fn rank_main(args: &Args) -> anyhow::Result<()> {
    let g = init(Backend::Any)?;
    let n = g.size();
    let ceiling: Vec<f64> = std::env::var(ENV_CEILING)?
        .split(',')
        .map(|s| s.parse())
        .collect::<Result<_, _>>()
        .with_context(|| format!("{ENV_CEILING} is not a list of seconds"))?;
    let mut rows = match (g.rank(), std::env::var_os(ENV_ROWS)) {
        (0, Some(p)) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .with_context(|| format!("opening {}", Path::new(&p).display()))?,
        ),
        _ => None,
    };
    for (k, &bytes) in sizes(args.min_bytes, args.max_bytes).iter().enumerate() {
        let ceil_gbs = bytes as f64 / ceiling[k] / 1e9;
        for op in args.ops.iter().map(String::as_str) {
            let mut buf = vec![1.0f32; bytes / 4];
            let part = vec![1.0f32; bytes / 4 / n];
            let mut out = vec![0.0f32; part.len() * n];
            let bf16 = mlx_array::Dtype::BF16;
            // The bytes of the whole message: all_sum's buffer, all_gather's
            // gathered output, sum_scatter's input (every rank's part of it).
            let moved = if op.starts_with("all_sum") {
                buf.len() * 4
            } else {
                out.len() * 4
            };
            let mut run = || -> anyhow::Result<()> {
                match op {
                    "all_sum" => g.all_sum(&mut buf)?,
                    // The n-part `out` in, one part of `buf` out.
                    "sum_scatter" => g.sum_scatter_into(&out, &mut buf[..part.len()])?,
                    // The same bytes as bfloat16 (each f32 one reads as 0 and 1).
                    "all_sum_bf16" => g.all_sum_bytes(bytemuck::cast_slice_mut(&mut buf), bf16)?,
                    "sum_scatter_bf16" => g.sum_scatter_into_bytes(
                        bytemuck::cast_slice(&out),
                        bytemuck::cast_slice_mut(&mut buf[..part.len()]),
                        bf16,
                    )?,
                    "all_gather" => g.all_gather_into_bytes(
                        bytemuck::cast_slice(&part),
                        bytemuck::cast_slice_mut(&mut out),
                        mlx_array::Dtype::F32,
                    )?,
                    _ => anyhow::bail!(
                        "unknown op {op:?} (all_sum, all_gather, sum_scatter, all_sum_bf16, sum_scatter_bf16)"
                    ),
                }
                Ok(())
            };
            let warm = Instant::now();
            run()?;
            let warm = warm.elapsed().as_secs_f64();
            let it = match args.seconds_per_size {
                // Fewer repetitions where one takes long (slow links): what
                // fits the budget by the warm-up's time, at least 3. The
                // ranks agree on the mean of their counts (exact in f32).
                Some(budget) => {
                    let mine = ((budget / warm.max(1e-9)) as usize).clamp(3, iters(bytes));
                    let mut c = [mine as f32];
                    g.all_sum(&mut c)?;
                    (c[0] as usize / n).max(3)
                }
                None => iters(bytes),
            };
            g.barrier()?;
            let t = Instant::now();
            for _ in 0..it {
                run()?;
            }
            g.barrier()?;
            let secs = t.elapsed().as_secs_f64() / it as f64;
            let algbw = moved as f64 / secs / 1e9;
            let factor = if op.starts_with("all_sum") {
                2.0 * (n - 1) as f64 / n as f64
            } else {
                (n - 1) as f64 / n as f64
            };
            let busbw = algbw * factor;
            if g.rank() == 0 {
                println!(
                    "{:<5} {:<10} {:>5} {:>10} {:>11.1} {:>9.3} {:>9.3} {:>9.3} {:>6.0}%",
                    g.backend(),
                    op,
                    n,
                    human(bytes),
                    secs * 1e6,
                    algbw,
                    busbw,
                    ceil_gbs,
                    100.0 * busbw / ceil_gbs
                );
                if let Some(f) = rows.as_mut() {
                    let row = json!({
                        "op": op,
                        "bytes": moved,
                        "iters": it,
                        "time_us": secs * 1e6,
                        "algbw_gbs": algbw,
                        "busbw_gbs": busbw,
                        "ceiling_gbs": ceil_gbs,
                        "ratio": busbw / ceil_gbs,
                    });
                    writeln!(f, "{row}")?;
                }
            }
        }
    }
    Ok(())
}

fn human(b: usize) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

/// Runs one backend at one world size; `Err` carries why it failed.
fn launch_one(
    args: &Args,
    backend: Backend,
    world: usize,
    ceiling: &[f64],
    rows: Option<&Path>,
) -> anyhow::Result<()> {
    let mut cmd = vec![std::env::current_exe()?.display().to_string()];
    cmd.extend(std::env::args().skip(1));
    let mut spec = LaunchSpec::local(world, cmd);
    if !args.hosts.is_empty() {
        anyhow::ensure!(
            args.hosts.len() >= world,
            "world {world} needs {world} hosts; --hosts names {}",
            args.hosts.len()
        );
        spec.hosts = args.hosts[..world]
            .iter()
            .map(|h| launch::RankHost::on(h).map_err(anyhow::Error::msg))
            .collect::<anyhow::Result<_>>()?;
        spec.ssh_config = args.ssh_config.clone();
        spec.mpi_args = args.mpi_arg.clone();
    }
    for kv in &args.env {
        let (k, v) = kv
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--env {kv:?} is not K=V"))?;
        spec.env.push((k.into(), v.into()));
    }
    spec.backend = backend;
    spec.prefix_output = false;
    spec.connections_per_peer = args.connections;
    spec.collective_timeout = Some(Duration::from_secs(120));
    spec.env.push((
        ENV_CEILING.into(),
        ceiling
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(","),
    ));
    if let Some(p) = rows {
        spec.env.push((ENV_ROWS.into(), p.display().to_string()));
    }
    if backend == Backend::Mpi {
        // mpirun supervises the ranks: it stops them all when one fails.
        let code = launch::mpirun::run(&spec)?;
        anyhow::ensure!(code == 0, "mpirun exited with status {code}");
        return Ok(());
    }
    let out = launch::run(&spec)?;
    match out.report() {
        Some(why) => anyhow::bail!(why),
        None => Ok(()),
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if std::env::var_os(ENV_CEILING).is_some() {
        return rank_main(&args);
    }
    if let Some(addr) = &args.tcp_recv {
        return tcp_recv(addr);
    }
    if let Some(addr) = &args.tcp_send {
        return tcp_send(addr, args.tcp_bytes, args.tcp_reps);
    }
    let sz = sizes(args.min_bytes, args.max_bytes);
    anyhow::ensure!(
        !sz.is_empty(),
        "no message sizes between --min-bytes {} and --max-bytes {}",
        args.min_bytes,
        args.max_bytes
    );
    let mut ceiling = Vec::new();
    let mut ceiling_json = Vec::new();
    match args.ceiling_gbs {
        Some(g) => println!("the ceiling (given): {g:.3} GB/s at every size"),
        None => println!("single-stream TCP copy on loopback (the ceiling):"),
    }
    for &b in &sz {
        let t = match args.ceiling_gbs {
            Some(g) => {
                anyhow::ensure!(g > 0.0, "--ceiling-gbs must be positive");
                b as f64 / (g * 1e9)
            }
            None => tcp_copy(b)?,
        };
        if args.ceiling_gbs.is_none() {
            println!(
                "  {:>10} {:>11.1} us {:>9.3} GB/s",
                human(b),
                t * 1e6,
                b as f64 / t / 1e9
            );
        }
        ceiling.push(t);
        ceiling_json.push(json!({"bytes": b, "time_us": t * 1e6, "gbs": b as f64 / t / 1e9}));
    }
    println!(
        "\n{:<5} {:<10} {:>5} {:>10} {:>11} {:>9} {:>9} {:>9} {:>7}",
        "algo", "op", "world", "bytes", "time us", "algbw", "busbw", "tcp GB/s", "ratio"
    );
    let mut runs = Vec::new();
    let mut failures = Vec::new();
    for b in &args.backends {
        let backend =
            Backend::from_name(b).ok_or_else(|| anyhow::anyhow!("unknown backend {b}"))?;
        if !mlx_dist::is_available(backend) {
            let reason = format!("{b} is not in this build (cargo feature `{b}` of mlx-dist)");
            println!("{b:<5} skipped: {reason}");
            runs.push(json!({"backend": b, "status": "skipped", "reason": reason}));
            continue;
        }
        for &w in &args.worlds {
            let rows_file = args
                .json
                .as_ref()
                .map(|j| j.with_extension(format!("{b}-{w}.jsonl")));
            if let Some(p) = &rows_file {
                let _ = std::fs::remove_file(p);
            }
            let t = Instant::now();
            let result = launch_one(&args, backend, w, &ceiling, rows_file.as_deref());
            let wall_s = t.elapsed().as_secs_f64();
            let rows: Vec<Value> = match &rows_file {
                Some(p) => std::fs::read_to_string(p)
                    .unwrap_or_default()
                    .lines()
                    .map(serde_json::from_str)
                    .collect::<Result<_, _>>()
                    .with_context(|| format!("parsing {}", p.display()))?,
                None => vec![],
            };
            if let Some(p) = &rows_file {
                let _ = std::fs::remove_file(p);
            }
            let (status, reason) = match result {
                Ok(()) => ("ok", None),
                Err(e) => {
                    let reason = format!("{e:#}");
                    eprintln!("collectives_bench: {b} world {w} failed: {reason}");
                    failures.push(format!("{b} world {w}: {reason}"));
                    ("failed", Some(reason))
                }
            };
            runs.push(json!({
                "backend": b, "world": w, "status": status, "reason": reason,
                "wall_s": wall_s, "rows": rows,
            }));
        }
    }
    if let Some(p) = &args.json {
        let report = json!({
            "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
            "ceiling": ceiling_json,
            "runs": runs,
        });
        std::fs::write(p, serde_json::to_string_pretty(&report)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    anyhow::ensure!(
        failures.is_empty(),
        "{} run(s) failed:\n  {}",
        failures.len(),
        failures.join("\n  ")
    );
    Ok(())
}
