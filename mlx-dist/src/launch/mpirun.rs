//! `mlx-launch --backend mpi`: the job is started by Open MPI's `mpirun`
//! (`MLX_LAUNCH_MPIRUN` names another binary), which sets up MPI's own
//! environment; the ranks join it with `init(Backend::Mpi)` or `Backend::Any`
//! (a build of `mlx-dist` with the `mpi` feature).
//!
//! # What the MPI backend guarantees
//!
//! mpirun, not `mlx-launch`, starts and supervises the ranks, and the MPI
//! transport has no timeouts and no liveness check of its own: `--timeout`
//! and `--liveness-timeout` (`MLX_DIST_TIMEOUT_MS`, `MLX_DIST_LIVENESS_MS`)
//! do not apply to it.
//! - A rank that exits with a failure status or is killed is noticed by
//!   mpirun, which aborts the job (it stops the other ranks) and exits
//!   non-zero; `mlx-launch` exits with mpirun's status and does not name the
//!   rank itself (mpirun's own message does). A rank of `mlx-dist` that
//!   panics or exits with a failure calls `MPI_Abort` itself (see
//!   `mlx_dist::exit_rank`), so it never waits in `MPI_Finalize` for peers
//!   that wait for it in a collective.
//! - A rank that is alive but makes no progress (a deadlock, a stopped
//!   process, a rank that never reaches a collective) is not detected: the
//!   other ranks wait inside MPI and the job hangs until it is interrupted
//!   (Ctrl-C or SIGTERM to `mlx-launch`) or killed from outside (a batch
//!   system's time limit).
//!
//! What `mlx-launch` adds around mpirun, as for its own ranks: mpirun runs
//! in a process group of its own that dies with `mlx-launch` (on Linux
//! `PR_SET_PDEATHSIG`, even when `mlx-launch` is killed with SIGKILL); Ctrl-C
//! (and SIGTERM, SIGHUP) is forwarded to that group as it came, upon which
//! mpirun stops the job, and SIGKILL follows after the liveness timeout
//! plus 3 s, at most `--grace` (2 s after a second Ctrl-C); the group is
//! killed when mpirun exits. Open MPI starts
//! each rank in a process group of its own, so these signals reach the ranks
//! only through mpirun: a rank outlives a killed mpirun unless Open MPI's own
//! clean-up stops it.

use std::collections::HashMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::mpsc;

use anyhow::Context;
use mlx_progress::render::Renderer;

use super::LaunchSpec;
use super::lines::{BoundedLines, MAX_LINE};
use super::process::{kill_group_if_ours, signal_group, spawn_guarded, status_code};
use super::supervise::{
    Grace, finish_output, forward_interrupts, forward_stdin, report_exit, supervise,
};

/// The variables `mpirun` passes on to every rank (`-x NAME`): set in
/// mpirun's own environment, so that their values (the user's `--env`
/// values may be secrets) stay off its command line, which `ps` shows and
/// the launcher logs.
pub fn mpirun_env(spec: &LaunchSpec) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> =
        vec![(crate::config::ENV_BACKEND.to_string(), "mpi".to_string())];
    env.extend(super::thread_env(spec, 0));
    env.extend(spec.env.iter().cloned());
    env
}

