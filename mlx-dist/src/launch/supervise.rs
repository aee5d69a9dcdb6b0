//! Starting the ranks, forwarding their output and signals, and stopping them
//! all when one fails. The supervisor blocks on a channel of events (a rank
//! exited, Ctrl-C) with a timeout only while a grace period runs: no polling.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use std::path::PathBuf;

use mlx_progress::render::Renderer;

use super::lines::{BoundedLines, MAX_LINE};
use super::process::{
    Guard, kill_group_if_ours, signal_group, signal_of, spawn_guarded, status_code,
};
use super::progress::{self, Rendered};
use super::{JobIdentity, LaunchSpec, agent, hosts, parent, rank_env, remote};

/// How a launch ended.
#[derive(Debug)]
pub struct LaunchOutcome {
    /// Exit status of each rank, by rank.
    pub statuses: Vec<Option<ExitStatus>>,
    /// The first failure the launcher did not cause (see [`run`]): the rank and how it failed.
    pub first_failure: Option<(usize, String)>,
    /// Whether the user interrupted the job.
    pub interrupted: bool,
    /// The signal that interrupted it (SIGINT for Ctrl-C, SIGTERM, SIGHUP),
    /// which the ranks were sent too.
    pub interrupt_signal: Option<i32>,
    /// The ranks the launcher signalled before they exited (after another
    /// rank failed, or forwarding Ctrl-C); their failures are not blamed.
    pub signalled: Vec<bool>,
    /// The rank the failing ranks' own reports blame (see [`crate::report`]):
    /// a frozen or unresponsive rank never exits by itself, so only its
    /// peers can name it.
    pub blamed: Option<Blame>,
}

/// The rank that the ranks' failure reports name.
#[derive(Clone, Debug)]
pub struct Blame {
    /// The blamed rank.
    pub rank: usize,
    /// What the first reporter said.
    pub reason: String,
    /// The ranks that blamed it.
    pub reporters: Vec<usize>,
}

impl LaunchOutcome {
    /// The exit code the launcher should return: 0 when every rank succeeded,
    /// else the failed rank's code (or 128 + signal), 128 + the signal when
    /// interrupted (130 for Ctrl-C, 143 for SIGTERM), or 1.
    pub fn exit_code(&self) -> i32 {
        if let Some(b) = &self.blamed
            && !self.signalled[b.rank]
            && let Some(st) = self.statuses[b.rank].filter(|s| !s.success())
        {
            return status_code(&st);
        }
        if let Some((r, _)) = &self.first_failure {
            return self.statuses[*r].map_or(1, |st| status_code(&st));
        }
        if self.interrupted {
            128 + self.interrupt_signal.unwrap_or(libc::SIGINT)
        } else if self.statuses.iter().all(|s| s.is_some_and(|s| s.success())) {
            0
        } else {
            1
        }
    }

    /// The line that says why the launch failed, if it did.
    pub fn report(&self) -> Option<String> {
        if let Some(b) = &self.blamed {
            let by: Vec<String> = b.reporters.iter().map(usize::to_string).collect();
            let mut line = format!(
                "rank {} failed (as rank{} {} reported: {})",
                b.rank,
                if by.len() == 1 { "" } else { "s" },
                by.join(", "),
                b.reason
            );
            if let Some(st) = self.statuses[b.rank].filter(|_| !self.signalled[b.rank]) {
                line += &format!("; rank {} itself ended with {}", b.rank, describe(&st));
            }
            return Some(line);
        }
        if let Some((rank, how)) = &self.first_failure {
            return Some(format!("rank {rank} failed ({how})"));
        }
        let stopped: Vec<usize> = (0..self.statuses.len())
            .filter(|&r| self.signalled[r] && !self.statuses[r].is_some_and(|s| s.success()))
            .collect();
        if self.interrupted && stopped.is_empty() {
            Some("interrupted".into())
        } else if self.interrupted {
            Some(format!(
                "interrupted; the launcher stopped ranks {stopped:?} (no rank failed on its own)"
            ))
        } else if !stopped.is_empty() {
            Some(format!(
                "ranks {stopped:?} were stopped by the launcher (no rank failed on its own)"
            ))
        } else {
            None
        }
    }
}

pub(crate) enum Event {
    Exited(usize, std::io::Result<ExitStatus>),
    /// The launcher got this signal (SIGINT, SIGTERM or SIGHUP).
    Interrupt(i32),
    /// A rank (remote: through its agent) needs this long to stop cleanly:
    /// its last step plus its last checkpoint.
    StopTime(usize, Duration),
}

