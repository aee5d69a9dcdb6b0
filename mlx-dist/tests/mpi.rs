//! The collective suite over MPI (feature `mpi`): real ranks started by
//! `mlx-launch --backend mpi`, which runs Open MPI's `mpirun`, at world 2
//! and 4. The ranks are this test binary itself, running the scenarios of
//! `scenarios/mod.rs` that the ring and quic tests run too.
//!
//! Without `mpirun` on the PATH the tests say so and pass, unless `CI` is
//! set: CI installs Open MPI and must run them.
#![cfg(feature = "mpi")]

use std::process::Command;

mod scenarios;

use scenarios::SCENARIO;

/// Whether `mpirun` can run here; panics in CI when it cannot.
fn have_mpirun() -> bool {
    let ok = Command::new("mpirun")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI is set but mpirun cannot run: install Open MPI (libopenmpi-dev openmpi-bin)"
        );
        eprintln!("skipping: mpirun is not installed (Debian: libopenmpi-dev openmpi-bin)");
    }
    ok
}

fn assert_scenario_ok(n: usize, scenario: &str) {
    if !have_mpirun() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-launch"))
        .args(["--backend", "mpi", "-n", &n.to_string()])
        .args(["--env", &format!("{SCENARIO}={scenario}")])
        .arg("--")
        .arg(exe)
        .args(scenarios::RANK_ARGS)
        .output()
        .unwrap();
    let t = scenarios::output_text(&out);
    assert!(out.status.success(), "mpirun world {n} failed:\n{t}");
    for r in 0..n {
        assert!(
            t.contains(&format!("[{r}] RANK {r} OK (mpi")),
            "rank {r} missing:\n{t}"
        );
    }
}

#[test]
fn rank_main() {
    scenarios::run_scenario()
}

#[test]
fn every_collective_world_2() {
    assert_scenario_ok(2, "all");
}

#[test]
fn every_collective_world_4() {
    assert_scenario_ok(4, "all");
}

#[test]
fn arrays_world_2() {
    assert_scenario_ok(2, "arrays");
}

#[test]
fn arrays_world_4() {
    assert_scenario_ok(4, "arrays");
}

#[test]
fn without_a_launcher_mpi_is_a_world_of_one() {
    // MPI singleton start-up: no mpirun, one rank; every collective is the identity.
    if !have_mpirun() {
        return;
    }
    if std::env::var_os(SCENARIO).is_some() {
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "rank_main", "--nocapture", "-q"])
        .env(SCENARIO, "single")
        .output()
        .unwrap();
    let t = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && t.contains("SINGLE OK"),
        "{t}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
