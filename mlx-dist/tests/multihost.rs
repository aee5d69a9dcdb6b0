//! `mlx-launch` across hosts, for real: ranks started over ssh in emulated
//! hosts (Linux network namespaces, each with its own address, its own
//! `/dev/shm` and an OpenSSH server), brought up by `cargo xtask hosts up`.
//!
//! `cargo xtask test` brings two hosts up and runs this file with
//! `MLX_TEST_HOSTS` naming their state folder (`target/mlx-hosts`); by
//! hand: `cargo xtask hosts up 2`, then
//! `MLX_TEST_HOSTS=target/mlx-hosts cargo test -p mlx-dist --test multihost`.
//! Without it every test says why it skips (under CI, `xtask test` fails
//! instead when the hosts cannot be brought up).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

mod scenarios;

use scenarios::{SCENARIO, output_text as text};

#[test]
fn rank_main() {
    scenarios::run_scenario()
}

/// The jobs share the hosts' ports: one at a time.
static HOSTS: Mutex<()> = Mutex::new(());

/// The emulated hosts: names, addresses and the ssh configuration.
struct Hosts {
    names: Vec<String>,
    ips: Vec<String>,
    ssh_config: PathBuf,
    _lock: std::sync::MutexGuard<'static, ()>,
}

fn hosts() -> Option<Hosts> {
    let Some(dir) = std::env::var_os("MLX_TEST_HOSTS") else {
        eprintln!(
            "skipping: no emulated hosts (MLX_TEST_HOSTS unset; `cargo xtask test` brings them up)"
        );
        return None;
    };
    let dir = PathBuf::from(dir);
    let dir = if dir.is_relative() {
        // Relative to the workspace, where cargo xtask runs.
        Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(dir)
    } else {
        dir
    };
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("hosts.json")).unwrap()).unwrap();
    let list = json.as_array().unwrap();
    assert!(list.len() >= 2, "the tests need two hosts");
    Some(Hosts {
        names: list
            .iter()
            .map(|h| h["ssh"].as_str().unwrap().to_string())
            .collect(),
        ips: list
            .iter()
            .map(|h| h["ips"][0].as_str().unwrap().to_string())
            .collect(),
        ssh_config: dir.join("ssh_config"),
        _lock: HOSTS.lock().unwrap_or_else(|p| p.into_inner()),
    })
}

impl Hosts {
    /// `mlx-launch` with the hosts' ssh configuration and `args`.
    fn launcher(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-launch"));
        c.arg("--ssh-config").arg(&self.ssh_config).args(args);
        c
    }

    fn pair(&self) -> String {
        format!("{},{}", self.names[0], self.names[1])
    }

    /// Runs a command inside host `i`'s network namespace (as its sshd does).
    fn netns(&self, i: usize, cmd: &[&str]) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.names[i]])
            .args(cmd)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd:?} in {}: {}",
            self.names[i],
            text(&out)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The `all` scenario (every collective, split groups) as ranks of this test binary.
fn scenario_command(scenario: &str) -> Vec<String> {
    let mut v = vec![
        "--env".to_string(),
        format!("{SCENARIO}={scenario}"),
        "--".into(),
        std::env::current_exe().unwrap().display().to_string(),
    ];
    v.extend(scenarios::RANK_ARGS.iter().map(|s| s.to_string()));
    v
}

fn run(mut c: Command) -> (Output, String) {
    let out = c.output().unwrap();
    let t = text(&out);
    (out, t)
}

fn assert_ranks_ok(t: &str, world: usize, backend: &str, shm_peers: Option<usize>) {
    for r in 0..world {
        let want = match shm_peers {
            Some(p) => format!("[{r}] RANK {r} OK ({backend}, shm peers {p})"),
            None => format!("[{r}] RANK {r} OK ({backend}"),
        };
        assert!(t.contains(&want), "missing {want:?} in:\n{t}");
    }
}

