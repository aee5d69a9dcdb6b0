//! Ranks started as Slurm's `srun` starts them, without `mlx-launch`: the
//! example `all_sum` run as 1, 2 and 3 tasks of a step on one node, with
//! only the variables srun sets (no `MLX_*` variable at all), and a bad
//! node list, which must be an error that names the variable.
//!
//! The example is built by `cargo build --example all_sum` with this test's
//! profile and features (a no-op when `cargo test` has built it already).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

mod scenarios;

use scenarios::output_text as text;

/// `target/<profile>/examples/all_sum`, built with this test's profile and features.
fn all_sum() -> &'static PathBuf {
    static EXE: OnceLock<PathBuf> = OnceLock::new();
    EXE.get_or_init(|| {
        let me = std::env::current_exe().unwrap();
        let profile_dir = me.parent().and_then(|d| d.parent()).unwrap();
        let profile = match profile_dir.file_name().unwrap().to_str().unwrap() {
            "debug" => "dev",
            p => p,
        };
        let features: Vec<&str> = [
            ("quic", cfg!(feature = "quic")),
            ("mpi", cfg!(feature = "mpi")),
        ]
        .into_iter()
        .filter_map(|(f, on)| on.then_some(f))
        .collect();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let out = Command::new(cargo)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .args(["build", "-q", "-p", "mlx-dist", "--example", "all_sum"])
            .args(["--profile", profile, "--no-default-features"])
            .args(["--features", &features.join(",")])
            .env("CARGO_TARGET_DIR", profile_dir.parent().unwrap())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "building all_sum failed:\n{}",
            text(&out)
        );
        let exe = profile_dir
            .join("examples")
            .join(format!("all_sum{}", std::env::consts::EXE_SUFFIX));
        assert!(exe.is_file(), "{} was not built", exe.display());
        exe
    })
}

/// `n` consecutive ports that are free now.
fn free_ports(n: usize) -> u16 {
    for _ in 0..100 {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = first.local_addr().unwrap().port();
        if usize::from(p) + n > 65536 {
            continue;
        }
        let rest: Vec<_> = (1..n)
            .map_while(|i| TcpListener::bind(("127.0.0.1", p + i as u16)).ok())
            .collect();
        if rest.len() == n - 1 {
            return p;
        }
    }
    panic!("no {n} consecutive free ports");
}

/// A command for `all_sum` with nothing of a launcher's environment: every
/// inherited `MLX_*`, Slurm and MPI variable removed, so that the test also
/// works inside a Slurm job or under `mlx-launch`.
fn bare_all_sum() -> Command {
    let mut c = Command::new(all_sum());
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if ["MLX_", "SLURM", "PMI", "OMPI_"]
            .iter()
            .any(|p| k.starts_with(p))
        {
            c.env_remove(&k);
        }
    }
    c.env("RUST_LOG", "warn");
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

/// A job secret file as a user gives one to a Slurm job: random hex,
/// readable by its owner only, in a directory of its own that goes with it.
struct SecretFile(PathBuf);

impl SecretFile {
    fn new() -> SecretFile {
        use std::os::unix::fs::OpenOptionsExt;
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("mlx-dist-secret-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut bytes = [0u8; 32];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").unwrap(),
            &mut bytes,
        )
        .unwrap();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join("secret");
        let mut f = std::fs::OpenOptions::new()
            .create_new(true)
            .write(true)
            .mode(0o600)
            .open(&path)
            .unwrap();
        std::io::Write::write_all(&mut f, hex.as_bytes()).unwrap();
        SecretFile(path)
    }

    fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.0.parent().unwrap());
    }
}

/// The variables srun sets for task `rank` of an `n`-task step on one
/// node, and the job secret file the user gives.
fn srun_env(
    rank: usize,
    n: usize,
    resv: u16,
    secret: &SecretFile,
) -> BTreeMap<&'static str, String> {
    [
        ("MLX_DIST_JOB_SECRET_FILE", secret.path()),
        ("SLURM_PROCID", rank.to_string()),
        ("SLURM_LOCALID", rank.to_string()),
        ("SLURM_NODEID", "0".into()),
        ("SLURM_NTASKS", n.to_string()),
        ("SLURM_NODELIST", "localhost".into()),
        ("SLURM_TASKS_PER_NODE", n.to_string()),
        ("SLURM_JOB_ID", std::process::id().to_string()),
        ("SLURM_STEP_ID", "0".into()),
        (
            "SLURM_STEP_RESV_PORTS",
            format!("{resv}-{}", resv + n as u16 - 1),
        ),
    ]
    .into_iter()
    .collect()
}

/// Runs the `n` tasks of a step and returns each one's output.
fn run_step(n: usize) -> Vec<Output> {
    let resv = free_ports(n);
    let secret = SecretFile::new();
    let children: Vec<_> = (0..n)
        .map(|r| {
            bare_all_sum()
                .envs(srun_env(r, n, resv, &secret))
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect()
}

fn assert_all_sum(n: usize) {
    let outs = run_step(n);
    let want = vec![n as f32; 10];
    for (r, out) in outs.iter().enumerate() {
        let t = text(out);
        assert!(out.status.success(), "task {r} of {n} failed:\n{t}");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout).trim(),
            format!("{r} {want:?}"),
            "task {r} of {n}:\n{t}"
        );
    }
}

