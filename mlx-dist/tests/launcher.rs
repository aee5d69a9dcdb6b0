//! How `mlx-launch` handles processes: the real binary, with `/bin/sh -c`
//! scripts as ranks (each sees `MLX_RANK`, and `T`, a scratch directory
//! where it writes its pid). Every wait is bounded, and every process a test
//! started is killed when the test ends, passed or not.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const LAUNCH: &str = env!("CARGO_BIN_EXE_mlx-launch");

/// A scratch directory and the launcher started in it; on drop, kills the
/// launcher and every process whose pid a rank wrote into the directory.
struct Job {
    dir: PathBuf,
    launcher: Option<Child>,
}

impl Job {
    fn new(name: &str) -> Job {
        let dir =
            std::env::temp_dir().join(format!("mlx-launcher-test-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Job {
            dir,
            launcher: None,
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Starts `mlx-launch ARGS -- /bin/sh -c SCRIPT`; its output goes to files.
    fn launch(&mut self, args: &[&str], script: &str) -> &mut Job {
        self.launch_with(args, script, &[])
    }

    fn launch_with(&mut self, args: &[&str], script: &str, env: &[(&str, &Path)]) -> &mut Job {
        let child = Command::new(LAUNCH)
            .args(args)
            .args(["--", "/bin/sh", "-c", script])
            .env("T", &self.dir)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(File::create(self.path("launcher.out")).unwrap())
            .stderr(File::create(self.path("launcher.err")).unwrap())
            .spawn()
            .unwrap();
        self.launcher = Some(child);
        self
    }

    fn launcher_pid(&self) -> i32 {
        self.launcher.as_ref().unwrap().id() as i32
    }

    /// The launcher's exit status, or a panic after `limit`.
    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let child = self.launcher.as_mut().unwrap();
        let t = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return st;
            }
            assert!(
                t.elapsed() < limit,
                "mlx-launch still running after {limit:?}:\n{}",
                self.output()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn output(&self) -> String {
        let read = |f| std::fs::read_to_string(self.path(f)).unwrap_or_default();
        format!("{}{}", read("launcher.out"), read("launcher.err"))
    }

    fn last_stderr_line(&self) -> String {
        let err = std::fs::read_to_string(self.path("launcher.err")).unwrap_or_default();
        err.lines().last().unwrap_or_default().to_string()
    }

    /// The pid a rank wrote to `name`, waiting up to 5 s for it.
    fn pid(&self, name: &str) -> i32 {
        let mut pid = None;
        assert!(
            eventually(Duration::from_secs(5), || {
                pid = read_pid(&self.path(name));
                pid.is_some()
            }),
            "no pid in {name}:\n{}",
            self.output()
        );
        pid.unwrap()
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(c) = self.launcher.as_mut() {
            let _ = c.kill();
            let _ = c.wait();
        }
        for entry in std::fs::read_dir(&self.dir).into_iter().flatten().flatten() {
            if let Some(pid) = read_pid(&entry.path()) {
                // SAFETY: kill(2) on processes this test started (ranks lead their group).
                unsafe {
                    libc::kill(-pid, libc::SIGKILL);
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_pid(p: &Path) -> Option<i32> {
    let name = p.file_name()?.to_str()?;
    if !["pid", "child", "escaped"]
        .iter()
        .any(|k| name.starts_with(k))
    {
        return None;
    }
    std::fs::read_to_string(p)
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|&p| p > 1)
}

/// Whether `f` holds within `limit` (checked every 20 ms).
fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    loop {
        if f() {
            return true;
        }
        if t.elapsed() > limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether process `pid` is gone: no such process, or a zombie that
/// nobody reaped yet (a dead orphan waits for init).
fn gone(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    if unsafe { libc::kill(pid, 0) } == -1
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    {
        return true;
    }
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit(')')
                .next()
                .map(|r| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

fn assert_gone(job: &Job, what: &str, pid: i32) {
    assert!(
        eventually(Duration::from_secs(3), || gone(pid)),
        "{what} (pid {pid}) is still running:\n{}",
        job.output()
    );
}

/// Rank 1 fails at once; rank 0, which the launcher then terminates, is
/// not blamed: the launcher exits with rank 1's status and names it last.
#[test]
fn the_failure_reported_is_the_one_the_launcher_did_not_cause() {
    let mut job = Job::new("first-failure");
    let t = Instant::now();
    let st = job
        .launch(
            &["-n", "2", "--grace", "1"],
            r#"echo $$ > "$T/pid.$MLX_RANK"; [ "$MLX_RANK" = 1 ] && exit 3; exec sleep 60"#,
        )
        .wait(Duration::from_secs(8));
    assert_eq!(st.code(), Some(3), "{}", job.output());
    let last = job.last_stderr_line();
    assert!(
        last.contains("rank 1 failed (exit status 3)"),
        "the last line must name rank 1: {last:?}\n{}",
        job.output()
    );
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
}

/// The processes a rank started die with it: the signals go to the rank's
/// process group, and what a failed rank left behind is killed at the end.
#[test]
fn a_ranks_children_die_with_the_launch() {
    let mut job = Job::new("children");
    let st = job
        .launch(
            &["-n", "2", "--grace", "0.5"],
            r#"sleep 1000 & echo $! > "$T/child.$MLX_RANK"
               [ "$MLX_RANK" = 1 ] && exit 3
               echo $$ > "$T/pid.0"; exec sleep 60"#,
        )
        .wait(Duration::from_secs(8));
    assert_eq!(st.code(), Some(3), "{}", job.output());
    for rank in 0..2 {
        let child = job.pid(&format!("child.{rank}"));
        assert_gone(&job, &format!("rank {rank}'s child"), child);
    }
}

/// SIGKILL leaves the launcher no chance to clean up: the ranks still die.
#[test]
fn ranks_die_when_the_launcher_is_killed() {
    let mut job = Job::new("launcher-killed");
    job.launch(
        &["-n", "2"],
        r#"echo $$ > "$T/pid.$MLX_RANK"; exec sleep 60"#,
    );
    let ranks = [job.pid("pid.0"), job.pid("pid.1")];
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGKILL) };
    job.wait(Duration::from_secs(5));
    // Its host file and report folder are named by its pid.
    assert_eq!(remove_job_files_of(job.launcher_pid()), 2);
    for (r, pid) in ranks.into_iter().enumerate() {
        assert_gone(&job, &format!("rank {r}"), pid);
    }
}

/// The same for mpirun under `--backend mpi` (a stand-in named by
/// `MLX_LAUNCH_MPIRUN`, so that no MPI is needed).
#[test]
fn mpirun_dies_when_the_launcher_is_killed() {
    let mut job = Job::new("mpirun-killed");
    let fake = job.path("fake-mpirun");
    std::fs::write(
        &fake,
        "#!/bin/sh\necho $$ > \"$T/pid.mpirun\"\nexec sleep 60\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    job.launch_with(
        &["--backend", "mpi", "-n", "2"],
        "true",
        &[("MLX_LAUNCH_MPIRUN", &fake)],
    );
    let mpirun = job.pid("pid.mpirun");
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGKILL) };
    job.wait(Duration::from_secs(5));
    remove_job_files_of(job.launcher_pid());
    assert_gone(&job, "mpirun", mpirun);
}

/// Durations are finite, non-negative numbers (timeouts positive); anything
/// else is a usage error naming the flag and the value, never a panic.
#[test]
fn bad_durations_are_usage_errors() {
    for (flag, value) in [
        ("--grace", "inf"),
        ("--grace", "nan"),
        ("--grace", "-1"),
        ("--grace", "abc"),
        ("--timeout", "-1"),
        ("--timeout", "0"),
        ("--liveness-timeout", "inf"),
    ] {
        let out = Command::new(LAUNCH)
            .args(["-n", "1", flag, value, "--", "true"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(
            err.contains(flag) && err.contains(&format!("'{value}'")),
            "{flag} {value}: the message must name both: {err}"
        );
        assert!(!err.contains("panicked"), "{flag} {value}: {err}");
    }
}

/// A stopped rank cannot act on SIGTERM: the launcher continues it, so it
/// terminates (running its TERM trap) within the grace period, before the
/// SIGKILL that would follow 2 s later.
#[test]
fn a_stopped_rank_is_continued_and_terminated() {
    let mut job = Job::new("stopped");
    job.launch(
        &["-n", "2", "--grace", "1"],
        r#"if [ "$MLX_RANK" = 0 ]; then
               echo $$ > "$T/pid.0"
               trap 'echo term > "$T/term.0"; exit 7' TERM
               while :; do sleep 0.1; done
           fi
           i=0; while [ ! -e "$T/go" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
           exit 3"#,
    );
    let rank0 = job.pid("pid.0");
    // SAFETY: kill(2) on the process group of a rank this test started.
    unsafe { libc::kill(-rank0, libc::SIGSTOP) };
    File::create(job.path("go")).unwrap();
    let t = Instant::now();
    let st = job.wait(Duration::from_secs(8));
    let took = t.elapsed();
    assert_eq!(st.code(), Some(3), "{}", job.output());
    assert!(
        job.path("term.0").exists(),
        "the stopped rank never acted on SIGTERM (took {took:?}):\n{}",
        job.output()
    );
    // grace (1 s) + the SIGKILL deadline (2 s): it must be done before.
    assert!(took < Duration::from_secs(3), "took {took:?}");
}

/// A process that left the rank's process group (setsid) and keeps its
/// output pipe open does not hold the launcher: it gives up on the output
/// 2 s after the last rank exited.
#[test]
fn output_held_open_by_an_escaped_process_does_not_hang_the_launcher() {
    let mut job = Job::new("escaped");
    let t = Instant::now();
    let st = job
        .launch(
            &["-n", "1"],
            r#"setsid sh -c 'echo $$ > "$T/escaped"; exec sleep 30' &
               i=0; while [ ! -s "$T/escaped" ] && [ $i -lt 100 ]; do sleep 0.05; i=$((i+1)); done
               echo done"#,
        )
        .wait(Duration::from_secs(8));
    assert!(st.success(), "{}", job.output());
    assert!(job.output().contains("[0] done"), "{}", job.output());
    assert!(
        t.elapsed() < Duration::from_secs(6),
        "took {:?}",
        t.elapsed()
    );
}

/// Ctrl-C is forwarded; the ranks it stops are not blamed, and the launcher
/// says it was interrupted.
#[test]
fn an_interrupted_launch_says_so() {
    let mut job = Job::new("interrupted");
    job.launch(
        &["-n", "2"],
        r#"echo $$ > "$T/pid.$MLX_RANK"; exec sleep 60"#,
    );
    let ranks = [job.pid("pid.0"), job.pid("pid.1")];
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGINT) };
    let st = job.wait(Duration::from_secs(8));
    assert_eq!(st.code(), Some(130), "{}", job.output());
    let last = job.last_stderr_line();
    assert!(last.contains("interrupted"), "{last:?}\n{}", job.output());
    // Every line of the launcher's own says whose it is (its warning that
    // it forwards the signal was a bare ` WARN ...`).
    let err = std::fs::read_to_string(job.path("launcher.err")).unwrap();
    assert!(err.lines().count() >= 2, "{err}");
    for line in err.lines() {
        assert!(line.starts_with("mlx-launch: "), "{line:?} in\n{err}");
    }
    for (r, pid) in ranks.into_iter().enumerate() {
        assert_gone(&job, &format!("rank {r}"), pid);
    }
}

/// Without `-n`, one process, as `mlx.launch` and torchrun start.
#[test]
fn one_process_by_default() {
    let mut job = Job::new("one-by-default");
    let st = job
        .launch(&[], r#"echo "rank $MLX_RANK of $MLX_WORLD_SIZE""#)
        .wait(Duration::from_secs(10));
    assert!(st.success(), "{}", job.output());
    assert!(job.output().contains("[0] rank 0 of 1"), "{}", job.output());
}

/// SIGTERM to the launcher (a cluster's preemption) reaches the ranks as
/// SIGTERM, not as Ctrl-C, and the launcher exits with 128 + SIGTERM, as a
/// trainer stopped by it does.
#[test]
fn sigterm_reaches_the_ranks_as_sigterm_and_the_launcher_exits_143() {
    let mut job = Job::new("sigterm");
    job.launch(
        &["-n", "2"],
        r#"trap 'echo TERM > "$T/got.$MLX_RANK"; exit 0' TERM
           trap 'echo INT > "$T/got.$MLX_RANK"; exit 0' INT
           echo $$ > "$T/pid.$MLX_RANK"
           while :; do sleep 0.1; done"#,
    );
    let ranks = [job.pid("pid.0"), job.pid("pid.1")];
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGTERM) };
    let st = job.wait(Duration::from_secs(10));
    assert_eq!(st.code(), Some(143), "{}", job.output());
    for (r, pid) in ranks.into_iter().enumerate() {
        let got = std::fs::read_to_string(job.path(&format!("got.{r}"))).unwrap_or_default();
        assert_eq!(got.trim(), "TERM", "rank {r}:\n{}", job.output());
        assert_gone(&job, &format!("rank {r}"), pid);
    }
}

/// Removes what a SIGKILLed launcher could not: its job files in the
/// temporary folder (`mlx-launch-<pid>-*`; the next launch would too).
/// Returns how many there were.
fn remove_job_files_of(pid: i32) -> usize {
    let prefix = format!("mlx-launch-{pid}-");
    let mut n = 0;
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let p = e.path();
            let _ = if p.is_dir() {
                std::fs::remove_dir_all(&p)
            } else {
                std::fs::remove_file(&p)
            };
            n += 1;
        }
    }
    n
}

/// The lines of `name` in the job's folder (a rank appends one per attempt).
fn lines_of(job: &Job, name: &str) -> Vec<String> {
    std::fs::read_to_string(job.path(name))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// A job that always fails is restarted `--max-restarts` times, each
/// attempt announced and told its number, and then exits with the failing
/// rank's code.
#[test]
fn a_job_that_always_fails_stops_after_its_restarts() {
    let mut job = Job::new("restarts-exhausted");
    let st = job
        .launch(
            &[
                "-n",
                "2",
                "--grace",
                "1",
                "--max-restarts",
                "2",
                "--restart-backoff",
                "0.1",
            ],
            r#"echo $$ > "$T/pid.$MLX_RANK"; echo "$MLX_RESTART_COUNT" >> "$T/attempts.$MLX_RANK"
               [ "$MLX_RANK" = 1 ] && exit 3; exec sleep 60"#,
        )
        .wait(Duration::from_secs(20));
    assert_eq!(st.code(), Some(3), "{}", job.output());
    for rank in 0..2 {
        assert_eq!(
            lines_of(&job, &format!("attempts.{rank}")),
            ["0", "1", "2"],
            "rank {rank}:\n{}",
            job.output()
        );
    }
    let out = job.output();
    for i in 1..=2 {
        let line = format!(
            "mlx-launch: rank 1 failed (exit status 3); restarting the job (restart {i} of 2) in"
        );
        assert!(out.contains(&line), "no line {line:?}:\n{out}");
    }
    assert!(!out.contains("restart 3 of"), "{out}");
    let last = job.last_stderr_line();
    assert!(
        last.contains("rank 1 failed (exit status 3) (after 2 restarts)"),
        "{last:?}\n{out}"
    );
}

/// A job that fails once and then succeeds exits 0 with one restart; the
/// second attempt has a new job identity (id and secret).
#[test]
fn a_job_that_fails_once_succeeds_on_its_restart() {
    let mut job = Job::new("restart-succeeds");
    let st = job
        .launch(
            &["-n", "2", "--grace", "1", "--max-restarts", "1", "--restart-backoff", "0.1"],
            r#"echo $$ > "$T/pid.$MLX_RANK"
               echo "$MLX_RESTART_COUNT $MLX_DIST_JOB_ID $MLX_DIST_JOB_SECRET" >> "$T/attempts.$MLX_RANK"
               [ "$MLX_RESTART_COUNT" = 1 ] && exit 0
               [ "$MLX_RANK" = 0 ] && exit 5; exec sleep 60"#,
        )
        .wait(Duration::from_secs(20));
    let out = job.output();
    assert_eq!(st.code(), Some(0), "{out}");
    assert!(
        out.contains("rank 0 failed (exit status 5); restarting the job (restart 1 of 1) in 0.1s"),
        "{out}"
    );
    let attempts = lines_of(&job, "attempts.0");
    assert_eq!(attempts.len(), 2, "{out}");
    let words: Vec<Vec<&str>> = attempts.iter().map(|l| l.split(' ').collect()).collect();
    assert_eq!((words[0][0], words[1][0]), ("0", "1"));
    assert_eq!(words[0][1].len(), 32, "a job id: {attempts:?}");
    assert_ne!(words[0][1], words[1][1], "the job id must be new");
    assert_ne!(words[0][2], words[1][2], "the job secret must be new");
    assert_eq!(
        lines_of(&job, "attempts.1"),
        attempts,
        "both ranks of an attempt agree"
    );
}

/// Ctrl-C (SIGINT to the launcher) stops the job without a restart.
#[test]
fn an_interrupted_job_is_not_restarted() {
    let mut job = Job::new("restart-interrupted");
    job.launch(
        &["-n", "2", "--max-restarts", "3", "--restart-backoff", "0.1"],
        r#"echo $$ > "$T/pid.$MLX_RANK"; echo "$MLX_RESTART_COUNT" >> "$T/attempts.$MLX_RANK"; exec sleep 60"#,
    );
    let ranks = [job.pid("pid.0"), job.pid("pid.1")];
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGINT) };
    let st = job.wait(Duration::from_secs(8));
    let out = job.output();
    assert_eq!(st.code(), Some(130), "{out}");
    assert!(!out.contains("restarting"), "{out}");
    // Give a wrongly restarted attempt the time to show up.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(lines_of(&job, "attempts.0"), ["0"], "{out}");
    for (r, pid) in ranks.into_iter().enumerate() {
        assert_gone(&job, &format!("rank {r}"), pid);
    }
}

/// Ctrl-C while the launcher waits to restart ends it at once, with 130.
#[test]
fn an_interrupt_during_the_backoff_stops_the_restarts() {
    let mut job = Job::new("restart-backoff-interrupted");
    job.launch(
        &["-n", "1", "--max-restarts", "2", "--restart-backoff", "30"],
        r#"echo "$MLX_RESTART_COUNT" >> "$T/attempts.$MLX_RANK"; exit 4"#,
    );
    assert!(
        eventually(Duration::from_secs(8), || job
            .output()
            .contains("restart 1 of 2) in 30.0s")),
        "no restart line:\n{}",
        job.output()
    );
    let t = Instant::now();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGINT) };
    let st = job.wait(Duration::from_secs(5));
    assert_eq!(st.code(), Some(130), "{}", job.output());
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(lines_of(&job, "attempts.0"), ["0"], "{}", job.output());
    assert!(
        job.last_stderr_line()
            .contains("interrupted before restarting"),
        "{}",
        job.output()
    );
}

/// Without `--max-restarts` a failed job is not restarted, and its ranks
/// see `MLX_RESTART_COUNT=0`; `--max-restarts` with mpirun is refused.
#[test]
fn without_max_restarts_nothing_is_restarted() {
    let mut job = Job::new("no-restarts");
    let st = job
        .launch(
            &["-n", "1"],
            r#"echo "$MLX_RESTART_COUNT" >> "$T/attempts.$MLX_RANK"; exit 4"#,
        )
        .wait(Duration::from_secs(8));
    assert_eq!(st.code(), Some(4), "{}", job.output());
    assert_eq!(lines_of(&job, "attempts.0"), ["0"]);
    assert!(!job.output().contains("restart"), "{}", job.output());
    let out = Command::new(LAUNCH)
        .args([
            "--backend",
            "mpi",
            "-n",
            "2",
            "--max-restarts",
            "1",
            "--",
            "true",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--max-restarts is not supported with --backend mpi"),
        "{err}"
    );
}

/// An option mistyped before the program is a usage error that suggests
/// the right one, not the program; a program's own options after it still
/// reach it, with or without `--`.
#[test]
fn an_unknown_option_before_the_program_is_a_usage_error() {
    let out = Command::new(LAUNCH)
        .args(["-n", "1", "--tme", "5", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("unexpected argument '--tme'"), "{err}");
    assert!(err.contains("--timeout"), "no suggestion: {err}");
    for args in [
        &["-n", "1", "echo", "--steps", "5"][..],
        &["-n", "1", "--", "echo", "--steps", "5"],
    ] {
        let out = Command::new(LAUNCH).args(args).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{args:?}: {out:?}");
        assert_eq!(text.trim(), "[0] --steps 5", "{args:?}");
    }
}

/// `--help` opens with what mlx-launch does (not the crate's description),
/// and `--version` answers.
#[test]
fn help_says_what_the_launcher_does_and_version_answers() {
    let out = Command::new(LAUNCH).arg("--help").output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(
        help.starts_with("Start a distributed mlx-dist program on several processes"),
        "{help}"
    );
    assert!(help.contains("--log-dir <DIR>"), "{help}");
    let out = Command::new(LAUNCH).arg("--version").output().unwrap();
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("mlx-launch {}", env!("CARGO_PKG_VERSION"))
    );
}

/// `--log-dir`: each rank's output, both streams and unprefixed, in a file
/// of its own, while the terminal still shows it prefixed; ranks learn
/// their rank on the host and how many ranks the host runs.
#[test]
fn log_dir_keeps_one_file_per_rank_and_ranks_know_their_local_rank() {
    let mut job = Job::new("log-dir");
    let logs = job.path("logs");
    let st = job
        .launch(
            &["-n", "2", "--log-dir", logs.to_str().unwrap()],
            r#"echo "out $MLX_RANK local $MLX_LOCAL_RANK of $MLX_LOCAL_WORLD_SIZE"; echo "err $MLX_RANK" >&2"#,
        )
        .wait(Duration::from_secs(10));
    assert!(st.success(), "{}", job.output());
    for r in 0..2 {
        let log = std::fs::read_to_string(logs.join(format!("rank-{r}.log"))).unwrap();
        let mut lines: Vec<&str> = log.lines().collect();
        lines.sort();
        assert_eq!(
            lines,
            [format!("err {r}"), format!("out {r} local {r} of 2")],
            "rank {r}'s log"
        );
        assert!(
            job.output()
                .contains(&format!("[{r}] out {r} local {r} of 2")),
            "{}",
            job.output()
        );
    }
}

/// When one rank fails, the launcher says why the others run on and for
/// how long before they are stopped.
#[test]
fn a_failure_says_why_and_how_long_the_others_run_on() {
    let mut job = Job::new("grace-note");
    let st = job
        .launch(
            &["-n", "2", "--grace", "1.5"],
            r#"if [ "$MLX_RANK" = 1 ]; then exit 3; fi; exec sleep 30"#,
        )
        .wait(Duration::from_secs(10));
    assert_eq!(st.code(), Some(3), "{}", job.output());
    let out = job.output();
    assert!(
        out.contains(
            "rank 1 failed (exit status 3); the others run on for 1.5 s (--grace) so that they can notice the failure and report whom they blame, then get SIGTERM, and SIGKILL 2 s later"
        ),
        "{out}"
    );
}

/// A stand-in for ssh that runs the remote command on this machine, so
/// that ranks go through the agent and its control channel.
fn fake_ssh(dir: &Path) -> PathBuf {
    let p = dir.join("fake-ssh");
    std::fs::write(
        &p,
        "#!/bin/sh\n# ssh -G (configuration): say nothing.\nfor a; do [ \"$a\" = -G ] && exit 1; last=\"$a\"; done\nexec /bin/sh -c \"$last\"\n",
    )
    .unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    p
}

/// A process killed when the test ends, passed or not.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `mlx-launch` on two "remote" ranks with `yes` as its standard
/// input: rank 0 never reads it.
fn launch_fed(job: &mut Job, args: &[&str], script: &str) -> KillOnDrop {
    let ssh = fake_ssh(&job.dir);
    let mut yes = Command::new("yes").stdout(Stdio::piped()).spawn().unwrap();
    let child = Command::new(LAUNCH)
        .args(["--hosts", "fakehost1,fakehost2", "--starting-port", "40000"])
        .args(args)
        .args(["--", "/bin/sh", "-c", script])
        .env("T", &job.dir)
        .env("MLX_LAUNCH_SSH", ssh)
        .stdin(yes.stdout.take().unwrap())
        .stdout(File::create(job.path("launcher.out")).unwrap())
        .stderr(File::create(job.path("launcher.err")).unwrap())
        .spawn()
        .unwrap();
    job.launcher = Some(child);
    KillOnDrop(yes)
}

/// Input that rank 0 never reads fills every pipe on its way; the signals
/// behind it still get through: rank 1's failure ends the job promptly,
/// with rank 1's status.
#[test]
fn input_a_remote_rank_never_reads_does_not_hold_up_a_failure() {
    let mut job = Job::new("input-failure");
    let yes = launch_fed(
        &mut job,
        &["--grace", "1"],
        r#"echo $$ > "$T/pid.$MLX_RANK"; if [ "$MLX_RANK" = 1 ]; then sleep 1; exit 3; fi; exec sleep 30"#,
    );
    let st = job.wait(Duration::from_secs(15));
    drop(yes);
    assert_eq!(st.code(), Some(3), "{}", job.output());
    assert!(
        job.last_stderr_line().contains("rank 1 failed"),
        "{}",
        job.output()
    );
}

/// Ctrl-C while input is pending for a rank that does not read it: the
/// job stops at once.
#[test]
fn ctrl_c_works_while_input_is_pending() {
    let mut job = Job::new("input-ctrl-c");
    let yes = launch_fed(
        &mut job,
        &[],
        r#"echo $$ > "$T/pid.$MLX_RANK"; exec sleep 30"#,
    );
    let ranks = [job.pid("pid.0"), job.pid("pid.1")];
    // Time for the input to fill the pipes.
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGINT) };
    let st = job.wait(Duration::from_secs(10));
    drop(yes);
    assert_eq!(st.code(), Some(130), "{}", job.output());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "took {:?}",
        t.elapsed()
    );
    for (r, pid) in ranks.into_iter().enumerate() {
        assert_gone(&job, &format!("rank {r}"), pid);
    }
}