#[test]
fn ranks_on_two_hosts_over_ring_tls_and_quic() {
    let Some(h) = hosts() else { return };
    let mpi_style = std::env::temp_dir().join(format!("mlx-mh-hostfile-{}", std::process::id()));
    std::fs::write(
        &mpi_style,
        format!(
            "# two ranks per host\n{} slots=2\n{} slots=2\n",
            h.names[0], h.names[1]
        ),
    )
    .unwrap();
    for backend in ["ring", "tls", "quic"] {
        // World 2: one rank per host, from --hosts.
        let mut c = h.launcher(&["--hosts", &h.pair(), "--backend", backend]);
        c.args(scenario_command("all"));
        let (out, t) = run(c);
        assert!(out.status.success(), "world 2 over {backend}:\n{t}");
        // Each host has its own /dev/shm: ranks on different hosts share none.
        assert_ranks_ok(&t, 2, backend, (backend == "ring").then_some(0));
        // World 4: two ranks per host, from an MPI-style host file. The two
        // ranks of a host share its /dev/shm, and only those.
        let mut c = h.launcher(&[
            "--hostfile",
            mpi_style.to_str().unwrap(),
            "--backend",
            backend,
        ]);
        c.args(scenario_command("all"));
        let (out, t) = run(c);
        assert!(out.status.success(), "world 4 over {backend}:\n{t}");
        assert_ranks_ok(&t, 4, backend, (backend == "ring").then_some(1));
    }
    std::fs::remove_file(mpi_style).unwrap();
}

/// The pids of the processes whose environment holds `MLX_TEST_TAG=tag`.
fn tagged(tag: &str) -> Vec<u32> {
    let needle = format!("MLX_TEST_TAG={tag}");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|&b| b == 0).any(|kv| kv == needle.as_bytes()))
        })
        .collect()
}

/// The value of `key` in process `pid`'s environment.
fn environ_value(pid: u32, key: &str) -> Option<String> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    env.split(|&b| b == 0).find_map(|kv| {
        let kv = String::from_utf8_lossy(kv);
        kv.strip_prefix(&format!("{key}=")).map(str::to_string)
    })
}

fn wait_for(what: &str, limit: Duration, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < limit,
            "timed out after {limit:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn unique_tag() -> String {
    format!(
        "mh{}x{}",
        std::process::id(),
        Instant::now().elapsed().as_nanos() ^ rand_nanos()
    )
}

fn rand_nanos() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// Starts a job of `per_host` sleeping ranks on each host, tagged with
/// `tag`, and waits until all its ranks run.
fn sleeping_job(h: &Hosts, tag: &str, per_host: usize, backend: &str) -> Child {
    let child = h
        .launcher(&[
            "--hosts",
            &h.pair(),
            "-n",
            &per_host.to_string(),
            "--backend",
            backend,
            "--grace",
            "1",
            "--env",
            &format!("MLX_TEST_TAG={tag}"),
            "--",
            "sleep",
            "600",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let ranks = 2 * per_host;
    wait_for("the ranks to start", Duration::from_secs(20), || {
        tagged(tag)
            .iter()
            .filter(|&&p| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
            })
            .count()
            == ranks
    });
    child
}

fn no_rank_left(tag: &str) {
    wait_for("every rank to be gone", Duration::from_secs(20), || {
        tagged(tag).is_empty()
    });
}

#[test]
fn secrets_are_never_on_a_command_line_and_ctrl_c_stops_remote_ranks() {
    let Some(h) = hosts() else { return };
    let tag = unique_tag();
    let launcher = sleeping_job(&h, &tag, 1, "quic");
    let ranks = tagged(&tag);
    let secrets: Vec<String> = ranks
        .iter()
        .flat_map(|&p| {
            ["MLX_DIST_JOB_SECRET", "MLX_DIST_QUIC_KEY"]
                .into_iter()
                .map(move |k| environ_value(p, k).unwrap_or_else(|| panic!("rank {p} has no {k}")))
        })
        .collect();
    assert!(secrets.iter().all(|s| s.len() >= 64), "{secrets:?}");
    // Every process of the machine, in every namespace: the launcher, ssh,
    // sshd, the agents, the ranks.
    let mut scanned = 0;
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmdline) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        scanned += 1;
        let cmdline = String::from_utf8_lossy(&cmdline);
        for s in &secrets {
            // The whole value, and any 16-digit piece of it.
            assert!(
                !(0..=s.len() - 16)
                    .step_by(16)
                    .any(|i| cmdline.contains(&s[i..i + 16])),
                "a secret is on the command line of {:?}: {cmdline}",
                e.path()
            );
        }
    }
    assert!(scanned > 10, "only {scanned} processes scanned");
    // Ctrl-C: the launcher forwards it to the remote ranks through their agents.
    unsafe { libc::kill(launcher.id() as i32, libc::SIGINT) };
    let out = launcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", text(&out));
    no_rank_left(&tag);
}