/// The Ctrl-C handler can be installed once per process; it forwards to the current launch.
static INTERRUPTS: OnceLock<Mutex<Option<Sender<Event>>>> = OnceLock::new();

/// The last interrupting signal received; 0 before any.
static LAST_INTERRUPT: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The last of SIGINT, SIGTERM and SIGHUP received since the handler was
/// installed (by the first [`forward_interrupts`]), if any.
pub(crate) fn last_interrupt() -> Option<i32> {
    Some(LAST_INTERRUPT.load(std::sync::atomic::Ordering::SeqCst)).filter(|&s| s > 0)
}

/// How many interrupts the handler received, forwarded or not: a launcher
/// that restarts jobs also sees one that came between two attempts.
static INTERRUPTS_SEEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The number of interrupts (Ctrl-C, SIGTERM, SIGHUP) received since the
/// handler was installed (by the first [`forward_interrupts`]).
pub(crate) fn interrupts_seen() -> u64 {
    INTERRUPTS_SEEN.load(std::sync::atomic::Ordering::SeqCst)
}

/// Sends Ctrl-C (and SIGTERM, SIGHUP) to `tx` as [`Event::Interrupt`]; `None` stops forwarding.
pub(crate) fn forward_interrupts(tx: Option<Sender<Event>>) {
    let slot = INTERRUPTS.get_or_init(|| {
        let r = super::signals::install(|sig| {
            LAST_INTERRUPT.store(sig, std::sync::atomic::Ordering::SeqCst);
            INTERRUPTS_SEEN.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            if let Some(tx) = INTERRUPTS.get().and_then(|m| m.lock().ok()).and_then(|g| g.clone()) {
                let _ = tx.send(Event::Interrupt(sig));
            }
        });
        if let Err(e) = r {
            tracing::warn!(error = %e, "cannot install the Ctrl-C handler; Ctrl-C will not be forwarded");
        }
        Mutex::new(None)
    });
    *slot.lock().unwrap_or_else(|p| p.into_inner()) = tx;
}

fn describe(st: &ExitStatus) -> String {
    match (st.code(), signal_of(st)) {
        (Some(c), _) => format!("exit status {c}"),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => st.to_string(),
    }
}

/// Waits for `child` on a thread of its own and reports its exit as process `index`.
pub(crate) fn report_exit(mut child: Child, index: usize, tx: Sender<Event>) {
    std::thread::spawn(move || {
        let st = child.wait();
        let _ = tx.send(Event::Exited(index, st));
    });
}

/// Copies this process's standard input to `child`'s on a detached thread.
pub(crate) fn forward_stdin(child: &mut Child) {
    if let Some(mut stdin) = child.stdin.take() {
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut std::io::stdin().lock(), &mut stdin);
        });
    }
}

/// How long output forwarding may go on after the last process exited: a
/// grandchild that escaped the process group may hold a pipe open for ever.
const OUTPUT_DEADLINE: Duration = Duration::from_secs(2);

/// How long a terminated process has before SIGKILL.
const KILL_AFTER: Duration = Duration::from_secs(2);

/// How long the launcher lets processes run on once it asked them to stop.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Grace {
    /// What survivors need to notice a failure and report whom they blame:
    /// the liveness timeout plus 3 s (see [`super::default_grace`]).
    pub notice: Duration,
    /// The most they ever get (`--grace`, [`LaunchSpec::grace`]).
    pub most: Duration,
}

impl Grace {
    /// The grace of `spec`'s ranks.
    pub fn of(spec: &LaunchSpec) -> Grace {
        Grace {
            notice: super::default_grace(spec.liveness_timeout),
            most: spec.grace,
        }
    }

    /// How long the others run on after one failed.
    pub fn after_failure(self) -> Duration {
        self.notice.min(self.most)
    }

    /// How long the ranks have to stop on an interrupt when the slowest
    /// needs `need` (its last step plus checkpoint): that twice over (a
    /// step may be slower than the last) plus [`Grace::notice`], at most
    /// [`Grace::most`].
    pub fn for_stopping(self, need: Duration) -> Duration {
        self.notice
            .saturating_add(need.saturating_mul(2))
            .min(self.most)
    }
}