#[test]
fn srun_tasks_sum_world_1() {
    assert_all_sum(1);
}

#[test]
fn srun_tasks_sum_world_2() {
    assert_all_sum(2);
}

#[test]
fn srun_tasks_sum_world_3() {
    assert_all_sum(3);
}

/// A node list that is not one is an error naming the variable and the text.
#[test]
fn bad_nodelist_is_named() {
    let secret = SecretFile::new();
    let mut env = srun_env(0, 2, free_ports(2), &secret);
    env.insert("SLURM_NODELIST", "node[01-".into());
    let out = bare_all_sum().envs(env).output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains(r#"SLURM_NODELIST="node[01-": '[' without ']' in "[01-""#),
        "{t}"
    );
}

/// A step given no job secret does not start (anyone could join it): the
/// error says how to give one; the explicit opt-out still works; a secret
/// file others may read is refused.
#[test]
fn a_step_without_a_secret_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let secret = SecretFile::new();
    let mut env = srun_env(0, 2, free_ports(2), &secret);
    env.remove("MLX_DIST_JOB_SECRET_FILE");
    let out = bare_all_sum().envs(&env).output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("MLX_DIST_JOB_SECRET_FILE") && t.contains("MLX_DIST_INSECURE_DERIVED_SECRET"),
        "{t}"
    );
    std::fs::set_permissions(&secret.0, std::fs::Permissions::from_mode(0o644)).unwrap();
    env.insert("MLX_DIST_JOB_SECRET_FILE", secret.path());
    let out = bare_all_sum().envs(&env).output().unwrap();
    let t = text(&out);
    assert!(!out.status.success() && t.contains("chmod 600"), "{t}");
}

