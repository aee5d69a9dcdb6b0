//! The collective suite over MPI (feature `mpi`): real ranks started by
//! `mlx-launch --backend mpi`, which runs Open MPI's `mpirun`, at world 2
//! and 4. The ranks are this test binary itself, running the scenarios of
//! `scenarios/mod.rs` that the ring and quic tests run too.
//!
//! Without `mpirun` on the PATH the tests say so and pass, unless `CI` is
//! set: CI installs Open MPI and must run them.
#![cfg(feature = "mpi")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod scenarios;

use scenarios::{FAULT_DIR, SCENARIO};

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

/// Rank 1 fails before the first collective (`how`: a panic, or an exit
/// with a failure status) while rank 0 waits in it: the failed rank aborts
/// the job, so mpirun ends rank 0 too and the launch fails within seconds,
/// instead of rank 1 waiting in `MPI_Finalize` and rank 0 in the collective
/// for ever.
fn a_failing_rank_ends_the_job(how: &str) {
    if !have_mpirun() {
        return;
    }
    let dir = std::env::temp_dir().join(format!("mlx-mpi-abort-{how}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join("launch.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-launch"))
        .args(["--backend", "mpi", "-n", "2"])
        .args(["--env", &format!("{SCENARIO}=fail_early_{how}")])
        .args(["--env", &format!("{FAULT_DIR}={}", dir.display())])
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args(scenarios::RANK_ARGS)
        .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
        .stderr(Stdio::from(
            std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
        ))
        .spawn()
        .unwrap();
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > Duration::from_secs(60) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let took = t.elapsed();
    // Whatever is left (the job hung): SIGINT to the launcher, which mpirun
    // forwards, then SIGKILL to everything the ranks recorded.
    if status.is_none() {
        // SAFETY: signals to processes this test started.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        std::thread::sleep(Duration::from_secs(2));
        let _ = child.kill();
        let _ = child.wait();
    }
    for r in 0..2 {
        let pid = std::fs::read_to_string(dir.join(format!("pid-{r}")));
        if let Some(pid) = pid.ok().and_then(|p| p.trim().parse::<i32>().ok())
            && pid > 1
        {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    let status = status.unwrap_or_else(|| panic!("{how}: the job hung for {took:?}:\n{text}"));
    assert!(!status.success(), "{how}: the job succeeded:\n{text}");
    assert!(
        took < Duration::from_secs(30),
        "{how}: the job took {took:?} to end:\n{text}"
    );
    assert!(
        !text.contains("FAIL_EARLY rank 0 left the collective: Ok"),
        "{how}: rank 0 completed a collective without rank 1:\n{text}"
    );
}

#[test]
fn a_rank_that_panics_before_a_collective_aborts_the_job() {
    a_failing_rank_ends_the_job("panic");
}

#[test]
fn a_rank_that_exits_with_a_failure_before_a_collective_aborts_the_job() {
    a_failing_rank_ends_the_job("exit");
}