/// Waits until every output forwarder holding a clone of the sender of
/// `done` finished, or [`OUTPUT_DEADLINE`] passed.
pub(crate) fn finish_output(done: Receiver<()>) {
    if let Err(RecvTimeoutError::Timeout) = done.recv_timeout(OUTPUT_DEADLINE) {
        tracing::debug!(
            "output still open {OUTPUT_DEADLINE:?} after the last rank exited (a process outside the ranks' groups holds it); not waiting for it"
        );
    }
}

/// One failure: the process, how it failed, whether a signal killed it, and
/// whether the launcher had signalled it.
struct Failure {
    index: usize,
    how: String,
    by_signal: bool,
    caused: bool,
}

/// What [`supervise`] saw.
pub(crate) struct Supervised {
    /// Exit status of each process, by index.
    pub statuses: Vec<Option<ExitStatus>>,
    /// The first failure the launcher did not cause: a process killed by a
    /// signal the launcher did not send is the likelier root cause, else the
    /// first one seen.
    pub first_failure: Option<(usize, String)>,
    /// Which processes the launcher signalled before they exited.
    pub signalled: Vec<bool>,
    /// Whether an interrupt arrived.
    pub interrupted: bool,
    /// The signal of the first interrupt.
    pub interrupt_signal: Option<i32>,
    /// Which processes were reaped (their exit was reported).
    pub reaped: Vec<bool>,
}

/// Waits until each of the `started` processes (out of `n` meant to run)
/// reported its exit on `rx`; `signal(i, sig)` signals process `i` (its
/// whole process group, or a remote rank through its agent). When one
/// fails on its own the others get [`Grace::after_failure`], then SIGTERM,
/// then SIGKILL; an interrupt is forwarded as the signal it was (SIGKILL
/// on the second) and SIGKILL follows after [`Grace::for_stopping`] of the longest stop
/// time of the ranks: `stop_time()`'s (read on the interrupt) and those
/// [`Event::StopTime`] brings. `stop_now` starts the stopping at once (a
/// rank could not start). `name` names process `i` in the log.
#[allow(clippy::too_many_arguments)]
pub(crate) fn supervise(
    started: usize,
    signal: &dyn Fn(usize, i32),
    n: usize,
    rx: &Receiver<Event>,
    grace: Grace,
    stop_time: &dyn Fn() -> Option<Duration>,
    stop_now: bool,
    name: &dyn Fn(usize) -> String,
) -> Supervised {
    // A year stands for "for ever" and keeps Instant arithmetic in range.
    let year = Duration::from_secs(365 * 24 * 3600);
    let grace = Grace {
        notice: grace.notice.min(year),
        most: grace.most.min(year),
    };
    // The first interrupt's time while its grace runs, and the longest
    // stop time heard of.
    let mut stop_asked: Option<Instant> = None;
    let mut need = Duration::ZERO;
    let mut alive = vec![true; started];
    let mut signalled = vec![false; n];
    let mut statuses: Vec<Option<ExitStatus>> = vec![None; n];
    let mut failures: Vec<Failure> = Vec::new();
    let mut interrupted = false;
    let mut interrupt_signal = None;
    let mut interrupts = 0;
    // When set: (deadline, next signal to send to the survivors).
    let mut stopping: Option<(Instant, i32)> = stop_now.then(|| (Instant::now(), libc::SIGTERM));
    let send = |alive: &[bool], signalled: &mut [bool], sig: i32| {
        for (r, _) in alive.iter().enumerate().filter(|(_, a)| **a) {
            signalled[r] = true;
            signal(r, sig);
        }
    };
    while alive.iter().any(|&a| a) {
        let ev = match stopping {
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
            Some((t, _)) => rx.recv_timeout(t.saturating_duration_since(Instant::now())),
        };
        match ev {
            Ok(Event::Exited(r, st)) => {
                alive[r] = false;
                let caused = signalled[r];
                let (how, by_signal) = match st {
                    Ok(st) if st.success() => {
                        statuses[r] = Some(st);
                        tracing::debug!("{} exited", name(r));
                        continue;
                    }
                    Ok(st) => {
                        statuses[r] = Some(st);
                        (describe(&st), signal_of(&st).is_some())
                    }
                    Err(e) => (format!("could not be waited for: {e}"), false),
                };
                let who = name(r);
                if caused {
                    tracing::debug!("{who} exited ({how}) after the launcher signalled it");
                } else if alive.iter().any(|&a| a) && stopping.is_none() {
                    let g = grace.after_failure();
                    tracing::error!("{who} failed ({how}); {}", grace_note(g));
                    stopping = Some((Instant::now() + g, libc::SIGTERM));
                } else {
                    tracing::error!("{who} failed ({how})");
                }
                failures.push(Failure {
                    index: r,
                    how,
                    by_signal,
                    caused,
                });
            }
            Ok(Event::Interrupt(got)) => {
                interrupted = true;
                interrupt_signal.get_or_insert(got);
                interrupts += 1;
                let sig = if interrupts == 1 { got } else { libc::SIGKILL };
                send(&alive, &mut signalled, sig);
                if interrupts == 1 {
                    let now = Instant::now();
                    if let Some(d) = stop_time() {
                        need = need.max(d);
                    }
                    let window = grace.for_stopping(need);
                    tracing::warn!(
                        "interrupted by {}; forwarding it: {}",
                        super::signals::name(sig),
                        stop_note(need, window, grace)
                    );
                    stop_asked = Some(now);
                    stopping = Some((now + window, libc::SIGKILL));
                } else {
                    tracing::warn!("interrupted again; killing the ranks (signal {sig})");
                    stop_asked = None;
                    stopping = Some((Instant::now() + KILL_AFTER, libc::SIGKILL));
                }
            }
            Ok(Event::StopTime(r, d)) => {
                if d <= need {
                    continue;
                }
                need = d;
                if let Some(at) = stop_asked {
                    let window = grace.for_stopping(need);
                    tracing::warn!("{}: {}", name(r), stop_note(need, window, grace));
                    stopping = Some((at + window, libc::SIGKILL));
                }
            }
            Err(RecvTimeoutError::Timeout) => {
                stop_asked = None;
                let sig = stopping.map_or(libc::SIGKILL, |(_, s)| s);
                tracing::debug!(
                    signal = sig,
                    "grace period over; signalling the remaining processes"
                );
                send(&alive, &mut signalled, sig);
                stopping = Some((Instant::now() + KILL_AFTER, libc::SIGKILL));
            }
            Err(RecvTimeoutError::Disconnected) => break,
        }
    }
    // Ranks that lose a peer exit with an error at nearly the same moment as
    // the peer itself, so the order of exits is not a reliable witness: a rank
    // killed by a signal is the likelier root cause, then the first one seen.
    // Failures the launcher caused by signalling are never the cause.
    let own: Vec<&Failure> = failures.iter().filter(|f| !f.caused).collect();
    let first_failure = own
        .iter()
        .find(|f| f.by_signal)
        .or(own.first())
        .map(|f| (f.index, f.how.clone()));
    let mut reaped = vec![false; n];
    for (r, a) in alive.iter().enumerate() {
        reaped[r] = !a;
    }
    Supervised {
        statuses,
        first_failure,
        signalled,
        interrupted,
        interrupt_signal,
        reaped,
    }
}

