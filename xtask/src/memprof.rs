//! `cargo xtask memprof --worlds 1,2,4`: the reference experiment at several
//! world sizes, with the resident memory (RSS) and CPU time of the launcher and
//! of every rank polled about ten times a second, and each rank's own array
//! memory (`memory::active()`/`peak()`, from the trainer's `--memory-log`).
//!
//! Writes into the run folder: `samples.csv` (every sample), `memprof.md` (peak
//! and mean per process and in total, per world size, and the checks of issue
//! 8: per-rank peak within 10% of world 1, launcher under 1% of a core) and
//! `memprof.png` (memory over time per process, one panel per world size).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use clap::Args as ClapArgs;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind};

use crate::util::{RunnerArgs, log_tail, root, spawn_trainer, timestamp};

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

/// Options of `cargo xtask memprof`; anything after `--` goes to `mlx-llama train`.
#[derive(ClapArgs, Debug)]
pub struct Args {
    /// World sizes to run, one after the other.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub worlds: Vec<usize>,
    /// Optimizer steps per run.
    #[arg(long, default_value_t = 10)]
    pub steps: u64,
    /// Sequences per step on each rank (the same at every world size, so that
    /// per-rank memory is comparable).
    #[arg(long, default_value_t = 2)]
    pub per_rank_batch: usize,
    /// Milliseconds between samples.
    #[arg(long, default_value_t = 100)]
    pub interval_ms: u64,
    /// Run folder (default: `runs/memprof-<UTC time>`).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Skip the unmonitored one-step run that first prepares the data (tokenizer
    /// and token store), so that the first world size does not pay for it.
    #[arg(long)]
    pub no_prepare: bool,
    /// Where the binaries come from and how the ranks talk.
    #[command(flatten)]
    pub runner: RunnerArgs,
    /// Options for `mlx-llama train` (see `mlx-llama train --help`).
    #[arg(last = true)]
    pub trainer: Vec<String>,
}

/// Who a sample is of.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Who {
    Launcher,
    Rank(usize),
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Launcher => write!(f, "launcher"),
            Who::Rank(r) => write!(f, "rank{r}"),
        }
    }
}

/// One poll of one process.
#[derive(Clone, Debug)]
struct Sample {
    world: usize,
    tick: u64,
    /// Seconds since the launcher was started.
    t_s: f64,
    unix_ms: u128,
    who: Who,
    pid: u32,
    rss: u64,
    cpu_ms: u64,
}

/// One line of a rank's `--memory-log`.
#[derive(Clone, Debug)]
struct ArrayMem {
    t_s: f64,
    active: u64,
    peak: u64,
}

/// What one world size produced.
struct WorldRun {
    world: usize,
    samples: Vec<Sample>,
    /// Per rank, the memory-log lines (time relative to the launcher's start).
    arrays: BTreeMap<usize, Vec<ArrayMem>>,
    /// Wall time of the launcher, seconds.
    wall_s: f64,
}

