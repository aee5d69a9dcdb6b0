//! `cargo xtask bench collectives`: all_sum and all_gather from 1 KiB to
//! 256 MiB at world 2 and 4 on loopback for every backend (ring, quic, mpi;
//! and `ring-tcp`, the ring with shared memory off, `MLX_DIST_SHM=0`),
//! beside a single-stream TCP copy of the same bytes (the ceiling), then
//! `average_gradients` on the reference Llama's gradient tree against one
//! all_sum per tensor (world 2, ring). The measuring is done by the examples
//! `mlx-dist/examples/collectives_bench.rs` and
//! `mlx-nn/examples/average_gradients_bench.rs` (their `--json` output); this
//! builds them in release, runs one backend and world at a time under a
//! deadline, and writes `collectives.md` and `collectives.json` into the run
//! folder. With `--hosts N` it runs across emulated hosts over shaped links
//! instead (see `bench_multihost.rs`).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};

use crate::util::{Ended, cargo, log_tail, root, run_logged, target_dir, timestamp};

/// The goals of issue 6, at world 2 over the ring.
const GOAL_BYTES: u64 = 64 << 20;
const GOAL_RATIO: f64 = 0.7;
const GOAL_SMALL_BYTES: u64 = 1 << 10;
const GOAL_SMALL_US: f64 = 100.0;

/// Options of `cargo xtask bench collectives`.
#[derive(Args, Debug)]
pub struct CollectivesArgs {
    /// Largest message in bytes (sizes are powers of 4 times 1 KiB).
    #[arg(long, default_value_t = 256 << 20)]
    pub max_bytes: u64,
    /// World sizes.
    #[arg(long, value_delimiter = ',', default_value = "2,4")]
    pub worlds: Vec<usize>,
    /// Backends: ring, ring-tcp (the ring with shared memory off), tls (the
    /// ring over TLS 1.3), quic, mpi (mpi needs Open MPI's mpirun; skipped
    /// with a reason without it).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "ring,ring-tcp,tls,quic,mpi"
    )]
    pub backends: Vec<String>,
    /// Collectives to time: all_sum, all_gather, sum_scatter.
    #[arg(long, value_delimiter = ',', default_value = "all_sum,all_gather")]
    pub ops: Vec<String>,
    /// A quick pass: messages up to 1 MiB, one timed average_gradients repetition.
    #[arg(long)]
    pub quick: bool,
    /// Timed repetitions of the average_gradients comparison (median reported).
    #[arg(long, default_value_t = 5)]
    pub avg_iters: usize,
    /// Leave out the average_gradients comparison.
    #[arg(long)]
    pub no_average_gradients: bool,
    /// Deadline of one backend at one world size (or of the average_gradients run), in seconds.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,
    /// Use the release binaries already built instead of building.
    #[arg(long)]
    pub no_build: bool,
    /// Run folder (default: `runs/bench-collectives-<UTC time>`, or
    /// `runs/bench-multihost-<UTC time>` with `--hosts`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Multi-host mode: bring up this many emulated hosts (network
    /// namespaces with sshd, `cargo xtask hosts`), one rank per host, and
    /// measure over their shaped links at each of `--rates` (backends ring,
    /// quic, mpi, and mlx: MLX's ring from ~/mlx-venv); then fit the
    /// alpha-beta model and project a training step onto more hosts. Needs
    /// root; holds /tmp/mlx-hosts.lock while it runs.
    #[arg(long)]
    pub hosts: Option<usize>,
    /// Link rates of the multi-host mode (tc syntax), each host's link in
    /// each direction.
    #[arg(long, value_delimiter = ',', default_value = "10gbit,1gbit")]
    pub rates: Vec<String>,
    /// Multi-host mode: the per-step compute time at world 1 in ms (the
    /// reference Llama, BENCHMARKS.md) for the projection.
    #[arg(long, default_value_t = 1230.0)]
    pub compute_ms: f64,
    /// Multi-host mode: link rates to project the step onto (tc syntax).
    #[arg(long, value_delimiter = ',', default_value = "1gbit,10gbit,100gbit")]
    pub project_rates: Vec<String>,
    /// Multi-host mode: host counts to project the step onto.
    #[arg(long, value_delimiter = ',', default_value = "8,16,64")]
    pub project_hosts: Vec<usize>,
    /// Multi-host mode without measuring: fit and project again from the
    /// `multihost.json` of this earlier run folder (e.g. with another
    /// `--compute-ms`), rewriting its report.
    #[arg(long)]
    pub from_run: Option<PathBuf>,
}