/// Why the other processes run on after one failed, and for how long.
fn grace_note(grace: Duration) -> String {
    format!(
        "the others run on for {} (--grace) so that they can notice the failure and report whom they blame, then get SIGTERM, and SIGKILL {} later",
        seconds(grace),
        seconds(KILL_AFTER)
    )
}

/// How long the ranks have to stop on an interrupt (`window`), and why.
fn stop_note(need: Duration, window: Duration, grace: Grace) -> String {
    let wanted = grace.notice.saturating_add(need.saturating_mul(2));
    let why = if need.is_zero() {
        "no rank said how long its step and checkpoint take: the liveness timeout + 3 s".to_string()
    } else {
        format!(
            "the slowest rank's last step and checkpoint took {}: twice that + {}",
            seconds(need),
            seconds(grace.notice)
        )
    };
    if wanted > window {
        format!(
            "the ranks have {} to stop (--grace; they would need {}, as {why}), then SIGKILL",
            seconds(window),
            seconds(wanted)
        )
    } else {
        format!(
            "the ranks have {} to stop ({why}), then SIGKILL",
            seconds(window)
        )
    }
}

/// `d` in seconds as people write them: "8 s", "1.5 s".
fn seconds(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s.fract() == 0.0 {
        format!("{s:.0} s")
    } else {
        format!("{} s", (s * 1000.0).round() / 1000.0)
    }
}

/// The command that starts local rank `rank` with `env`.
fn local_command(spec: &LaunchSpec, env: &[(String, String)]) -> Command {
    let mut c = Command::new(&spec.command[0]);
    c.args(&spec.command[1..]);
    c.envs(env.iter().map(|(k, v)| (k, v)));
    c.env(parent::ENV_PARENT_PID, std::process::id().to_string());
    if let Some(d) = &spec.cwd {
        c.current_dir(d);
    }
    c
}