/// The `mpirun` command line (program and arguments) for `spec`; the
/// variables' values come from [`mpirun_env`], in mpirun's environment.
pub fn mpirun_command(spec: &LaunchSpec, running_as_root: bool) -> Vec<String> {
    let n = spec.hosts.len();
    let mut c = vec![
        std::env::var("MLX_LAUNCH_MPIRUN").unwrap_or_else(|_| "mpirun".into()),
        "-np".into(),
        n.to_string(),
    ];
    if running_as_root {
        c.push("--allow-run-as-root".into());
    }
    // More ranks than cores is fine for tests and small jobs, as with the other backends.
    c.push("--oversubscribe".into());
    if spec.prefix_output {
        c.push("--tag-output".into());
    }
    let remote: Vec<&str> = spec.hosts.iter().filter_map(|h| h.ssh.as_deref()).collect();
    if !remote.is_empty() {
        // One slot per rank placed on each host, in rank order.
        let mut slots: Vec<(&str, usize)> = Vec::new();
        for h in &spec.hosts {
            let name = h.ssh.as_deref().unwrap_or("localhost");
            match slots.iter_mut().find(|(s, _)| *s == name) {
                Some((_, k)) => *k += 1,
                None => slots.push((name, 1)),
            }
        }
        let list: Vec<String> = slots.iter().map(|(h, k)| format!("{h}:{k}")).collect();
        c.push("--host".into());
        c.push(list.join(","));
    }
    if let Some(cwd) = &spec.cwd {
        c.push("--wdir".into());
        c.push(cwd.display().to_string());
    }
    let mut names: Vec<String> = Vec::new();
    for (k, _) in mpirun_env(spec) {
        if !names.contains(&k) {
            c.push("-x".into());
            c.push(k.clone());
            names.push(k);
        }
    }
    c.extend(spec.mpi_args.iter().cloned());
    c.extend(spec.command.iter().cloned());
    c
}

/// A `[jobid,rank]<stdout>:` or `<stderr>:` tag (mpirun `--tag-output`) at
/// the start of `s`: `(rank, is_stderr, tag length)`.
fn parse_tag(s: &str) -> Option<(usize, bool, usize)> {
    let rest = s.strip_prefix('[')?;
    let (ids, rest) = rest.split_once(']')?;
    let (job, rank) = ids.split_once(',')?;
    if job.is_empty() || !job.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let rank = rank.parse().ok()?;
    let (stream, _) = rest.strip_prefix('<')?.split_once(">:")?;
    let is_stderr = match stream {
        "stdout" => false,
        "stderr" => true,
        _ => return None,
    };
    Some((rank, is_stderr, 1 + ids.len() + 1 + 1 + stream.len() + 2))
}

/// Where a piece of mpirun's output came from: `(rank, is_stderr)`, or
/// `None` for mpirun's own messages.
type Source = Option<(usize, bool)>;

/// Splits mpirun's tagged output back into each rank's lines. Open MPI tags
/// every chunk a rank writes, not every line, so one physical line can hold
/// the unfinished line of one rank followed by chunks of others.
///
/// What it keeps is bounded, whatever the ranks print: an unfinished line
/// that reaches [`MAX_LINE`] comes out as a line of its own (as
/// [`BoundedLines`] cuts a long physical line), and more than
/// [`MAX_SOURCES`] unfinished lines (tags naming made-up ranks) all come out.
#[derive(Default)]
pub(crate) struct Untagger {
    partial: HashMap<Source, String>,
}

/// The most sources with an unfinished line an [`Untagger`] keeps.
pub(crate) const MAX_SOURCES: usize = 1024;

impl Untagger {
    /// Takes one physical line (without its newline) and returns the lines
    /// it completes.
    pub(crate) fn line(&mut self, line: &str) -> Vec<(Source, String)> {
        let mut pieces: Vec<(Source, &str)> = Vec::new();
        let (mut source, mut start, mut i) = (None, 0, 0);
        while i < line.len() {
            if line.as_bytes()[i] == b'['
                && let Some((rank, err, n)) = parse_tag(&line[i..])
            {
                if i > start || source.is_some() {
                    pieces.push((source, &line[start..i]));
                }
                source = Some((rank, err));
                i += n;
                start = i;
                continue;
            }
            i += 1;
        }
        pieces.push((source, &line[start..]));
        let last = pieces.len() - 1;
        let mut done = Vec::new();
        for (k, (source, text)) in pieces.into_iter().enumerate() {
            let buf = self.partial.entry(source).or_default();
            buf.push_str(text);
            // The newline ends the line of whoever wrote last.
            if k == last || buf.len() >= MAX_LINE {
                done.push((source, std::mem::take(buf)));
            }
        }
        self.partial.retain(|_, t| !t.is_empty());
        if self.partial.len() > MAX_SOURCES {
            done.extend(self.partial.drain());
        }
        done
    }

