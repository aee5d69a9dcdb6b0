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
//!
//! One file a job: this one holds the entry and the analysis that a run and
//! `--from-run` both end with; `results.rs` what one link rate measured and
//! the ring's fits at it; `measure.rs` starts the example and the TCP streams
//! in the hosts' namespaces; `mlx.rs` runs MLX's ring; `goals.rs` checks the
//! issue's goals; `projection.rs` projects the step onto more hosts and
//! `chart.rs` draws it; `report.rs` writes `multihost.md`; `json.rs` writes
//! `multihost.json` and reads it back for `--from-run`.

mod chart;
mod goals;
mod json;
mod measure;
mod mlx;
mod projection;
mod report;
mod results;
#[cfg(test)]
mod tests;

use std::path::Path;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::alpha_beta;
use crate::bench_collectives::{
    CollectivesArgs, Run, build_example, load_average, run_collectives_with,
};
use crate::hosts::{self, HostsGuard};
use crate::util::{build_launcher, root, target_dir, timestamp};

use chart::projection_chart;
use json::{reanalyse, to_json};
use measure::{example_args, streams};
use mlx::{MLX_PORT, MlxRun, mlx_setup, run_mlx};
use projection::project_all;
use report::{Report, markdown};
use results::{RateFits, RateResult};

/// The backends measured across hosts, in the tables' order.
const BACKENDS: [&str; 5] = ["ring", "tls", "quic", "mpi", "mlx"];

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
        build_launcher()?;
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
