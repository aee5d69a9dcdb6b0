//! The fault-injection suite: real ranks through the real `mlx-launch`, one
//! of them SIGKILLed or SIGSTOPped in the middle of a loop of collectives,
//! for worlds 2, 3 and 4, ring and QUIC, and message sizes that reach every
//! path (1 KiB: direct exchange; 256 KiB: the polled ring; 4 MiB: the
//! threaded ring and shared memory; 64 MiB: the same, long). Every survivor
//! must fail with an error naming that rank within the liveness timeout plus
//! 2 s, the launcher must exit non-zero naming it, and no process or
//! shared-memory segment may be left. Also: a rank busy far longer than the
//! liveness timeout fails nothing, ranks that exit right after their last
//! collective fail nobody, and a soak of 10,000 random collectives.
//!
//! The timeouts are shortened through the launcher's configuration
//! (`--liveness-timeout 2`), not by special cases in the code. The runs
//! are serialised: detection times are only meaningful on a quiet machine.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod scenarios;

use scenarios::{FAULT_BYTES, FAULT_DIR, SCENARIO};

/// The liveness timeout of every run of this suite.
const LIVENESS: Duration = Duration::from_secs(2);

/// One run at a time: the timings are the point.
static SERIAL: Mutex<()> = Mutex::new(());

#[test]
fn rank_main() {
    scenarios::run_scenario()
}

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// `mlx-launch` running this binary's `rank_main` as each rank.
fn launcher(n: usize, scenario: &str, env: &[(&str, String)], extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-launch"));
    c.args(["-n", &n.to_string(), "--liveness-timeout"])
        .arg(LIVENESS.as_secs_f64().to_string())
        .args(["--env", &format!("{SCENARIO}={scenario}")]);
    for (k, v) in env {
        c.args(["--env", &format!("{k}={v}")]);
    }
    c.args(extra)
        .arg("--")
        .arg(std::env::current_exe().unwrap())
        .args(scenarios::RANK_ARGS);
    c
}

fn alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    unsafe { libc::kill(pid, 0) == 0 }
}