    /// Lines left unfinished when the stream ended.
    pub(crate) fn finish(self) -> Vec<(Source, String)> {
        self.partial
            .into_iter()
            .filter(|(_, t)| !t.is_empty())
            .collect()
    }
}

/// Prints one line of `source`; with `renderer`, a rank's progress events
/// become bars and the other lines are printed around them.
fn print(source: Source, text: &str, renderer: Option<&Renderer>) {
    let write = || {
        let _ = match source {
            Some((rank, true)) => writeln!(std::io::stderr(), "[{rank}] {text}"),
            Some((rank, false)) => writeln!(std::io::stdout(), "[{rank}] {text}"),
            None => writeln!(std::io::stdout(), "{text}"),
        };
    };
    match (renderer, source) {
        (None, _) => write(),
        (Some(r), Some((rank, true))) => {
            if let Some(text) = r.feed(rank, text) {
                r.println(format!("[{rank}] {text}"));
            }
        }
        (Some(r), _) => r.suspend(write),
    }
}

/// Runs `spec` under `mpirun` and returns the exit code the launcher should
/// exit with (mpirun's: non-zero when a rank failed; 128 + signal when
/// mpirun was killed). Call it from the thread that waits for the launch
/// (see [`super::run`]).
pub fn run(spec: &LaunchSpec) -> anyhow::Result<i32> {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mut spec = spec.clone();
    let renderer = super::progress::renderer_for(&mut spec);
    let spec = &spec;
    let argv = mpirun_command(spec, root);
    tracing::info!(?argv, "launching through mpirun");
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(mpirun_env(spec));
    // mpirun runs in a process group of its own, which does not read the
    // terminal: standard input reaches it through a pipe.
    cmd.stdin(Stdio::piped());
    if spec.prefix_output {
        cmd.stdout(Stdio::piped());
    }
    let (tx, rx) = mpsc::channel();
    forward_interrupts(Some(tx.clone()));
    let (mut child, guard) = match spawn_guarded(&mut cmd) {
        Ok(c) => c,
        Err(e) => {
            forward_interrupts(None);
            return Err(e)
                .with_context(|| format!("cannot run {} (is Open MPI installed?)", argv[0]));
        }
    };
    let pgid = child.id();
    forward_stdin(&mut child);
    let (out_tx, out_rx) = mpsc::channel::<()>();
    let n = spec.hosts.len();
    if let Some(out) = child.stdout.take() {
        // With --tag-output everything arrives on mpirun's stdout, tagged; it
        // becomes `[rank] text` on our stdout or stderr, like the other backends.
        std::thread::spawn(move || {
            let _done = out_tx;
            let mut untagger = Untagger::default();
            let renderer = renderer.as_deref();
            let mut lines = BoundedLines::new(out, MAX_LINE);
            while let Some(line) = lines.next_line() {
                let line = String::from_utf8_lossy(&line);
                let line = line.trim_end_matches(['\n', '\r']);
                for (source, text) in untagger.line(line) {
                    print(source, &text, renderer);
                }
            }
            for (source, text) in untagger.finish() {
                print(source, &text, renderer);
            }
            if let Some(r) = renderer {
                for rank in 0..n {
                    r.end_rank(rank);
                }
            }
        });
    } else {
        drop(out_tx);
    }
    report_exit(child, 0, tx);
    let s = supervise(
        1,
        &|_, sig| signal_group(pgid, sig),
        1,
        &rx,
        Grace::of(spec),
        &|| None,
        false,
        &|_| argv[0].clone(),
    );
    forward_interrupts(None);
    kill_group_if_ours(pgid, s.reaped[0]);
    guard.end();
    finish_output(out_rx);
    match (&s.statuses[0], &s.first_failure) {
        (Some(st), _) => Ok(status_code(st)),
        (None, Some((_, how))) => anyhow::bail!("{} {how}", argv[0]),
        (None, None) => anyhow::bail!("{} was not waited for", argv[0]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_and_tags() {
        let mut spec = LaunchSpec::local(3, vec!["prog".into(), "--x".into()]);
        spec.env.push(("K".into(), "hunter2".into()));
        let c = mpirun_command(&spec, true);
        assert_eq!(
            &c[1..5],
            ["-np", "3", "--allow-run-as-root", "--oversubscribe"]
        );
        // Names on the command line, values in mpirun's environment.
        assert!(c.windows(2).any(|w| w == ["-x", "K"]), "{c:?}");
        assert!(!c.iter().any(|a| a.contains("hunter2")), "{c:?}");
        assert!(
            c.windows(2).any(|w| w == ["-x", "MLX_DIST_BACKEND"]),
            "{c:?}"
        );
        let env = mpirun_env(&spec);
        assert!(env.contains(&("K".into(), "hunter2".into())), "{env:?}");
        assert!(env.contains(&("MLX_DIST_BACKEND".into(), "mpi".into())));
        assert_eq!(&c[c.len() - 2..], ["prog", "--x"]);
        assert!(!mpirun_command(&spec, false).contains(&"--allow-run-as-root".to_string()));
    }

    #[test]
    fn unfinished_lines_are_bounded_whatever_the_ranks_print() {
        let mut u = Untagger::default();
        // One rank's line that never ends, a chunk at a time.
        let chunk = format!("[1,1]<stdout>:{}[1,0]<stdout>:x", "a".repeat(1000));
        let mut out = Vec::new();
        for _ in 0..(MAX_LINE / 1000 + 2) {
            out.extend(u.line(&chunk));
        }
        let long: Vec<_> = out.iter().filter(|(s, _)| *s == Some((1, false))).collect();
        assert_eq!(
            long.len(),
            1,
            "the unfinished line came out once it was full"
        );
        assert!(long[0].1.len() >= MAX_LINE && long[0].1.len() < MAX_LINE + 1000);
        // Tags of made-up ranks, each left unfinished.
        let mut u = Untagger::default();
        let mut out = Vec::new();
        for r in 0..(MAX_SOURCES + 1) {
            out.extend(u.line(&format!("[1,{r}]<stderr>:part[1,0]<stdout>:x")));
            assert!(u.partial.len() <= MAX_SOURCES);
        }
        assert_eq!(
            out.iter().filter(|(_, t)| t == "part").count(),
            MAX_SOURCES + 1
        );
    }

    #[test]
    fn tags_become_rank_lines_even_when_chunks_interleave() {
        let mut u = Untagger::default();
        assert_eq!(
            u.line("[1,2]<stdout>:hello: x"),
            [(Some((2, false)), "hello: x".to_string())]
        );
        assert_eq!(u.line("[1,0]<stderr>:"), [(Some((0, true)), String::new())]);
        assert_eq!(
            u.line("plain [not a tag]"),
            [(None, "plain [not a tag]".to_string())]
        );
        // Seen under mpirun -np 4: rank 1 wrote "test result: " without a
        // newline, then rank 3's whole line arrived.
        assert_eq!(
            u.line("[1,1]<stdout>:test result: [1,3]<stdout>:RANK 3 OK (mpi)"),
            [(Some((3, false)), "RANK 3 OK (mpi)".to_string())]
        );
        assert_eq!(
            u.line("[1,1]<stdout>:ok.[1,0]<stdout>:RANK 0 OK (mpi)"),
            [(Some((0, false)), "RANK 0 OK (mpi)".to_string())]
        );
        assert_eq!(
            u.line("[1,1]<stdout>: done"),
            [(Some((1, false)), "test result: ok. done".to_string())]
        );
        assert_eq!(
            u.line("[1,2]<stdout>:unfinished[1,3]<stdout>:x"),
            [(Some((3, false)), "x".to_string())]
        );
        assert_eq!(u.finish(), [(Some((2, false)), "unfinished".to_string())]);
    }
}
