//! Availability (issue 61): clean jobs end cleanly on a busy machine, and a
//! flood of idle connections does not keep a ring job from forming.
//!
//! - `clean_jobs_beside_cpu_hogs_succeed` launches short data-parallel jobs
//!   of 3 ranks with the real `mlx-launch` (over QUIC and the TCP ring)
//!   while two threads of this process spin; every job must succeed. The
//!   ranks are this test binary itself, re-run with `--exact rank_main` and
//!   `MLX_DIST_TEST_AVAILABILITY` set. `MLX_DIST_TEST_CLEAN_JOBS` sets the
//!   number of jobs per transport (default 10; the check is 50).
//! - The flood tests run two ranks as threads of this process while 64
//!   sockets from another loopback address (127.0.0.2) connect to rank 0
//!   and sit idle, each reconnecting 2 ms after rank 0 drops it. The QUIC
//!   flood is a unit test of `mlx-dist` (`transports::quic`), where the
//!   job's certificate is at hand.

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mlx_array::Array;
use mlx_dist::{Backend, Config, DistError, all_sum, init, init_with_config};

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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A TCP connection to `to` from address `from` (any port).
fn connect_from(from: Ipv4Addr, to: SocketAddrV4) -> std::io::Result<TcpStream> {
    use std::os::fd::FromRawFd;
    let sockaddr = |a: SocketAddrV4| {
        // SAFETY: all zeros is a valid sockaddr_in on every platform (with
        // the BSDs' `sin_len` too, which their kernels take from the length).
        let mut s: libc::sockaddr_in = unsafe { std::mem::zeroed() };
        s.sin_family = libc::AF_INET as libc::sa_family_t;
        s.sin_port = a.port().to_be();
        s.sin_addr = libc::in_addr {
            s_addr: u32::from(*a.ip()).to_be(),
        };
        s
    };
    // Not inherited by the ranks the tests start (macOS has no
    // SOCK_CLOEXEC: there a rank may hold a flood socket, to no effect).
    #[cfg(target_os = "linux")]
    let kind = libc::SOCK_STREAM | libc::SOCK_CLOEXEC;
    #[cfg(not(target_os = "linux"))]
    let kind = libc::SOCK_STREAM;
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned by the TcpStream once made (or closed
    // here), and address structures of the size passed.
    unsafe {
        let fd = libc::socket(libc::AF_INET, kind, 0);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let st = TcpStream::from_raw_fd(fd);
        let src = sockaddr(SocketAddrV4::new(from, 0));
        if libc::bind(fd, (&src as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dst = sockaddr(to);
        if libc::connect(fd, (&dst as *const libc::sockaddr_in).cast(), len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(st)
    }
}

/// 64 sockets from 127.0.0.2 connected to `to`, each idle until the other
/// end drops it and then connected again 2 ms later, until dropped.
struct Flood {
    stop: Arc<AtomicBool>,
    connects: Arc<AtomicU64>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

const FLOOD_SOCKETS: usize = 64;

impl Flood {
    fn start(to: SocketAddrV4) -> Flood {
        let stop = Arc::new(AtomicBool::new(false));
        let connects = Arc::new(AtomicU64::new(0));
        let threads = (0..FLOOD_SOCKETS)
            .map(|_| {
                let (stop, connects) = (stop.clone(), connects.clone());
                std::thread::spawn(move || {
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(mut s) = connect_from(Ipv4Addr::new(127, 0, 0, 2), to) {
                            connects.fetch_add(1, Ordering::Relaxed);
                            let _ = s.set_read_timeout(Some(Duration::from_millis(50)));
                            let mut b = [0u8; 64];
                            // Idle until dropped (or told to stop).
                            while !stop.load(Ordering::Relaxed) {
                                match s.read(&mut b) {
                                    Ok(0) => break,
                                    Ok(_) => {}
                                    Err(e)
                                        if matches!(
                                            e.kind(),
                                            std::io::ErrorKind::WouldBlock
                                                | std::io::ErrorKind::TimedOut
                                        ) => {}
                                    Err(_) => break,
                                }
                            }
                        }
                        std::thread::sleep(Duration::from_millis(2));
                    }
                })
            })
            .collect();
        Flood {
            stop,
            connects,
            threads,
        }
    }

    fn connects(&self) -> u64 {
        self.connects.load(Ordering::Relaxed)
    }
}

impl Drop for Flood {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

fn ring_config(rank: usize, hosts: &[String], connect_timeout: Duration) -> Config {
    let mut c = Config::new(rank, hosts.to_vec(), [6; 16], vec![0x61; 32]);
    c.connect_timeout = connect_timeout;
    c
}

/// Before: every handshake slot went to the flood (32 slots, none kept for
/// other sources, each idle connection held 5 s and replaced within 2 ms),
/// rank 1 never got one, and both ranks failed at the connect timeout
/// blaming rank 1 (the issue saw it after 60 s; here 30 s).
#[test]
fn a_ring_job_forms_under_a_flood_of_idle_connections() {
    let hosts = vec![
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    ];
    let timeout = Duration::from_secs(30);
    let rank0 = {
        let c = ring_config(0, &hosts, timeout);
        std::thread::spawn(move || {
            let g = init_with_config(&c, Backend::Ring)?;
            let mut x = vec![1.0f32; 8];
            g.all_sum(&mut x)?;
            Ok::<_, DistError>(x)
        })
    };
    let flood = Flood::start(hosts[0].parse().unwrap());
    // Rank 1 starts 3 s late, into a flood that has had time to settle.
    std::thread::sleep(Duration::from_secs(3));
    let before = flood.connects();
    let t = Instant::now();
    let joined = init_with_config(&ring_config(1, &hosts, timeout), Backend::Ring).and_then(|g| {
        let mut x = vec![2.0f32; 8];
        g.all_sum(&mut x)?;
        Ok(x)
    });
    let formed = t.elapsed();
    let during = flood.connects() - before;
    drop(flood);
    let r0 = rank0.join().unwrap();
    eprintln!(
        "formed {formed:.1?} after rank 1 started, the flood connecting {during} times meanwhile"
    );
    assert!(
        before > FLOOD_SOCKETS as u64,
        "the flood never got going ({before} connections)"
    );
    assert_eq!(joined.unwrap(), vec![3.0; 8]);
    assert_eq!(r0.unwrap(), vec![3.0; 8]);
}

/// A rank that truly is missing is still named, with the count of the
/// unauthenticated connections turned away while waiting for it.
#[test]
fn a_missing_rank_is_named_with_the_connections_turned_away() {
    let hosts = vec![
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    ];
    let c = ring_config(0, &hosts, Duration::from_secs(4));
    let rank0 = std::thread::spawn(move || init_with_config(&c, Backend::Ring).map(|_| ()));
    let flood = Flood::start(hosts[0].parse().unwrap());
    let e = rank0.join().unwrap().unwrap_err();
    drop(flood);
    let DistError::AcceptTimeout {
        missing,
        turned_away,
        no_slot,
        ..
    } = &e
    else {
        panic!("expected an accept timeout, got {e}");
    };
    assert_eq!(missing, &[1]);
    assert!(*turned_away > 0 && *no_slot <= *turned_away, "{e}");
    let text = e.to_string();
    assert!(
        text.contains("ranks [1] did not connect")
            && text.contains(&format!(
                "{turned_away} unauthenticated connections were turned away"
            )),
        "{text}"
    );
}