/// Starts `mlx-launch --hosts fakehost1,fakehost2 ARGS -- /bin/sh -c
/// SCRIPT` through the stand-in for ssh: each rank goes through its agent.
fn launch_remote(job: &mut Job, args: &[&str], script: &str, env: &[(&str, &Path)]) {
    let ssh = fake_ssh(&job.dir);
    let child = Command::new(LAUNCH)
        .args(["--hosts", "fakehost1,fakehost2", "--starting-port", "40100"])
        .args(args)
        .args(["--", "/bin/sh", "-c", script])
        .env("T", &job.dir)
        .env("MLX_LAUNCH_SSH", ssh)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(File::create(job.path("launcher.out")).unwrap())
        .stderr(File::create(job.path("launcher.err")).unwrap())
        .spawn()
        .unwrap();
    job.launcher = Some(child);
}

/// SIGKILL to the launcher ends the whole process tree of every rank:
/// the rank, its child and its child's child (`sh -c 'sleep 97 & ...'`),
/// which used to be left running under pid 1.
#[test]
fn a_sigkilled_launcher_ends_the_whole_process_tree_of_each_rank() {
    let mut job = Job::new("tree-killed");
    job.launch(
        &["-n", "2"],
        r#"sh -c 'sleep 97 & echo $! > "$T/child.grand.$MLX_RANK"; exec sleep 97' &
           echo $! > "$T/child.$MLX_RANK"
           echo $$ > "$T/pid.$MLX_RANK"; exec sleep 60"#,
    );
    let mut tree = Vec::new();
    for r in 0..2 {
        for what in ["pid", "child", "child.grand"] {
            tree.push((
                format!("rank {r}'s {what}"),
                job.pid(&format!("{what}.{r}")),
            ));
        }
    }
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGKILL) };
    job.wait(Duration::from_secs(5));
    remove_job_files_of(job.launcher_pid());
    for (what, pid) in tree {
        assert_gone(&job, &what, pid);
    }
}

