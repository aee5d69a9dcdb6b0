//! A running set of hosts as callers see it ([`Hosts`]): its names,
//! addresses and files, ssh to one of them, and what `up` and `status` print.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use anyhow::{Context, Result, bail};

use super::exec::{list_namespaces, tool};
use super::rate::parse_rate;
use super::sshd::sshd_pid;
use super::state::State;

/// A running set of emulated hosts, as [`up`](super::up::up) made them.
#[derive(Debug, Clone)]
#[allow(dead_code)] // Library API for tests and benchmarks; the CLI reads only part of it.
pub struct Hosts {
    /// The hosts' names (`mlxh0`, ...): their ssh aliases, hostnames and namespaces.
    pub names: Vec<String>,
    /// Their addresses (`10.77.0.1`, ...), in the same order.
    pub ips: Vec<String>,
    /// The state folder (`target/mlx-hosts`).
    pub state_dir: PathBuf,
    /// The ssh client config: `ssh -F <ssh_config> mlxh0 ...`.
    pub ssh_config: PathBuf,
    /// MLX's launcher hostfile: `[{"ssh": "mlxh0", "ips": ["10.77.0.1"]}, ...]`.
    pub json_hostfile: PathBuf,
    /// An MPI hostfile: `mlxh0 slots=1` lines.
    pub mpi_hostfile: PathBuf,
    /// A shell file exporting `MLX_LAUNCH_SSH_CONFIG` (the ssh config's path).
    pub env_file: PathBuf,
    /// The shaping of each host's link (tc syntax, each direction), if any.
    pub rate: Option<String>,
}

#[allow(dead_code)] // Library API for tests and benchmarks.
impl Hosts {
    /// The hosts that `cargo xtask hosts up` (or [`up`](super::up::up)) left running, as
    /// recorded in the state folder; `None` when none are up.
    pub fn current() -> Result<Option<Hosts>> {
        let Some(state) = State::load()? else {
            return Ok(None);
        };
        Ok(Some(state.hosts()))
    }

    /// The number of hosts.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Whether there are no hosts (never, for a set [`up`](super::up::up) returned).
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// `ssh -F <ssh_config> <host i> <remote_cmd>`, to be run or spawned. The
    /// remote command runs in host `i`'s namespaces under sshd's default
    /// `PATH` (and root's shell startup files), so give binaries by their
    /// absolute paths. Panics if there is no host `i`.
    pub fn ssh_command(&self, i: usize, remote_cmd: &str) -> Command {
        let mut c = Command::new(tool("ssh"));
        c.arg("-F")
            .arg(&self.ssh_config)
            .arg(&self.names[i])
            .arg(remote_cmd)
            .stdin(Stdio::null());
        c
    }

    /// The summary `up` prints.
    pub(super) fn describe(&self) -> String {
        let mut s = String::new();
        let shaping = match self.rate.as_deref().map(parse_rate) {
            Some(Ok(Some(r))) => r.describe(),
            _ => "unshaped".to_string(),
        };
        let _ = writeln!(s, "{} emulated host(s) up, links {shaping}:", self.len());
        for (name, ip) in self.names.iter().zip(&self.ips) {
            let _ = writeln!(s, "  {name:<10} {ip}");
        }
        let _ = writeln!(
            s,
            "ssh config:    {}\n               (ssh -F {} {} hostname)",
            self.ssh_config.display(),
            self.ssh_config.display(),
            self.names[0]
        );
        let _ = writeln!(s, "MLX hostfile:  {}", self.json_hostfile.display());
        let _ = writeln!(s, "MPI hostfile:  {}", self.mpi_hostfile.display());
        let _ = writeln!(
            s,
            "environment:   . {}   (exports MLX_LAUNCH_SSH_CONFIG)",
            self.env_file.display()
        );
        let _ = writeln!(s, "remove with:   cargo xtask hosts down");
        s
    }

    /// [`Hosts::describe`] with each host's namespace and sshd checked.
    pub(super) fn status(&self) -> String {
        let mut s = self.describe();
        let namespaces = list_namespaces().unwrap_or_default();
        let mut problems = Vec::new();
        for name in &self.names {
            if !namespaces.contains(name) {
                problems.push(format!("{name}: its namespace is missing"));
                continue;
            }
            let pid_file = self.state_dir.join(format!("sshd-{name}.pid"));
            match sshd_pid(&pid_file, &self.state_dir) {
                Some(_) => {}
                None => problems.push(format!(
                    "{name}: its sshd is not running (log: {})",
                    self.state_dir.join(format!("sshd-{name}.log")).display()
                )),
            }
        }
        if problems.is_empty() {
            let _ = writeln!(s, "every namespace and sshd is running");
        } else {
            for p in problems {
                let _ = writeln!(s, "problem: {p}");
            }
        }
        s
    }
}

/// Runs `cmd` on host `i` over ssh and returns its output, whatever its exit
/// status (an error only when ssh cannot be started).
#[allow(dead_code)] // Library API for tests and benchmarks.
pub fn ssh(hosts: &Hosts, i: usize, cmd: &str) -> Result<Output> {
    if i >= hosts.len() {
        bail!("no host {i}: there are {}", hosts.len());
    }
    hosts
        .ssh_command(i, cmd)
        .output()
        .with_context(|| format!("starting ssh to {}", hosts.names[i]))
}

impl State {
    /// The public view (here, not in `state.rs`, so that the state stays
    /// below the running hosts).
    pub(super) fn hosts(&self) -> Hosts {
        let l = &self.layout;
        Hosts {
            names: (0..l.n).map(|i| l.name(i)).collect(),
            ips: (0..l.n).map(|i| l.ip(i)).collect(),
            state_dir: self.dir.clone(),
            ssh_config: self.dir.join("ssh_config"),
            json_hostfile: self.dir.join("hosts.json"),
            mpi_hostfile: self.dir.join("hostfile"),
            env_file: self.dir.join("env.sh"),
            rate: self.rate.as_ref().map(|r| r.text.clone()),
        }
    }
}
