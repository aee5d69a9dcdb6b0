//! Running cargo and the workspace's binaries.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives one level below the workspace root")
        .to_path_buf()
}

/// Runs a cargo command in the workspace root and fails if it fails.
pub fn cargo(args: &[&str]) -> Result<()> {
    cargo_with_env(args, &[])
}

/// [`cargo`] with extra environment variables for it and what it runs.
pub fn cargo_with_env(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let shown: Vec<String> = env
        .iter()
        .map(|(k, v)| format!("{k}={} ", v.to_string_lossy()))
        .collect();
    eprintln!("xtask: {}cargo {}", shown.concat(), args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .envs(env.iter().copied())
        .current_dir(root())
        .status()
        .with_context(|| format!("could not start {cargo}"))?;
    if !status.success() {
        bail!("cargo {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// The target folder (honours `CARGO_TARGET_DIR`).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// Builds `mlx-launch` in release: the agent ssh starts for a remote rank.
pub fn build_launcher() -> Result<()> {
    cargo(&[
        "build",
        "--release",
        "-p",
        "mlx-dist",
        "--bin",
        "mlx-launch",
    ])
}

/// Builds the launcher and the trainer in `profile` (`release` or `dev`) and
/// returns the folder holding them.
pub fn build_trainer(profile: &str, build: bool) -> Result<PathBuf> {
    if build {
        cargo(&[
            "build",
            "--profile",
            profile,
            "-p",
            "mlx-dist",
            "-p",
            "mlx-llama",
            "--bins",
        ])?;
    }
    let dir = target_dir().join(if profile == "dev" { "debug" } else { profile });
    for bin in ["mlx-launch", "mlx-llama"] {
        let p = dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
        if !p.exists() {
            bail!(
                "{} is missing: build it with `cargo build --profile {profile} -p mlx-dist -p mlx-llama --bins`",
                p.display()
            );
        }
    }
    Ok(dir)
}

/// The folder holding `mlx-launch` and `mlx-llama`: `bin_dir` if given (checked,
/// never built), else the `dev` or `release` build, built first unless `no_build`.
pub fn trainer_bins(debug: bool, no_build: bool, bin_dir: Option<&Path>) -> Result<PathBuf> {
    match bin_dir {
        Some(dir) => {
            for bin in ["mlx-launch", "mlx-llama"] {
                let p = dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
                if !p.exists() {
                    bail!(
                        "{} is missing: build the launcher and the trainer there first (`cargo build -p mlx-dist -p mlx-llama --bins`, or `cargo test --workspace`, which builds them)",
                        p.display()
                    );
                }
            }
            Ok(dir.to_path_buf())
        }
        None => build_trainer(if debug { "dev" } else { "release" }, !no_build),
    }
}

/// Starts `mlx-launch -n world --backend backend -- mlx-llama train <args>` in the
/// workspace root with its output (both streams) going to `log`.
pub fn spawn_trainer(
    bins: &Path,
    world: usize,
    backend: &str,
    args: &[String],
    log: &Path,
) -> Result<std::process::Child> {
    let file = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    Command::new(bins.join("mlx-launch"))
        .args(["-n", &world.to_string(), "--backend", backend, "--"])
        .arg(bins.join("mlx-llama"))
        .arg("train")
        .args(args)
        .current_dir(root())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .context("starting mlx-launch")
}

/// How a command run by [`run_logged`] ended.
pub enum Ended {
    /// It exited by itself.
    Exited(std::process::ExitStatus),
    /// It ran past its deadline; it and every process it started were stopped.
    TimedOut,
}

/// Runs `cmd` with its output shown here and copied into `log`; past
/// `deadline` it and every process it started (ranks, `mpirun`) get SIGTERM,
/// then SIGKILL 10 s later.
pub fn run_logged(mut cmd: Command, log: &Path, deadline: Duration) -> Result<Ended> {
    use std::io::{BufRead, BufReader, Write};
    use std::sync::{Arc, Mutex, mpsc};

    let file = Arc::new(Mutex::new(
        std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?,
    ));
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {:?}", cmd.get_program()))?;
    let pid = child.id();
    let (done_tx, done_rx) = mpsc::channel();
    let tee = |from: Box<dyn std::io::Read + Send>, to_stderr: bool| {
        let file = file.clone();
        let done = done_tx.clone();
        std::thread::spawn(move || {
            let mut from = BufReader::new(from);
            let mut line = Vec::new();
            while from.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let _ = if to_stderr {
                    std::io::stderr().write_all(&line)
                } else {
                    std::io::stdout().write_all(&line)
                };
                let _ = file.lock().map(|mut f| f.write_all(&line));
                line.clear();
            }
            let _ = done.send(());
        })
    };
    tee(Box::new(child.stdout.take().expect("piped")), false);
    tee(Box::new(child.stderr.take().expect("piped")), true);
    let (exit_tx, exit_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = exit_tx.send(child.wait());
    });
    let ended = match exit_rx.recv_timeout(deadline) {
        Ok(status) => Ended::Exited(status.context("waiting for the command")?),
        Err(_) => {
            let tree = process_tree(pid);
            signal_all(&tree, sysinfo::Signal::Term);
            if exit_rx.recv_timeout(Duration::from_secs(10)).is_err() {
                signal_all(&tree, sysinfo::Signal::Kill);
                let _ = exit_rx.recv_timeout(Duration::from_secs(10));
            } else {
                // The command is gone; its ranks may linger a moment.
                std::thread::sleep(Duration::from_secs(2));
                signal_all(&tree, sysinfo::Signal::Kill);
            }
            Ended::TimedOut
        }
    };
    // The output threads end when the last writer of the pipes is gone.
    for _ in 0..2 {
        if done_rx.recv_timeout(Duration::from_secs(10)).is_err() {
            break;
        }
    }
    Ok(ended)
}

/// `pid` and every process below it, parents first.
fn process_tree(pid: u32) -> Vec<sysinfo::Pid> {
    use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};
    let Ok(mut sys) = System::new() else {
        return vec![Pid::from_u32(pid)];
    };
    sys.refresh_processes_specifics(ProcessesToUpdate::All, true, ProcessRefreshKind::nothing());
    let mut tree = vec![Pid::from_u32(pid)];
    let mut k = 0;
    while k < tree.len() {
        let parent = tree[k];
        tree.extend(
            sys.processes()
                .iter()
                .filter(|(_, p)| p.parent() == Some(parent))
                .map(|(pid, _)| *pid),
        );
        k += 1;
    }
    tree
}

/// Sends `signal` to each of `pids` that still runs.
fn signal_all(pids: &[sysinfo::Pid], signal: sysinfo::Signal) {
    use sysinfo::{ProcessRefreshKind, ProcessesToUpdate, System};
    let Ok(mut sys) = System::new() else { return };
    sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(pids),
        true,
        ProcessRefreshKind::nothing(),
    );
    for pid in pids {
        if let Some(p) = sys.process(*pid) {
            // Signals the platform lacks (SIGTERM on Windows) fall back to killing.
            if p.kill_with(signal).is_none() {
                p.kill();
            }
        }
    }
}

