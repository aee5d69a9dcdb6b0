//! The hosts' ssh servers: starting one in its host's namespaces, waiting
//! for it to take a login, and finding it again by its pid file.

use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::exec::{tool, write};
use super::ssh_files::sshd_config;
use super::state::State;

/// The OpenSSH server; it must be started by its absolute path (it re-executes itself).
pub(super) const SSHD: &str = "/usr/sbin/sshd";

/// How long `up` waits for each sshd to take a login.
const SSH_READY: Duration = Duration::from_secs(10);

/// Starts host `i`'s sshd in its network namespace and in new mount and UTS
/// namespaces, where `/dev/shm` is a fresh tmpfs and the hostname is the
/// host's name; every session inherits them. sshd daemonizes.
pub(super) fn start_sshd(state: &State, i: usize) -> Result<()> {
    let name = state.layout.name(i);
    let config = state.dir.join(format!("sshd-{name}.conf"));
    let log = state.dir.join(format!("sshd-{name}.log"));
    write(&config, &sshd_config(state, i)?)?;
    let log_file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log)
        .with_context(|| format!("creating {}", log.display()))?;
    // The three steps must run in the one process whose namespaces sshd
    // keeps, hence this one-line sh script (its arguments are passed apart).
    let script = format!(
        "mount -t tmpfs -o mode=1777 tmpfs /dev/shm && hostname \"$1\" && exec {SSHD} -f \"$2\" -E \"$3\""
    );
    let mut cmd = Command::new(tool("ip"));
    cmd.args(["netns", "exec", &name])
        .arg(tool("unshare"))
        .args(["--mount", "--uts", "--", "sh", "-c", &script, "sh", &name])
        .arg(&config)
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().context("opening the sshd log")?)
        .stderr(log_file);
    let status = cmd
        .status()
        .with_context(|| format!("starting sshd for {name}"))?;
    if !status.success() {
        bail!(
            "sshd for {name} did not start ({status}); its log said:\n{}",
            fs::read_to_string(&log).unwrap_or_default()
        );
    }
    Ok(())
}

/// Waits until host `i`'s sshd takes a real login (`ssh host true`).
pub(super) fn wait_for_login(state: &State, i: usize) -> Result<()> {
    let name = state.layout.name(i);
    let config = state.dir.join("ssh_config");
    let start = Instant::now();
    loop {
        let out = Command::new(tool("ssh"))
            .arg("-F")
            .arg(&config)
            .args(["-o", "ConnectTimeout=2", &name, "true"])
            .stdin(Stdio::null())
            .output()
            .context("starting ssh")?;
        if out.status.success() {
            return Ok(());
        }
        if start.elapsed() > SSH_READY {
            let log = state.dir.join(format!("sshd-{name}.log"));
            bail!(
                "{name}'s sshd took no login within {} s: ssh said: {}\nsshd's log said:\n{}",
                SSH_READY.as_secs(),
                String::from_utf8_lossy(&out.stderr).trim(),
                fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The pid in an sshd pid file, if that process still runs and is one of
/// ours (its command line names the state folder; pids are reused).
pub(super) fn sshd_pid(pid_file: &Path, dir: &Path) -> Option<u32> {
    let pid: u32 = fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let ours = String::from_utf8_lossy(&cmdline).contains(dir.to_str()?);
    ours.then_some(pid)
}
