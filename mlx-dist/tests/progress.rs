//! The ranks' progress through the real `mlx-launch`: plain lines when the
//! launcher's stderr is a file or a pipe, bars when it is a terminal (a
//! pseudo-terminal made by util-linux's `script`). The ranks are this test
//! binary: `rank_progress` reports a small task when `MLX_PROGRESS_TEST_RANK`
//! is set, and does nothing in a normal test run.

use std::process::Command;
use std::time::Duration;

use mlx_progress::{MARKER, Task, Unit};

const LAUNCH: &str = env!("CARGO_BIN_EXE_mlx-launch");

/// Set for the ranks only.
const ROLE: &str = "MLX_PROGRESS_TEST_RANK";

#[test]
fn rank_progress() {
    if std::env::var_os(ROLE).is_none() {
        return;
    }
    let rank = std::env::var("MLX_RANK").unwrap_or_default();
    let task = Task::new("copying", Some(8 << 20), Unit::Bytes);
    for i in 1..=8 {
        std::thread::sleep(Duration::from_millis(80));
        task.inc(1 << 20);
        task.set_message(format!("{i} files"));
    }
    task.println(format!("rank {rank} says hello"));
    task.finish();
}

/// The launcher's command line: two ranks running [`rank_progress`].
fn launch_args() -> Vec<String> {
    let exe = std::env::current_exe().unwrap();
    let mut a: Vec<String> = ["-n", "2", "--"].map(String::from).to_vec();
    a.push(exe.display().to_string());
    a.extend(
        [
            "--exact",
            "rank_progress",
            "--nocapture",
            "--test-threads",
            "1",
            "-q",
        ]
        .map(String::from),
    );
    a
}

/// The launcher, with the ranks' role and a short plain-line interval, and
/// no progress mode of the test's own environment.
fn launcher(program: &str) -> Command {
    let mut c = Command::new(program);
    c.env(ROLE, "1")
        .env("MLX_PROGRESS_INTERVAL", "0.2")
        .env_remove("MLX_PROGRESS")
        .env_remove("NO_COLOR");
    c
}

#[test]
fn ranks_print_plain_lines_when_the_launcher_output_is_not_a_terminal() {
    let out = launcher(LAUNCH).args(launch_args()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "mlx-launch failed:\n{err}");
    assert!(
        !err.contains('\x1b'),
        "ANSI escape in the plain output:\n{err:?}"
    );
    assert!(
        !err.contains(MARKER.trim_end()),
        "an event line came through:\n{err:?}"
    );
    for r in 0..2 {
        let lines: Vec<&str> = err
            .lines()
            .filter(|l| l.starts_with(&format!("[{r}] progress task=\"copying\" unit=bytes")))
            .collect();
        assert!(
            lines[0].ends_with(" state=started total=8.0MiB"),
            "rank {r}'s first line: {:?}\n{err}",
            lines[0]
        );
        let last = lines.last().unwrap();
        assert!(
            last.contains(" state=finished done=8.0MiB total=8.0MiB pct=100 rate=")
                && last.ends_with(" msg=\"8 files\""),
            "rank {r}'s last line: {last:?}"
        );
        // About 640 ms of work at one line per 200 ms at most: a few lines
        // in between, each with a rate and an ETA.
        let between = &lines[1..lines.len() - 1];
        assert!((1..=4).contains(&between.len()), "rank {r}: {between:#?}");
        assert!(
            between
                .iter()
                .all(|l| l.contains(" rate=") && l.contains(" eta=")),
            "{between:#?}"
        );
        assert!(
            err.contains(&format!("[{r}] rank {r} says hello\n")),
            "{err}"
        );
    }
}

/// A shell word for `s` (for `script`, whose test is Linux's).
#[cfg(target_os = "linux")]
fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(target_os = "linux")]
#[test]
fn the_launcher_draws_the_ranks_events_as_bars_on_a_terminal() {
    let mut line = sh_quote(LAUNCH);
    for a in launch_args() {
        line = format!("{line} {}", sh_quote(&a));
    }
    // `script` runs the launcher on a pseudo-terminal and copies all it
    // writes there (stdout and stderr) to its own stdout.
    let out = launcher("script")
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .env("TERM", "xterm")
        .output()
        .expect(
            "running util-linux's `script` (Debian: bsdutils), which gives the launcher a terminal",
        );
    let seen = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mlx-launch under script failed:\n{seen}"
    );
    assert!(
        !seen.contains(MARKER.trim_end()),
        "an event line was printed raw:\n{seen:?}"
    );
    assert!(
        !seen.contains("progress task="),
        "the ranks wrote plain lines, not events:\n{seen:?}"
    );
    for r in 0..2 {
        // A bar while the task ran, a line when it finished, and the rank's
        // own text in between.
        assert!(
            seen.contains(&format!("[{r}] copying [")) && seen.contains("/8.0MiB"),
            "no bar for rank {r}:\n{seen:?}"
        );
        assert!(
            seen.contains(&format!("[{r}] copying: 8.0MiB in ")),
            "no summary line for rank {r}:\n{seen:?}"
        );
        assert!(
            seen.contains(&format!("[{r}] rank {r} says hello")),
            "rank {r}'s text is missing:\n{seen:?}"
        );
    }
}