/// This process's peak resident memory in bytes (Linux: VmHWM).
fn peak_rss(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    kb << 10
}

/// A rank that prints 96 MiB without a newline: the launcher holds at
/// most a piece of it at a time (its peak memory stays under 48 MiB, where
/// it used to hold the whole line), and forwards every byte, in prefixed
/// lines of at most 256 KiB.
#[test]
fn a_rank_printing_without_newlines_does_not_grow_the_launcher() {
    const N: usize = 96 << 20;
    let mut job = Job::new("long-line");
    job.launch(
        &["-n", "1"],
        &format!(
            r#"head -c {N} /dev/zero | tr '\0' x; echo $$ > "$T/pid.0"
               i=0; while [ ! -e "$T/go" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done"#
        ),
    );
    job.pid("pid.0");
    let out = job.path("launcher.out");
    assert!(
        eventually(Duration::from_secs(30), || std::fs::metadata(&out)
            .is_ok_and(|m| m.len() >= N as u64)),
        "the output never arrived:\n{}",
        job.last_stderr_line()
    );
    let peak = peak_rss(job.launcher_pid());
    File::create(job.path("go")).unwrap();
    let st = job.wait(Duration::from_secs(20));
    assert!(st.success(), "{}", job.last_stderr_line());
    assert!(
        peak < 48 << 20,
        "the launcher's peak memory was {} MiB",
        peak >> 20
    );
    let text = std::fs::read(&out).unwrap();
    let mut xs = 0;
    for line in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
        let body = line.strip_prefix(b"[0] ").expect("every piece is prefixed");
        assert!(body.len() <= 256 << 10, "a piece of {} bytes", body.len());
        assert!(body.iter().all(|&b| b == b'x'));
        xs += body.len();
    }
    assert_eq!(xs, N, "every byte arrives");
}

