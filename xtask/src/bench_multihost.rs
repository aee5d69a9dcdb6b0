//! `cargo xtask bench collectives --hosts N --rates 10gbit,1gbit`: the
//! collectives across emulated hosts (`xtask::hosts`: network namespaces
//! with sshd, their links shaped by `tc tbf`), one rank per host.
//!
//! Under `/tmp/mlx-hosts.lock` (the hosts are one machine-wide resource) it
//! brings N hosts up (a [`HostsGuard`]: they come down on every exit), and
//! per link rate:
//! - the ceiling: one TCP stream from host 0 to host 1 (the
//!   `collectives_bench` example's `--tcp-send`/`--tcp-recv`, started in the
//!   namespaces with `ip netns exec`); and, to show what this machine's cores
//!   allow, `n` such streams at once around the ring of hosts;
//! - all_sum and all_gather, 1 KiB to 256 MiB, at each world size, over our
//!   ring, TLS and QUIC (ranks started over ssh by mlx-launch's library, as
//!   `mlx-launch --hosts` does), Open MPI (`mpirun --host` over ssh), and
//!   MLX's ring (`../shared/anchors/mlx/allsum_bench.py` from ~/mlx-venv,
//!   each rank started in its host's namespace);
//!
//! then fits the alpha-beta model of the ring ([`crate::alpha_beta`]) per
//! rate, projects the reference Llama's step onto more hosts, and writes
//! `multihost.md`, `multihost.json` and `projection.png` into the run folder.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use crate::alpha_beta::{self, Fit, Projection, Sample};
use crate::bench_collectives::{
    CollectivesArgs, Row, Run, build_example, describe, human, load_average, run_collectives_with,
    time,
};
use crate::hosts::{self, Hosts, HostsGuard};
use crate::report_common::{Goal, goals_table};
use crate::util::{Ended, cargo, log_tail, root, run_logged, target_dir, timestamp};

/// Everyone who brings the emulated hosts up takes this lock first.
/// The goals' message size.
const GOAL_BYTES: u64 = 64 << 20;
/// The encrypted transports' goal at 10 Gbit/s: this fraction of the
/// ring's bus bandwidth (TLS over the ring's TCP is the road taken; QUIC is
/// measured beside it).
const GOAL_QUIC_OF_RING: f64 = 0.5;

/// The backends measured across hosts, in the tables' order.
const BACKENDS: [&str; 5] = ["ring", "tls", "quic", "mpi", "mlx"];
/// Ports of the one-stream measurements (one per concurrent stream).
const STREAM_PORT: u16 = 5201;
/// First port of MLX's ranks (each MLX run takes the next ten).
const MLX_PORT: u16 = 42323;
/// MLX's message sizes (the anchor's defaults), cut at `--max-bytes`.
const MLX_SIZES: [(&str, u64); 6] = [
    ("1K", 1 << 10),
    ("64K", 64 << 10),
    ("1M", 1 << 20),
    ("16M", 16 << 20),
    ("64M", 64 << 20),
    ("256M", 256 << 20),
];
/// The message sizes of the summary tables.
const KEY_SIZES: [u64; 5] = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 64 << 10];

/// The ring's goal at a link rate: a fraction of the one-stream ceiling.
fn ring_goal(bits: u64) -> Option<f64> {
    match bits {
        1_000_000_000 => Some(0.95),
        10_000_000_000 => Some(0.90),
        _ => None,
    }
}

/// One MLX all_sum size.
struct MlxRow {
    bytes: u64,
    /// The slowest rank's median seconds.
    secs: f64,
    busbw: f64,
    ok: bool,
}

/// MLX's ring at one world size.
struct MlxRun {
    world: usize,
    /// "ok", "failed" or "skipped".
    status: String,
    reason: Option<String>,
    rows: Vec<MlxRow>,
}

/// Everything measured at one link rate.
struct RateResult {
    /// As given (tc syntax).
    rate: String,
    bits: u64,
    /// One stream host 0 -> host 1, GB/s (the median transfer), or why not.
    ceiling: Result<f64, String>,
    /// Each timed transfer of the one stream, GB/s.
    ceiling_each: Vec<f64>,
    /// `(n, per-stream GB/s)`: n streams at once around the ring of hosts.
    concurrent: Vec<(usize, Result<Vec<f64>, String>)>,
    runs: Vec<Run>,
    mlx: Vec<MlxRun>,
    load_before: Option<String>,
}

impl RateResult {
    /// The ceiling used for the ratios: the measured stream's best timed
    /// transfer (the machine's other work only ever slows a transfer down),
    /// else what the link carries as TCP payload with a 1500-byte MTU (1448
    /// of 1514 bytes).
    fn ceiling_gbs(&self) -> f64 {
        match &self.ceiling {
            Ok(g) => self.ceiling_each.iter().copied().fold(*g, f64::max),
            Err(_) => self.bits as f64 / 8e9 * 1448.0 / 1514.0,
        }
    }

    /// `op` of `backend` at `world` and `bytes`: (seconds, busbw GB/s).
    fn point(&self, backend: &str, world: usize, op: &str, bytes: u64) -> Option<(f64, f64)> {
        if backend == "mlx" {
            if op != "all_sum" {
                return None;
            }
            return self
                .mlx
                .iter()
                .filter(|r| r.world == world)
                .flat_map(|r| &r.rows)
                .find(|x| x.bytes == bytes)
                .map(|x| (x.secs, x.busbw));
        }
        self.runs
            .iter()
            .filter(|r| r.backend == backend && r.world == world)
            .flat_map(|r| &r.rows)
            .find(|x| x.op == op && x.bytes == bytes)
            .map(|x| (x.time_us / 1e6, x.busbw))
    }

    /// The ring's all_sum measurements at `world` (every world when `None`).
    fn ring_samples(&self, world: Option<usize>) -> Vec<Sample> {
        self.runs
            .iter()
            .filter(|r| r.backend == "ring" && world.is_none_or(|w| r.world == w))
            .flat_map(|r| {
                r.rows
                    .iter()
                    .filter(|x| x.op == "all_sum")
                    .map(move |x| Sample {
                        n: r.world,
                        bytes: x.bytes as f64,
                        secs: x.time_us / 1e6,
                    })
            })
            .collect()
    }
}

/// The fits of one rate: over every world, then per world.
struct RateFits {
    rate: String,
    bits: u64,
    joint: Option<Fit>,
    per_world: Vec<(usize, Option<Fit>)>,
}