/// Tasks laid out by another distribution than block are refused, naming it.
#[test]
fn cyclic_distribution_is_named() {
    let secret = SecretFile::new();
    let mut env = srun_env(0, 4, free_ports(2), &secret);
    env.insert("SLURM_NODELIST", "n[1-2]".into());
    env.insert("SLURM_TASKS_PER_NODE", "2(x2)".into());
    env.insert("SLURM_DISTRIBUTION", "cyclic".into());
    let out = bare_all_sum().envs(env).output().unwrap();
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(t.contains(r#"SLURM_DISTRIBUTION="cyclic""#), "{t}");
}

/// Where `name` is installed: the `PATH`, then the sbin directories that a
/// non-login shell may not have on it.
fn installed(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/usr/local/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A one-node Slurm cluster in a temporary directory: munged, slurmctld and
/// slurmd in the foreground, killed and the directory removed on drop.
struct Cluster {
    dir: PathBuf,
    daemons: Vec<std::process::Child>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // slurmd, slurmctld, munged: asked to stop, then killed.
        for d in self.daemons.iter_mut().rev() {
            // SAFETY: signalling our own child, which has not been waited for.
            unsafe { libc::kill(d.id() as libc::pid_t, libc::SIGTERM) };
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while d.try_wait().ok().flatten().is_none() && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl Cluster {
    /// Starts the cluster, or says why it cannot.
    fn start() -> Result<Cluster, String> {
        let tools = ["srun", "sinfo", "slurmctld", "slurmd", "munged", "mungekey"];
        let paths: Vec<PathBuf> = tools
            .iter()
            .map(|t| installed(t).ok_or(format!("{t} is not installed")))
            .collect::<Result<_, _>>()?;
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("slurmd must run as root".into());
        }
        let [_, sinfo, slurmctld, slurmd, munged, mungekey] = &paths[..] else {
            unreachable!()
        };
        let dir = std::env::temp_dir().join(format!("mlx-dist-slurm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut c = Cluster {
            dir: dir.clone(),
            daemons: Vec::new(),
        };
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| e.to_string())?;
        }
        let d = |p: &str| dir.join(p).display().to_string();
        let ok = |what: &str, out: std::io::Result<Output>| match out {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) => Err(format!("{what} failed:\n{}", text(&o))),
            Err(e) => Err(format!("{what}: {e}")),
        };
        ok(
            "mungekey",
            Command::new(mungekey)
                .args(["--create", "--keyfile", &d("munge/munge.key")])
                .output(),
        )?;
        let spawn = |c: &mut Cluster, cmd: &mut Command| -> Result<(), String> {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("log/daemons.log"))
                .map_err(|e| e.to_string())?;
            let child = cmd
                .stdin(Stdio::null())
                .stdout(log.try_clone().map_err(|e| e.to_string())?)
                .stderr(log)
                .spawn()
                .map_err(|e| format!("{cmd:?}: {e}"))?;
            c.daemons.push(child);
            Ok(())
        };
        spawn(
            &mut c,
            Command::new(munged).args([
                "--foreground",
                "--force",
                &format!("--key-file={}", d("munge/munge.key")),
                &format!("--socket={}", d("munge/sock")),
                &format!("--pid-file={}", d("munge/pid")),
                &format!("--log-file={}", d("munge/log")),
                &format!("--seed-file={}", d("munge/seed")),
            ]),
        )?;
        let (ctld_port, resv) = (free_ports(2), free_ports(16));
        let conf = format!(
            "ClusterName=mlxtest\n\
             SlurmctldHost=localhost\n\
             SlurmctldPort={ctld_port}\n\
             SlurmdPort={}\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={}\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_CPU\n\
             MpiDefault=none\n\
             MpiParams=ports={resv}-{}\n\
             StateSaveLocation={}\n\
             SlurmdSpoolDir={}\n\
             SlurmctldPidFile={}\n\
             SlurmdPidFile={}\n\
             SlurmctldLogFile={}\n\
             SlurmdLogFile={}\n\
             ReturnToService=2\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             NodeName=localhost CPUs=2 State=UNKNOWN\n\
             PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP\n",
            ctld_port + 1,
            d("munge/sock"),
            resv + 15,
            d("state"),
            d("spool"),
            d("slurmctld.pid"),
            d("slurmd.pid"),
            d("log/slurmctld.log"),
            d("log/slurmd.log"),
        );
        std::fs::write(dir.join("slurm.conf"), conf).map_err(|e| e.to_string())?;
        std::thread::sleep(std::time::Duration::from_millis(500));
        spawn(
            &mut c,
            Command::new(slurmctld).args(["-D", "-f", &d("slurm.conf")]),
        )?;
        spawn(
            &mut c,
            Command::new(slurmd).args(["-D", "-N", "localhost", "-f", &d("slurm.conf")]),
        )?;
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let state = Command::new(sinfo)
                .args(["-h", "-o", "%t"])
                .env("SLURM_CONF", d("slurm.conf"))
                .output();
            if state.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle") {
                return Ok(c);
            }
            if std::time::Instant::now() > deadline {
                let logs: String = ["log/daemons.log", "log/slurmctld.log", "log/slurmd.log"]
                    .iter()
                    .map(|l| std::fs::read_to_string(dir.join(l)).unwrap_or_default())
                    .collect();
                return Err(format!("the node did not become idle in 60 s:\n{logs}"));
            }
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
    }

    /// `srun <args> all_sum` with nothing of this process's launcher or Slurm environment.
    fn srun(&self, args: &[&str], secret: &SecretFile) -> Output {
        let mut c = Command::new(installed("srun").unwrap());
        for (k, _) in std::env::vars_os() {
            let k = k.to_string_lossy().into_owned();
            if ["MLX_", "SLURM", "PMI", "OMPI_"]
                .iter()
                .any(|p| k.starts_with(p))
            {
                c.env_remove(&k);
            }
        }
        let mut child = c
            .env("SLURM_CONF", self.dir.join("slurm.conf"))
            .env("MLX_DIST_JOB_SECRET_FILE", secret.path())
            .args(["--time", "2"])
            .args(args)
            .arg(all_sum())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(180);
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        child.wait_with_output().unwrap()
    }
}

/// The real thing: a one-node Slurm cluster (munge, slurmctld, slurmd) and
/// `srun -n 2` then `srun -n 3` of `all_sum`. Needs root and Slurm with
/// munge installed (Debian: `slurm-wlm`, which brings `slurmctld`,
/// `slurmd`, `slurm-client` and `munge`); says why and passes when they are
/// missing, unless `MLX_DIST_TEST_SLURM` is set.
#[test]
fn real_srun_runs_all_sum() {
    let t = std::time::Instant::now();
    all_sum();
    eprintln!("all_sum built in {:?}", t.elapsed());
    let t = std::time::Instant::now();
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => {
            assert!(
                std::env::var_os("MLX_DIST_TEST_SLURM").is_none(),
                "MLX_DIST_TEST_SLURM is set but Slurm cannot run here: {why}"
            );
            eprintln!("skipping: {why} (Debian: apt-get install slurm-wlm, as root)");
            return;
        }
    };
    let secret = SecretFile::new();
    eprintln!("cluster up in {:?}", t.elapsed());
    for (n, args) in [(2, &["-n", "2"][..]), (3, &["-n", "3", "--overcommit"][..])] {
        let t = std::time::Instant::now();
        let out = cluster.srun(args, &secret);
        eprintln!("srun -n {n}: {:?}", t.elapsed());
        let t = text(&out);
        assert!(out.status.success(), "srun -n {n} failed:\n{t}");
        let want = vec![n as f32; 10];
        let stdout = String::from_utf8_lossy(&out.stdout);
        for r in 0..n {
            assert!(
                stdout.lines().any(|l| l == format!("{r} {want:?}")),
                "srun -n {n}: rank {r} missing:\n{t}"
            );
        }
    }
}
