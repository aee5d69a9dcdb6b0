//! Starting programs on the emulated hosts: the example's arguments for a
//! backend, commands in a host's namespace run together under a deadline,
//! and the TCP streams between hosts (the one-stream ceiling).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::Value;

use crate::bench_collectives::{CollectivesArgs, human};
use crate::hosts::Hosts;
use crate::util::{Ended, run_logged};

/// Ports of the one-stream measurements (one per concurrent stream).
const STREAM_PORT: u16 = 5201;

/// The example's arguments for `backend` at world `w` over the hosts.
pub(super) fn example_args(
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
pub(super) fn in_namespace(ns: &str) -> Command {
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
pub(super) fn run_together(
    cmds: Vec<(Command, PathBuf)>,
    deadline: Duration,
) -> Vec<Result<Ended>> {
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
pub(super) fn streams(
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