impl CollectivesArgs {
    pub(crate) fn max_bytes(&self) -> u64 {
        if self.quick {
            self.max_bytes.min(1 << 20)
        } else {
            self.max_bytes
        }
    }

    fn avg_iters(&self) -> usize {
        if self.quick { 1 } else { self.avg_iters }
    }

    /// The command line that reproduces this run.
    pub(crate) fn command_line(&self) -> String {
        let mut s = String::from("cargo xtask bench collectives");
        let default = CollectivesArgs {
            max_bytes: 256 << 20,
            worlds: vec![2, 4],
            backends: ["ring", "ring-tcp", "tls", "quic", "mpi"]
                .map(String::from)
                .to_vec(),
            ops: ["all_sum", "all_gather"].map(String::from).to_vec(),
            quick: false,
            avg_iters: 5,
            no_average_gradients: false,
            timeout: 900,
            no_build: false,
            out: None,
            hosts: None,
            rates: ["10gbit", "1gbit"].map(String::from).to_vec(),
            compute_ms: 1230.0,
            project_rates: ["1gbit", "10gbit", "100gbit"].map(String::from).to_vec(),
            project_hosts: vec![8, 16, 64],
            from_run: None,
        };
        if let Some(d) = &self.from_run {
            let _ = write!(s, " --from-run {}", d.display());
        }
        if let Some(n) = self.hosts {
            let _ = write!(s, " --hosts {n}");
            if self.rates != default.rates {
                let _ = write!(s, " --rates {}", self.rates.join(","));
            }
        }
        if self.max_bytes != default.max_bytes {
            let _ = write!(s, " --max-bytes {}", self.max_bytes);
        }
        let list = |v: &[String]| v.join(",");
        if self.worlds != default.worlds {
            let w: Vec<String> = self.worlds.iter().map(|w| w.to_string()).collect();
            let _ = write!(s, " --worlds {}", list(&w));
        }
        if self.backends != default.backends {
            let _ = write!(s, " --backends {}", list(&self.backends));
        }
        if self.ops != default.ops {
            let _ = write!(s, " --ops {}", list(&self.ops));
        }
        if self.quick {
            s.push_str(" --quick");
        }
        if self.avg_iters != default.avg_iters {
            let _ = write!(s, " --avg-iters {}", self.avg_iters);
        }
        if self.no_average_gradients && self.hosts.is_none() {
            s.push_str(" --no-average-gradients");
        }
        if self.hosts.is_some() || self.from_run.is_some() {
            if self.compute_ms != default.compute_ms {
                let _ = write!(s, " --compute-ms {}", self.compute_ms);
            }
            if self.project_rates != default.project_rates {
                let _ = write!(s, " --project-rates {}", self.project_rates.join(","));
            }
            if self.project_hosts != default.project_hosts {
                let h: Vec<String> = self.project_hosts.iter().map(|h| h.to_string()).collect();
                let _ = write!(s, " --project-hosts {}", h.join(","));
            }
        }
        s
    }
}

/// One backend at one world size.
pub(crate) struct Run {
    pub backend: String,
    pub world: usize,
    /// "ok", "failed" or "skipped".
    pub status: String,
    pub reason: Option<String>,
    pub wall_s: f64,
    /// The TCP copy's GB/s per size, measured just before this run.
    pub ceiling: Vec<(u64, f64)>,
    pub rows: Vec<Row>,
}

/// One collective at one message size.
pub(crate) struct Row {
    pub op: String,
    pub bytes: u64,
    pub time_us: f64,
    pub algbw: f64,
    pub busbw: f64,
    pub ceiling: f64,
    pub ratio: f64,
}

