//! `multihost.md`: what the run was ([`Report`]), the goals, a summary and
//! every size per link rate, the alpha-beta fits and the projection.

use std::fmt::Write as _;
use std::path::Path;

use crate::alpha_beta;
use crate::bench_collectives::{human, time};
use crate::report_common::goals_table;

use super::goals::{GOAL_BYTES, goals};
use super::projection::{Projections, efficiency};
use super::results::{RateFits, RateResult};

/// The message sizes of the summary tables.
const KEY_SIZES: [u64; 5] = [1 << 20, 16 << 20, 64 << 20, 256 << 20, 64 << 10];

/// What the report says about the run as a whole.
pub(super) struct Report {
    /// The command that measured.
    pub(super) command: String,
    /// The command that re-analysed the figures (`--from-run`), if one did.
    pub(super) reanalysis: Option<String>,
    pub(super) n_hosts: usize,
    pub(super) worlds: Vec<usize>,
    pub(super) backends: Vec<String>,
    pub(super) ops: Vec<String>,
    pub(super) max_bytes: u64,
    pub(super) cores: usize,
    pub(super) load: (Option<String>, Option<String>),
    pub(super) wall_s: f64,
    pub(super) grad_bytes: u64,
    pub(super) compute_s: f64,
}

fn gbs(x: f64) -> String {
    format!("{x:.3}")
}

pub(super) fn markdown(
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