/// The last `lines` lines of a log file (for error messages).
pub fn log_tail(log: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The current UTC time as `YYYYMMDD-HHMMSS`, for run folder names.
pub fn timestamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Howard Hinnant's civil_from_days.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}{m:02}{d:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    #[test]
    fn timestamp_is_utc_date_and_time() {
        let t = super::timestamp();
        assert_eq!(t.len(), 15, "{t}");
        assert_eq!(&t[8..9], "-");
        assert!(
            t[..8]
                .chars()
                .chain(t[9..].chars())
                .all(|c| c.is_ascii_digit())
        );
        assert!(t.as_str() > "20240101-000000");
    }
}

/// Where the trainer's binaries come from and how its ranks talk: the
/// options `train`, `memprof` and `bench train` share.
#[derive(clap::Args, Debug, Clone)]
pub struct RunnerArgs {
    /// Collective backend: ring, quic or mpi.
    #[arg(long, default_value = "ring")]
    pub backend: String,
    /// Build and run the debug binaries instead of release ones.
    #[arg(long)]
    pub debug: bool,
    /// Use binaries already built instead of building.
    #[arg(long)]
    pub no_build: bool,
    /// Take mlx-launch and mlx-llama from this folder (never builds).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
}

impl RunnerArgs {
    /// The folder holding `mlx-launch` and `mlx-llama`, built first unless told not to.
    pub fn binaries(&self) -> Result<PathBuf> {
        trainer_bins(self.debug, self.no_build, self.bin_dir.as_deref())
    }
}
