//! The report half of `cargo xtask memprof`: per-process and total figures
//! of each world size, the checks of issue 8, and the files `samples.csv`,
//! `memprof.md` and `memprof.png`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::{Args, Sample, Who, WorldRun};
use crate::report_common::register_chart_font;

const MIB: f64 = (1u64 << 20) as f64;

/// Distinct colours for the ranks' lines (matplotlib's tab10 without grey).
const RANK_COLORS: [(u8, u8, u8); 9] = [
    (31, 119, 180),
    (255, 127, 14),
    (44, 160, 44),
    (214, 39, 40),
    (148, 103, 189),
    (140, 86, 75),
    (227, 119, 194),
    (188, 189, 34),
    (23, 190, 207),
];

/// Per-process figures of one world size.
pub(super) struct Stats {
    pub(super) who: Who,
    pub(super) peak: u64,
    mean: f64,
    samples: usize,
    /// CPU time over the sampled life time, in cores (1.0 = one core busy).
    cores: f64,
    /// CPU time at the last sample, milliseconds.
    cpu_ms: u64,
    pub(super) array_peak: Option<u64>,
}

/// Writes `samples.csv`, `memprof.md` and `memprof.png` into `out` and
/// prints the table.
pub(super) fn write(a: &Args, bins: &Path, out: &Path, runs: &[WorldRun]) -> Result<()> {
    let csv = out.join("samples.csv");
    write_csv(&csv, runs)?;
    let md = out.join("memprof.md");
    let table = markdown(a, bins, runs);
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let png = out.join("memprof.png");
    chart(&png, runs)?;
    println!("{table}");
    println!("xtask: samples  {}", csv.display());
    println!("xtask: table    {}", md.display());
    println!("xtask: chart    {}", png.display());
    Ok(())
}

fn write_csv(path: &Path, runs: &[WorldRun]) -> Result<()> {
    let mut s = String::from("world,tick,t_s,unix_ms,process,pid,rss_bytes,cpu_ms\n");
    for r in runs {
        for x in &r.samples {
            writeln!(
                s,
                "{},{},{:.3},{},{},{},{},{}",
                x.world, x.tick, x.t_s, x.unix_ms, x.who, x.pid, x.rss, x.cpu_ms
            )?;
        }
    }
    std::fs::write(path, s).with_context(|| format!("writing {}", path.display()))
}

pub(super) fn stats(run: &WorldRun) -> (Vec<Stats>, Option<(u64, f64)>) {
    let mut by: BTreeMap<Who, Vec<&Sample>> = BTreeMap::new();
    for s in &run.samples {
        by.entry(s.who).or_default().push(s);
    }
    let per: Vec<Stats> = by
        .iter()
        .map(|(who, xs)| {
            let peak = xs.iter().map(|x| x.rss).max().unwrap_or(0);
            let mean = xs.iter().map(|x| x.rss as f64).sum::<f64>() / xs.len() as f64;
            let last = xs.last().expect("at least one sample");
            // CPU time over the time since launch (ranks start within a few
            // milliseconds of the launcher).
            let cores = if last.t_s > 0.0 {
                last.cpu_ms as f64 / 1e3 / last.t_s
            } else {
                0.0
            };
            let array_peak = match who {
                Who::Launcher => None,
                Who::Rank(r) => run
                    .arrays
                    .get(r)
                    .and_then(|v| v.iter().map(|m| m.peak).max()),
            };
            Stats {
                who: *who,
                peak,
                mean,
                samples: xs.len(),
                cores,
                cpu_ms: last.cpu_ms,
                array_peak,
            }
        })
        .collect();
    let mut ticks: BTreeMap<u64, u64> = BTreeMap::new();
    for s in &run.samples {
        *ticks.entry(s.tick).or_default() += s.rss;
    }
    let total = (!ticks.is_empty()).then(|| {
        (
            ticks.values().copied().max().unwrap_or(0),
            ticks.values().map(|&v| v as f64).sum::<f64>() / ticks.len() as f64,
        )
    });
    (per, total)
}

fn mib(b: f64) -> String {
    format!("{:.1}", b / MIB)
}