/// Runs the multi-host benchmark (see the module documentation).
pub fn run(a: &CollectivesArgs) -> Result<()> {
    if let Some(dir) = &a.from_run {
        let dir = if dir.is_absolute() {
            dir.clone()
        } else {
            root().join(dir)
        };
        return reanalyse(a, &dir);
    }
    let n_hosts = a.hosts.context("multi-host mode needs --hosts")?;
    if n_hosts < 2 {
        bail!("--hosts needs at least 2 hosts");
    }
    let worlds: Vec<usize> = a.worlds.clone();
    if worlds.is_empty() || worlds.iter().any(|&w| w < 2 || w > n_hosts) {
        bail!("--worlds must lie between 2 and --hosts ({n_hosts}), one rank per host");
    }
    let mut rates = Vec::new();
    for r in &a.rates {
        match hosts::parse_rate(r).map_err(anyhow::Error::msg)? {
            Some(rate) => rates.push(rate),
            None => bail!("--rates takes link rates (e.g. 10gbit,1gbit), not `none`"),
        }
    }
    if rates.is_empty() {
        bail!("--rates needs at least one rate, e.g. 10gbit,1gbit");
    }
    for r in &a.project_rates {
        if hosts::parse_rate(r).map_err(anyhow::Error::msg)?.is_none() {
            bail!("--project-rates takes link rates, e.g. 10gbit,100gbit");
        }
    }
    if a.project_hosts.iter().any(|&h| h < 2) {
        bail!("--project-hosts takes host counts of at least 2");
    }
    // Across hosts there is no shared memory: ring-tcp is the ring.
    let default_backends = ["ring", "ring-tcp", "tls", "quic", "mpi"]
        .map(String::from)
        .to_vec();
    let backends: Vec<String> = if a.backends == default_backends {
        BACKENDS.map(String::from).to_vec()
    } else {
        a.backends.clone()
    };
    for b in &backends {
        if !BACKENDS.contains(&b.as_str()) {
            bail!("unknown backend {b:?} across hosts: ring, tls, quic, mpi or mlx");
        }
    }
    crate::bench_collectives::check_ops(&a.ops)?;
    if a.max_bytes() < 1024 {
        bail!("--max-bytes must be at least 1024 (the smallest message)");
    }
    hosts::available()
        .map_err(|why| anyhow::anyhow!("the multi-host benchmark cannot run here: {why}"))?;

    let out = a.out.clone().unwrap_or_else(|| {
        root()
            .join("runs")
            .join(format!("bench-multihost-{}", timestamp()))
    });
    let out = if out.is_absolute() {
        out
    } else {
        root().join(out)
    };
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let started = Instant::now();

    // Build (before taking the lock: others may use the hosts meanwhile).
    let mpi_skipped = build_example(a, &backends, &out)?;
    if !a.no_build {
        // The remote ranks' agent: the mlx-launch beside the example's folder.
        cargo(&[
            "build",
            "--release",
            "-p",
            "mlx-dist",
            "--bin",
            "mlx-launch",
        ])?;
    }
    let release = target_dir().join("release");
    let bench = release
        .join("examples")
        .join(format!("collectives_bench{}", std::env::consts::EXE_SUFFIX));
    for p in [&bench, &release.join("mlx-launch")] {
        if !p.exists() {
            bail!(
                "{} is missing: build with `cargo build --release -p mlx-dist --example collectives_bench --bin mlx-launch` (or run without --no-build)",
                p.display()
            );
        }
    }
    let mlx = mlx_setup();
    if let Err(why) = &mlx
        && backends.iter().any(|b| b == "mlx")
    {
        eprintln!("xtask: mlx: skipped, {why}");
    }

    let lock = crate::hosts_lock::take()?;
    let load_start = load_average();
    eprintln!(
        "xtask: bringing up {n_hosts} emulated hosts, links {}",
        rates[0].text
    );
    let guard = HostsGuard::up(n_hosts, Some(&rates[0].text))?;
    let mut results = Vec::new();
    let mut mlx_runs = 0u16;
    for rate in &rates {
        hosts::shape(Some(&rate.text))?;
        let load_before = load_average();
        eprintln!(
            "\nxtask: links {} (load average {})",
            rate.text,
            load_before.as_deref().unwrap_or("?")
        );
        let tag = format!("{}-", rate.text);
        let secs = if a.quick { 0.4 } else { 1.0 };
        let bytes = ((rate.bytes_per_sec() as f64 * secs) as u64).max(16 << 20);
        let reps = if a.quick { 3 } else { 5 };
        let one = streams(&bench, &guard, &[(0, 1)], bytes, reps, &raw, &tag);
        let (ceiling, ceiling_each) = match one {
            Ok(mut v) => {
                let (g, each) = v.remove(0);
                (Ok(g), each)
            }
            Err(e) => {
                eprintln!("xtask: the one-stream ceiling failed: {e:#}");
                (Err(format!("{e:#}")), vec![])
            }
        };
        let mut concurrent = Vec::new();
        for &w in &worlds {
            let pairs: Vec<(usize, usize)> = (0..w).map(|i| (i, (i + 1) % w)).collect();
            let r = streams(
                &bench,
                &guard,
                &pairs,
                bytes,
                reps,
                &raw,
                &format!("{tag}ring{w}-"),
            );
            concurrent.push((
                w,
                r.map(|v| v.into_iter().map(|(g, _)| g).collect())
                    .map_err(|e| format!("{e:#}")),
            ));
        }
        let mut result = RateResult {
            rate: rate.text.clone(),
            bits: rate.bits_per_sec,
            ceiling,
            ceiling_each,
            concurrent,
            runs: vec![],
            mlx: vec![],
            load_before,
        };
        let ceil = result.ceiling_gbs();
        eprintln!("xtask: {} one-stream ceiling {ceil:.3} GB/s", rate.text);
        for backend in &backends {
            if backend == "mlx" {
                for &w in &worlds {
                    let run = match &mlx {
                        Ok((python, script)) => {
                            mlx_runs += 1;
                            run_mlx(
                                a,
                                &guard,
                                python,
                                script,
                                &raw,
                                &tag,
                                w,
                                MLX_PORT + 10 * mlx_runs,
                            )
                        }
                        Err(why) => MlxRun {
                            world: w,
                            status: "skipped".into(),
                            reason: Some(why.clone()),
                            rows: vec![],
                        },
                    };
                    result.mlx.push(run);
                }
                continue;
            }
            if backend == "mpi"
                && let Some(reason) = &mpi_skipped
            {
                result.runs.push(Run::skipped(backend, reason));
                continue;
            }
            for &w in &worlds {
                let extra = example_args(a, &guard, backend, w, ceil);
                let run = run_collectives_with(a, &bench, &raw, backend, w, &tag, &extra)?;
                let skipped = run.status == "skipped";
                result.runs.push(run);
                if skipped {
                    break;
                }
            }
        }
        results.push(result);
    }
    drop(guard);
    drop(lock);
    let load_end = load_average();
    let wall_s = started.elapsed().as_secs_f64();

    let report = Report {
        command: a.command_line(),
        reanalysis: None,
        n_hosts,
        worlds,
        backends,
        ops: a.ops.clone(),
        max_bytes: a.max_bytes(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        load: (load_start, load_end),
        wall_s,
        grad_bytes: alpha_beta::reference_llama_parameters() * 4,
        compute_s: a.compute_ms / 1e3,
    };
    analyse(a, &report, &results, &out)?;

    let failed: Vec<String> = results
        .iter()
        .flat_map(|r| {
            let runs = r
                .runs
                .iter()
                .filter(|x| x.status == "failed")
                .map(move |x| format!("{} {} world {}", r.rate, x.backend, x.world));
            let mlx = r
                .mlx
                .iter()
                .filter(|x| x.status == "failed")
                .map(move |x| format!("{} mlx world {}", r.rate, x.world));
            runs.chain(mlx)
        })
        .collect();
    if !failed.is_empty() {
        bail!(
            "{} run(s) failed (details in {}): {}",
            failed.len(),
            out.join("multihost.md").display(),
            failed.join(", ")
        );
    }
    Ok(())
}

/// Fits the model, projects the step and writes `multihost.md`,
/// `multihost.json` and `projection.png` into `out`.
fn analyse(a: &CollectivesArgs, c: &Report, results: &[RateResult], out: &Path) -> Result<()> {
    let mut project_bits = Vec::new();
    for r in &a.project_rates {
        match hosts::parse_rate(r).map_err(anyhow::Error::msg)? {
            Some(rate) => project_bits.push((rate.text.clone(), rate.bits_per_sec)),
            None => bail!("--project-rates takes link rates, e.g. 10gbit,100gbit"),
        }
    }
    let fits: Vec<RateFits> = results
        .iter()
        .map(|r| RateFits {
            rate: r.rate.clone(),
            bits: r.bits,
            joint: alpha_beta::fit(&r.ring_samples(None)),
            per_world: c
                .worlds
                .iter()
                .map(|&w| (w, alpha_beta::fit(&r.ring_samples(Some(w)))))
                .collect(),
        })
        .collect();
    let projections = project_all(
        &fits,
        &project_bits,
        &a.project_hosts,
        c.grad_bytes,
        c.compute_s,
    );
    let png = out.join("projection.png");
    let chart = match &projections {
        Some(p) => projection_chart(&png, p, c.compute_s)
            .map(|()| Some(png.clone()))
            .unwrap_or_else(|e| {
                eprintln!("xtask: the projection chart failed: {e:#}");
                None
            }),
        None => None,
    };
    let md = markdown(c, results, &fits, projections.as_ref(), chart.as_deref());
    let md_path = out.join("multihost.md");
    std::fs::write(&md_path, &md).with_context(|| format!("writing {}", md_path.display()))?;
    let json_path = out.join("multihost.json");
    std::fs::write(
        &json_path,
        serde_json::to_string_pretty(&to_json(c, results, &fits, projections.as_ref()))?,
    )
    .with_context(|| format!("writing {}", json_path.display()))?;
    println!("\n{md}");
    println!("xtask: table {}", md_path.display());
    println!("xtask: json  {}", json_path.display());
    if let Some(p) = &chart {
        println!("xtask: chart {}", p.display());
    }
    Ok(())
}

/// `--from-run DIR`: the measurements of an earlier run (its
/// `multihost.json`) analysed again, with this command's projection options,
/// into the same folder.
fn reanalyse(a: &CollectivesArgs, dir: &Path) -> Result<()> {
    let path = dir.join("multihost.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let (report, results) = from_json(&v, a)
        .with_context(|| format!("{} is not a multi-host report", path.display()))?;
    analyse(a, &report, &results, dir)
}

/// The report and measurements [`to_json`] wrote (`None` if something is missing).
fn from_json(v: &Value, a: &CollectivesArgs) -> Option<(Report, Vec<RateResult>)> {
    let strs = |x: &Value| -> Vec<String> {
        x.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    let text = |x: &Value| x.as_str().map(String::from);
    let mut results = Vec::new();
    for r in v["rates"].as_array()? {
        let runs = r["runs"]
            .as_array()?
            .iter()
            .map(|x| Run {
                backend: text(&x["backend"]).unwrap_or_default(),
                world: x["world"].as_u64().unwrap_or(0) as usize,
                status: text(&x["status"]).unwrap_or_default(),
                reason: text(&x["reason"]),
                wall_s: x["wall_s"].as_f64().unwrap_or(0.0),
                ceiling: vec![],
                rows: x["rows"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|y| {
                        Some(Row {
                            op: text(&y["op"])?,
                            bytes: y["bytes"].as_u64()?,
                            time_us: y["time_us"].as_f64()?,
                            algbw: y["algbw_gbs"].as_f64()?,
                            busbw: y["busbw_gbs"].as_f64()?,
                            ceiling: 0.0,
                            ratio: y["ratio"].as_f64()?,
                        })
                    })
                    .collect(),
            })
            .collect();
        let mlx = r["mlx"]
            .as_array()?
            .iter()
            .map(|m| MlxRun {
                world: m["world"].as_u64().unwrap_or(0) as usize,
                status: text(&m["status"]).unwrap_or_default(),
                reason: text(&m["reason"]),
                rows: m["rows"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|y| {
                        Some(MlxRow {
                            bytes: y["bytes"].as_u64()?,
                            secs: y["median_s"].as_f64()?,
                            busbw: y["busbw_gbs"].as_f64()?,
                            ok: y["ok"].as_bool().unwrap_or(false),
                        })
                    })
                    .collect(),
            })
            .collect();
        let floats = |x: &Value| -> Vec<f64> {
            x.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .collect()
        };
        results.push(RateResult {
            rate: text(&r["rate"])?,
            bits: r["bits_per_sec"].as_u64()?,
            ceiling: match r["ceiling_gbs"].as_f64() {
                Some(g) => Ok(g),
                None => Err(text(&r["ceiling_error"]).unwrap_or_else(|| "not measured".into())),
            },
            ceiling_each: floats(&r["ceiling_transfers_gbs"]),
            concurrent: r["concurrent_streams"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let n = c["n"].as_u64().unwrap_or(0) as usize;
                    match c["gbs"].as_array() {
                        Some(_) => (n, Ok(floats(&c["gbs"]))),
                        None => (n, Err(text(&c["error"]).unwrap_or_default())),
                    }
                })
                .collect(),
            runs,
            mlx,
            load_before: text(&r["load_average_before"]),
        });
    }
    let worlds: Vec<usize> = v["worlds"]
        .as_array()?
        .iter()
        .filter_map(|w| w.as_u64().map(|w| w as usize))
        .collect();
    let mut backends: Vec<String> = Vec::new();
    for b in BACKENDS {
        let present = results
            .iter()
            .any(|r| r.runs.iter().any(|x| x.backend == b) || (b == "mlx" && !r.mlx.is_empty()));
        if present {
            backends.push(b.into());
        }
    }
    let report = Report {
        command: text(&v["command"])?,
        reanalysis: Some(a.command_line()),
        n_hosts: v["hosts"].as_u64()? as usize,
        worlds,
        backends,
        // What the rows hold, where the report does not say.
        ops: match strs(&v["ops"]) {
            ops if !ops.is_empty() => ops,
            _ => ["all_sum", "all_gather", "sum_scatter"]
                .into_iter()
                .filter(|op| {
                    results
                        .iter()
                        .flat_map(|r| r.runs.iter().flat_map(|x| &x.rows))
                        .any(|x| x.op == *op)
                })
                .map(String::from)
                .collect(),
        },
        max_bytes: v["max_bytes"].as_u64().unwrap_or_else(|| {
            results
                .iter()
                .flat_map(|r| r.runs.iter().flat_map(|x| &x.rows))
                .map(|x| x.bytes)
                .max()
                .unwrap_or(0)
        }),
        cores: v["cores"].as_u64().unwrap_or(0) as usize,
        load: (
            text(&v["load_average_before"]),
            text(&v["load_average_after"]),
        ),
        wall_s: v["wall_s"].as_f64().unwrap_or(0.0),
        grad_bytes: alpha_beta::reference_llama_parameters() * 4,
        compute_s: a.compute_ms / 1e3,
    };
    Some((report, results))
}

/// The example's arguments for `backend` at world `w` over the hosts.
fn example_args(
    a: &CollectivesArgs,
    hosts: &Hosts,
    backend: &str,
    w: usize,
    ceil: f64,
) -> Vec<String> {
    let config = hosts.ssh_config.display().to_string();
    let mut v = vec![
        "--hosts".to_string(),
        hosts.names[..w].join(","),
        "--ssh-config".into(),
        config.clone(),
        "--ceiling-gbs".into(),
        format!("{ceil}"),
        "--seconds-per-size".into(),
        if a.quick { "0.3" } else { "1" }.into(),
    ];
    if backend == "mpi" {
        // Open MPI's daemons over the same ssh; its TCP traffic on the
        // hosts' subnet; ranks that wait yield the core (4 ranks busy-polling
        // on 2 cores otherwise wait out each other's time slices: 4-8 ms at 1 KiB).
        let mpi = [
            "--mca",
            "plm_rsh_agent",
            &format!("ssh -F {config}"),
            "--mca",
            "btl_tcp_if_include",
            "10.77.0.0/24",
            "--mca",
            "oob_tcp_if_include",
            "10.77.0.0/24",
            "--mca",
            "mpi_yield_when_idle",
            "1",
        ];
        v.extend(mpi.iter().map(|m| format!("--mpi-arg={m}")));
    }
    v
}

/// `ip netns exec NAME ...`.
fn in_namespace(ns: &str) -> Command {
    let ip = ["/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .unwrap_or("ip");
    let mut c = Command::new(ip);
    c.args(["netns", "exec", ns]);
    c
}

/// Runs `cmds` at once, each with its output in its log, all under one
/// deadline; the result of each.
fn run_together(cmds: Vec<(Command, PathBuf)>, deadline: Duration) -> Vec<Result<Ended>> {
    std::thread::scope(|s| {
        let threads: Vec<_> = cmds
            .into_iter()
            .map(|(cmd, log)| s.spawn(move || run_logged(cmd, &log, deadline)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a runner thread panicked")))
            })
            .collect()
    })
}

/// TCP streams between hosts, all at once: `pairs` of (sender, receiver),
/// `reps` transfers of `bytes` each (the first a warm-up). Per stream: the
/// median GB/s and each timed transfer's.
fn streams(
    bench: &Path,
    hosts: &Hosts,
    pairs: &[(usize, usize)],
    bytes: u64,
    reps: usize,
    raw: &Path,
    tag: &str,
) -> Result<Vec<(f64, Vec<f64>)>> {
    let mut cmds = Vec::new();
    let mut sender_logs = Vec::new();
    for (k, &(from, to)) in pairs.iter().enumerate() {
        let addr = format!("{}:{}", hosts.ips[to], STREAM_PORT + k as u16);
        let mut recv = in_namespace(&hosts.names[to]);
        recv.arg(bench).args(["--tcp-recv", &addr]);
        cmds.push((recv, raw.join(format!("{tag}stream{k}-recv.log"))));
        let mut send = in_namespace(&hosts.names[from]);
        send.arg(bench)
            .args(["--tcp-send", &addr])
            .args(["--tcp-bytes", &bytes.to_string()])
            .args(["--tcp-reps", &reps.to_string()]);
        let log = raw.join(format!("{tag}stream{k}-send.log"));
        sender_logs.push(log.clone());
        cmds.push((send, log));
    }
    eprintln!(
        "xtask: {} TCP stream(s) at once ({}), {} x {}",
        pairs.len(),
        pairs
            .iter()
            .map(|(f, t)| format!("{} -> {}", hosts.names[*f], hosts.names[*t]))
            .collect::<Vec<_>>()
            .join(", "),
        reps,
        human(bytes)
    );
    let ended = run_together(cmds, Duration::from_secs(60 + 10 * reps as u64));
    for (e, k) in ended.into_iter().zip(0..) {
        match e? {
            Ended::Exited(st) if st.success() => {}
            Ended::Exited(st) => bail!("stream {} exited with {st}", k / 2),
            Ended::TimedOut => bail!("stream {} timed out", k / 2),
        }
    }
    let mut out = Vec::new();
    for log in sender_logs {
        let text = std::fs::read_to_string(&log)?;
        let v: Value = text
            .lines()
            .rev()
            .find_map(|l| serde_json::from_str(l).ok())
            .with_context(|| format!("no result in {}", log.display()))?;
        let each = v["each_gbs"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_f64)
            .collect();
        out.push((v["gbs"].as_f64().context("no gbs")?, each));
    }
    Ok(out)
}

/// MLX's Python and its benchmark script, or why MLX is skipped.
fn mlx_setup() -> std::result::Result<(PathBuf, PathBuf), String> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let python = home.join("mlx-venv").join("bin").join("python");
    if !python.is_file() {
        return Err(format!(
            "{} is missing (set it up as ../shared/anchors/README.md says: `python3 -m venv \
             ~/mlx-venv && ~/mlx-venv/bin/pip install \"mlx[cpu]\" numpy`)",
            python.display()
        ));
    }
    let script = root()
        .join("..")
        .join("shared")
        .join("anchors")
        .join("mlx")
        .join("allsum_bench.py");
    if !script.is_file() {
        return Err(format!("{} is missing", script.display()));
    }
    Ok((python, script))
}

/// MLX's ring at world `w`: each rank started in its host's namespace with
/// `MLX_RANK` and `MLX_HOSTFILE` (the hosts' addresses), as the anchors'
/// README starts them.
#[allow(clippy::too_many_arguments)]
fn run_mlx(
    a: &CollectivesArgs,
    hosts: &Hosts,
    python: &Path,
    script: &Path,
    raw: &Path,
    tag: &str,
    w: usize,
    port: u16,
) -> MlxRun {
    let mut run = MlxRun {
        world: w,
        status: "failed".into(),
        reason: None,
        rows: vec![],
    };
    let hostfile = raw.join(format!("{tag}mlx-world{w}-hosts.json"));
    let list: Vec<Value> = hosts.ips[..w]
        .iter()
        .map(|ip| json!([format!("{ip}:{port}")]))
        .collect();
    if let Err(e) = std::fs::write(&hostfile, Value::Array(list).to_string()) {
        run.reason = Some(format!("writing {}: {e}", hostfile.display()));
        return run;
    }
    let sizes: Vec<&str> = MLX_SIZES
        .iter()
        .filter(|(_, b)| *b <= a.max_bytes())
        .map(|(s, _)| *s)
        .collect();
    let json_path = raw.join(format!("{tag}mlx-world{w}.json"));
    let _ = std::fs::remove_file(&json_path);
    let mut cmds = Vec::new();
    for r in 0..w {
        let mut c = in_namespace(&hosts.names[r]);
        c.arg(python)
            .arg(script)
            .args(["--backend", "ring", "--gather", ""])
            .args(["--sizes", &sizes.join(",")])
            .args(["--iters", if a.quick { "3" } else { "5" }])
            .args(["--warmup", "1"])
            .arg("--json")
            .arg(&json_path)
            .env("MLX_RANK", r.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .current_dir(root());
        if r == 0 {
            eprintln!(
                "\nxtask: {tag}mlx world {w}: MLX_RANK=r MLX_HOSTFILE={} {} (r = 0..{w})",
                hostfile.display(),
                describe(&c)
            );
        }
        cmds.push((c, raw.join(format!("{tag}mlx-world{w}-rank{r}.log"))));
    }
    let logs: Vec<PathBuf> = cmds.iter().map(|(_, l)| l.clone()).collect();
    let ended = run_together(cmds, Duration::from_secs(a.timeout.min(600)));
    for (r, e) in ended.into_iter().enumerate() {
        let why = match e {
            Ok(Ended::Exited(st)) if st.success() => continue,
            Ok(Ended::Exited(st)) => format!("rank {r} exited with {st}"),
            Ok(Ended::TimedOut) => format!("rank {r}: no result in time, stopped"),
            Err(e) => format!("rank {r}: {e:#}"),
        };
        run.reason = Some(format!(
            "{why}; the end of {}:\n{}",
            logs[r].display(),
            log_tail(&logs[r], 10)
        ));
        return run;
    }
    let report: Option<Value> = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let Some(report) = report else {
        run.reason = Some(format!("rank 0 wrote no {}", json_path.display()));
        return run;
    };
    run.rows = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["op"] == "all_sum")
        .filter_map(|x| {
            Some(MlxRow {
                bytes: x["bytes"].as_u64()?,
                secs: x["med_maxrank_s"].as_f64()?,
                busbw: x["busbw_GBps"].as_f64()?,
                ok: x["ok"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    run.status = "ok".into();
    run
}

/// The projection of every `(rate, hosts)`, with the model's parameters.
struct Projections {
    /// Which fits the parameters come from: `world N` (the smallest world's)
    /// or `every world`.
    over: String,
    /// The highest link efficiency measured (its rate and value), for the
    /// second variant; `None` with one measured rate.
    best: Option<(String, f64)>,
    rates: Vec<ProjectedRate>,
}

/// One projected link rate.
struct ProjectedRate {
    name: String,
    /// The measured rate whose fit gives alpha and the link efficiency.
    from: String,
    alpha: f64,
    /// The link efficiency of that fit: (1/beta) / link rate.
    efficiency: f64,
    beta: f64,
    /// beta at the best efficiency measured (when another fit has it).
    beta_best: Option<f64>,
    rows: Vec<(Projection, Option<Projection>)>,
    /// Every host count from 2 to the largest, for the chart.
    curve: Vec<Projection>,
}

/// Link efficiency of a fit: the bus bandwidth it reaches over the link rate.
fn efficiency(fit: &Fit, bits: u64) -> f64 {
    (1.0 / fit.beta) / (bits as f64 / 8.0)
}

/// The fit a projection uses at one measured rate: its smallest world's,
/// whose ranks each have a core of their own here (four ranks on two cores
/// measure this machine's CPU at 10 Gbit/s, not the link), else the fit over
/// every world.
fn base_fit(f: &RateFits) -> Option<(Fit, String)> {
    let smallest = f.per_world.iter().min_by_key(|(w, _)| *w);
    match smallest {
        Some((w, Some(x))) => Some((*x, format!("world {w}"))),
        _ => f.joint.map(|x| (x, "every world".to_string())),
    }
}

/// Projects every rate of `project` onto every host count of `hosts`. Each
/// projected rate takes alpha and the link efficiency e from the fit at the
/// fastest measured rate not above it (else the slowest measured), and
/// beta = 1 / (e x rate); the second variant takes the best e measured.
fn project_all(
    fits: &[RateFits],
    project: &[(String, u64)],
    hosts: &[usize],
    grad_bytes: u64,
    compute_s: f64,
) -> Option<Projections> {
    let with_fit: Vec<(&RateFits, Fit, String)> = fits
        .iter()
        .filter_map(|f| base_fit(f).map(|(x, over)| (f, x, over)))
        .filter(|(_, x, _)| x.beta > 0.0)
        .collect();
    let slowest = with_fit.iter().min_by_key(|(f, _, _)| f.bits)?;
    let best = with_fit
        .iter()
        .map(|(f, x, _)| (f, efficiency(x, f.bits)))
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .filter(|_| with_fit.len() > 1)
        .map(|(f, e)| (f.rate.clone(), e, f.bits));
    let max_hosts = hosts.iter().copied().max().unwrap_or(2).max(2);
    let rates = project
        .iter()
        .map(|(name, bits)| {
            let (f, fit, _) = with_fit
                .iter()
                .filter(|(f, _, _)| f.bits <= *bits)
                .max_by_key(|(f, _, _)| f.bits)
                .unwrap_or(slowest);
            let e = efficiency(fit, f.bits);
            let beta = 1.0 / (e * *bits as f64 / 8.0);
            let beta_best = best
                .as_ref()
                .filter(|(_, _, b)| *b != f.bits)
                .map(|(_, eb, _)| 1.0 / (eb * *bits as f64 / 8.0));
            let p = |b: f64, h: usize| {
                alpha_beta::project(fit.alpha, b, grad_bytes as f64, compute_s, h)
            };
            ProjectedRate {
                name: name.clone(),
                from: f.rate.clone(),
                alpha: fit.alpha,
                efficiency: e,
                beta,
                beta_best,
                rows: hosts
                    .iter()
                    .map(|&h| (p(beta, h), beta_best.map(|bb| p(bb, h))))
                    .collect(),
                curve: (2..=max_hosts).map(|h| p(beta, h)).collect(),
            }
        })
        .collect();
    Some(Projections {
        over: slowest.2.clone(),
        best: best.map(|(r, e, _)| (r, e)),
        rates,
    })
}

/// Scaling efficiency against hosts (log scale), per projected rate, with
/// no overlap (solid) and perfect overlap (dashed).
fn projection_chart(path: &Path, p: &Projections, compute_s: f64) -> Result<()> {
    use plotters::prelude::*;

    crate::report_common::register_chart_font();
    let err = |e: &dyn std::fmt::Display| anyhow::anyhow!("{e}");
    let root_area = BitMapBackend::new(path, (1000, 600)).into_drawing_area();
    root_area.fill(&WHITE).map_err(|e| err(&e))?;
    let max_hosts = p
        .rates
        .iter()
        .flat_map(|r| r.curve.last())
        .map(|x| x.hosts)
        .max()
        .unwrap_or(64) as f64;
    let y_min = p
        .rates
        .iter()
        .flat_map(|r| &r.curve)
        .map(|x| x.eff_serial * 100.0)
        .fold(100.0f64, f64::min);
    let y_lo = ((y_min - 5.0) / 10.0).floor().max(0.0) * 10.0;
    let mut chart = ChartBuilder::on(&root_area)
        .caption(
            format!(
                "Projected scaling efficiency, reference Llama ({:.0} ms compute per step)",
                compute_s * 1e3
            ),
            ("sans-serif", 20),
        )
        .margin(14)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..max_hosts.log2(), y_lo..100.5f64)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("hosts (one rank each; log scale)")
        .y_desc("compute / step time, %")
        .y_label_formatter(&|y| format!("{y:.0}"))
        .x_label_formatter(&|x| format!("{:.0}", 2f64.powf(*x)))
        .x_labels(max_hosts.log2() as usize + 1)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    const COLORS: [(u8, u8, u8); 4] = [
        (31, 119, 180),
        (214, 39, 40),
        (44, 160, 44),
        (148, 103, 189),
    ];
    for (k, r) in p.rates.iter().enumerate() {
        let (cr, cg, cb) = COLORS[k % COLORS.len()];
        let color = RGBAColor(cr, cg, cb, 1.0);
        let serial: Vec<(f64, f64)> = r
            .curve
            .iter()
            .map(|x| ((x.hosts as f64).log2(), x.eff_serial * 100.0))
            .collect();
        let overlap: Vec<(f64, f64)> = r
            .curve
            .iter()
            .map(|x| ((x.hosts as f64).log2(), x.eff_overlap * 100.0))
            .collect();
        chart
            .draw_series(LineSeries::new(serial, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("{}: no overlap", r.name))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart
            .draw_series(DashedLineSeries::new(overlap, 6, 4, color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("{}: perfect overlap", r.name))
            .legend(move |(x, y)| {
                EmptyElement::at((x, y))
                    + PathElement::new(vec![(0, 0), (7, 0)], color.stroke_width(2))
                    + PathElement::new(vec![(13, 0), (20, 0)], color.stroke_width(2))
            });
        let marks: Vec<(f64, f64)> = r
            .rows
            .iter()
            .map(|(x, _)| ((x.hosts as f64).log2(), x.eff_serial * 100.0))
            .collect();
        chart
            .draw_series(
                marks
                    .into_iter()
                    .map(|pt| Circle::new(pt, 4, color.filled())),
            )
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| err(&e))?;
    root_area
        .present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

/// What the report says about the run as a whole.
struct Report {
    /// The command that measured.
    command: String,
    /// The command that re-analysed the figures (`--from-run`), if one did.
    reanalysis: Option<String>,
    n_hosts: usize,
    worlds: Vec<usize>,
    backends: Vec<String>,
    ops: Vec<String>,
    max_bytes: u64,
    cores: usize,
    load: (Option<String>, Option<String>),
    wall_s: f64,
    grad_bytes: u64,
    compute_s: f64,
}

/// The issue's goals: `(goal, measured, met)`; `None` where not measured.
fn goals(results: &[RateResult], worlds: &[usize]) -> Vec<Goal> {
    let mut v = Vec::new();
    for r in results {
        let Some(goal) = ring_goal(r.bits) else {
            continue;
        };
        let ceil = r.ceiling_gbs();
        for &w in worlds {
            let got = r.point("ring", w, "all_sum", GOAL_BYTES).map(|(_, bus)| {
                (
                    format!("{:.0}% ({bus:.3} of {ceil:.3} GB/s)", 100.0 * bus / ceil),
                    bus / ceil >= goal,
                )
            });
            v.push((
                format!(
                    "{}: ring all_sum, world {w}, 64 MiB: bus bandwidth at least {:.0}% of one TCP stream",
                    r.rate,
                    goal * 100.0
                ),
                got,
            ));
        }
    }
    for r in results.iter().filter(|r| r.bits == 10_000_000_000) {
        for (backend, name) in [("tls", "TLS"), ("quic", "QUIC")] {
            for &w in worlds {
                let ring = r.point("ring", w, "all_sum", GOAL_BYTES);
                let quic = r.point(backend, w, "all_sum", GOAL_BYTES);
                let got = ring.zip(quic).map(|((_, rb), (_, qb))| {
                    (
                        format!("{:.0}% ({qb:.3} of {rb:.3} GB/s)", 100.0 * qb / rb),
                        qb / rb >= GOAL_QUIC_OF_RING,
                    )
                });
                v.push((
                format!(
                    "{}: {name} all_sum, world {w}, 64 MiB: at least {:.0}% of the ring's bus bandwidth",
                    r.rate,
                    GOAL_QUIC_OF_RING * 100.0
                ),
                got,
            ));
            }
        }
    }
    v
}

fn gbs(x: f64) -> String {
    format!("{x:.3}")
}

fn markdown(
    c: &Report,
    results: &[RateResult],
    fits: &[RateFits],
    proj: Option<&Projections>,
    chart: Option<&Path>,
) -> String {
    let cores = c.cores;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`{}`{}: {} emulated hosts (network namespaces joined by a bridge, each link shaped by \
         `tc tbf` in both directions), one rank per host, ranks started over ssh: ours by \
         mlx-launch's library, MPI by `mpirun --host` (`--mca mpi_yield_when_idle 1`), MLX's ring \
         in each host's namespace with `MLX_RANK`/`MLX_HOSTFILE`. **This machine has {cores} \
         logical cores: the {} ranks of the largest world share them** (and the kernel's network \
         work), so figures that need more CPU than that are this machine's, not the link's. Load \
         average {} before and {} after; {:.0} s in all.\n",
        c.command,
        c.reanalysis
            .as_ref()
            .map_or(String::new(), |r| format!(" (analysed again by `{r}`)")),
        c.n_hosts,
        c.worlds.iter().max().unwrap_or(&0),
        c.load.0.as_deref().unwrap_or("?"),
        c.load.1.as_deref().unwrap_or("?"),
        c.wall_s,
    );
    let _ = writeln!(
        s,
        "Time is the mean per operation on rank 0 over back-to-back repetitions (about a second \
         of them per size); MLX's is the slowest rank's median with a barrier before each. Bus \
         bandwidth (busbw) follows NCCL: all_sum 2(n-1)/n x bytes / time, all_gather (n-1)/n x \
         output bytes / time; for a ring all_sum the ceiling of busbw is the one-stream link rate. \
         \"Ceiling\" is one TCP stream host 0 -> host 1; \"n streams\" is n streams at once around \
         the ring of hosts (each host sending and receiving one), the most this machine's cores \
         move at once.\n"
    );
    let _ = writeln!(s, "### Goals\n");
    goals_table(&mut s, goals(results, &c.worlds), "**no**");

    for r in results {
        let ceil = r.ceiling_gbs();
        let _ = writeln!(
            s,
            "### Links at {} (load average {} before)\n",
            r.rate,
            r.load_before.as_deref().unwrap_or("?")
        );
        match &r.ceiling {
            Ok(g) => {
                let _ = writeln!(
                    s,
                    "Ceiling (one TCP stream, the best timed transfer): **{} GB/s** ({:.1}% of \
                     the {:.3} GB/s link; median {}; transfers {}).",
                    gbs(ceil),
                    100.0 * ceil / (r.bits as f64 / 8e9),
                    r.bits as f64 / 8e9,
                    gbs(*g),
                    r.ceiling_each
                        .iter()
                        .map(|x| gbs(*x))
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            }
            Err(e) => {
                let _ = writeln!(
                    s,
                    "The one-stream measurement failed ({e}); the ratios use the link's TCP \
                     payload rate, {} GB/s.",
                    gbs(ceil)
                );
            }
        }
        for (n, got) in &r.concurrent {
            match got {
                Ok(v) => {
                    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
                    let _ = writeln!(
                        s,
                        "{n} streams at once: {} GB/s each on average ({}).",
                        gbs(mean),
                        v.iter().map(|x| gbs(*x)).collect::<Vec<_>>().join(", ")
                    );
                }
                Err(e) => {
                    let _ = writeln!(s, "{n} streams at once: failed ({e}).");
                }
            }
        }
        let _ = writeln!(s);
        // The summary at key sizes.
        let sizes: Vec<u64> = KEY_SIZES
            .iter()
            .copied()
            .filter(|&b| b <= c.max_bytes && b != 64 << 10)
            .collect();
        let _ = writeln!(
            s,
            "| all_sum | world | 1 KiB time | 64 KiB time | {} | 64 MiB / ceiling |",
            sizes
                .iter()
                .map(|b| format!("{} busbw", human(*b)))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        let _ = writeln!(
            s,
            "|---|---:|---:|---:|{}---:|",
            "---:|".repeat(sizes.len())
        );
        for b in &c.backends {
            for &w in &c.worlds {
                let t = |bytes: u64| {
                    r.point(b, w, "all_sum", bytes)
                        .map_or("-".into(), |(secs, _)| time(secs * 1e6))
                };
                let cells: Vec<String> = sizes
                    .iter()
                    .map(|&bytes| {
                        r.point(b, w, "all_sum", bytes)
                            .map_or("-".into(), |(_, bus)| gbs(bus))
                    })
                    .collect();
                if cells.iter().all(|x| x == "-") && t(1024) == "-" {
                    continue;
                }
                let ratio = r
                    .point(b, w, "all_sum", GOAL_BYTES)
                    .map_or("-".into(), |(_, bus)| format!("{:.0}%", 100.0 * bus / ceil));
                let _ = writeln!(
                    s,
                    "| {} | {w} | {} | {} | {} | {ratio} |",
                    label(b),
                    t(1024),
                    t(64 << 10),
                    cells.join(" | ")
                );
            }
        }
        let _ = writeln!(s);
        if c.ops.iter().any(|o| o == "all_gather") {
            let _ = writeln!(
                s,
                "| all_gather | world | 1 KiB time | {} | 64 MiB / ceiling |",
                sizes
                    .iter()
                    .map(|b| format!("{} busbw", human(*b)))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let _ = writeln!(s, "|---|---:|---:|{}---:|", "---:|".repeat(sizes.len()));
            for b in c.backends.iter().filter(|b| *b != "mlx") {
                for &w in &c.worlds {
                    let cells: Vec<String> = sizes
                        .iter()
                        .map(|&bytes| {
                            r.point(b, w, "all_gather", bytes)
                                .map_or("-".into(), |(_, bus)| gbs(bus))
                        })
                        .collect();
                    let small = r
                        .point(b, w, "all_gather", 1024)
                        .map_or("-".into(), |(secs, _)| time(secs * 1e6));
                    if cells.iter().all(|x| x == "-") && small == "-" {
                        continue;
                    }
                    let ratio = r
                        .point(b, w, "all_gather", GOAL_BYTES)
                        .map_or("-".into(), |(_, bus)| format!("{:.0}%", 100.0 * bus / ceil));
                    let _ = writeln!(
                        s,
                        "| {} | {w} | {small} | {} | {ratio} |",
                        label(b),
                        cells.join(" | ")
                    );
                }
            }
            let _ = writeln!(s);
        }
        // What did not run, and why.
        for run in &r.runs {
            if run.status != "ok" {
                let _ = writeln!(
                    s,
                    "{} {}{}: {}\n\n```\n{}\n```\n",
                    label(&run.backend),
                    if run.status == "skipped" {
                        ""
                    } else {
                        "world "
                    },
                    if run.status == "skipped" {
                        String::new()
                    } else {
                        run.world.to_string()
                    },
                    run.status.to_uppercase(),
                    run.reason.as_deref().unwrap_or("")
                );
            }
        }
        for m in &r.mlx {
            if m.status != "ok" {
                let _ = writeln!(
                    s,
                    "MLX world {}: {}\n\n```\n{}\n```\n",
                    m.world,
                    m.status.to_uppercase(),
                    m.reason.as_deref().unwrap_or("")
                );
            } else if m.rows.iter().any(|x| !x.ok) {
                let _ = writeln!(
                    s,
                    "MLX world {}: a result was WRONG (its `ok` is false).\n",
                    m.world
                );
            }
        }
    }

    // Every size, per op: time and busbw of each backend and world.
    let _ = writeln!(s, "### Every size\n");
    for r in results {
        for op in &c.ops {
            let cols: Vec<(&str, usize)> = c
                .backends
                .iter()
                .filter(|b| *b != "mlx" || op == "all_sum")
                .flat_map(|b| c.worlds.iter().map(move |&w| (b.as_str(), w)))
                .filter(|(b, w)| {
                    if *b == "mlx" {
                        r.mlx.iter().any(|m| m.world == *w && !m.rows.is_empty())
                    } else {
                        r.runs
                            .iter()
                            .any(|x| x.backend == *b && x.world == *w && !x.rows.is_empty())
                    }
                })
                .collect();
            if cols.is_empty() {
                continue;
            }
            let mut sizes: Vec<u64> = r
                .runs
                .iter()
                .flat_map(|x| &x.rows)
                .filter(|x| &x.op == op)
                .map(|x| x.bytes)
                .collect();
            sizes.sort_unstable();
            sizes.dedup();
            let _ = writeln!(s, "{} {op}: time per operation / busbw GB/s\n", r.rate);
            let _ = writeln!(
                s,
                "| size | {} |",
                cols.iter()
                    .map(|(b, w)| format!("{} {w}", label(b)))
                    .collect::<Vec<_>>()
                    .join(" | ")
            );
            let _ = writeln!(s, "|---:|{}", "---:|".repeat(cols.len()));
            for bytes in sizes {
                let cells: Vec<String> = cols
                    .iter()
                    .map(|(b, w)| {
                        r.point(b, *w, op, bytes).map_or("-".into(), |(secs, bus)| {
                            format!("{} / {}", time(secs * 1e6), gbs(bus))
                        })
                    })
                    .collect();
                let _ = writeln!(s, "| {} | {} |", human(bytes), cells.join(" | "));
            }
            let _ = writeln!(s);
        }
    }

    // The model.
    let _ = writeln!(s, "### The alpha-beta model of the ring\n");
    let _ = writeln!(
        s,
        "time(all_sum, n, bytes) = 2(n-1) alpha + 2(n-1)/n bytes beta, fitted to our ring's \
         all_sum at every size by least squares on the relative error (each point weighs \
         1/time^2, so that 1 KiB counts as much as 256 MiB); alpha and beta at least 0. 1/beta is \
         the bus bandwidth the ring reaches, against the link's rate.\n"
    );
    let _ = writeln!(
        s,
        "| link | fitted over | alpha | beta | 1/beta | 1/beta / link rate | RMS error | max error | points |"
    );
    let _ = writeln!(s, "|---|---|---:|---:|---:|---:|---:|---:|---:|");
    for f in fits {
        let rows = std::iter::once(("worlds ".to_string() + &join(&c.worlds), f.joint))
            .chain(f.per_world.iter().map(|(w, x)| (format!("world {w}"), *x)));
        for (over, fit) in rows {
            match fit {
                Some(x) => {
                    let _ = writeln!(
                        s,
                        "| {} | {over} | {:.1} us | {:.3} ns/B | {:.3} GB/s | {:.1}% | {:.1}% | {:.1}% | {} |",
                        f.rate,
                        x.alpha * 1e6,
                        x.beta * 1e9,
                        1.0 / x.beta / 1e9,
                        100.0 * efficiency(&x, f.bits),
                        100.0 * x.rms_rel,
                        100.0 * x.max_rel,
                        x.samples
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "| {} | {over} | - | - | - | - | - | - | too few |",
                        f.rate
                    );
                }
            }
        }
    }
    let _ = writeln!(s);

    // The projection.
    let _ = writeln!(s, "### Projection: the reference Llama on more hosts\n");
    match proj {
        None => {
            let _ = writeln!(s, "No fit, so no projection (the ring did not run).\n");
        }
        Some(p) => {
            let _ = writeln!(
                s,
                "The gradients: {} f32 parameters (vocabulary 50,257, dims 256, 4 layers, MLP 512, \
                 4 heads; embedding and output projection untied), {} bytes ({:.1} MiB), summed by \
                 one ring all_sum per step (the sharded optimizer's sum_scatter + all_gather moves \
                 the same bytes). Compute per step: {:.0} ms, world 1's step (`--compute-ms`; \
                 weak scaling: every host keeps world 1's batch, so the scaling efficiency is \
                 compute / step time). Step time: compute + all_sum with no overlap, max(compute, \
                 all_sum) with perfect overlap.\n",
                alpha_beta::reference_llama_parameters(),
                c.grad_bytes,
                c.grad_bytes as f64 / 1_048_576.0,
                c.compute_s * 1e3
            );
            let _ = writeln!(
                s,
                "Parameters: each projected rate takes alpha and the link efficiency e = \
                 (1/beta) / link rate from the fit at the fastest measured rate not above it, \
                 over {} (the smallest world: one core per rank here; at world 4 four ranks \
                 share two cores), and beta = 1 / (e x link rate).{}\n",
                p.over,
                match &p.best {
                    Some((rate, e)) => format!(
                        " The last two columns take the best efficiency measured instead, \
                         {:.1}% at {rate}, where this machine's cores were not the bound (what \
                         hosts with cores to spare would see).",
                        100.0 * e
                    ),
                    None => String::new(),
                }
            );
            let _ = writeln!(
                s,
                "| link | fit from | alpha | e | hosts | all_sum | step, no overlap | efficiency | step, overlap | efficiency | all_sum at the best e | efficiency, no overlap |"
            );
            let _ = writeln!(
                s,
                "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
            );
            for r in &p.rates {
                for (x, best) in &r.rows {
                    let _ = writeln!(
                        s,
                        "| {} | {} | {:.1} us | {:.1}% | {} | {:.1} ms | {:.0} ms | {:.1}% | {:.0} ms | {:.1}% | {} | {} |",
                        r.name,
                        r.from,
                        r.alpha * 1e6,
                        100.0 * r.efficiency,
                        x.hosts,
                        x.comm_s * 1e3,
                        x.step_serial_s * 1e3,
                        100.0 * x.eff_serial,
                        x.step_overlap_s * 1e3,
                        100.0 * x.eff_overlap,
                        best.map_or("-".into(), |b| format!("{:.1} ms", b.comm_s * 1e3)),
                        best.map_or("-".into(), |b| format!("{:.1}%", 100.0 * b.eff_serial)),
                    );
                }
            }
            let _ = writeln!(s);
            if let Some(path) = chart {
                let _ = writeln!(
                    s,
                    "![projected scaling efficiency]({})\n",
                    path.file_name()
                        .map_or(String::new(), |n| n.to_string_lossy().into_owned())
                );
            }
        }
    }
    s
}

fn join(v: &[usize]) -> String {
    v.iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// How a backend is named in the tables.
fn label(backend: &str) -> &str {
    match backend {
        "ring" => "ours, ring",
        "tls" => "ours, TLS",
        "quic" => "ours, QUIC",
        "mpi" => "ours over Open MPI",
        "mlx" => "MLX 0.32 ring",
        other => other,
    }
}

fn fit_json(f: &Option<Fit>, bits: u64) -> Value {
    match f {
        Some(x) => json!({
            "alpha_s": x.alpha, "beta_s_per_byte": x.beta, "inv_beta_gbs": 1.0 / x.beta / 1e9,
            "link_efficiency": efficiency(x, bits), "rms_rel_error": x.rms_rel,
            "max_rel_error": x.max_rel, "points": x.samples,
        }),
        None => Value::Null,
    }
}

fn proj_json(x: &Projection) -> Value {
    json!({
        "hosts": x.hosts, "all_sum_s": x.comm_s, "step_serial_s": x.step_serial_s,
        "step_overlap_s": x.step_overlap_s, "efficiency_serial": x.eff_serial,
        "efficiency_overlap": x.eff_overlap,
    })
}

fn to_json(
    c: &Report,
    results: &[RateResult],
    fits: &[RateFits],
    proj: Option<&Projections>,
) -> Value {
    let rates: Vec<Value> = results
        .iter()
        .map(|r| {
            let runs: Vec<Value> = r
                .runs
                .iter()
                .map(|x| {
                    json!({
                        "backend": x.backend, "world": x.world, "status": x.status,
                        "reason": x.reason, "wall_s": x.wall_s,
                        "rows": x.rows.iter().map(|y| json!({
                            "op": y.op, "bytes": y.bytes, "time_us": y.time_us,
                            "algbw_gbs": y.algbw, "busbw_gbs": y.busbw, "ratio": y.ratio,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let mlx: Vec<Value> = r
                .mlx
                .iter()
                .map(|m| {
                    json!({
                        "world": m.world, "status": m.status, "reason": m.reason,
                        "rows": m.rows.iter().map(|y| json!({
                            "op": "all_sum", "bytes": y.bytes, "median_s": y.secs,
                            "busbw_gbs": y.busbw, "ok": y.ok,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "rate": r.rate, "bits_per_sec": r.bits,
                "ceiling_gbs": r.ceiling.as_ref().ok(), "ceiling_error": r.ceiling.as_ref().err(),
                "ceiling_transfers_gbs": r.ceiling_each,
                "concurrent_streams": r.concurrent.iter().map(|(n, v)| json!({
                    "n": n, "gbs": v.as_ref().ok(), "error": v.as_ref().err(),
                })).collect::<Vec<_>>(),
                "load_average_before": r.load_before,
                "runs": runs, "mlx": mlx,
            })
        })
        .collect();
    let fits: Vec<Value> = fits
        .iter()
        .map(|f| {
            json!({
                "rate": f.rate, "joint": fit_json(&f.joint, f.bits),
                "per_world": f.per_world.iter().map(|(w, x)| json!({"world": w, "fit": fit_json(x, f.bits)})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let goals: Vec<Value> = goals(results, &c.worlds)
        .into_iter()
        .map(|(g, got)| json!({"goal": g, "measured": got.as_ref().map(|x| &x.0), "met": got.map(|x| x.1)}))
        .collect();
    json!({
        "command": c.command,
        "analysed_again_by": c.reanalysis,
        "ops": c.ops,
        "max_bytes": c.max_bytes,
        "hosts": c.n_hosts,
        "worlds": c.worlds,
        "cores": c.cores,
        "load_average_before": c.load.0,
        "load_average_after": c.load.1,
        "wall_s": c.wall_s,
        "goals": goals,
        "rates": rates,
        "fits": fits,
        "projection": proj.map(|p| json!({
            "gradient_bytes": c.grad_bytes,
            "compute_s": c.compute_s,
            "fitted_over": p.over,
            "best_efficiency": p.best.as_ref().map(|(r, e)| json!({"rate": r, "efficiency": e})),
            "rates": p.rates.iter().map(|r| json!({
                "rate": r.name, "fit_from": r.from, "alpha_s": r.alpha,
                "link_efficiency": r.efficiency, "beta_s_per_byte": r.beta,
                "beta_at_best_efficiency_s_per_byte": r.beta_best,
                "rows": r.rows.iter().map(|(x, l)| json!({
                    "fit": proj_json(x), "at_best_efficiency": l.as_ref().map(proj_json),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(op: &str, bytes: u64, time_us: f64, busbw: f64) -> Row {
        Row {
            op: op.into(),
            bytes,
            time_us,
            algbw: busbw,
            busbw,
            ceiling: 1.0,
            ratio: busbw,
        }
    }

    fn run(backend: &str, world: usize, rows: Vec<Row>) -> Run {
        Run {
            backend: backend.into(),
            world,
            status: "ok".into(),
            reason: None,
            wall_s: 1.0,
            ceiling: vec![],
            rows,
        }
    }

    fn rate(bits: u64, ceiling: f64, runs: Vec<Run>) -> RateResult {
        RateResult {
            rate: format!("{}gbit", bits / 1_000_000_000),
            bits,
            ceiling: Ok(ceiling),
            ceiling_each: vec![ceiling],
            concurrent: vec![],
            runs,
            mlx: vec![],
            load_before: None,
        }
    }

    #[test]
    fn goals_per_rate_world_and_quic_against_the_ring() {
        let m = GOAL_BYTES;
        let ten = rate(
            10_000_000_000,
            1.0,
            vec![
                run("ring", 2, vec![row("all_sum", m, 1.0, 0.91)]),
                run("ring", 4, vec![row("all_sum", m, 1.0, 0.5)]),
                run("tls", 2, vec![row("all_sum", m, 1.0, 0.55)]),
                run("quic", 2, vec![row("all_sum", m, 1.0, 0.40)]),
            ],
        );
        let one = rate(
            1_000_000_000,
            0.12,
            vec![run("ring", 2, vec![row("all_sum", m, 1.0, 0.115)])],
        );
        let g = goals(&[ten, one], &[2, 4]);
        let met: Vec<Option<bool>> = g.iter().map(|(_, x)| x.as_ref().map(|y| y.1)).collect();
        // 10gbit ring w2, w4; 1gbit ring w2, w4; 10gbit tls w2, w4; quic w2, w4.
        assert_eq!(
            met,
            vec![
                Some(true),
                Some(false),
                Some(true),
                None,
                Some(true),
                None,
                Some(false),
                None
            ]
        );
        assert!(g[0].0.contains("at least 90%"));
        assert!(g[2].0.contains("at least 95%"));
        assert!(g[4].0.contains("TLS all_sum, world 2"));
        assert!(g[4].1.as_ref().unwrap().0.starts_with("60%"));
        assert!(g[6].1.as_ref().unwrap().0.starts_with("44%"));
    }

    #[test]
    fn the_ring_samples_feed_the_fit() {
        let (alpha, beta) = (40e-6, 1e-9);
        let rows = |n: usize| {
            [1u64 << 10, 1 << 20, 64 << 20]
                .iter()
                .map(|&b| {
                    let t = alpha_beta::predict(alpha, beta, n, b as f64);
                    row("all_sum", b, t * 1e6, 0.0)
                })
                .chain(std::iter::once(row("all_gather", 1 << 20, 1.0, 0.0)))
                .collect::<Vec<_>>()
        };
        let r = rate(
            10_000_000_000,
            1.0,
            vec![
                run("ring", 2, rows(2)),
                run("ring", 4, rows(4)),
                run("quic", 2, rows(2)),
            ],
        );
        assert_eq!(r.ring_samples(None).len(), 6);
        assert_eq!(r.ring_samples(Some(4)).len(), 3);
        let f = alpha_beta::fit(&r.ring_samples(None)).unwrap();
        assert!((f.alpha - alpha).abs() < 1e-9 && (f.beta - beta).abs() < 1e-15);
        // 1 ns/B = 1 GB/s on a 10 Gbit/s (1.25 GB/s) link.
        assert!((efficiency(&f, 10_000_000_000) - 0.8).abs() < 1e-6);
    }

    #[test]
    fn each_projected_rate_takes_the_nearest_measured_fit_below() {
        let fit = |alpha: f64, beta: f64| Fit {
            alpha,
            beta,
            rms_rel: 0.0,
            max_rel: 0.0,
            samples: 10,
        };
        let fits = [
            RateFits {
                rate: "10gbit".into(),
                bits: 10_000_000_000,
                joint: Some(fit(50e-6, 1.6e-9)), // 0.625 GB/s: 50% of the link
                per_world: vec![],
            },
            RateFits {
                rate: "1gbit".into(),
                bits: 1_000_000_000,
                joint: Some(fit(80e-6, 8.4e-9)), // 95.2% of the link
                per_world: vec![],
            },
        ];
        let rates = [
            ("100mbit".to_string(), 100_000_000),
            ("1gbit".to_string(), 1_000_000_000),
            ("100gbit".to_string(), 100_000_000_000),
        ];
        let p = project_all(&fits, &rates, &[8, 64], 1 << 30, 1.0).unwrap();
        let from: Vec<&str> = p.rates.iter().map(|r| r.from.as_str()).collect();
        assert_eq!(from, ["1gbit", "1gbit", "10gbit"]);
        assert_eq!(p.over, "every world");
        let best = p.best.clone().unwrap();
        assert_eq!(best.0, "1gbit");
        assert!((best.1 - 1.0 / 8.4e-9 / 125e6).abs() < 1e-12);
        // 100 Gbit/s at the 10gbit fit's 50%: 6.25 GB/s, alpha from that fit.
        let r = &p.rates[2];
        assert_eq!(r.alpha, 50e-6);
        assert!((1.0 / r.beta / 1e9 - 6.25).abs() < 1e-9);
        let (x, best) = &r.rows[1];
        assert_eq!(x.hosts, 64);
        let expect = alpha_beta::predict(50e-6, r.beta, 64, (1u64 << 30) as f64);
        assert!((x.comm_s - expect).abs() < 1e-12);
        assert!(
            best.unwrap().comm_s < x.comm_s,
            "1gbit's efficiency is higher"
        );
        assert_eq!(r.curve.len(), 63);
        // The 1gbit projection is its own fit: no second variant.
        assert!(p.rates[1].rows[0].1.is_none());
        assert!((p.rates[1].beta - 8.4e-9).abs() < 1e-18);
        assert!(project_all(&[], &[], &[8], 1, 1.0).is_none());
        // With fits per world, the smallest world's is used.
        let mut fits = fits;
        fits[0].per_world = vec![(4, Some(fit(90e-6, 4e-9))), (2, Some(fit(20e-6, 1e-9)))];
        let p = project_all(&fits, &[("10gbit".into(), 10_000_000_000)], &[8], 1, 1.0).unwrap();
        assert_eq!(p.rates[0].alpha, 20e-6);
    }

    #[test]
    fn the_chart_is_written() {
        let dir = std::env::temp_dir().join(format!("mlx-multihost-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fits = [RateFits {
            rate: "10gbit".into(),
            bits: 10_000_000_000,
            joint: Some(Fit {
                alpha: 50e-6,
                beta: 1e-9,
                rms_rel: 0.1,
                max_rel: 0.2,
                samples: 20,
            }),
            per_world: vec![],
        }];
        let p = project_all(
            &fits,
            &[
                ("10gbit".into(), 10_000_000_000),
                ("100gbit".into(), 100_000_000_000),
            ],
            &[8, 16, 64],
            113_421_312,
            1.23,
        )
        .unwrap();
        let png = dir.join("projection.png");
        projection_chart(&png, &p, 1.23).unwrap();
        let img = image::open(&png).unwrap();
        assert_eq!((img.width(), img.height()), (1000, 600));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
