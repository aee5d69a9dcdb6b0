//! `cargo xtask bench train --hosts N --rate 1gbit`: the trainer across
//! emulated hosts (`xtask hosts`: network namespaces with sshd, links shaped
//! with tc tbf), one rank per host, at every world of `--worlds` (default 2
//! and 4), with the evaluator's overlap of communication on and off
//! (`MLX_OVERLAP`), the gradients travelling in f32 and in bf16
//! (`--communication-dtype`), and AdamW's state sharded over the ranks or
//! whole on each (`--no-shard-optimizer`). For each run: seconds per step (median of the
//! steps after the first) and how long the step waited on the network (the
//! time the ranks sat blocked on collectives, from the trainer's summary),
//! beside the same world on loopback. Takes `/tmp/mlx-hosts.lock` for its
//! whole duration: the hosts are one machine-wide resource.

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use crate::bench::TrainArgs;
use crate::hosts::{Hosts, HostsGuard};
use crate::util::{log_tail, root};

/// Options of the multi-host mode (flattened into `bench train`).
#[derive(clap::Args, Debug, Clone)]
pub struct HostsArgs {
    /// Run across N emulated hosts, one rank per host (worlds up to N;
    /// default worlds 2 and 4, as many as there are hosts), instead of on
    /// loopback. Needs root, iproute2 and OpenSSH (`cargo xtask hosts`).
    #[arg(long, value_name = "N")]
    pub hosts: Option<usize>,
    /// With --hosts: each host's link rate, each way (tc syntax: 1gbit,
    /// 10gbit, 500mbit; `none`: unshaped).
    #[arg(long, default_value = "1gbit")]
    pub rate: String,
    /// With --hosts: the evaluator's overlap of communication, `on`, `off`
    /// or both (MLX_OVERLAP=1/0).
    #[arg(long, value_delimiter = ',', default_value = "on,off")]
    pub overlap: Vec<Toggle>,
    /// With --hosts: the dtypes the gradients travel in (mlx-llama
    /// --communication-dtype): f32 (as they are), bf16, f16.
    #[arg(long, value_delimiter = ',', default_value = "f32,bf16")]
    pub comm: Vec<String>,
    /// With --hosts: where AdamW's state lives: `sharded` over the ranks
    /// (each rank updates its share of the weights, then all_gathers them
    /// in f32), `whole` on every rank (`--no-shard-optimizer`: one all_sum
    /// of the gradients, in --comm's dtype), `parameters` (ZeRO-3: the
    /// weights sharded too; f32 only), or several.
    #[arg(long, value_delimiter = ',', default_value = "sharded,whole")]
    pub optimizer_state: Vec<OptimizerState>,
    /// With --hosts: run the whole matrix this many times, interleaved
    /// (the table gives each configuration's median).
    #[arg(long, default_value_t = 1)]
    pub repeats: usize,
    /// With --hosts: skip the loopback runs of each world (overlap on, every
    /// --comm dtype), the step's time without the shaped links.
    #[arg(long)]
    pub no_loopback: bool,
}

/// On or off.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Toggle {
    /// Enabled.
    On,
    /// Disabled.
    Off,
}

/// Where AdamW's state lives.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptimizerState {
    /// Sharded over the ranks (the trainer's default).
    Sharded,
    /// Whole on every rank.
    Whole,
    /// The parameters sharded too (ZeRO-3, `--shard parameters`): the
    /// weights gathered and the gradients reduce-scattered unit by unit,
    /// in their own dtype (so with `--comm f32` only).
    Parameters,
}

impl OptimizerState {
    fn name(self) -> &'static str {
        match self {
            OptimizerState::Sharded => "sharded",
            OptimizerState::Whole => "whole",
            OptimizerState::Parameters => "parameters",
        }
    }
}

/// Where a run's ranks ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Emulated hosts, one rank each.
    Hosts,
    /// This machine's loopback, all ranks here.
    Loopback,
}

/// One trainer run.
#[derive(Debug, Clone)]
struct Config {
    world: usize,
    place: Place,
    overlap: bool,
    comm: String,
    state: OptimizerState,
}