/// Per-process figures of one world size.
struct Stats {
    who: Who,
    peak: u64,
    mean: f64,
    samples: usize,
    /// CPU time over the sampled life time, in cores (1.0 = one core busy).
    cores: f64,
    /// CPU time at the last sample, milliseconds.
    cpu_ms: u64,
    array_peak: Option<u64>,
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// Runs the experiment at every world size and writes the report.
pub fn run(a: Args) -> Result<()> {
    if a.worlds.is_empty() || a.worlds.contains(&0) {
        bail!("--worlds needs world sizes of at least 1, e.g. 1,2,4");
    }
    if a.per_rank_batch == 0 || a.interval_ms == 0 {
        bail!("--per-rank-batch and --interval-ms must be at least 1");
    }
    let bins = a.runner.binaries()?;
    let out = a
        .out
        .clone()
        .unwrap_or_else(|| root().join("runs").join(format!("memprof-{}", timestamp())));
    let out = if out.is_absolute() {
        out
    } else {
        root().join(out)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    if !a.no_prepare {
        prepare(&a, &bins, &out)?;
    }
    let mut runs = vec![];
    for &world in &a.worlds {
        runs.push(run_world(&a, &bins, &out, world)?);
    }

    let csv = out.join("samples.csv");
    write_csv(&csv, &runs)?;
    let md = out.join("memprof.md");
    let table = markdown(&a, &bins, &runs);
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let png = out.join("memprof.png");
    chart(&png, &runs)?;
    println!("{table}");
    println!("xtask: samples  {}", csv.display());
    println!("xtask: table    {}", md.display());
    println!("xtask: chart    {}", png.display());
    Ok(())
}

/// One unmonitored step at world 1, so that the tokenizer and the token store
/// exist before the measured runs (data is prepared once, then memory-mapped).
fn prepare(a: &Args, bins: &Path, out: &Path) -> Result<()> {
    let dir = out.join("prepare");
    std::fs::create_dir_all(&dir)?;
    let mut args: Vec<String> = vec![
        "--out".into(),
        dir.join("train").display().to_string(),
        "--fresh".into(),
        "--steps".into(),
        "1".into(),
        "--per-rank-batch".into(),
        a.per_rank_batch.to_string(),
    ];
    args.extend(a.trainer.iter().cloned());
    let log = dir.join("train.log");
    eprintln!(
        "xtask: memprof: preparing the data with one unmonitored step (log {}; skip with --no-prepare)",
        log.display()
    );
    let t = Instant::now();
    let status = spawn_trainer(bins, 1, &a.runner.backend, &args, &log)?
        .wait()
        .context("waiting for mlx-launch")?;
    if !status.success() {
        bail!(
            "the preparation run failed ({status}); the end of {}:\n{}",
            log.display(),
            log_tail(&log, 30)
        );
    }
    eprintln!(
        "xtask: memprof: prepared in {:.1} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Starts one world size and polls it until the launcher exits.
fn run_world(a: &Args, bins: &Path, out: &Path, world: usize) -> Result<WorldRun> {
    let dir = out.join(format!("world{world}"));
    std::fs::create_dir_all(&dir)?;
    let memlog = dir.join("memory");
    let mut args: Vec<String> = vec![
        "--out".into(),
        dir.join("train").display().to_string(),
        "--fresh".into(),
        "--steps".into(),
        a.steps.to_string(),
        "--per-rank-batch".into(),
        a.per_rank_batch.to_string(),
        "--memory-log".into(),
        memlog.display().to_string(),
    ];
    args.extend(a.trainer.iter().cloned());
    let log = dir.join("train.log");
    eprintln!(
        "xtask: memprof world {world}: {} rank(s) of mlx-llama train {} (log {})",
        world,
        args.join(" "),
        log.display()
    );

    let start_unix = unix_ms();
    let start = Instant::now();
    let mut child = spawn_trainer(bins, world, &a.runner.backend, &args, &log)?;
    let launcher = Pid::from_u32(child.id());
    let interval = Duration::from_millis(a.interval_ms);
    let find = ProcessRefreshKind::nothing()
        .without_tasks()
        .with_memory()
        .with_cpu()
        // Always: a child read between fork and exec shows the launcher's.
        .with_environ(UpdateKind::Always)
        .with_cmd(UpdateKind::Always);
    let poll = ProcessRefreshKind::nothing()
        .without_tasks()
        .with_memory()
        .with_cpu();
    let mut sys = System::new().map_err(|e| anyhow::anyhow!("process monitor: {e}"))?;
    let mut ranks: BTreeMap<Pid, usize> = BTreeMap::new();
    let mut samples = vec![];
    let mut tick = 0u64;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if ranks.len() < world {
            // Still looking for ranks: list every process (parents and environments).
            sys.refresh_processes_specifics(ProcessesToUpdate::All, true, find);
            let launcher_cmd = sys.process(launcher).and_then(|p| p.cmd().first().cloned());
            let mut new: Vec<(Pid, Option<usize>)> = sys
                .processes()
                .iter()
                .filter(|(pid, p)| p.parent() == Some(launcher) && !ranks.contains_key(pid))
                .filter_map(|(pid, p)| match rank_of(p.environ()) {
                    Some(r) => Some((*pid, Some(r))),
                    // A child forked but not yet running the trainer still has the
                    // launcher's environment and command: not a rank yet. With an
                    // environment we may not read (empty), take it once it has
                    // started a different program.
                    None if p.environ().is_empty()
                        && !p.cmd().is_empty()
                        && p.cmd().first() != launcher_cmd.as_ref() =>
                    {
                        Some((*pid, None))
                    }
                    None => None,
                })
                .collect();
            new.sort();
            for (pid, rank) in new {
                // Without a readable environment, ranks are numbered in order of
                // appearance (the launcher starts them in rank order).
                let rank = rank.unwrap_or_else(|| {
                    (0..).find(|r| !ranks.values().any(|x| x == r)).unwrap_or(0)
                });
                if !ranks.values().any(|&x| x == rank) {
                    ranks.insert(pid, rank);
                }
            }
        } else {
            let pids: Vec<Pid> = std::iter::once(launcher)
                .chain(ranks.keys().copied())
                .collect();
            sys.refresh_processes_specifics(ProcessesToUpdate::Some(&pids), true, poll);
        }
        let t_s = start.elapsed().as_secs_f64();
        let now = unix_ms();
        let procs = std::iter::once((launcher, Who::Launcher))
            .chain(ranks.iter().map(|(pid, r)| (*pid, Who::Rank(*r))));
        for (pid, who) in procs {
            if let Some(p) = sys.process(pid) {
                // Zero means gone (or a zombie not yet reaped): not a sample.
                if p.memory() > 0 {
                    samples.push(Sample {
                        world,
                        tick,
                        t_s,
                        unix_ms: now,
                        who,
                        pid: pid.as_u32(),
                        rss: p.memory(),
                        cpu_ms: p.accumulated_cpu_time(),
                    });
                }
            }
        }
        tick += 1;
        // Keep a fixed cadence: sleep to the next tick, not a full interval.
        let next = interval * tick as u32;
        if let Some(wait) = next.checked_sub(start.elapsed()) {
            std::thread::sleep(wait);
        }
    };
    let wall_s = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "world {world}: the run failed ({status}); the end of {}:\n{}",
            log.display(),
            log_tail(&log, 30)
        );
    }
    let mut arrays = BTreeMap::new();
    for r in 0..world {
        let p = PathBuf::from(format!("{}.rank{r}.jsonl", memlog.display()));
        arrays.insert(r, read_memory_log(&p, start_unix)?);
    }
    eprintln!(
        "xtask: memprof world {world}: {:.1} s, {} samples of {} process(es)",
        wall_s,
        samples.len(),
        ranks.len() + 1
    );
    Ok(WorldRun {
        world,
        samples,
        arrays,
        wall_s,
    })
}

/// `MLX_RANK` from a process environment.
fn rank_of(environ: &[std::ffi::OsString]) -> Option<usize> {
    environ.iter().find_map(|kv| {
        kv.to_str()?
            .strip_prefix("MLX_RANK=")
            .and_then(|r| r.parse().ok())
    })
}

fn read_memory_log(path: &Path, start_unix: u128) -> Result<Vec<ArrayMem>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading {} (does the trainer support --memory-log?)",
            path.display()
        )
    })?;
    let mut out = vec![];
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not JSON", path.display(), i + 1))?;
        let field = |k: &str| {
            v[k].as_u64()
                .with_context(|| format!("{}:{}: no number {k:?}", path.display(), i + 1))
        };
        let at = field("unix_ms")? as f64;
        out.push(ArrayMem {
            t_s: (at - start_unix as f64) / 1e3,
            active: field("active")?,
            peak: field("peak")?,
        });
    }
    Ok(out)
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

fn stats(run: &WorldRun) -> (Vec<Stats>, Option<(u64, f64)>) {
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
    use plotters::style::{FontStyle, register_font};

    // ab_glyph needs a font registered under the family name we draw with.
    let _ = register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    );
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_from_environment() {
        let env: Vec<std::ffi::OsString> =
            vec!["PATH=/bin".into(), "MLX_RANK=3".into(), "X=1".into()];
        assert_eq!(rank_of(&env), Some(3));
        assert_eq!(rank_of(&[]), None);
    }
}