fn markdown(a: &Args, bins: &Path, runs: &[WorldRun]) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "# memprof\n");
    let _ = writeln!(
        s,
        "`cargo xtask memprof --worlds {} --steps {} --per-rank-batch {} --backend {}{}{}`, \
         sampled every {} ms; binaries: {}.\n",
        a.worlds
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(","),
        a.steps,
        a.per_rank_batch,
        a.runner.backend,
        if a.runner.debug { " --debug" } else { "" },
        if a.trainer.is_empty() {
            String::new()
        } else {
            format!(" -- {}", a.trainer.join(" "))
        },
        a.interval_ms,
        bins.display(),
    );
    let _ = writeln!(
        s,
        "Resident memory (RSS) of each process as the OS reports it, and each rank's \
         own array memory (`memory::peak()`, from `--memory-log`). CPU is the process's \
         CPU time over its life time, in % of one core.\n"
    );
    let _ = writeln!(
        s,
        "| world | process | peak RSS MiB | mean RSS MiB | CPU % of a core | array peak MiB | samples |"
    );
    let _ = writeln!(s, "|---:|---|---:|---:|---:|---:|---:|");
    let mut checks = vec![];
    for run in runs {
        let (per, total) = stats(run);
        for p in &per {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {:.2} | {} | {} |",
                run.world,
                p.who,
                mib(p.peak as f64),
                mib(p.mean),
                p.cores * 100.0,
                p.array_peak.map_or("".into(), |b| mib(b as f64)),
                p.samples
            );
        }
        if let Some((peak, mean)) = total {
            let _ = writeln!(
                s,
                "| {} | **total** | {} | {} | | | |",
                run.world,
                mib(peak as f64),
                mib(mean)
            );
        }
        let rank_peak = per
            .iter()
            .filter(|p| p.who != Who::Launcher)
            .map(|p| p.peak)
            .max();
        let array_peak = per.iter().filter_map(|p| p.array_peak).max();
        let launcher = per
            .iter()
            .find(|p| p.who == Who::Launcher)
            .map(|p| (p.cores, p.cpu_ms));
        checks.push((run.world, rank_peak, array_peak, launcher, run.wall_s));
    }
    let base = checks
        .iter()
        .find(|c| c.0 == 1)
        .or(checks.first())
        .map(|c| (c.0, c.1, c.2));
    if let Some((bw, base_rss, base_arr)) = base {
        let _ = writeln!(
            s,
            "\n## Checks (issue 8)\n\nPer-rank peak RSS must stay within 10% of world {bw}'s at the same \
             per-rank batch ({}); the launcher must use under 1% of a core (CPU time as the OS \
             counts it, in clock ticks of 10 ms on Linux).\n",
            a.per_rank_batch
        );
        let _ = writeln!(
            s,
            "| world | wall s | max rank peak RSS MiB | vs world {bw} | within 10% | max rank array peak MiB | vs world {bw} | launcher CPU ms | launcher CPU % of a core | under 1% |"
        );
        let _ = writeln!(s, "|---:|---:|---:|---:|---|---:|---:|---:|---:|---|");
        let rel = |x: Option<u64>, b: Option<u64>| match (x, b) {
            (Some(x), Some(b)) if b > 0 => Some(x as f64 / b as f64 - 1.0),
            _ => None,
        };
        for (world, rss, arr, launcher, wall) in checks {
            let r = rel(rss, base_rss);
            let ar = rel(arr, base_arr);
            let _ = writeln!(
                s,
                "| {world} | {wall:.1} | {} | {} | {} | {} | {} | {} | {} | {} |",
                rss.map_or("-".into(), |b| mib(b as f64)),
                r.map_or("-".into(), |r| format!("{:+.1}%", r * 100.0)),
                r.map_or("-", |r| if r <= 0.10 { "yes" } else { "**no**" }),
                arr.map_or("-".into(), |b| mib(b as f64)),
                ar.map_or("-".into(), |r| format!("{:+.1}%", r * 100.0)),
                launcher.map_or("-".into(), |(_, ms)| ms.to_string()),
                launcher.map_or("-".into(), |(c, _)| format!("{:.2}", c * 100.0)),
                launcher.map_or("-", |(c, _)| if c < 0.01 { "yes" } else { "**no**" }),
            );
        }
    }
    s
}

fn chart(path: &Path, runs: &[WorldRun]) -> Result<()> {
    use plotters::prelude::*;

    register_chart_font();
    let panel_h = 360u32;
    let root =
        BitMapBackend::new(path, (1200, panel_h * runs.len().max(1) as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let panels = root.split_evenly((runs.len().max(1), 1));
    for (run, area) in runs.iter().zip(panels) {
        let t_max = run
            .samples
            .iter()
            .map(|s| s.t_s)
            .chain(run.arrays.values().flatten().map(|m| m.t_s))
            .fold(0.1f64, f64::max);
        let y_max = run
            .samples
            .iter()
            .map(|s| s.rss)
            .chain(run.arrays.values().flatten().map(|m| m.active))
            .max()
            .unwrap_or(1) as f64
            / MIB
            * 1.1;
        let mut chart = ChartBuilder::on(&area)
            .caption(
                format!("world {}: memory per process over time", run.world),
                ("sans-serif", 20),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0f64..t_max, 0f64..y_max.max(1.0))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("seconds since launch")
            .y_desc("MiB")
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let mut by: BTreeMap<Who, Vec<(f64, f64)>> = BTreeMap::new();
        for s in &run.samples {
            by.entry(s.who)
                .or_default()
                .push((s.t_s, s.rss as f64 / MIB));
        }
        for (i, (who, pts)) in by.into_iter().enumerate() {
            let color = match who {
                Who::Launcher => RGBAColor(0, 0, 0, 1.0),
                Who::Rank(_) => {
                    let (r, g, b) = RANK_COLORS[(i - 1) % RANK_COLORS.len()];
                    RGBAColor(r, g, b, 1.0)
                }
            };
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(format!("{who} RSS"))
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
            if let Who::Rank(r) = who
                && let Some(mem) = run.arrays.get(&r).filter(|m| !m.is_empty())
            {
                let pts: Vec<(f64, f64)> =
                    mem.iter().map(|m| (m.t_s, m.active as f64 / MIB)).collect();
                let thin = color.stroke_width(1);
                chart
                    .draw_series(DashedLineSeries::new(pts, 6, 4, thin))
                    .map_err(|e| anyhow::anyhow!("{e}"))?
                    .label(format!("{who} arrays (active after each step)"))
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], thin));
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::MiddleRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 13))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
