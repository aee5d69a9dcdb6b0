//! Who may join a job, seen from outside the crate: a flood of idle
//! connections during start-up neither kills nor wedges the job, and a
//! rank's children do not inherit the job secret.
//!
//! `the_secret_leaves_the_environment` re-runs this test binary as a
//! rank-like child (`--exact child_reads_config` with `MLX_DIST_TEST_CHILD`
//! set), which reads its configuration and then starts a shell of its own.

use std::net::{TcpListener, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use mlx_dist::{Backend, Config, init_with_config};

const SECRET_HEX: &str = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// This process's thread count (Linux).
fn threads() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// 200 idle connections to rank 0's port while it starts: it spends a
/// bounded number of threads on them (before: one each), drops them after
/// the handshake deadline, and the real rank 1 still joins.
#[test]
fn a_flood_of_idle_connections_does_not_kill_or_wedge_start_up() {
    let hosts = vec![
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    ];
    let cfg = |rank| {
        let mut c = Config::new(rank, hosts.clone(), [3; 16], vec![0x42; 32]);
        c.connect_timeout = Duration::from_secs(30);
        c
    };
    let before = threads();
    let t = Instant::now();
    let rank0 = {
        let c = cfg(0);
        std::thread::spawn(move || {
            let g = init_with_config(&c, Backend::Ring)?;
            let mut x = vec![1.0f32; 8];
            g.all_sum(&mut x)?;
            Ok::<_, mlx_dist::DistError>(x)
        })
    };
    let mut idle = Vec::new();
    while idle.len() < 200 {
        match TcpStream::connect(&hosts[0]) {
            Ok(s) => idle.push(s),
            Err(_) if t.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err(e) => panic!("cannot reach rank 0: {e}"),
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    let during = threads();
    assert!(
        during < before + 80,
        "{during} threads with 200 idle connections (from {before})"
    );
    let g1 = init_with_config(&cfg(1), Backend::Ring).unwrap();
    let mut x = vec![2.0f32; 8];
    g1.all_sum(&mut x).unwrap();
    assert_eq!(x, vec![3.0; 8]);
    assert_eq!(rank0.join().unwrap().unwrap(), vec![3.0; 8]);
    assert!(t.elapsed() < Duration::from_secs(25), "{:?}", t.elapsed());
    drop(idle);
}

/// The rank-like child: reads its configuration, then reports what a
/// program it starts sees of the secret variables.
#[test]
fn child_reads_config() {
    if std::env::var_os("MLX_DIST_TEST_CHILD").is_none() {
        return;
    }
    let (cfg, _) = Config::from_env().unwrap().unwrap();
    assert_eq!(mlx_dist::config::hex_encode(&cfg.secret), SECRET_HEX);
    // A second read (a second init) still finds it.
    let (again, _) = Config::from_env().unwrap().unwrap();
    assert_eq!(again.secret, cfg.secret);
    let out = Command::new("sh")
        .args([
            "-c",
            "echo \"grandchild secret=${MLX_DIST_JOB_SECRET-unset} key=${MLX_DIST_QUIC_KEY-unset} rank=$MLX_RANK\"",
        ])
        .output()
        .unwrap();
    print!("{}", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn the_secret_leaves_the_environment() {
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_reads_config",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("MLX_DIST_TEST_CHILD", "1")
        .env("MLX_RANK", "1")
        .env("MLX_DIST_HOSTS", "127.0.0.1:1,127.0.0.1:2")
        .env("MLX_DIST_JOB_SECRET", SECRET_HEX)
        .env("MLX_DIST_QUIC_KEY", "abcd")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("grandchild secret=unset key=unset rank=1"),
        "{text}"
    );
}