#[test]
fn a_sigkilled_launcher_leaves_no_rank_on_any_host() {
    let Some(h) = hosts() else { return };
    let tag = unique_tag();
    let mut launcher = sleeping_job(&h, &tag, 2, "ring");
    launcher.kill().unwrap();
    launcher.wait().unwrap();
    no_rank_left(&tag);
    // What it could not remove itself: its report folder, named by its pid.
    let prefix = format!("mlx-launch-{}-", launcher.id());
    for e in std::fs::read_dir(std::env::temp_dir()).unwrap().flatten() {
        if e.file_name().to_string_lossy().starts_with(&prefix) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[test]
fn a_failing_rank_stops_the_remote_ranks() {
    let Some(h) = hosts() else { return };
    let tag = unique_tag();
    let t = Instant::now();
    let (out, t_out) = run(h.launcher(&[
        "--hosts",
        &h.pair(),
        "-n",
        "2",
        "--grace",
        "1",
        "--env",
        &format!("MLX_TEST_TAG={tag}"),
        "--",
        "sh",
        "-c",
        "if [ \"$MLX_RANK\" = 3 ]; then sleep 1; echo rank 3 gives up >&2; exit 3; fi; exec sleep 600",
    ]));
    assert_eq!(out.status.code(), Some(3), "{t_out}");
    assert!(t_out.contains("[3] rank 3 gives up"), "{t_out}");
    assert!(
        t.elapsed() < Duration::from_secs(30),
        "took {:?}",
        t.elapsed()
    );
    no_rank_left(&tag);
}

/// `--max-restarts` over ssh: the first attempt runs every collective on
/// the hosts' fixed ports, then rank 1 fails; the job is started again with
/// a new identity, and the second attempt binds the same ports and passes.
#[test]
fn a_failed_remote_job_is_restarted_on_the_same_ports() {
    let Some(h) = hosts() else { return };
    let tag = unique_tag();
    let mut c = h.launcher(&[
        "--hosts",
        &h.pair(),
        "--grace",
        "1",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "0.1",
        "--env",
        &format!("MLX_TEST_TAG={tag}"),
    ]);
    let mut rank = scenario_command("all");
    let at = rank.iter().position(|a| a == "--").unwrap();
    let wrapper = r#""$@"; rc=$?
        echo "attempt $MLX_RESTART_COUNT job $MLX_DIST_JOB_ID"
        if [ "$MLX_RESTART_COUNT" = 0 ]; then
            [ "$MLX_RANK" = 1 ] && exit 3
            exec sleep 600
        fi
        exit $rc"#;
    for (i, a) in ["sh", "-c", wrapper, "sh"].into_iter().enumerate() {
        rank.insert(at + 1 + i, a.to_string());
    }
    c.args(rank);
    let (out, t) = run(c);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(
        t.contains("rank 1 failed (exit status 3); restarting the job (restart 1 of 1) in 0.1s"),
        "{t}"
    );
    for r in 0..2 {
        let ok = format!("[{r}] RANK {r} OK (ring");
        assert_eq!(t.matches(&ok).count(), 2, "{ok:?} once per attempt:\n{t}");
    }
    let job = |attempt: u32| {
        let want = format!("[0] attempt {attempt} job ");
        t.lines()
            .find_map(|l| l.strip_prefix(&want).map(str::to_string))
            .unwrap_or_else(|| panic!("no {want:?}:\n{t}"))
    };
    assert_ne!(job(0), job(1), "each attempt is a new job");
    no_rank_left(&tag);
}

#[test]
fn remote_ranks_start_in_the_launchers_folder_and_share_their_hosts_cores() {
    let Some(h) = hosts() else { return };
    let dir = std::env::temp_dir().join(format!("mlx-mh-cwd {}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let report = "echo \"RANK $MLX_RANK $(hostname) $RAYON_NUM_THREADS $(pwd)\"";
    let (out, t) = run({
        let mut c = h.launcher(&["--hosts", &h.pair(), "-n", "2", "--", "sh", "-c", report]);
        c.current_dir(&dir);
        c
    });
    assert!(out.status.success(), "{t}");
    let cores = std::thread::available_parallelism().unwrap().get();
    let share = (cores / 2).max(1);
    for r in 0..4 {
        let host = &h.names[r / 2];
        let want = format!("[{r}] RANK {r} {host} {share} {}", dir.display());
        assert!(t.contains(&want), "missing {want:?} in:\n{t}");
    }
    // --cwd wins, and values reach the remote shell unchanged.
    let (out, t) = run(h.launcher(&[
        "--hosts",
        &h.pair(),
        "--cwd",
        "/",
        "--env",
        "ODD=it's $HOME; `x`",
        "--",
        "sh",
        "-c",
        "echo \"$(pwd)|$ODD\"",
    ]));
    assert!(out.status.success(), "{t}");
    assert!(t.contains("[1] /|it's $HOME; `x`"), "{t}");
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn hosts_and_variable_names_cannot_inject() {
    let Some(h) = hosts() else { return };
    let marker = std::env::temp_dir().join(format!("mlx-mh-injected-{}", std::process::id()));
    for args in [
        vec![
            format!("--hosts=-oProxyCommand=touch {}", marker.display()),
            "--".into(),
            "true".into(),
        ],
        vec![
            "--hosts".into(),
            h.pair(),
            "--env".into(),
            format!("A;touch {}=1", marker.display()),
            "--".into(),
            "true".into(),
        ],
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (out, t) = run(h.launcher(&args));
        assert_eq!(out.status.code(), Some(2), "{args:?} was accepted:\n{t}");
        assert!(!marker.exists(), "{args:?} ran a command");
    }
}

/// `/proc/net/tcp` holds IPv4 addresses as little-endian hex.
fn proc_net_hex(ip: &str) -> String {
    let o: Vec<u8> = ip.split('.').map(|b| b.parse().unwrap()).collect();
    format!("{:02X}{:02X}{:02X}{:02X}", o[3], o[2], o[1], o[0])
}

#[test]
fn a_hostfile_entry_with_two_addresses_uses_both() {
    let Some(h) = hosts() else { return };
    // A second address per host, on another subnet.
    let second: Vec<String> = (0..2)
        .map(|i| {
            let last = h.ips[i].rsplit('.').next().unwrap();
            format!("10.78.0.{last}")
        })
        .collect();
    let dev = |i: usize| {
        let out = h.netns(i, &["ip", "-o", "-4", "addr", "show"]);
        out.lines()
            .find(|l| l.contains(&format!("inet {}/", h.ips[i])))
            .and_then(|l| l.split_whitespace().nth(1))
            .unwrap()
            .to_string()
    };
    for (i, ip) in second.iter().enumerate() {
        let d = dev(i);
        h.netns(i, &["ip", "addr", "add", &format!("{ip}/24"), "dev", &d]);
    }
    let file = std::env::temp_dir().join(format!("mlx-mh-ips-{}.json", std::process::id()));
    let json = serde_json::json!([
        { "ssh": h.names[0], "ips": [h.ips[0], second[0]] },
        { "ssh": h.names[1], "ips": [h.ips[1], second[1]] },
    ]);
    std::fs::write(&file, json.to_string()).unwrap();
    let mut c = h.launcher(&[
        "--hostfile",
        file.to_str().unwrap(),
        "--env",
        "MLX_HOLD_MS=3000",
    ]);
    c.args(scenario_command("hold"));
    let job = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // While the job holds its connections: host 0 has established TCP
    // connections on both of its addresses.
    let seen = |ip: &str| {
        let hex = proc_net_hex(ip);
        h.netns(0, &["cat", "/proc/net/tcp"])
            .lines()
            .skip(1)
            .any(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                f.len() > 3 && f[3] == "01" && (f[1].starts_with(&hex) || f[2].starts_with(&hex))
            })
    };
    let t = Instant::now();
    let mut both = false;
    while t.elapsed() < Duration::from_secs(20) && !both {
        both = seen(&h.ips[0]) && seen(&second[0]);
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = job.wait_with_output().unwrap();
    for (i, ip) in second.iter().enumerate() {
        h.netns(
            i,
            &["ip", "addr", "del", &format!("{ip}/24"), "dev", &dev(i)],
        );
    }
    std::fs::remove_file(file).unwrap();
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("[1] HOLD rank 1 OK"), "{t}");
    assert!(both, "the ring did not connect over both addresses");
}

#[test]
fn check_says_ready_and_names_what_is_wrong() {
    let Some(h) = hosts() else { return };
    let exe = std::env::current_exe().unwrap().display().to_string();
    let (out, t) = run(h.launcher(&["--check", "--hosts", &h.pair(), "-n", "2", "--", &exe]));
    assert!(out.status.success(), "{t}");
    assert!(
        t.contains(&format!("{}: ok", h.names[1])) && t.contains("ready"),
        "{t}"
    );
    // A missing program, an unknown host, and ports held by a running job.
    let (out, t) = run(h.launcher(&[
        "--check",
        "--hosts",
        &format!("{},no-such-host.invalid", h.names[0]),
        "--",
        "./no-such-program",
    ]));
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains("no-such-host.invalid: cannot ssh in batch mode"),
        "{t}"
    );
    assert!(
        t.contains("the program ./no-such-program is not there"),
        "{t}"
    );
    // Another program holds rank 1's port on host 1.
    let busy = format!("{}:41001", h.ips[1]);
    let mut holder = Command::new("ip")
        .args(["netns", "exec", &h.names[1], &exe])
        .args(scenarios::RANK_ARGS)
        .env(SCENARIO, "listen")
        .env("MLX_LISTEN", &busy)
        .env("MLX_HOLD_MS", "30000")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // (Kept open until the holder is killed: it prints more.)
    let mut holder_out = std::io::BufReader::new(holder.stdout.take().unwrap());
    let mut line = String::new();
    while !line.contains("LISTENING") {
        line.clear();
        let n = std::io::BufRead::read_line(&mut holder_out, &mut line).unwrap();
        assert!(n > 0, "the port holder ended before listening");
    }
    let (out, t) = run(h.launcher(&[
        "--check",
        "--hosts",
        &h.pair(),
        "--starting-port",
        "41000",
        "--",
        &exe,
    ]));
    holder.kill().unwrap();
    holder.wait().unwrap();
    drop(holder_out);
    assert_eq!(out.status.code(), Some(1), "{t}");
    assert!(
        t.contains(&format!("cannot listen on {}:41001 over TCP", h.ips[1])),
        "{t}"
    );
}

#[test]
fn a_frozen_remote_rank_is_named_from_its_peers_reports() {
    let Some(h) = hosts() else { return };
    let tag = unique_tag();
    let mut c = h.launcher(&[
        "--hosts",
        &h.pair(),
        "--liveness-timeout",
        "2",
        "--env",
        "MLX_HOLD_MS=4000",
        "--env",
        &format!("MLX_TEST_TAG={tag}"),
    ]);
    c.args(scenario_command("hold"));
    let job = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The ranks are this test binary; rank 1 runs on the second host.
    let exe_name = std::env::current_exe().unwrap();
    let exe_name = exe_name.file_name().unwrap().to_string_lossy();
    let comm: String = exe_name.chars().take(15).collect();
    let rank1 = || {
        tagged(&tag).into_iter().find(|&p| {
            environ_value(p, "MLX_RANK").as_deref() == Some("1")
                && std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == comm)
        })
    };
    wait_for("rank 1 to start", Duration::from_secs(20), || {
        rank1().is_some()
    });
    // Let it connect and finish its first sum, then freeze it.
    std::thread::sleep(Duration::from_millis(1500));
    let pid = rank1().unwrap();
    unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
    let out = job.wait_with_output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    // Rank 0's report crossed ssh: only it could name the frozen rank.
    assert!(
        t.contains("mlx-launch: rank 1 failed (as rank 0 reported:"),
        "{t}"
    );
    no_rank_left(&tag);
}
