//! The run half of `cargo xtask memprof`: starts the trainer at one world
//! size, finds its ranks among the launcher's children, polls every
//! process's memory and CPU time, and reads the ranks' memory logs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail};
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System, UpdateKind};

use super::{Args, ArrayMem, Sample, Who, WorldRun};
use crate::util::{log_tail, spawn_trainer};

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or(0)
}

/// One unmonitored step at world 1, so that the tokenizer and the token store
/// exist before the measured runs (data is prepared once, then memory-mapped).
pub(super) fn prepare(a: &Args, bins: &Path, out: &Path) -> Result<()> {
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
pub(super) fn run_world(a: &Args, bins: &Path, out: &Path, world: usize) -> Result<WorldRun> {
    let dir = out.join(format!("world{world}"));
    std::fs::create_dir_all(&dir)?;
    let memlog = dir.join("memory");
    let mut args: Vec<String> = vec![
        "--out".into(),
        dir.join("train").display().to_string(),
        "--fresh".into(),
        "--steps".into(),
        a.steps.to_string(),
        // Measure training steps only (mlx-llama evaluates every 25 by default).
        "--eval-every".into(),
        "0".into(),
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