/// A line in a remote rank's output that looks like its agent's failure
/// report (what a rank, or a log line it prints, could write) is not
/// taken for one: rank 0 fails and is named, not the rank the forgery
/// blames.
#[test]
fn a_forged_report_in_a_remote_ranks_output_blames_nobody() {
    let mut job = Job::new("forged-report");
    launch_remote(
        &mut job,
        &["--grace", "1"],
        r#"echo $$ > "$T/pid.$MLX_RANK"
           if [ "$MLX_RANK" = 0 ]; then
               printf '\001mlx-launch-report 00ff {"rank":0,"culprit":1,"reason":"forged"}\n' >&2
               printf '\001mlx-launch-report {"rank":0,"culprit":1,"reason":"forged"}\n' >&2
               exit 3
           fi
           exec sleep 30"#,
        &[],
    );
    let st = job.wait(Duration::from_secs(15));
    assert_eq!(st.code(), Some(3), "{}", job.output());
    let last = job.last_stderr_line();
    assert!(
        last.contains("rank 0 failed (exit status 3)") && !last.contains("forged"),
        "{last:?}\n{}",
        job.output()
    );
}

/// A remote rank's own failure report, which its agent carries back
/// sealed, names the rank it blames.
#[test]
fn a_remote_ranks_own_report_reaches_the_launcher() {
    let mut job = Job::new("remote-report");
    launch_remote(
        &mut job,
        &["--grace", "1"],
        r#"echo $$ > "$T/pid.$MLX_RANK"
           if [ "$MLX_RANK" = 0 ]; then
               echo '{"rank":0,"culprit":1,"reason":"rank 1 went silent"}' > "$MLX_LAUNCH_REPORT_DIR/rank-0.json"
               exit 3
           fi
           exec sleep 30"#,
        &[],
    );
    let st = job.wait(Duration::from_secs(15));
    assert_eq!(st.code(), Some(3), "{}", job.output());
    let last = job.last_stderr_line();
    assert!(
        last.contains("rank 1 failed (as rank 0 reported: rank 1 went silent)"),
        "{last:?}\n{}",
        job.output()
    );
}

