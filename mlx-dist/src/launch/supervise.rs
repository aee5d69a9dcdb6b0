//! Starting the ranks, forwarding their output and signals, and stopping them
//! all when one fails. The supervisor blocks on a channel of events (a rank
//! exited, Ctrl-C) with a timeout only while a grace period runs: no polling.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{JobIdentity, LaunchSpec, hosts, rank_env};

/// How a launch ended.
#[derive(Debug)]
pub struct LaunchOutcome {
    /// Exit status of each rank, by rank.
    pub statuses: Vec<Option<ExitStatus>>,
    /// The first rank that failed and how, if any.
    pub first_failure: Option<(usize, String)>,
    /// Whether the user interrupted the job.
    pub interrupted: bool,
}

impl LaunchOutcome {
    /// The exit code the launcher should return: 0 when every rank succeeded,
    /// else the failed rank's code (or 128 + signal, or 1).
    pub fn exit_code(&self) -> i32 {
        let Some((r, _)) = &self.first_failure else {
            return if self.interrupted { 130 } else { 0 };
        };
        match self.statuses[*r] {
            Some(st) => match (st.code(), signal_of(&st)) {
                (Some(c), _) if c != 0 => c,
                (_, Some(s)) => 128 + s,
                _ => 1,
            },
            None => 1,
        }
    }
}

enum Event {
    Exited(usize, std::io::Result<ExitStatus>),
    Interrupt,
}

/// The Ctrl-C handler can be installed once per process; it forwards to the current launch.
static INTERRUPTS: OnceLock<Mutex<Option<Sender<Event>>>> = OnceLock::new();

fn install_interrupt_handler(tx: Sender<Event>) {
    let slot = INTERRUPTS.get_or_init(|| {
        let r = ctrlc::set_handler(|| {
            if let Some(tx) = INTERRUPTS.get().and_then(|m| m.lock().ok()).and_then(|g| g.clone()) {
                let _ = tx.send(Event::Interrupt);
            }
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot install the Ctrl-C handler; Ctrl-C will not be forwarded");
        }
        Mutex::new(None)
    });
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(tx);
}

#[cfg(unix)]
fn signal_of(st: &ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(st)
}

#[cfg(not(unix))]
fn signal_of(_: &ExitStatus) -> Option<i32> {
    None
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), signal_of(st)) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

#[cfg(unix)]
fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid we started and have not yet reaped.
    unsafe {
        libc::kill(pid as libc::pid_t, sig);
    }
}

#[cfg(unix)]
const SIGINT: i32 = libc::SIGINT;
#[cfg(unix)]
const SIGTERM: i32 = libc::SIGTERM;
#[cfg(unix)]
const SIGKILL: i32 = libc::SIGKILL;

fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

fn command_for(spec: &LaunchSpec, rank: usize, env: &[(String, String)]) -> Command {
    match &spec.hosts[rank].ssh {
        None => {
            let mut c = Command::new(&spec.command[0]);
            c.args(&spec.command[1..]);
            c.envs(env.iter().map(|(k, v)| (k, v)));
            if let Some(d) = &spec.cwd {
                c.current_dir(d);
            }
            c
        }
        Some(host) => {
            let mut script = String::new();
            if let Some(d) = &spec.cwd {
                script += &format!("cd {} && ", shell_quote(&d.display().to_string()));
            }
            script += "exec env";
            for (k, v) in env {
                script += &format!(" {}={}", k, shell_quote(v));
            }
            for a in &spec.command {
                script += " ";
                script += &shell_quote(a);
            }
            let mut c = Command::new("ssh");
            c.args(["-o", "BatchMode=yes", host, &script]);
            c
        }
    }
}

fn forward<R: Read + Send + 'static, W: Write>(
    src: R,
    rank: usize,
    mut sink: impl FnMut() -> W + Send + 'static,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut r = BufReader::new(src);
        let mut line = Vec::new();
        let prefix = format!("[{rank}] ");
        loop {
            line.clear();
            match r.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    if !line.ends_with(b"\n") {
                        line.push(b'\n');
                    }
                    let mut w = sink();
                    let _ = w.write_all(prefix.as_bytes());
                    let _ = w.write_all(&line);
                    let _ = w.flush();
                }
            }
        }
    })
}