impl Config {
    fn label(&self) -> String {
        format!(
            "w{}-{}-{}-{}-{}",
            self.world,
            match self.place {
                Place::Hosts => "hosts",
                Place::Loopback => "loopback",
            },
            if self.overlap {
                "overlap"
            } else {
                "no-overlap"
            },
            self.comm,
            self.state.name()
        )
    }
}

/// What one run measured (rank 0's summary).
#[derive(Debug, Clone)]
struct Measured {
    config: Config,
    /// Median seconds per step (steps after the first).
    step_s: f64,
    /// Every rank's median seconds waiting on collectives per step.
    wait_s: Vec<f64>,
    /// Rank 0's median seconds of its communication thread per step.
    comm_s: f64,
    /// Rank 0's median megabytes sent per step (the summary's `sent_bytes`).
    sent_mb: f64,
    final_loss: Option<f64>,
    wall_s: f64,
}

/// The rank count of each world's threads: the emulated hosts share this
/// machine's cores, so each rank gets its share (at least one).
fn threads_per_rank(world: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / world.max(1)).max(1)
}

/// Runs the multi-host benchmark: brings `n` hosts up, runs the matrix,
/// writes `bench.md` and `bench.json` into `out`, brings the hosts down.
pub fn run(a: &TrainArgs, h: &HostsArgs, n: usize, bins: &Path, out: &Path) -> Result<()> {
    let worlds: Vec<usize> = match &a.worlds {
        Some(w) => w.clone(),
        None => [2, 4].into_iter().filter(|&w| w <= n).collect(),
    };
    if worlds.is_empty() || worlds.iter().any(|&w| w < 2 || w > n) {
        bail!("--worlds must be between 2 and the {n} host(s) of --hosts, e.g. --worlds 2");
    }
    if h.overlap.is_empty() || h.comm.is_empty() || h.optimizer_state.is_empty() || h.repeats == 0 {
        bail!("--overlap, --comm, --optimizer-state and --repeats need at least one value each");
    }
    for c in &h.comm {
        if !["f32", "bf16", "f16"].contains(&c.as_str()) {
            bail!("--comm takes f32, bf16 or f16, not `{c}`");
        }
    }
    if let Err(why) = crate::hosts::available() {
        bail!("--hosts: {why}");
    }
    let mut matrix = vec![];
    for &world in &worlds {
        for &state in &h.optimizer_state {
            if !h.no_loopback {
                for comm in comms(&h.comm, state) {
                    matrix.push(Config {
                        world,
                        place: Place::Loopback,
                        overlap: true,
                        comm: comm.clone(),
                        state,
                    });
                }
            }
            for &o in &h.overlap {
                for comm in comms(&h.comm, state) {
                    matrix.push(Config {
                        world,
                        place: Place::Hosts,
                        overlap: o == Toggle::On,
                        comm: comm.clone(),
                        state,
                    });
                }
            }
        }
    }
    let _lock = crate::hosts_lock::take()?;
    eprintln!(
        "xtask: bench train across {n} emulated host(s), links {}; {} run(s) of {} steps",
        h.rate,
        matrix.len() * h.repeats,
        a.steps
    );
    let hosts = HostsGuard::up(n, Some(&h.rate)).context("bringing the emulated hosts up")?;
    let mut done = vec![];
    for round in 0..h.repeats {
        for c in &matrix {
            let m = run_one(a, c, &hosts, bins, out, round)?;
            eprintln!(
                "xtask: {}: {:.3} s/step, waited {} s on collectives (rank 0 comm {:.3} s), {:.0} s",
                c.label(),
                m.step_s,
                span(&m.wait_s),
                m.comm_s,
                m.wall_s
            );
            done.push(m);
        }
    }
    drop(hosts);
    let table = markdown(a, h, n, &worlds, &done);
    let md = out.join("bench.md");
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let json = out.join("bench.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&to_json(a, h, n, &done))?,
    )
    .with_context(|| format!("writing {}", json.display()))?;
    println!("{table}");
    println!("xtask: table {}", md.display());
    println!("xtask: json  {}", json.display());
    Ok(())
}

