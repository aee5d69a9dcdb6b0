//! Collective benchmark: all_sum and all_gather from 1 KiB to 256 MiB at world
//! 2 and 4 on loopback, against a plain single-stream TCP copy of the same
//! bytes as the ceiling. One command runs everything:
//!
//! ```text
//! cargo run --release -p mlx-dist --example collectives_bench
//! cargo run --release -p mlx-dist --example collectives_bench -- --max-bytes 67108864 --worlds 2
//! ```
//!
//! Bus bandwidth follows the NCCL convention: `algbw * 2(n-1)/n` for all_sum,
//! `algbw * (n-1)/n` for all_gather (bytes = the gathered output), so it is
//! directly comparable with the bytes one link can move.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use clap::Parser;
use mlx_dist::launch::{self, LaunchSpec};
use mlx_dist::{Backend, init};

#[derive(Parser, Debug, Clone)]
struct Args {
    /// Largest message in bytes.
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: usize,
    /// Smallest message in bytes.
    #[arg(long, default_value_t = 1024)]
    min_bytes: usize,
    /// Operations to time.
    #[arg(long, value_delimiter = ',', default_value = "all_sum,all_gather")]
    ops: Vec<String>,
    /// World sizes to run.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    worlds: Vec<usize>,
    /// Connections per peer and ring direction.
    #[arg(long, default_value_t = 1)]
    connections: usize,
    /// Backends to run (ring, quic, mpi); unavailable ones are reported and skipped.
    #[arg(long, value_delimiter = ',', default_value = "ring,quic,mpi")]
    backends: Vec<String>,
}

fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut v = vec![];
    let mut s = min.max(1024);
    while s <= max {
        v.push(s);
        s *= 4;
    }
    v
}

fn iters(bytes: usize) -> usize {
    ((256usize << 20) / bytes).clamp(3, 2000)
}

/// Seconds to move `bytes` over one loopback TCP stream (median of a few copies).
fn tcp_copy(bytes: usize) -> f64 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let reps = iters(bytes).min(200);
    let rx = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_nodelay(true).unwrap();
        let mut buf = vec![0u8; bytes];
        for _ in 0..reps + 1 {
            s.read_exact(&mut buf).unwrap();
            s.write_all(&[1]).unwrap();
        }
    });
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let buf = vec![7u8; bytes];
    let mut ack = [0u8];
    let mut times = Vec::new();
    for i in 0..reps + 1 {
        let t = Instant::now();
        s.write_all(&buf).unwrap();
        s.read_exact(&mut ack).unwrap();
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    rx.join().unwrap();
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    times[times.len() / 2]
}

fn rank_main(args: &Args) -> anyhow::Result<()> {
    let g = init(Backend::Any)?;
    let n = g.size();
    let ceiling: Vec<f64> = std::env::var("BENCH_CEILING")?
        .split(',')
        .map(|s| s.parse().unwrap())
        .collect();
    for (k, &bytes) in sizes(args.min_bytes, args.max_bytes).iter().enumerate() {
        let ceil_gbs = bytes as f64 / ceiling[k] / 1e9;
        for op in args.ops.iter().map(String::as_str) {
            let mut buf = vec![1.0f32; bytes / 4];
            let part = vec![1.0f32; bytes / 4 / n];
            let mut out = vec![0.0f32; part.len() * n];
            let mut run = || -> anyhow::Result<()> {
                if op == "all_sum" {
                    g.all_sum(&mut buf)?;
                } else {
                    g.all_gather_into_bytes(
                        bytemuck::cast_slice(&part),
                        bytemuck::cast_slice_mut(&mut out),
                        mlx_array::Dtype::F32,
                    )?;
                }
                Ok(())
            };
            run()?;
            g.barrier()?;
            let it = iters(bytes);
            let t = Instant::now();
            for _ in 0..it {
                run()?;
            }
            g.barrier()?;
            let secs = t.elapsed().as_secs_f64() / it as f64;
            let algbw = bytes as f64 / secs / 1e9;
            let factor = if op == "all_sum" {
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

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if std::env::var("MLX_RANK").is_ok() {
        return rank_main(&args);
    }
    let sz = sizes(args.min_bytes, args.max_bytes);
    println!("single-stream TCP copy on loopback (the ceiling):");
    let mut ceiling = Vec::new();
    for &b in &sz {
        let t = tcp_copy(b);
        println!(
            "  {:>10} {:>11.1} us {:>9.3} GB/s",
            human(b),
            t * 1e6,
            b as f64 / t / 1e9
        );
        ceiling.push(t);
    }
    println!(
        "\n{:<5} {:<10} {:>5} {:>10} {:>11} {:>9} {:>9} {:>9} {:>7}",
        "algo", "op", "world", "bytes", "time us", "algbw", "busbw", "tcp GB/s", "ratio"
    );
    let exe = std::env::current_exe()?;
    for b in &args.backends {
        let backend =
            Backend::from_name(b).ok_or_else(|| anyhow::anyhow!("unknown backend {b}"))?;
        if !mlx_dist::is_available(backend) {
            println!("{b:<5} not available in this build; skipped");
            continue;
        }
        for &w in &args.worlds {
            let mut cmd = vec![exe.display().to_string()];
            cmd.extend(std::env::args().skip(1));
            let mut spec = LaunchSpec::local(w, cmd);
            spec.backend = backend;
            spec.prefix_output = false;
            spec.connections_per_peer = args.connections;
            spec.stall_timeout = Some(Duration::from_secs(120));
            spec.env.push((
                "BENCH_CEILING".into(),
                ceiling
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(","),
            ));
            let out = launch::run(&spec)?;
            anyhow::ensure!(
                out.first_failure.is_none(),
                "world {w} failed: {:?}",
                out.first_failure
            );
        }
    }
    Ok(())
}
