//! The run half of `cargo xtask bench collectives`: builds the examples,
//! starts one backend at one world size at a time under the deadline (and
//! the average_gradients comparison), and reads the JSON they write.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use super::{CollectivesArgs, Measured, Row, Run};
use crate::util::{Ended, build_launcher, cargo, log_tail, root, run_logged, target_dir};

/// Builds what the run needs (unless `--no-build`) and measures every
/// backend at every world size, then the average_gradients comparison.
pub(super) fn measure(a: &CollectivesArgs, out: &Path) -> Result<Measured> {
    let load_before = load_average();

    // Build: the collectives example with MPI when Open MPI is usable here.
    let mpi_skipped = build_example(a, &a.backends, out)?;
    if !a.no_build && !a.no_average_gradients {
        build_launcher()?;
        cargo(&[
            "build",
            "--release",
            "-p",
            "mlx-nn",
            "--example",
            "average_gradients_bench",
        ])?;
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
            runs.push(run_collectives(a, &bench, &raw, backend, world)?);
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
            a,
            &exe("mlx-launch"),
            &release.join("examples").join(format!(
                "average_gradients_bench{}",
                std::env::consts::EXE_SUFFIX
            )),
            &raw,
        ))
    };
    let load = (load_before, load_average());
    Ok(Measured { runs, avg, load })
}

/// Builds the collectives example (unless `--no-build`): with MPI when
/// `backends` has mpi and Open MPI is usable here, else without. Returns why
/// MPI is skipped (`None` when it is not, or not asked for).
pub(crate) fn build_example(
    a: &CollectivesArgs,
    backends: &[String],
    out: &Path,
) -> Result<Option<String>> {
    let mut mpi_skipped = None;
    if backends.iter().any(|b| b == "mpi") {
        mpi_skipped = mpi_unusable(a, out);
        if let Some(reason) = &mpi_skipped {
            eprintln!("xtask: mpi: skipped, {reason}");
        }
    }
    if !a.no_build && (mpi_skipped.is_some() || !backends.iter().any(|b| b == "mpi")) {
        cargo(&[
            "build",
            "--release",
            "-p",
            "mlx-dist",
            "--example",
            "collectives_bench",
        ])?;
    }
    Ok(mpi_skipped)
}

/// Why the MPI backend cannot run here (`None` when it can). Unless
/// `--no-build`, this builds the collectives example with `--features mpi`
/// (its log goes to `build-mpi.log` in the run folder).
fn mpi_unusable(a: &CollectivesArgs, out: &Path) -> Option<String> {
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