/// `min-max` of seconds, or one figure when they agree to the millisecond.
fn span(xs: &[f64]) -> String {
    let lo = xs.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = xs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if !lo.is_finite() {
        return "-".into();
    }
    if hi - lo < 0.0005 {
        format!("{lo:.3}")
    } else {
        format!("{lo:.3}-{hi:.3}")
    }
}

/// The launcher command of one run (its ranks' output goes to the log).
fn command(
    c: &Config,
    hosts: &Hosts,
    bins: &Path,
    backend: &str,
    trainer_args: &[String],
) -> Result<(Command, Vec<String>)> {
    let launch = bins.join("mlx-launch");
    let mut cmd = Command::new(&launch);
    let mut shown = vec![launch.display().to_string()];
    let mut arg = |cmd: &mut Command, s: String| {
        shown.push(s.clone());
        cmd.arg(s);
    };
    arg(&mut cmd, "--backend".into());
    arg(&mut cmd, backend.into());
    match c.place {
        Place::Hosts => {
            arg(&mut cmd, "--ssh-config".into());
            arg(&mut cmd, hosts.ssh_config.display().to_string());
            arg(&mut cmd, "--hosts".into());
            arg(&mut cmd, hosts.names[..c.world].join(","));
            arg(&mut cmd, "-n".into());
            arg(&mut cmd, "1".into());
        }
        Place::Loopback => {
            arg(&mut cmd, "-n".into());
            arg(&mut cmd, c.world.to_string());
        }
    }
    let threads = threads_per_rank(c.world).to_string();
    for (k, v) in [
        ("RAYON_NUM_THREADS", threads.as_str()),
        ("OPENBLAS_NUM_THREADS", threads.as_str()),
        ("MLX_OVERLAP", if c.overlap { "1" } else { "0" }),
    ] {
        arg(&mut cmd, "--env".into());
        arg(&mut cmd, format!("{k}={v}"));
    }
    arg(&mut cmd, "--".into());
    arg(&mut cmd, bins.join("mlx-llama").display().to_string());
    arg(&mut cmd, "train".into());
    for t in trainer_args {
        arg(&mut cmd, t.clone());
    }
    cmd.current_dir(root());
    Ok((cmd, shown))
}