/// Runs the benchmark and writes the run folder.
pub fn run(a: CollectivesArgs) -> Result<()> {
    if a.hosts.is_some() || a.from_run.is_some() {
        return crate::bench_multihost::run(&a);
    }
    if a.worlds.is_empty() || a.worlds.iter().any(|&w| w < 2) {
        bail!("--worlds needs world sizes of at least 2, e.g. 2,4");
    }
    if a.max_bytes() < 1024 {
        bail!("--max-bytes must be at least 1024 (the smallest message)");
    }
    for b in &a.backends {
        if !["ring", "ring-tcp", "tls", "quic", "mpi"].contains(&b.as_str()) {
            bail!("unknown backend {b:?}: ring, ring-tcp, tls, quic or mpi");
        }
    }
    for op in &a.ops {
        if !["all_sum", "all_gather", "sum_scatter"].contains(&op.as_str()) {
            bail!("unknown op {op:?}: all_sum, all_gather or sum_scatter");
        }
    }
    let out = a.out.clone().unwrap_or_else(|| {
        root()
            .join("runs")
            .join(format!("bench-collectives-{}", timestamp()))
    });
    let out = if out.is_absolute() {
        out
    } else {
        root().join(out)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let load_before = load_average();

    // Build: the collectives example with MPI when Open MPI is usable here.
    let mut mpi_skipped = None;
    if a.backends.iter().any(|b| b == "mpi") {
        mpi_skipped = mpi_unusable(&a, &out);
        if let Some(reason) = &mpi_skipped {
            eprintln!("xtask: mpi: skipped, {reason}");
        }
    }
    if !a.no_build {
        if mpi_skipped.is_some() || !a.backends.iter().any(|b| b == "mpi") {
            cargo(&[
                "build",
                "--release",
                "-p",
                "mlx-dist",
                "--example",
                "collectives_bench",
            ])?;
        }
        if !a.no_average_gradients {
            cargo(&[
                "build",
                "--release",
                "-p",
                "mlx-dist",
                "--bin",
                "mlx-launch",
            ])?;
            cargo(&[
                "build",
                "--release",
                "-p",
                "mlx-nn",
                "--example",
                "average_gradients_bench",
            ])?;
        }
    }
    let release = target_dir().join("release");
    let exe = |name: &str| release.join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    let bench = release
        .join("examples")
        .join(format!("collectives_bench{}", std::env::consts::EXE_SUFFIX));
    if !bench.exists() {
        bail!(
            "{} is missing: build it with `cargo build --release -p mlx-dist --example collectives_bench` (or run without --no-build)",
            bench.display()
        );
    }

    let raw = out.join("raw");
    std::fs::create_dir_all(&raw)?;
    let mut runs = vec![];
    for backend in &a.backends {
        if backend == "mpi"
            && let Some(reason) = &mpi_skipped
        {
            runs.push(Run::skipped(backend, reason));
            continue;
        }
        for &world in &a.worlds {
            runs.push(run_collectives(&a, &bench, &raw, backend, world)?);
            if runs.last().is_some_and(|r| r.status == "skipped") {
                // Not in this build: the same at every world size.
                break;
            }
        }
    }

    let avg = if a.no_average_gradients {
        None
    } else {
        Some(run_average_gradients(
            &a,
            &exe("mlx-launch"),
            &release.join("examples").join(format!(
                "average_gradients_bench{}",
                std::env::consts::EXE_SUFFIX
            )),
            &raw,
        ))
    };
    let load = (load_before, load_average());

    let table = markdown(&a, &runs, avg.as_ref(), &load);
    let md = out.join("collectives.md");
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let json = out.join("collectives.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&to_json(&a, &runs, avg.as_ref(), &load))?,
    )
    .with_context(|| format!("writing {}", json.display()))?;
    println!("\n{table}");
    println!("xtask: table {}", md.display());
    println!("xtask: json  {}", json.display());

    // The first line of each reason; the rest (the log's end) is above and in the table.
    let first = |s: &str| s.lines().next().unwrap_or_default().to_string();
    let mut failed: Vec<String> = runs
        .iter()
        .filter(|r| r.status == "failed")
        .map(|r| {
            let reason = first(r.reason.as_deref().unwrap_or("?"));
            format!("{} world {}: {reason}", r.backend, r.world)
        })
        .collect();
    if let Some(Err(e)) = &avg {
        failed.push(format!("average_gradients: {}", first(&format!("{e:#}"))));
    }
    if !failed.is_empty() {
        bail!(
            "{} run(s) failed (details in {}):\n  {}",
            failed.len(),
            md.display(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

impl Run {
    pub(crate) fn skipped(backend: &str, reason: &str) -> Run {
        Run {
            backend: backend.into(),
            world: 0,
            status: "skipped".into(),
            reason: Some(reason.into()),
            wall_s: 0.0,
            ceiling: vec![],
            rows: vec![],
        }
    }
}

/// Why the MPI backend cannot run here (`None` when it can). Unless
/// `--no-build`, this builds the collectives example with `--features mpi`
/// (its log goes to `build-mpi.log` in the run folder).
pub(crate) fn mpi_unusable(a: &CollectivesArgs, out: &Path) -> Option<String> {
    let mpirun = std::env::var("MLX_LAUNCH_MPIRUN").unwrap_or_else(|_| "mpirun".into());
    match Command::new(&mpirun).arg("--version").output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => return Some(format!("`{mpirun} --version` failed ({})", o.status)),
        Err(e) => {
            return Some(format!(
                "{mpirun} is not on the PATH ({e}; Debian: openmpi-bin libopenmpi-dev clang libclang-dev)"
            ));
        }
    }
    if a.no_build {
        // The example says itself whether it was built with the feature.
        return None;
    }
    let log = out.join("build-mpi.log");
    let args = [
        "build",
        "--release",
        "-p",
        "mlx-dist",
        "--features",
        "mpi",
        "--example",
        "collectives_bench",
    ];
    eprintln!("xtask: cargo {} (log {})", args.join(" "), log.display());
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = std::fs::File::create(&log).and_then(|f| {
        Command::new(&cargo)
            .args(args)
            .current_dir(root())
            .stdout(f.try_clone()?)
            .stderr(f)
            .status()
    });
    match status {
        Ok(s) if s.success() => None,
        Ok(s) => Some(format!(
            "building mlx-dist with --features mpi failed ({s}); the end of {}:\n{}",
            log.display(),
            log_tail(&log, 15)
        )),
        Err(e) => Some(format!("cannot run {cargo}: {e}")),
    }
}

/// One backend at one world size through the collectives example, on loopback.
fn run_collectives(
    a: &CollectivesArgs,
    bench: &Path,
    raw: &Path,
    backend: &str,
    world: usize,
) -> Result<Run> {
    run_collectives_with(a, bench, raw, backend, world, "", &[])
}

/// [`run_collectives`] with `extra` arguments for the example (hosts, the
/// ceiling) and `tag` before the names of its files in `raw`.
pub(crate) fn run_collectives_with(
    a: &CollectivesArgs,
    bench: &Path,
    raw: &Path,
    backend: &str,
    world: usize,
    tag: &str,
    extra: &[String],
) -> Result<Run> {
    let json_path = raw.join(format!("{tag}{backend}-world{world}.json"));
    let log = raw.join(format!("{tag}{backend}-world{world}.log"));
    let _ = std::fs::remove_file(&json_path);
    let mut cmd = Command::new(bench);
    if backend == "ring-tcp" {
        cmd.env("MLX_DIST_SHM", "0");
    }
    let algorithm = backend.strip_suffix("-tcp").unwrap_or(backend);
    cmd.args(["--backends", algorithm, "--worlds", &world.to_string()])
        .args(["--ops", &a.ops.join(",")])
        .args([
            "--min-bytes",
            "1024",
            "--max-bytes",
            &a.max_bytes().to_string(),
        ])
        .arg("--json")
        .arg(&json_path)
        .args(extra)
        .current_dir(root());
    eprintln!(
        "\nxtask: {tag}{backend} world {world}: {} (log {})",
        describe(&cmd),
        log.display()
    );
    let start = std::time::Instant::now();
    let ended = run_logged(cmd, &log, Duration::from_secs(a.timeout))?;
    let wall_s = start.elapsed().as_secs_f64();
    let report: Option<Value> = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let mut run = Run {
        backend: backend.into(),
        world,
        status: "failed".into(),
        reason: None,
        wall_s,
        ceiling: vec![],
        rows: vec![],
    };
    if let Some(r) = &report {
        run.ceiling = r["ceiling"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| Some((c["bytes"].as_u64()?, c["gbs"].as_f64()?)))
            .collect();
        if let Some(v) = r["runs"].as_array().and_then(|v| v.first()) {
            run.status = v["status"].as_str().unwrap_or("failed").into();
            run.reason = v["reason"].as_str().map(String::from);
            run.rows = v["rows"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(parse_row)
                .collect();
        }
    }
    match ended {
        Ended::TimedOut => {
            run.status = "failed".into();
            run.reason = Some(format!(
                "no result after {} s (--timeout); stopped it and its ranks; the end of {}:\n{}",
                a.timeout,
                log.display(),
                log_tail(&log, 15)
            ));
        }
        Ended::Exited(st) if !st.success() && run.status != "failed" => {
            run.status = "failed".into();
            run.reason = Some(format!("the benchmark exited with {st}"));
        }
        Ended::Exited(st) if run.status == "failed" && run.reason.is_none() => {
            run.reason = Some(format!(
                "the benchmark exited with {st} and wrote no report; the end of {}:\n{}",
                log.display(),
                log_tail(&log, 15)
            ));
        }
        Ended::Exited(_) => {}
    }
    if run.status == "failed" {
        eprintln!(
            "xtask: {backend} world {world} FAILED: {}",
            run.reason.as_deref().unwrap_or("?")
        );
    }
    Ok(run)
}

fn parse_row(v: &Value) -> Option<Row> {
    Some(Row {
        op: v["op"].as_str()?.into(),
        bytes: v["bytes"].as_u64()?,
        time_us: v["time_us"].as_f64()?,
        algbw: v["algbw_gbs"].as_f64()?,
        busbw: v["busbw_gbs"].as_f64()?,
        ceiling: v["ceiling_gbs"].as_f64()?,
        ratio: v["ratio"].as_f64()?,
    })
}

/// `average_gradients` against one all_sum per tensor, world 2 over the ring:
/// the example's JSON report.
fn run_average_gradients(
    a: &CollectivesArgs,
    launcher: &Path,
    example: &Path,
    raw: &Path,
) -> Result<Value> {
    for p in [launcher, example] {
        if !p.exists() {
            bail!(
                "{} is missing: build with `cargo build --release -p mlx-dist --bin mlx-launch` and `cargo build --release -p mlx-nn --example average_gradients_bench`",
                p.display()
            );
        }
    }
    let json_path = raw.join("average_gradients.json");
    let log = raw.join("average_gradients.log");
    let _ = std::fs::remove_file(&json_path);
    let mut cmd = Command::new(launcher);
    cmd.args(["-n", "2", "--backend", "ring", "--timeout", "120"])
        .args(["--env", &format!("ITERS={}", a.avg_iters())])
        .arg("--")
        .arg(example)
        .arg("--json")
        .arg(&json_path)
        .current_dir(root());
    eprintln!(
        "\nxtask: average_gradients, world 2, ring: {} (log {})",
        describe(&cmd),
        log.display()
    );
    match run_logged(cmd, &log, Duration::from_secs(a.timeout))? {
        Ended::TimedOut => bail!(
            "no result after {} s (--timeout); stopped; the end of {}:\n{}",
            a.timeout,
            log.display(),
            log_tail(&log, 15)
        ),
        Ended::Exited(st) if !st.success() => bail!(
            "mlx-launch exited with {st}; the end of {}:\n{}",
            log.display(),
            log_tail(&log, 15)
        ),
        Ended::Exited(_) => {}
    }
    let text = std::fs::read_to_string(&json_path)
        .with_context(|| format!("reading {} (written by rank 0)", json_path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("parsing {}", json_path.display()))
}

pub(crate) fn describe(cmd: &Command) -> String {
    std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|s| s.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The 1, 5 and 15 minute load averages (Linux; `None` elsewhere).
pub(crate) fn load_average() -> Option<String> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
}

/// `1 KiB`, `64 MiB`.
pub(crate) fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

/// A time in the unit that keeps it readable.
pub(crate) fn time(us: f64) -> String {
    if us >= 1_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} us")
    }
}

/// The issue's goals, checked on the world-2 ring all_sum rows.
fn goals(runs: &[Run]) -> Vec<(String, Option<(String, bool)>)> {
    let row_of = |backend: &'static str, bytes: u64| {
        runs.iter()
            .filter(move |r| r.backend == backend && r.world == 2)
            .flat_map(|r| &r.rows)
            .find(move |x| x.op == "all_sum" && x.bytes == bytes)
    };
    let row = |bytes: u64| row_of("ring", bytes);
    let ratio = |r: &Row| {
        (
            format!(
                "{:.0}% ({:.3} of {:.3} GB/s)",
                r.ratio * 100.0,
                r.busbw,
                r.ceiling
            ),
            r.ratio >= GOAL_RATIO,
        )
    };
    vec![
        (
            format!(
                "ring all_sum, world 2, 64 MiB: bus bandwidth at least {:.0}% of one TCP stream",
                GOAL_RATIO * 100.0
            ),
            row(GOAL_BYTES).map(ratio),
        ),
        (
            format!(
                "(the same over TCP only, ring-tcp: at least {:.0}%)",
                GOAL_RATIO * 100.0
            ),
            row_of("ring-tcp", GOAL_BYTES).map(ratio),
        ),
        (
            format!("ring all_sum, world 2, 1 KiB: under {GOAL_SMALL_US:.0} us"),
            row(GOAL_SMALL_BYTES)
                .map(|r| (format!("{:.1} us", r.time_us), r.time_us < GOAL_SMALL_US)),
        ),
    ]
}

fn markdown(
    a: &CollectivesArgs,
    runs: &[Run],
    avg: Option<&Result<Value>>,
    load: &(Option<String>, Option<String>),
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`{}`: loopback, {} logical cores, load average {} before and {} after. Time is the mean \
         per operation on rank 0; bus bandwidth (busbw) follows the NCCL convention (all_sum: \
         algbw x 2(n-1)/n; all_gather: output bytes, x (n-1)/n; sum_scatter: input bytes, x \
         (n-1)/n); \"TCP\" is one loopback TCP \
         stream copying the same bytes, measured just before each run, and the ratio is busbw \
         over it.\n",
        a.command_line(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.0.as_deref().unwrap_or("?"),
        load.1.as_deref().unwrap_or("?"),
    );
    let _ = writeln!(s, "### Goals (issue 6)\n");
    let _ = writeln!(s, "| goal | measured | met |");
    let _ = writeln!(s, "|---|---|---|");
    for (goal, got) in goals(runs) {
        match got {
            Some((v, ok)) => {
                let _ = writeln!(s, "| {goal} | {v} | {} |", if ok { "yes" } else { "no" });
            }
            None => {
                let _ = writeln!(s, "| {goal} | not measured | - |");
            }
        }
    }
    let _ = writeln!(s);
    for r in runs {
        match r.status.as_str() {
            "skipped" => {
                let _ = writeln!(
                    s,
                    "### {}: skipped\n\n{}\n",
                    r.backend,
                    r.reason.as_deref().unwrap_or("")
                );
                continue;
            }
            "failed" => {
                let _ = writeln!(
                    s,
                    "### {} world {}: FAILED\n\n```\n{}\n```\n",
                    r.backend,
                    r.world,
                    r.reason.as_deref().unwrap_or("")
                );
            }
            _ => {}
        }
        for op in &a.ops {
            let rows: Vec<&Row> = r.rows.iter().filter(|x| &x.op == op).collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(
                s,
                "### {} {}, world {} ({:.0} s)\n",
                r.backend, op, r.world, r.wall_s
            );
            let _ = writeln!(
                s,
                "| size | time | algbw GB/s | busbw GB/s | TCP GB/s | busbw / TCP |"
            );
            let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
            for x in rows {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.3} | {:.3} | {:.3} | {:.0}% |",
                    human(x.bytes),
                    time(x.time_us),
                    x.algbw,
                    x.busbw,
                    x.ceiling,
                    x.ratio * 100.0
                );
            }
            let _ = writeln!(s);
        }
    }
    if let Some(avg) = avg {
        let _ = writeln!(
            s,
            "### average_gradients on the reference Llama's gradient tree, world 2, ring\n"
        );
        match avg {
            Ok(v) => {
                let _ = writeln!(
                    s,
                    "{} tensors, {:.1}M f32 parameters; median of {} ({}).\n",
                    v["tensors"],
                    v["parameters"].as_f64().unwrap_or(0.0) / 1e6,
                    v["iters"],
                    v["backend"].as_str().unwrap_or("?")
                );
                let _ = writeln!(s, "| | ms |");
                let _ = writeln!(s, "|---|---:|");
                for row in v["rows"].as_array().into_iter().flatten() {
                    let _ = writeln!(
                        s,
                        "| {} | {:.1} |",
                        row["label"].as_str().unwrap_or("?"),
                        row["ms"].as_f64().unwrap_or(f64::NAN)
                    );
                }
                let _ = writeln!(s);
            }
            Err(e) => {
                let _ = writeln!(s, "FAILED:\n\n```\n{e:#}\n```\n");
            }
        }
    }
    s
}

fn to_json(
    a: &CollectivesArgs,
    runs: &[Run],
    avg: Option<&Result<Value>>,
    load: &(Option<String>, Option<String>),
) -> Value {
    let runs: Vec<Value> = runs
        .iter()
        .map(|r| {
            let rows: Vec<Value> = r
                .rows
                .iter()
                .map(|x| {
                    json!({
                        "op": x.op, "bytes": x.bytes, "time_us": x.time_us,
                        "algbw_gbs": x.algbw, "busbw_gbs": x.busbw,
                        "tcp_gbs": x.ceiling, "ratio": x.ratio,
                    })
                })
                .collect();
            let ceiling: Vec<Value> = r
                .ceiling
                .iter()
                .map(|(b, g)| json!({"bytes": b, "gbs": g}))
                .collect();
            json!({
                "backend": r.backend,
                "world": if r.status == "skipped" { Value::Null } else { json!(r.world) },
                "status": r.status,
                "reason": r.reason,
                "wall_s": r.wall_s,
                "tcp_ceiling": ceiling,
                "rows": rows,
            })
        })
        .collect();
    json!({
        "command": a.command_line(),
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "load_average_before": load.0,
        "load_average_after": load.1,
        "max_bytes": a.max_bytes(),
        "runs": runs,
        "average_gradients": match avg {
            None => Value::Null,
            Some(Ok(v)) => v.clone(),
            Some(Err(e)) => json!({"error": format!("{e:#}")}),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bytes: u64, time_us: f64, ratio: f64) -> Row {
        Row {
            op: "all_sum".into(),
            bytes,
            time_us,
            algbw: 1.0,
            busbw: ratio,
            ceiling: 1.0,
            ratio,
        }
    }

    fn ring2(rows: Vec<Row>) -> Run {
        Run {
            backend: "ring".into(),
            world: 2,
            status: "ok".into(),
            reason: None,
            wall_s: 1.0,
            ceiling: vec![],
            rows,
        }
    }

    #[test]
    fn goals_read_the_world_2_ring_all_sum() {
        let mut tcp = ring2(vec![row(64 << 20, 30_000.0, 0.71)]);
        tcp.backend = "ring-tcp".into();
        let runs = [
            ring2(vec![row(1024, 12.0, 1.5), row(64 << 20, 30_000.0, 0.69)]),
            tcp,
        ];
        let g = goals(&runs);
        assert_eq!(g[0].1.as_ref().map(|x| x.1), Some(false));
        assert!(g[0].1.as_ref().unwrap().0.starts_with("69%"));
        assert_eq!(
            g[1].1.as_ref().map(|x| x.1),
            Some(true),
            "ring-tcp read apart"
        );
        assert!(g[1].1.as_ref().unwrap().0.starts_with("71%"));
        assert_eq!(g[2].1, Some(("12.0 us".into(), true)));
        // Other backends or worlds do not count.
        let mut quic = ring2(vec![row(1024, 12.0, 1.0)]);
        quic.backend = "quic".into();
        assert!(goals(&[quic]).iter().all(|(_, v)| v.is_none()));
    }

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(human(1024), "1 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(time(12.34), "12.3 us");
        assert_eq!(time(999.94), "999.9 us");
        assert_eq!(time(36_500.0), "36.50 ms");
    }
}
