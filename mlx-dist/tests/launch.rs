//! Multi-process tests: real ranks started by the real `mlx-launch`.
//!
//! The ranks are this test binary itself: `mlx-launch` re-runs it with
//! `--exact rank_main` and `MLX_DIST_TEST_SCENARIO` set, and `rank_main`
//! runs that scenario (it does nothing in a normal test run).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

mod scenarios;

use scenarios::SCENARIO;

fn launch(n: usize, scenario: &str, extra: &[&str]) -> (Output, Duration) {
    let exe = std::env::current_exe().unwrap();
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-launch"))
        .args([
            "-n",
            &n.to_string(),
            "--env",
            &format!("{SCENARIO}={scenario}"),
        ])
        .args(extra)
        .arg("--")
        .arg(exe)
        .args(scenarios::RANK_ARGS)
        .output()
        .unwrap();
    (out, t.elapsed())
}

use scenarios::output_text as text;

#[test]
fn rank_main() {
    scenarios::run_scenario()
}

fn assert_all_ok(n: usize, extra: &[&str]) -> String {
    assert_scenario_ok(n, "all", extra)
}

/// Asserts that every rank of the "all" scenario's output reached `peers`
/// of its peers through shared memory.
fn assert_shm_peers(t: &str, n: usize, peers: usize) {
    for r in 0..n {
        assert!(
            t.contains(&format!("[{r}] RANK {r} OK")) && t.contains(&format!("shm peers {peers})")),
            "rank {r} should share memory with {peers} peers:\n{t}"
        );
    }
}

fn assert_scenario_ok(n: usize, scenario: &str, extra: &[&str]) -> String {
    let (out, took) = launch(n, scenario, extra);
    let t = text(&out);
    assert!(out.status.success(), "world {n} failed:\n{t}");
    for r in 0..n {
        assert!(
            t.contains(&format!("[{r}] RANK {r} OK")),
            "rank {r} missing:\n{t}"
        );
    }
    eprintln!("world {n}: {took:?}");
    t
}

/// The suite runs on every transport this build has: `ring`, (feature `tls`)
/// `tls` and (feature `quic`) `quic`.
macro_rules! on_backends {
    ($($name:ident => $body:expr;)*) => {
        mod ring {
            use super::*;
            $(#[test] fn $name() { let _ = ($body)("ring"); })*
        }
        #[cfg(feature = "tls")]
        mod tls {
            use super::*;
            $(#[test] fn $name() { let _ = ($body)("tls"); })*
        }
        #[cfg(feature = "quic")]
        mod quic {
            use super::*;
            $(#[test] fn $name() { let _ = ($body)("quic"); })*
        }
    };
}

on_backends! {
    every_collective_world_2_two_connections => |b| assert_all_ok(2, &["--backend", b, "--connections-per-peer", "2"]);
    every_collective_world_3 => |b| {
        let t = assert_all_ok(3, &["--backend", b]);
        // Ranks on one host share memory over the ring; TLS and QUIC stay encrypted end to end.
        assert_shm_peers(&t, 3, if b == "ring" { 2 } else { 0 });
    };
    every_collective_world_4 => |b| assert_all_ok(4, &["--backend", b]);
    arrays_world_2 => |b| assert_scenario_ok(2, "arrays", &["--backend", b]);
    arrays_world_3 => |b| assert_scenario_ok(3, "arrays", &["--backend", b]);
    arrays_world_4 => |b| assert_scenario_ok(4, "arrays", &["--backend", b]);
    killed_rank_is_named_and_launcher_fails => |b| killed_rank_is_named(b, 3);
    killed_rank_is_named_by_every_survivor_world_4 => |b| killed_rank_is_named(b, 4);
    mismatched_sizes_are_an_error_on_every_rank => mismatched_sizes;
}

/// The ring with shared memory turned off: every byte over TCP, the
/// threaded ring included, and a killed rank still named.
#[test]
fn ring_over_tcp_only() {
    let t = assert_all_ok(3, &["--backend", "ring", "--env", "MLX_DIST_SHM=0"]);
    assert_shm_peers(&t, 3, 0);
    killed_rank_is_named_with(3, &["--backend", "ring", "--env", "MLX_DIST_SHM=0"]);
}

fn killed_rank_is_named(backend: &str, n: usize) {
    killed_rank_is_named_with(n, &["--backend", backend]);
}

fn killed_rank_is_named_with(n: usize, extra: &[&str]) {
    let args: Vec<&str> = extra.iter().copied().chain(["--timeout", "10"]).collect();
    let (out, took) = launch(n, "kill", &args);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("rank 1 failed"),
        "launcher must name rank 1:\n{t}"
    );
    // Every survivor names rank 1, also one that only saw the other
    // survivor's links close (that survivor's witness says whom it blamed).
    for r in (0..n).filter(|&r| r != 1) {
        let line = t
            .lines()
            .find(|l| l.starts_with(&format!("[{r}] KILLTEST")))
            .unwrap_or_else(|| panic!("rank {r} did not report:\n{t}"));
        assert!(
            line.contains("culprit=Some(1)") && line.contains("rank 1"),
            "rank {r} must name rank 1: {line}\n{t}"
        );
    }
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

fn mismatched_sizes(backend: &str) {
    let (out, _) = launch(3, "mismatch", &["--backend", backend]);
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    for r in 0..3 {
        assert!(
            t.contains(&format!("[{r}] MISMATCH rank {r} named=true")),
            "rank {r}:\n{t}"
        );
    }
}

#[test]
fn launcher_reports_a_failing_program() {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-launch"))
        .args([
            "-n",
            "2",
            "--",
            "sh",
            "-c",
            "echo hi from $MLX_RANK; exit $MLX_RANK",
        ])
        .output()
        .unwrap();
    let t = text(&out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("[0] hi from 0") && t.contains("[1] hi from 1"),
        "{t}"
    );
    assert!(t.contains("rank 1 failed (exit status 1)"), "{t}");
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-launch"))
        .args([
            "-n",
            "2",
            "--no-prefix",
            "--env",
            "X=y",
            "--",
            "sh",
            "-c",
            "echo $X$MLX_WORLD_SIZE",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "y2\ny2\n");
}

/// `--env-from NAME` gives the ranks the launcher's own value of NAME (no
/// value on the command line; remote ranks get it in their order, as
/// `--env` values); a name that is not set is an error naming it.
#[test]
fn env_from_passes_a_variable_by_name() {
    let run = |names: &[&str]| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-launch"));
        c.args(["-n", "1", "--no-prefix"]);
        for n in names {
            c.args(["--env-from", n]);
        }
        c.args(["--", "sh", "-c", "echo \"token=$MLX_TEST_TOKEN\""])
            .env("MLX_TEST_TOKEN", "t0ken")
            .env_remove("MLX_TEST_UNSET")
            .output()
            .unwrap()
    };
    let out = run(&["MLX_TEST_TOKEN"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "token=t0ken\n");
    let out = run(&["MLX_TEST_TOKEN", "MLX_TEST_UNSET"]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("--env-from MLX_TEST_UNSET") && t.contains("not set"),
        "{t}"
    );
}