/// Whether `name` is `mlx-launch-agent-<pid>-<rank>-` and 16 hex digits.
fn unguessable_agent_folder(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("mlx-launch-agent-") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    parts.len() == 3
        && parts[..2]
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        && parts[2].len() == 16
        && parts[2].bytes().all(|b| b.is_ascii_hexdigit())
}

/// The folder where a rank writes its reports, local or remote (made by
/// its agent), is new, this user's, a folder (not a link) with mode 0700,
/// and a remote one's name has a random part; it is gone after the job.
#[test]
fn the_ranks_report_folders_are_private_and_unguessable() {
    let script = r#"echo "$MLX_LAUNCH_REPORT_DIR" > "$T/dir.$MLX_RANK"; echo $$ > "$T/pid.$MLX_RANK"
                    i=0; while [ ! -e "$T/go" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done"#;
    for remote in [false, true] {
        let mut job = Job::new(if remote {
            "private-remote"
        } else {
            "private-local"
        });
        if remote {
            launch_remote(&mut job, &[], script, &[]);
        } else {
            job.launch(&["-n", "2"], script);
        }
        let mut dirs = Vec::new();
        for r in 0..2 {
            job.pid(&format!("pid.{r}"));
            let d = PathBuf::from(
                std::fs::read_to_string(job.path(&format!("dir.{r}")))
                    .unwrap()
                    .trim(),
            );
            let m = std::fs::symlink_metadata(&d).unwrap();
            use std::os::unix::fs::MetadataExt;
            assert!(m.file_type().is_dir(), "{}", d.display());
            assert_eq!(m.mode() & 0o777, 0o700, "{}", d.display());
            // SAFETY: geteuid has no preconditions.
            assert_eq!(m.uid(), unsafe { libc::geteuid() });
            let name = d.file_name().unwrap().to_string_lossy().into_owned();
            if remote {
                assert!(unguessable_agent_folder(&name), "{name}");
            }
            dirs.push(d);
        }
        File::create(job.path("go")).unwrap();
        let st = job.wait(Duration::from_secs(15));
        assert!(st.success(), "{}", job.output());
        for d in dirs {
            assert!(!d.exists(), "{} is left behind", d.display());
        }
    }
}

/// Environment variable: the checkpoint time, in milliseconds, of the
/// simulated trainer that [`slow_checkpoint_rank`] runs.
const SLOW_CHECKPOINT_MS: &str = "MLX_TEST_SLOW_CHECKPOINT_MS";

/// Set by the SIGINT and SIGTERM handler of [`slow_checkpoint_rank`].
static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn ask_to_stop(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::SeqCst);
}