fn signal(pid: i32, sig: i32) {
    // SAFETY: a pid this test read from a rank it started.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// Kills what a run left (also when an assertion fails) and removes its folder.
struct Run {
    dir: PathBuf,
    launcher: Option<Child>,
}

impl Run {
    fn pids(&self) -> Vec<i32> {
        pids_in(&self.dir)
    }
}

fn pids_in(dir: &Path) -> Vec<i32> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("pid-"))
                .filter_map(|e| std::fs::read_to_string(e.path()).ok()?.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

impl Drop for Run {
    fn drop(&mut self) {
        if let Some(l) = &mut self.launcher {
            let _ = l.kill();
            let _ = l.wait();
        }
        for p in self.pids() {
            signal(p, libc::SIGKILL);
            signal(p, libc::SIGCONT);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn fresh_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!(
        "mlx-faults-{}-{tag}-{}",
        std::process::id(),
        unix_ms()
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn shm_segments() -> Vec<String> {
    std::fs::read_dir("/dev/shm")
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("mlxd"))
                .collect()
        })
        .unwrap_or_default()
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    Kill,
    Stop,
}

/// What one injected fault showed.
struct Outcome {
    /// Slowest survivor's detection time after the fault.
    detect: Duration,
}

/// Runs the fault loop at `n` ranks over `backend` with `bytes`-byte
/// all_sums, injects `fault` into rank `victim`, and checks everything the
/// suite promises.
fn inject(backend: &str, n: usize, bytes: usize, fault: Fault, victim: usize) -> Outcome {
    let what = format!("{backend} world {n} {bytes} B {fault:?} rank {victim}");
    let dir = fresh_dir(&format!("{backend}{n}"));
    let shm_before = shm_segments();
    let log = dir.join("launcher.log");
    let child = launcher(
        n,
        "fault_loop",
        &[
            (FAULT_DIR, dir.display().to_string()),
            (FAULT_BYTES, bytes.to_string()),
        ],
        &["--backend", backend],
    )
    .stdout(Stdio::from(std::fs::File::create(&log).unwrap()))
    .stderr(Stdio::from(
        std::fs::OpenOptions::new().append(true).open(&log).unwrap(),
    ))
    .spawn()
    .unwrap();
    let mut run = Run {
        dir: dir.clone(),
        launcher: Some(child),
    };
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let started = Instant::now();
    while !(0..n).all(|r| dir.join(format!("started-{r}")).exists()) {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{what}: the loop never started:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid: i32 = std::fs::read_to_string(dir.join(format!("pid-{victim}")))
        .unwrap()
        .parse()
        .unwrap();
    let at = unix_ms();
    signal(
        pid,
        match fault {
            Fault::Kill => libc::SIGKILL,
            Fault::Stop => libc::SIGSTOP,
        },
    );
    // Survivors detect, the launcher gives the rest its grace (liveness + 3 s),
    // then SIGTERM and SIGCONT, SIGKILL 2 s later.
    let limit = Duration::from_secs(30);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = run.launcher.as_mut().unwrap().try_wait().unwrap() {
            break st;
        }
        assert!(
            t.elapsed() < limit,
            "{what}: launcher still running:\n{}",
            log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    run.launcher = None;
    let text = log_text();
    assert!(!status.success(), "{what}: launcher succeeded:\n{text}");
    let last = text.lines().rev().find(|l| l.starts_with("mlx-launch:"));
    assert!(
        last.is_some_and(|l| l.contains(&format!("rank {victim} failed"))),
        "{what}: the launcher must name rank {victim}:\n{text}"
    );
    let mut detect = Duration::ZERO;
    for r in (0..n).filter(|&r| r != victim) {
        let note = std::fs::read_to_string(dir.join(format!("fault-{r}")))
            .unwrap_or_else(|_| panic!("{what}: rank {r} reported no failure:\n{text}"));
        let mut parts = note.splitn(3, ' ');
        let culprit = parts.next().unwrap();
        let when: u128 = parts.next().unwrap().parse().unwrap();
        let msg = parts.next().unwrap_or("");
        assert_eq!(
            culprit,
            victim.to_string(),
            "{what}: rank {r} blames {culprit}: {msg}"
        );
        assert!(
            msg.contains(&format!("rank {victim}")),
            "{what}: rank {r}'s error does not name rank {victim}: {msg}"
        );
        let took = Duration::from_millis(when.saturating_sub(at) as u64);
        assert!(
            took <= LIVENESS + Duration::from_secs(2),
            "{what}: rank {r} took {took:?} to fail: {msg}"
        );
        detect = detect.max(took);
    }
    // No rank survives its launcher's end, and no segment its ranks made.
    let pids = run.pids();
    let gone = Instant::now();
    while pids.iter().any(|&p| alive(p)) {
        assert!(
            gone.elapsed() < Duration::from_secs(5),
            "{what}: processes left: {:?}",
            pids.iter().filter(|&&p| alive(p)).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let leaked: Vec<String> = shm_segments()
        .into_iter()
        .filter(|s| !shm_before.contains(s))
        .collect();
    assert!(leaked.is_empty(), "{what}: shared memory left: {leaked:?}");
    eprintln!("{what}: every survivor failed within {detect:?}");
    Outcome { detect }
}

const SIZES: [usize; 4] = [1 << 10, 256 << 10, 4 << 20, 64 << 20];

/// Every size and both faults at world `n`; the victim moves around the ring.
fn world(backend: &str, n: usize) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut slowest = [Duration::ZERO; 2];
    for (i, &bytes) in SIZES.iter().enumerate() {
        for (f, fault) in [Fault::Kill, Fault::Stop].into_iter().enumerate() {
            let victim = (i + f + 1) % n;
            let o = inject(backend, n, bytes, fault, victim);
            slowest[f] = slowest[f].max(o.detect);
        }
    }
    eprintln!(
        "FAULTS {backend} world {n}: slowest detection kill {:?}, stop {:?}",
        slowest[0], slowest[1]
    );
}

/// Rank 0 computes for three liveness timeouts before each of two
/// collectives that the others already wait in: the job succeeds.
fn busy(backend: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let busy_ms = (3 * LIVENESS).as_millis().to_string();
    let out = launcher(
        3,
        "busy",
        &[("MLX_BUSY_MS", busy_ms)],
        &["--backend", backend],
    )
    .output()
    .unwrap();
    let text = scenarios::output_text(&out);
    assert!(
        out.status.success(),
        "{backend}: a busy rank failed the job:\n{text}"
    );
    for r in 0..3 {
        assert!(text.contains(&format!("BUSY rank {r} OK")), "{text}");
    }
}

/// Ten jobs at world 3 whose ranks exit right after their one collective
/// (the slow rank and the size vary): a rank that finished first must not
/// fail one still reading its last bytes.
fn exit_after_last_collective(backend: &str) {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for round in 0..10 {
        let bytes = if round % 2 == 0 { 1 << 10 } else { 1 << 20 };
        let out = launcher(
            3,
            "last",
            &[
                ("MLX_LAST_BYTES", bytes.to_string()),
                ("MLX_LAST_SLOW", (round % 3).to_string()),
            ],
            &["--backend", backend],
        )
        .output()
        .unwrap();
        let text = scenarios::output_text(&out);
        assert!(out.status.success(), "{backend} round {round}:\n{text}");
        for r in 0..3 {
            assert!(text.contains(&format!("LAST rank {r} OK")), "{text}");
        }
    }
}

macro_rules! on_backends {
    ($($name:ident => $body:expr;)*) => {
        mod ring {
            use super::*;
            $(#[test] fn $name() { ($body)("ring") })*
        }
        #[cfg(feature = "tls")]
        mod tls {
            use super::*;
            $(#[test] fn $name() { ($body)("tls"); })*
        }
        #[cfg(feature = "quic")]
        mod quic {
            use super::*;
            $(#[test] fn $name() { ($body)("quic") })*
        }
    };
}

on_backends! {
    kill_and_stop_world_2 => |b| world(b, 2);
    kill_and_stop_world_3 => |b| world(b, 3);
    kill_and_stop_world_4 => |b| world(b, 4);
    a_busy_rank_fails_nothing => busy;
    exiting_after_the_last_collective_fails_nobody => exit_after_last_collective;
}

/// 10,000 random collectives (op, dtype, size, group split) on 4 ranks over
/// the ring, each checked against the reference on every rank; bounded by
/// the launcher's collective timeout, so a hang fails instead of hanging.
#[test]
fn soak_ten_thousand_random_collectives() {
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let seed = unix_ms() as u64;
    let out = launcher(
        4,
        "soak",
        &[
            ("MLX_SOAK_OPS", "10000".into()),
            ("MLX_SOAK_SEED", seed.to_string()),
        ],
        &["--backend", "ring", "--timeout", "60"],
    )
    .output()
    .unwrap();
    let text = scenarios::output_text(&out);
    assert!(out.status.success(), "soak (seed {seed}) failed:\n{text}");
    for r in 0..4 {
        assert!(
            text.contains(&format!("SOAK rank {r} OK 10000 ops")),
            "seed {seed}:\n{text}"
        );
    }
}