/// The stream of a rank that [`forward`] copies.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stream {
    Stdout,
    Stderr,
}

/// What the launcher takes out of a remote rank's standard error: the
/// lines its agent sealed (see [`agent::seal`]).
struct AgentLines {
    /// The rank.
    rank: usize,
    /// The key of the rank's order, which the rank never saw.
    key: [u8; 32],
    /// Where its failure report is saved.
    reports: PathBuf,
    /// Where its stop time goes.
    events: Sender<Event>,
}

impl AgentLines {
    /// Takes `line` when it starts with one of the agent's markers: its
    /// text is used when the agent sealed it, and dropped (with a warning)
    /// otherwise. Returns whether the line was taken.
    fn take(&self, line: &[u8]) -> bool {
        for marker in [agent::REPORT_MARKER, agent::STOP_MARKER] {
            let Some(rest) = line.strip_prefix(marker.as_bytes()) else {
                continue;
            };
            let Some(text) = agent::unseal(&self.key, marker, self.rank, rest) else {
                tracing::warn!(
                    "rank {}'s output has a line that looks like its agent's but is not sealed by it; ignored",
                    self.rank
                );
                return true;
            };
            if marker == agent::REPORT_MARKER {
                crate::report::save(&self.reports, self.rank, &text);
            } else if let Some(d) = crate::report::parse_stop_time(&text) {
                let _ = self.events.send(Event::StopTime(self.rank, d));
            }
            return true;
        }
        false
    }
}

/// Copies `src` (a rank's `stream`) line by line to the launcher's, after
/// `prefix`, on a thread that holds `done` until the stream ends. Lines
/// longer than [`MAX_LINE`] come in pieces of that size, each a line of
/// its own. With `agent`, the lines that a remote rank's agent sealed are
/// taken out (see [`AgentLines`]). With `rendered`, the rank's progress
/// events become bars and the other lines are printed around them.
#[allow(clippy::too_many_arguments)]
fn forward<R: Read + Send + 'static>(
    src: R,
    stream: Stream,
    prefix: String,
    agent: Option<AgentLines>,
    rendered: Option<Rendered>,
    log: Option<RankLog>,
    done: Sender<()>,
) {
    std::thread::spawn(move || {
        let _done = done;
        let mut lines = BoundedLines::new(src, MAX_LINE);
        let write = |line: &[u8]| {
            let mut w: Box<dyn Write> = match stream {
                Stream::Stdout => Box::new(std::io::stdout().lock()),
                Stream::Stderr => Box::new(std::io::stderr().lock()),
            };
            let _ = w.write_all(prefix.as_bytes());
            let _ = w.write_all(line);
            let _ = w.flush();
        };
        while let Some(mut line) = lines.next_line() {
            if agent.as_ref().is_some_and(|a| a.take(&line)) {
                continue;
            }
            if !line.ends_with(b"\n") {
                line.push(b'\n');
            }
            if let Some(log) = &log {
                log.write(&line);
            }
            match (&rendered, stream) {
                (None, _) => write(&line),
                (Some(r), Stream::Stdout) => r.stdout(|| write(&line)),
                (Some(r), Stream::Stderr) => {
                    let text = String::from_utf8_lossy(&line);
                    r.stderr_line(&prefix, text.trim_end_matches(['\n', '\r']));
                }
            }
        }
        if let Some(r) = &rendered
            && stream == Stream::Stderr
        {
            r.ended();
        }
    });
}

/// A rank's log file (`--log-dir`), shared by the forwarders of its two
/// streams: whole lines, unprefixed.
#[derive(Clone)]
struct RankLog(Arc<Mutex<std::fs::File>>);

impl RankLog {
    fn create(dir: &std::path::Path, rank: usize, restart: u32) -> anyhow::Result<RankLog> {
        let p = super::rank_log_path(dir, rank, restart);
        let f = std::fs::File::create(&p)
            .map_err(|e| anyhow::anyhow!("cannot create rank {rank}'s log {}: {e}", p.display()))?;
        Ok(RankLog(Arc::new(Mutex::new(f))))
    }

    /// Appends `line`; a log that cannot be written is noted once and dropped.
    fn write(&self, line: &[u8]) {
        let mut f = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Err(e) = f.write_all(line) {
            static NOTED: std::sync::Once = std::sync::Once::new();
            NOTED.call_once(|| tracing::warn!(error = %e, "cannot write a rank's log file"));
        }
    }
}