/// A rank when [`SLOW_CHECKPOINT_MS`] is set (this test binary re-run by
/// mlx-launch), a trainer in miniature: steps of 200 ms, each reported to
/// the launcher as mlx-llama reports its own (`mlx_dist::report`), as is
/// its last checkpoint; on SIGINT it finishes its step, writes a
/// checkpoint that takes that long (`$T/checkpoint.<rank>`) and exits 0.
#[test]
fn slow_checkpoint_rank() {
    let Some(ms) = std::env::var(SLOW_CHECKPOINT_MS).ok() else {
        return;
    };
    let checkpoint = Duration::from_millis(ms.parse().unwrap());
    let dir = PathBuf::from(std::env::var("T").unwrap());
    let rank = std::env::var("MLX_RANK").unwrap();
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic.
        unsafe { libc::signal(sig, ask_to_stop as *const () as libc::sighandler_t) };
    }
    // As a trainer after its first checkpoint (which this one skips).
    mlx_dist::report::checkpoint_took(checkpoint);
    loop {
        let t = Instant::now();
        std::thread::sleep(Duration::from_millis(200));
        mlx_dist::report::step_took(t.elapsed());
        std::fs::write(dir.join(format!("ready.{rank}")), "").unwrap();
        if STOP.load(std::sync::atomic::Ordering::SeqCst) {
            println!("stopping: writing a checkpoint");
            std::thread::sleep(checkpoint);
            std::fs::write(dir.join(format!("checkpoint.{rank}")), "").unwrap();
            println!("checkpoint written");
            return;
        }
    }
}