/// Starts every rank of `spec` and supervises them until all have exited.
pub fn run(spec: &LaunchSpec) -> anyhow::Result<LaunchOutcome> {
    anyhow::ensure!(!spec.command.is_empty(), "no program to launch");
    anyhow::ensure!(!spec.hosts.is_empty(), "no ranks to launch");
    let n = spec.hosts.len();
    let job = JobIdentity::random();
    #[cfg(feature = "quic")]
    let job = if spec.backend == crate::config::Backend::Quic {
        job.with_quic_certificate()
            .map_err(|e| anyhow::anyhow!("cannot create the job's QUIC certificate: {e}"))?
    } else {
        job
    };
    let addrs = hosts::addresses(&spec.hosts, spec.starting_port)?;
    let all_local = spec.hosts.iter().all(|h| h.ssh.is_none());
    // An MLX-style host file for local jobs (remote ranks get the inline list only).
    let hostfile = if all_local {
        let p = std::env::temp_dir().join(format!(
            "mlx-launch-{}.json",
            crate::config::hex_encode(&job.id[..8])
        ));
        let json =
            serde_json::to_string(&addrs.iter().map(|a| vec![a.clone()]).collect::<Vec<_>>())?;
        std::fs::write(&p, json)?;
        Some(p)
    } else {
        None
    };
    tracing::info!(world = n, backend = %spec.backend, ?addrs, "launching");

    let (tx, rx) = mpsc::channel();
    install_interrupt_handler(tx.clone());
    let mut pids = Vec::with_capacity(n);
    let mut outputs = Vec::new();
    let mut alive = vec![true; n];
    let mut spawn_error = None;
    for rank in 0..n {
        let env = rank_env(spec, &job, &addrs, rank, hostfile.as_deref());
        let mut cmd = command_for(spec, rank, &env);
        cmd.stdin(if rank == 0 {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        if spec.prefix_output {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child: Child = match cmd.spawn() {
            Ok(c) => c,
            Err(e) => {
                spawn_error = Some(anyhow::anyhow!(
                    "cannot start rank {rank} ({}): {e}",
                    spec.command[0]
                ));
                alive.truncate(rank);
                break;
            }
        };
        pids.push(child.id());
        if let Some(mut stdin) = child.stdin.take() {
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut std::io::stdin().lock(), &mut stdin);
            });
        }
        if let Some(o) = child.stdout.take() {
            outputs.push(forward(o, rank, || std::io::stdout().lock()));
        }
        if let Some(e) = child.stderr.take() {
            outputs.push(forward(e, rank, || std::io::stderr().lock()));
        }
        let tx = tx.clone();
        std::thread::spawn(move || {
            let st = child.wait();
            let _ = tx.send(Event::Exited(rank, st));
        });
    }
    drop(tx);

    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    let mut first_failure: Option<(usize, String)> = None;
    // (rank, how, killed by a signal), in the order the exits were seen.
    let mut failures: Vec<(usize, String, bool)> = Vec::new();
    let mut interrupted = false;
    let mut interrupts = 0;
    // When set: (deadline, next signal to send to the survivors).
    let mut stopping: Option<(Instant, i32)> = None;
    if spawn_error.is_some() {
        stopping = Some((Instant::now(), SIGTERM));
    }
    let stop_all = |alive: &[bool], sig: i32| {
        for (r, &a) in alive.iter().enumerate() {
            if a {
                signal(pids[r], sig);
            }
        }
    };
    while alive.iter().any(|&a| a) {
        let ev = match stopping {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some((t, _)) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
        };
        match ev {
            Ok(Event::Exited(rank, st)) => {
                alive[rank] = false;
                let st = match st {
                    Ok(s) => s,
                    Err(e) => {
                        first_failure
                            .get_or_insert((rank, format!("could not be waited for: {e}")));
                        continue;
                    }
                };
                statuses[rank] = Some(st);
                tracing::debug!(rank, status = %describe(&st), "rank exited");
                if !st.success() && !interrupted {
                    let how = describe(&st);
                    let others = alive.iter().any(|&a| a);
                    if others && stopping.is_none() {
                        tracing::error!(
                            rank,
                            "rank {rank} failed ({how}); stopping the other ranks in {:?}",
                            spec.grace
                        );
                        stopping = Some((Instant::now() + spec.grace, SIGTERM));
                    } else {
                        tracing::error!(rank, "rank {rank} failed ({how})");
                    }
                    failures.push((rank, how, signal_of(&st).is_some()));
                }
            }
            Ok(Event::Interrupt) => {
                interrupted = true;
                interrupts += 1;
                let sig = if interrupts == 1 { SIGINT } else { SIGKILL };
                tracing::warn!("interrupted; forwarding signal {sig} to every rank");
                stop_all(&alive, sig);
                stopping = Some((Instant::now() + spec.grace, SIGKILL));
            }
            Err(RecvTimeoutError::Timeout) => {
                let (_, sig) = stopping.expect("timeouts only while stopping");
                tracing::debug!(
                    signal = sig,
                    "grace period over; signalling the remaining ranks"
                );
                stop_all(&alive, sig);
                stopping = Some((Instant::now() + Duration::from_secs(2), SIGKILL));
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // Ranks that lose a peer exit with an error at nearly the same moment as
    // the peer itself, so the order of exits is not a reliable witness: a rank
    // killed by a signal is the likelier root cause, then the first one seen.
    if first_failure.is_none() {
        first_failure = failures
            .iter()
            .find(|f| f.2)
            .or(failures.first())
            .map(|(r, how, _)| (*r, how.clone()));
    }
    for h in outputs {
        let _ = h.join();
    }
    if let Some(p) = hostfile {
        let _ = std::fs::remove_file(p);
    }
    if let Some(e) = spawn_error {
        return Err(e);
    }
    Ok(LaunchOutcome {
        statuses,
        first_failure,
        interrupted,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a=b"), "a=b");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