/// How the launcher signals one rank.
enum Handle {
    /// A local process group, and its guard.
    Local(u32, Guard),
    /// A remote rank: through its agent, else by killing the local ssh.
    Remote {
        ssh: u32,
        control: remote::Control,
        guard: Guard,
    },
}

impl Handle {
    fn signal(&self, sig: i32) {
        match self {
            Handle::Local(pgid, _) => signal_group(*pgid, sig),
            Handle::Remote { ssh, control, .. } => {
                // SIGKILL is final: without ssh the agent kills the rank
                // even if the frame never gets through.
                if !control.send(&agent::Frame::Signal(sig)) || sig == libc::SIGKILL {
                    signal_group(*ssh, libc::SIGKILL);
                }
            }
        }
    }

    /// Ends whatever is left of the rank once the launch is over (`reaped`:
    /// whether its process, or its ssh, was reaped).
    fn finish(self, reaped: bool) {
        match self {
            Handle::Local(pgid, guard) => {
                kill_group_if_ours(pgid, reaped);
                guard.end();
            }
            Handle::Remote {
                ssh,
                control,
                guard,
            } => {
                control.close();
                kill_group_if_ours(ssh, reaped);
                guard.end();
            }
        }
    }
}

/// Where the ranks' output goes.
struct Output {
    /// Held by each forwarder until its stream ends.
    done: Sender<()>,
    /// Draws the ranks' progress events, when the launcher's stderr is a terminal.
    renderer: Option<Arc<Renderer>>,
    /// The supervisor's events (a remote rank's stop time).
    events: Sender<Event>,
}