fn run_one(
    a: &TrainArgs,
    c: &Config,
    hosts: &Hosts,
    bins: &Path,
    out: &Path,
    round: usize,
) -> Result<Measured> {
    let dir = out.join(format!("{}-{round}", c.label()));
    std::fs::create_dir_all(&dir)?;
    let summary = dir.join("summary.json");
    let _ = std::fs::remove_file(&summary);
    let mut args: Vec<String> = vec![
        "--out".into(),
        dir.join("train").display().to_string(),
        "--fresh".into(),
        "--steps".into(),
        a.steps.to_string(),
        // Measure training steps only (mlx-llama evaluates every 25 by default).
        "--eval-every".into(),
        "0".into(),
        "--summary".into(),
        summary.display().to_string(),
    ];
    if c.comm != "f32" {
        args.push("--communication-dtype".into());
        args.push(c.comm.clone());
    }
    match c.state {
        OptimizerState::Whole => args.push("--no-shard-optimizer".into()),
        OptimizerState::Parameters => {
            args.extend(["--shard".into(), "parameters".into()]);
        }
        OptimizerState::Sharded => {}
    }
    args.extend(a.trainer.iter().cloned());
    let (mut cmd, shown) = command(c, hosts, bins, &a.runner.backend, &args)?;
    let log = dir.join("train.log");
    std::fs::write(dir.join("command.txt"), shown.join(" ") + "\n")?;
    let file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    cmd.stdout(file.try_clone()?).stderr(file);
    let start = Instant::now();
    let child = cmd.spawn().context("starting mlx-launch")?;
    // Generous: start-up, data and the first step, then every step at 1 Mbit/s worth of slack.
    let deadline = Duration::from_secs(180 + 60 * a.steps);
    let status = wait_for(child, deadline)
        .with_context(|| format!("{}: see {}", c.label(), log.display()))?;
    let wall_s = start.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "{}: the run failed ({status}); the end of {}:\n{}",
            c.label(),
            log.display(),
            log_tail(&log, 30)
        );
    }
    let text = std::fs::read_to_string(&summary)
        .with_context(|| format!("reading {} (written by rank 0)", summary.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", summary.display()))?;
    let nums = |k: &str| -> Vec<f64> {
        v[k].as_array()
            .map(|a| a.iter().filter_map(|x| x.as_f64()).collect())
            .unwrap_or_default()
    };
    Ok(Measured {
        config: c.clone(),
        step_s: v["median_ms"]
            .as_f64()
            .with_context(|| format!("{}: no median_ms", summary.display()))?
            / 1e3,
        wait_s: nums("median_comm_wait_ms")
            .iter()
            .map(|x| x / 1e3)
            .collect(),
        comm_s: median_after_first(&nums("comm_ms")) / 1e3,
        sent_mb: median_after_first(&nums("sent_bytes")) / 1e6,
        final_loss: v["losses"]
            .as_array()
            .and_then(|l| l.last())
            .and_then(|l| l.as_f64()),
        wall_s,
    })
}

/// The gradient dtypes of `comm` a run with `state` takes: ZeRO-3's
/// gradients travel in their own (f32) only.
fn comms(comm: &[String], state: OptimizerState) -> Vec<&String> {
    comm.iter()
        .filter(|c| state != OptimizerState::Parameters || c.as_str() == "f32")
        .collect()
}

/// Waits for `child` up to `deadline`, then kills it (its ranks die with
/// the launcher; the hosts' teardown kills whatever is left in them).
fn wait_for(mut child: Child, deadline: Duration) -> Result<std::process::ExitStatus> {
    let start = Instant::now();
    loop {
        if let Some(s) = child.try_wait().context("waiting for mlx-launch")? {
            return Ok(s);
        }
        if start.elapsed() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!(
                "the run took longer than {} s and was stopped",
                deadline.as_secs()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The median of `xs` past the first (all of them when there is one).
fn median_after_first(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().skip(1).copied().collect();
    if v.is_empty() {
        v = xs.to_vec();
    }
    median(&mut v)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// The runs of one configuration (all repeats).
fn group<'a>(runs: &'a [Measured], c: &Config) -> Vec<&'a Measured> {
    runs.iter()
        .filter(|m| m.config.label() == c.label())
        .collect()
}

/// The matrix options that differ from their defaults, as on a command line.
fn matrix_flags(h: &HostsArgs) -> String {
    let mut s = String::new();
    let overlap: Vec<&str> = h
        .overlap
        .iter()
        .map(|o| if *o == Toggle::On { "on" } else { "off" })
        .collect();
    if overlap != ["on", "off"] {
        let _ = write!(s, " --overlap {}", overlap.join(","));
    }
    if h.comm != ["f32", "bf16"] {
        let _ = write!(s, " --comm {}", h.comm.join(","));
    }
    let states: Vec<&str> = h.optimizer_state.iter().map(|x| x.name()).collect();
    if states != ["sharded", "whole"] {
        let _ = write!(s, " --optimizer-state {}", states.join(","));
    }
    if h.no_loopback {
        s.push_str(" --no-loopback");
    }
    if h.repeats > 1 {
        let _ = write!(s, " --repeats {}", h.repeats);
    }
    s
}

fn markdown(a: &TrainArgs, h: &HostsArgs, n: usize, worlds: &[usize], runs: &[Measured]) -> String {
    let mut s = String::new();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let _ = writeln!(
        s,
        "`cargo xtask bench train --hosts {n} --rate {} --worlds {} --steps {}{}{}{}`: one rank per \
         emulated host (network namespaces on this machine, each host's link shaped to {} each \
         way with tc tbf), beside the same world on loopback. The hosts share this machine's {cores} \
         logical cores: each rank runs max(1, {cores} / world) compute threads, so world 4 runs two \
         ranks per core. s/step: median of the steps after the first (rank 0); waited: the median \
         time per step a rank sat blocked on collectives (communication not hidden behind \
         computation, and waiting for slower ranks), lowest and highest rank; comm: the time \
         rank 0's communication thread spent in collectives per step, hidden or not.\n",
        h.rate,
        worlds
            .iter()
            .map(|w| w.to_string())
            .collect::<Vec<_>>()
            .join(","),
        a.steps,
        matrix_flags(h),
        if a.runner.debug { " --debug" } else { "" },
        if a.trainer.is_empty() {
            String::new()
        } else {
            format!(" -- {}", a.trainer.join(" "))
        },
        h.rate,
    );
    let _ = writeln!(
        s,
        "| world | links | optimizer state | overlap | gradients travel in | s/step | waited on the network, s (ranks) | comm s (rank 0) | MB sent per step (rank 0) | final loss |{}",
        if h.repeats > 1 {
            " s/step of each run |"
        } else {
            ""
        }
    );
    let _ = writeln!(
        s,
        "|---:|---|---|---|---|---:|---:|---:|---:|---:|{}",
        if h.repeats > 1 { "---|" } else { "" }
    );
    let mut seen: Vec<String> = vec![];
    for m in runs {
        let label = m.config.label();
        if seen.contains(&label) {
            continue;
        }
        seen.push(label);
        let all = group(runs, &m.config);
        let mut steps: Vec<f64> = all.iter().map(|r| r.step_s).collect();
        let each = steps
            .iter()
            .map(|x| format!("{x:.3}"))
            .collect::<Vec<_>>()
            .join(", ");
        let step = median(&mut steps);
        let mut lo: Vec<f64> = all
            .iter()
            .map(|r| r.wait_s.iter().copied().fold(f64::INFINITY, f64::min))
            .collect();
        let mut hi: Vec<f64> = all
            .iter()
            .map(|r| r.wait_s.iter().copied().fold(f64::NEG_INFINITY, f64::max))
            .collect();
        let mut comm: Vec<f64> = all.iter().map(|r| r.comm_s).collect();
        let c = &m.config;
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {} | {:.3} | {} | {:.3} | {:.1} | {} |{}",
            c.world,
            match c.place {
                Place::Hosts => h.rate.as_str(),
                Place::Loopback => "loopback",
            },
            c.state.name(),
            if c.overlap { "on" } else { "off" },
            c.comm,
            step,
            span(&[median(&mut lo), median(&mut hi)]),
            median(&mut comm),
            m.sent_mb,
            m.final_loss.map_or("-".into(), |l| format!("{l:.4}")),
            if h.repeats > 1 {
                format!(" {each} |")
            } else {
                String::new()
            }
        );
    }
    s
}

fn to_json(a: &TrainArgs, h: &HostsArgs, n: usize, runs: &[Measured]) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = runs
        .iter()
        .map(|m| {
            serde_json::json!({
                "label": m.config.label(),
                "world": m.config.world,
                "place": match m.config.place { Place::Hosts => "hosts", Place::Loopback => "loopback" },
                "overlap": m.config.overlap,
                "communication_dtype": m.config.comm,
                "optimizer_state": m.config.state.name(),
                "s_per_step": m.step_s,
                "waited_s_per_rank": m.wait_s,
                "comm_s_rank0": m.comm_s,
                "final_loss": m.final_loss,
                "wall_s": m.wall_s,
            })
        })
        .collect();
    serde_json::json!({
        "hosts": n,
        "rate": h.rate,
        "steps": a.steps,
        "repeats": h.repeats,
        "threads_per_rank": "max(1, cores / world)",
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "trainer": a.trainer,
        "runs": runs,
    })
}

/// The run folder's default name in this mode.
pub fn default_out() -> PathBuf {
    root()
        .join("runs")
        .join(format!("bench-train-hosts-{}", crate::util::timestamp()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_medians() {
        assert_eq!(span(&[0.5, 0.25]), "0.250-0.500");
        assert_eq!(span(&[0.5, 0.5002]), "0.500");
        assert_eq!(span(&[]), "-");
        assert_eq!(median_after_first(&[9.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median_after_first(&[4.0]), 4.0);
    }

    #[test]
    fn every_rank_gets_a_thread() {
        assert!(threads_per_rank(64) >= 1);
        assert!(threads_per_rank(1) >= threads_per_rank(2));
    }
}