/// Starts two ranks of [`slow_checkpoint_rank`] with a checkpoint of
/// `checkpoint_ms`, locally or through their agents, and interrupts the
/// launcher once both have reported a step.
fn interrupt_slow_checkpoints(job: &mut Job, remote: bool, args: &[&str], checkpoint_ms: u64) {
    let exe = std::env::current_exe().unwrap();
    let ms = PathBuf::from(checkpoint_ms.to_string());
    let env = [
        ("TEST_EXE", exe.as_path()),
        (SLOW_CHECKPOINT_MS, ms.as_path()),
    ];
    let script = r#"echo $$ > "$T/pid.$MLX_RANK"; exec "$TEST_EXE" --exact slow_checkpoint_rank --nocapture --test-threads=1"#;
    if remote {
        launch_remote(job, args, script, &env);
    } else {
        let mut all = vec!["-n", "2"];
        all.extend_from_slice(args);
        job.launch_with(&all, script, &env);
    }
    assert!(
        eventually(Duration::from_secs(20), || (0..2)
            .all(|r| job.path(&format!("ready.{r}")).exists())),
        "the ranks never reported a step:\n{}",
        job.output()
    );
    // SAFETY: kill(2) on the launcher this test started.
    unsafe { libc::kill(job.launcher_pid(), libc::SIGINT) };
}