/// Starts rank `rank`: locally, or over ssh through its agent, with its
/// output forwarded (and, for a remote rank, its failure report saved in
/// `reports`).
fn start_rank(
    spec: &LaunchSpec,
    rank: usize,
    job: &JobIdentity,
    addrs: &[String],
    hostfile: Option<&std::path::Path>,
    reports: &std::path::Path,
    output: &Output,
) -> anyhow::Result<(Handle, Child)> {
    let out = &output.done;
    let env = rank_env(spec, job, addrs, rank, hostfile);
    let prefix = if spec.prefix_output {
        format!("[{rank}] ")
    } else {
        String::new()
    };
    let rendered = output.renderer.as_ref().map(|r| Rendered {
        renderer: r.clone(),
        rank,
    });
    let log = match &spec.log_dir {
        Some(d) => Some(RankLog::create(d, rank, spec.restart_count)?),
        None => None,
    };
    let Some(host) = &spec.hosts[rank].ssh else {
        let mut cmd = local_command(spec, &env);
        cmd.stdin(if rank == 0 {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        if spec.prefix_output || log.is_some() {
            cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        }
        let (mut child, guard) = spawn_guarded(&mut cmd)
            .map_err(|e| anyhow::anyhow!("cannot start rank {rank} ({}): {e}", spec.command[0]))?;
        forward_stdin(&mut child);
        if let Some(o) = child.stdout.take() {
            let (r, l) = (rendered.clone(), log.clone());
            forward(o, Stream::Stdout, prefix.clone(), None, r, l, out.clone());
        }
        if let Some(e) = child.stderr.take() {
            forward(e, Stream::Stderr, prefix, None, rendered, log, out.clone());
        }
        return Ok((Handle::Local(child.id(), guard), child));
    };
    // The rank's environment holds the job secret: it goes to the agent on
    // ssh's standard input, never on a command line.
    let mut env = env;
    env.retain(|(k, _)| k != crate::report::ENV_REPORT_DIR);
    let order = remote::order_for(spec, rank, env);
    let order_key = order.key;
    let mut cmd = remote::agent_command(spec, host);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let (mut child, guard) = spawn_guarded(&mut cmd)
        .map_err(|e| anyhow::anyhow!("cannot start ssh for rank {rank} on {host}: {e}"))?;
    let stdin = child.stdin.take().expect("piped");
    let control = remote::Control::start(stdin, &order)
        .map_err(|e| anyhow::anyhow!("cannot send rank {rank}'s order to ssh ({host}): {e}"))?;
    if rank == 0 {
        control.forward_stdin();
    }
    if let Some(o) = child.stdout.take() {
        let (r, l) = (rendered.clone(), log.clone());
        forward(o, Stream::Stdout, prefix.clone(), None, r, l, out.clone());
    }
    if let Some(e) = child.stderr.take() {
        let sealed = AgentLines {
            rank,
            key: order_key,
            reports: reports.to_path_buf(),
            events: output.events.clone(),
        };
        forward(
            e,
            Stream::Stderr,
            prefix,
            Some(sealed),
            rendered,
            log,
            out.clone(),
        );
    }
    let ssh = child.id();
    Ok((
        Handle::Remote {
            ssh,
            control,
            guard,
        },
        child,
    ))
}

/// Starts every rank of `spec` and supervises them until all have exited.
///
/// The ranks are started from the calling thread, which this blocks until
/// the launch is over (on Linux a rank is killed when the thread that
/// started it exits). When the last rank exited, whatever the ranks left
/// in their process groups is killed, and output still open 2 s later is
/// abandoned.
pub fn run(spec: &LaunchSpec) -> anyhow::Result<LaunchOutcome> {
    anyhow::ensure!(!spec.command.is_empty(), "no program to launch");
    anyhow::ensure!(!spec.hosts.is_empty(), "no ranks to launch");
    let mut resolved = spec.clone();
    remote::resolve_ssh_names(&mut resolved);
    let spec = &resolved;
    if let Some(p) = super::check::launch_problems(spec).first() {
        anyhow::bail!("{p}");
    }
    let n = spec.hosts.len();
    if let Some(d) = &spec.log_dir {
        std::fs::create_dir_all(d)
            .map_err(|e| anyhow::anyhow!("cannot create the log folder {}: {e}", d.display()))?;
    }
    let job = JobIdentity::random();
    #[cfg(feature = "tls")]
    let job = if matches!(
        spec.backend,
        crate::config::Backend::Quic | crate::config::Backend::Tls
    ) {
        job.with_quic_certificate()
            .map_err(|e| anyhow::anyhow!("cannot create the job's TLS certificate: {e}"))?
    } else {
        job
    };
    let addrs = hosts::addresses(&spec.hosts, spec.starting_port)?;
    let all_local = spec.hosts.iter().all(|h| h.ssh.is_none());
    remove_files_of_dead_launchers(&std::env::temp_dir());
    let stem = job_files_stem(std::process::id(), &job.id);
    // An MLX-style host file for local jobs (remote ranks get the inline list only).
    let hostfile = if all_local {
        let p = std::env::temp_dir().join(format!("{stem}.json"));
        let json =
            serde_json::to_string(&addrs.iter().map(|a| vec![a.clone()]).collect::<Vec<_>>())?;
        std::fs::write(&p, json)?;
        Some(p)
    } else {
        None
    };
    tracing::info!(world = n, backend = %spec.backend, ?addrs, "launching");
    // Where failing ranks say whom they blame, and how long they need to
    // stop (see `crate::report`): private to this user, made here and now.
    let reports = std::env::temp_dir().join(format!("{stem}.reports"));
    crate::report::create_private_dir(&reports).map_err(|e| {
        anyhow::anyhow!(
            "cannot make the private folder {} for the ranks' reports: {e}",
            reports.display()
        )
    })?;
    let mut spec = spec.clone();
    spec.env.push((
        crate::report::ENV_REPORT_DIR.to_string(),
        reports.display().to_string(),
    ));
    let renderer = progress::renderer_for(&mut spec);
    let spec = &spec;

    let (tx, rx) = mpsc::channel();
    let (out_tx, out_rx) = mpsc::channel();
    let output = Output {
        done: out_tx,
        renderer,
        events: tx.clone(),
    };
    forward_interrupts(Some(tx.clone()));
    let mut handles: Vec<Handle> = Vec::with_capacity(n);
    let mut spawn_error = None;
    for rank in 0..n {
        match start_rank(
            spec,
            rank,
            &job,
            &addrs,
            hostfile.as_deref(),
            &reports,
            &output,
        ) {
            Ok((handle, child)) => {
                handles.push(handle);
                report_exit(child, rank, tx.clone());
            }
            Err(e) => {
                spawn_error = Some(e);
                break;
            }
        }
    }
    drop((tx, output));

    let s = supervise(
        handles.len(),
        &|r, sig| handles[r].signal(sig),
        n,
        &rx,
        Grace::of(spec),
        &|| crate::report::stop_time(&reports).map(|(d, _)| d),
        spawn_error.is_some(),
        &|r| format!("rank {r}"),
    );
    forward_interrupts(None);
    for (h, &reaped) in handles.into_iter().zip(&s.reaped) {
        h.finish(reaped);
    }
    finish_output(out_rx);
    if let Some(p) = hostfile {
        let _ = std::fs::remove_file(p);
    }
    let filed = crate::report::read_reports(&reports, n);
    let _ = std::fs::remove_dir_all(&reports);
    if let Some(e) = spawn_error {
        return Err(e);
    }
    let blamed = crate::report::most_blamed(&filed).map(|(rank, by)| Blame {
        rank,
        reason: by[0].reason.clone(),
        reporters: by.iter().map(|r| r.rank).collect(),
    });
    Ok(LaunchOutcome {
        statuses: s.statuses,
        first_failure: s.first_failure,
        interrupted: s.interrupted,
        interrupt_signal: s.interrupt_signal,
        signalled: s.signalled,
        blamed,
    })
}

/// The name (without extension) of a launcher's job files in the temporary
/// folder: `mlx-launch-<its pid>-<job>`, so that a later launcher can tell
/// whose they are.
fn job_files_stem(pid: u32, job_id: &[u8]) -> String {
    format!(
        "mlx-launch-{pid}-{}",
        crate::config::hex_encode(&job_id[..8.min(job_id.len())])
    )
}

/// Removes the job files (`mlx-launch-<pid>-*`) of launchers that are gone:
/// a SIGKILLed launcher cannot remove its own.
fn remove_files_of_dead_launchers(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("mlx-launch-"))
            .and_then(|rest| rest.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<libc::pid_t>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
        }
    }
}

