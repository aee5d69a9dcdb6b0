//! Availability (issue 61): clean jobs end cleanly on a busy machine.
//!
//! `clean_jobs_beside_cpu_hogs_succeed` launches short data-parallel jobs
//! of 3 ranks with the real `mlx-launch` (over QUIC and the TCP ring) while
//! two threads of this process spin; every job must succeed. The ranks are
//! this test binary itself, re-run with `--exact rank_main` and
//! `MLX_DIST_TEST_AVAILABILITY` set. `MLX_DIST_TEST_CLEAN_JOBS` sets the
//! number of jobs per transport (default 10; the check is 50).

use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use mlx_array::Array;
use mlx_dist::{Backend, all_sum, init};

/// The variable that makes this test binary a rank of a clean job.
const ROLE: &str = "MLX_DIST_TEST_AVAILABILITY";

/// A rank of a clean job: a few data-parallel steps whose gradients are
/// summed by the graph's `all_sum` (so on the communication thread, as in
/// training), each checked, then a normal exit.
#[test]
fn rank_main() {
    if std::env::var(ROLE).as_deref() != Ok("clean") {
        return;
    }
    let world = init(Backend::Any).unwrap();
    let n = world.size() as f32;
    let r = world.rank() as f32;
    for step in 0..3 {
        let grad = Array::from_slice(&[r + step as f32; 64], &[64]).unwrap();
        let sum: Vec<f32> = all_sum(&grad, &world).unwrap().to_vec().unwrap();
        // The ranks 0..n, each plus the step.
        let want = n * (n - 1.0) / 2.0 + n * step as f32;
        assert!(sum.iter().all(|&s| s == want), "step {step}: {sum:?}");
    }
    println!("CLEAN rank {} OK", world.rank());
}

/// Threads that spin until dropped: the load of other jobs on the machine.
struct Hogs {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl Hogs {
    fn start(n: usize) -> Hogs {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(
                            x.wrapping_mul(6364136223846793005).wrapping_add(1),
                        );
                    }
                    x
                })
            })
            .collect();
        Hogs { stop, threads }
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Before: 2 in 20 and 1 in 25 QUIC jobs failed so (here 4 to 7 in 20): a
/// rank's last graph collective let go of the group on the communication
/// thread after handing back its result, so the program's own drop was not
/// the last, its process exited while the group was still open, and QUIC
/// lost the frames it still held: the peers waited for them and declared
/// the rank that had exited 0 unresponsive.
#[test]
fn clean_jobs_beside_cpu_hogs_succeed() {
    let jobs: usize = std::env::var("MLX_DIST_TEST_CLEAN_JOBS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let exe = std::env::current_exe().unwrap();
    let hogs = Hogs::start(2);
    let mut failures = Vec::new();
    let t = Instant::now();
    for backend in ["quic", "ring"] {
        for job in 0..jobs {
            let out = Command::new(env!("CARGO_BIN_EXE_mlx-launch"))
                .args(["-n", "3", "--backend", backend])
                .args(["--env", &format!("{ROLE}=clean")])
                .arg("--")
                .arg(&exe)
                .args(["--exact", "rank_main", "--nocapture", "--test-threads", "1"])
                .output()
                .unwrap();
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            let all_ok = (0..3).all(|r| text.contains(&format!("CLEAN rank {r} OK")));
            if !out.status.success() || !all_ok {
                failures.push(format!("{backend} job {job}: {}\n{text}", out.status));
            }
        }
    }
    drop(hogs);
    eprintln!(
        "{} clean jobs of 3 ranks beside 2 hogs in {:.1?}: {} failed",
        2 * jobs,
        t.elapsed(),
        failures.len()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}