/// Ctrl-C (as Slurm's preemption, SIGTERM) to a job whose checkpoint takes
/// 9 s, past the 8 s the launcher used to wait before SIGKILL: the ranks
/// reported their step and checkpoint durations, the launcher waits for
/// them, and every rank writes its checkpoint; local ranks and remote
/// ones (whose agents carry their durations back) alike.
#[test]
fn ctrl_c_waits_for_a_checkpoint_slower_than_the_liveness_grace() {
    for remote in [false, true] {
        let mut job = Job::new(if remote {
            "slow-ckpt-remote"
        } else {
            "slow-ckpt-local"
        });
        interrupt_slow_checkpoints(&mut job, remote, &[], 9000);
        let st = job.wait(Duration::from_secs(40));
        let out = job.output();
        assert_eq!(st.code(), Some(130), "remote {remote}:\n{out}");
        for r in 0..2 {
            assert!(
                job.path(&format!("checkpoint.{r}")).exists(),
                "remote {remote}: rank {r} was killed before its checkpoint:\n{out}"
            );
        }
        assert!(
            out.contains("to stop (the slowest rank's last step and checkpoint took 9"),
            "remote {remote}:\n{out}"
        );
    }
}

/// The wait is bounded by `--grace`: with `--grace 3` the ranks of a 9 s
/// checkpoint are killed after 3 s, and the launcher says why.
#[test]
fn the_wait_for_a_slow_checkpoint_is_bounded_by_grace() {
    let mut job = Job::new("slow-ckpt-bounded");
    interrupt_slow_checkpoints(&mut job, false, &["--grace", "3"], 9000);
    let st = job.wait(Duration::from_secs(20));
    let out = job.output();
    assert_eq!(st.code(), Some(130), "{out}");
    assert!(!job.path("checkpoint.0").exists(), "{out}");
    assert!(
        out.contains("the ranks have 3 s to stop (--grace; they would need"),
        "{out}"
    );
}