#[cfg(test)]
mod finish_tests {
    use super::*;

    /// Whether `pid` runs (a zombie that nobody reaps, as under a
    /// container's bare pid 1, does not).
    fn alive(pid: u32) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        let zombie = stat
            .rsplit_once(") ")
            .is_some_and(|(_, r)| r.starts_with('Z'));
        // SAFETY: signal 0 only asks whether the process exists.
        !zombie && unsafe { libc::kill(pid as libc::pid_t, 0) == 0 }
    }

    /// A rank reaped long ago whose pid now leads a stranger's group: that
    /// group is not killed. A rank reaped with processes left in its group:
    /// they are.
    #[test]
    fn only_groups_still_ours_are_killed_at_the_end() {
        let (mut stranger, _guard) = spawn_guarded(Command::new("sleep").arg("30")).unwrap();
        kill_group_if_ours(stranger.id(), true);
        std::thread::sleep(Duration::from_millis(100));
        let survived = stranger.try_wait().unwrap().is_none();
        let _ = stranger.kill();
        let _ = stranger.wait();
        assert!(survived, "a stranger's group was killed");

        let (mut rank, _guard) = spawn_guarded(
            Command::new("/bin/sh")
                .args(["-c", "sleep 30 >/dev/null & echo $!"])
                .stdout(Stdio::piped()),
        )
        .unwrap();
        let mut out = String::new();
        rank.stdout
            .take()
            .unwrap()
            .read_to_string(&mut out)
            .unwrap();
        let left: u32 = out.trim().parse().unwrap();
        let pgid = rank.id();
        rank.wait().unwrap();
        assert!(alive(left));
        kill_group_if_ours(pgid, true);
        let t = Instant::now();
        while alive(left) && t.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!alive(left), "what the rank left in its group is killed");
    }
}

#[cfg(test)]
mod job_files_tests {
    use super::*;

    #[test]
    fn the_files_of_a_dead_launcher_are_removed_and_a_live_ones_kept() {
        let dir = std::env::temp_dir().join(format!("mlx-launch-reaper-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        // A process that has exited: its pid is free (until reused).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let live = std::process::id();
        let dead_stem = job_files_stem(dead, &[1; 16]);
        let live_stem = job_files_stem(live, &[2; 16]);
        for stem in [&dead_stem, &live_stem] {
            std::fs::write(dir.join(format!("{stem}.json")), "[]").unwrap();
            std::fs::create_dir_all(dir.join(format!("{stem}.reports"))).unwrap();
        }
        std::fs::write(dir.join("mlx-launch-notapid-x.json"), "").unwrap();
        remove_files_of_dead_launchers(&dir);
        assert!(!dir.join(format!("{dead_stem}.json")).exists());
        assert!(!dir.join(format!("{dead_stem}.reports")).exists());
        assert!(dir.join(format!("{live_stem}.json")).exists());
        assert!(dir.join(format!("{live_stem}.reports")).exists());
        assert!(dir.join("mlx-launch-notapid-x.json").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
