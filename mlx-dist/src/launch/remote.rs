//! The launcher's side of a remote rank: the `ssh` command that starts the
//! rank's agent ([`super::agent`]), and the control channel (ssh's standard
//! input) that carries the order, the rank's input and the signals.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{ChildStdin, Command};
use std::sync::{Arc, Condvar, Mutex};

use super::LaunchSpec;
use super::agent::{AGENT_FLAG, Frame, Order};

/// Where `mlx-launch` is on the remote hosts when the spec does not say:
/// this program when it is `mlx-launch`, else the `mlx-launch` beside it
/// (or beside the folder it is in, as for test and example binaries in
/// Cargo's target folder), else `mlx-launch` on the remote `PATH`. Hosts
/// that share the file system (a cluster's shared home) find it at the
/// same path.
pub fn default_remote_launcher() -> String {
    let Ok(me) = std::env::current_exe() else {
        return "mlx-launch".into();
    };
    if me.file_stem().is_some_and(|s| s == "mlx-launch") {
        return me.display().to_string();
    }
    let dir = me.parent();
    [dir, dir.and_then(Path::parent)]
        .into_iter()
        .flatten()
        .map(|d| d.join("mlx-launch"))
        .find(|p| p.is_file())
        .map_or_else(|| "mlx-launch".into(), |p| p.display().to_string())
}

/// Quotes `s` for a POSIX shell (the remote login shell reads ssh's command).
pub(crate) fn shell_quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:,@%+".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The ssh file and options every remote command of `spec` uses.
pub(crate) fn ssh_base(ssh_config: Option<&Path>) -> Command {
    let mut c = Command::new(std::env::var("MLX_LAUNCH_SSH").unwrap_or_else(|_| "ssh".into()));
    if let Some(f) = ssh_config {
        c.arg("-F").arg(f);
    }
    // Never ask for a password; notice a host that is gone within ~15 s;
    // no terminal, so that the rank's output is not rewritten.
    c.args([
        "-o",
        "BatchMode=yes",
        "-o",
        "ServerAliveInterval=5",
        "-o",
        "ServerAliveCountMax=3",
        "-T",
    ]);
    c
}

/// Gives every remote rank named only by its ssh destination the address
/// ssh itself would connect to (`ssh -G`, which applies the ssh
/// configuration: an alias `mlxh0` with `HostName 10.77.0.1` becomes
/// 10.77.0.1), so that the peers dial what ssh reaches even when the name
/// is not in DNS. Addresses given in a host file are kept.
pub(crate) fn resolve_ssh_names(spec: &mut LaunchSpec) {
    let mut known: Vec<(String, Option<String>)> = Vec::new();
    for h in &mut spec.hosts {
        let Some(dest) = &h.ssh else { continue };
        let name = dest.rsplit_once('@').map_or(dest.as_str(), |(_, n)| n);
        if h.ips.len() != 1 || h.ips[0] != name.trim_start_matches('[').trim_end_matches(']') {
            continue;
        }
        let resolved = match known.iter().find(|(d, _)| d == dest) {
            Some((_, r)) => r.clone(),
            None => {
                let r = ssh_hostname(spec.ssh_config.as_deref(), dest);
                known.push((dest.clone(), r.clone()));
                r
            }
        };
        if let Some(ip) = resolved {
            h.ips = vec![ip];
        }
    }
}

/// The `hostname` ssh would connect to for `dest` (`ssh -G`), if ssh says.
fn ssh_hostname(ssh_config: Option<&Path>, dest: &str) -> Option<String> {
    let mut c = Command::new(std::env::var("MLX_LAUNCH_SSH").unwrap_or_else(|_| "ssh".into()));
    if let Some(f) = ssh_config {
        c.arg("-F").arg(f);
    }
    let out = c.args(["-G", "--", dest]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("hostname "))
        .map(|h| h.trim().to_string())
        .filter(|h| super::check_ssh_destination(h).is_ok())
}

/// `ssh HOST 'LAUNCHER --remote-agent'`: the command line holds no secret
/// and nothing from the user but the (checked) host and launcher path.
pub(crate) fn agent_command(spec: &LaunchSpec, host: &str) -> Command {
    let mut c = ssh_base(spec.ssh_config.as_deref());
    let launcher = spec
        .remote_launcher
        .clone()
        .unwrap_or_else(default_remote_launcher);
    // `--` ends ssh's options: the host was checked not to look like one,
    // and this makes sure.
    c.arg("--")
        .arg(host)
        .arg(format!("{} {AGENT_FLAG}", shell_quote(&launcher)));
    c
}

/// The order for remote rank `rank`: its environment, program and working
/// directory (the spec's, else the launcher's own, as MLX's launcher does).
pub(crate) fn order_for(spec: &LaunchSpec, rank: usize, env: Vec<(String, String)>) -> Order {
    let here = &spec.hosts[rank].ssh;
    let cwd: Option<PathBuf> = spec.cwd.clone().or_else(|| std::env::current_dir().ok());
    Order {
        rank,
        command: spec.command.clone(),
        cwd: cwd.map(|d| d.display().to_string()),
        env,
        ranks_on_host: spec.hosts.iter().filter(|h| &h.ssh == here).count(),
        key: {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).expect("the operating system's random source failed");
            key
        },
    }
}

/// The control channel of a remote rank: ssh's standard input, written by a
/// thread of its own, so that no caller ever blocks on the pipe. Signals
/// and the end of input are queued as they come; the rank's input waits
/// for room (at most [`INPUT_IN_FLIGHT`] frames queued), so a rank that does
/// not read its input holds up neither Ctrl-C nor the launcher (the agent,
/// too, never stops reading its frames; see [`super::agent`]).
#[derive(Clone)]
pub(crate) struct Control(Arc<Shared>);

/// Input frames queued at most, 64 KiB each.
const INPUT_IN_FLIGHT: usize = 16;

struct Shared {
    queue: Mutex<Queue>,
    changed: Condvar,
}

struct Queue {
    frames: VecDeque<Frame>,
    /// Input frames among `frames`.
    inputs: usize,
    /// The writer ended: the pipe failed or [`Control::close`] was called.
    closed: bool,
    /// [`Control::close`] was called: drop the pipe once the queue is written.
    closing: bool,
}

impl Control {
    /// Takes `stdin`, writes the order on it first, and starts the writer.
    pub fn start(mut stdin: ChildStdin, order: &Order) -> std::io::Result<Control> {
        stdin.write_all(order.to_line().as_bytes())?;
        stdin.flush()?;
        let shared = Arc::new(Shared {
            queue: Mutex::new(Queue {
                frames: VecDeque::new(),
                inputs: 0,
                closed: false,
                closing: false,
            }),
            changed: Condvar::new(),
        });
        let s = shared.clone();
        std::thread::spawn(move || s.write_all(stdin));
        Ok(Control(shared))
    }

    /// Queues `frame` without waiting; false when the channel is closed
    /// (ssh is gone, or the launch is over).
    pub fn send(&self, frame: &Frame) -> bool {
        let mut q = self.0.lock();
        if q.closed || q.closing {
            return false;
        }
        q.frames.push_back(frame.clone());
        self.0.changed.notify_all();
        true
    }

    /// Queues input for the rank, waiting while [`INPUT_IN_FLIGHT`] frames
    /// are queued; false when the channel is closed.
    fn send_input(&self, data: Vec<u8>) -> bool {
        let mut q = self.0.lock();
        while !(q.closed || q.closing) && q.inputs >= INPUT_IN_FLIGHT {
            q = self.0.changed.wait(q).unwrap_or_else(|p| p.into_inner());
        }
        if q.closed || q.closing {
            return false;
        }
        q.frames.push_back(Frame::Input(data));
        q.inputs += 1;
        self.0.changed.notify_all();
        true
    }

    /// Closes the channel: an agent whose rank still runs kills it. Frames
    /// not yet written are dropped.
    pub fn close(&self) {
        let mut q = self.0.lock();
        q.closing = true;
        q.frames.clear();
        q.inputs = 0;
        self.0.changed.notify_all();
    }

    /// Copies this process's standard input to the rank on a detached thread.
    pub fn forward_stdin(&self) {
        let control = self.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut input = std::io::stdin().lock();
            loop {
                match std::io::Read::read(&mut input, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if !control.send_input(buf[..n].to_vec()) {
                            return;
                        }
                    }
                }
            }
            control.send(&Frame::EndOfInput);
        });
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer: each queued frame in turn, until the pipe fails or the
    /// channel is closed. Only this thread ever blocks on the pipe.
    fn write_all(&self, mut stdin: ChildStdin) {
        loop {
            let frame = {
                let mut q = self.lock();
                loop {
                    if q.closing {
                        q.closed = true;
                        return;
                    }
                    if let Some(f) = q.frames.pop_front() {
                        if matches!(f, Frame::Input(_)) {
                            q.inputs -= 1;
                            self.changed.notify_all();
                        }
                        break f;
                    }
                    q = self.changed.wait(q).unwrap_or_else(|p| p.into_inner());
                }
            };
            if stdin
                .write_all(&frame.encode())
                .and_then(|()| stdin.flush())
                .is_err()
            {
                let mut q = self.lock();
                q.closed = true;
                q.frames.clear();
                q.inputs = 0;
                self.changed.notify_all();
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(shell_quote("a=b"), "a=b");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
        assert_eq!(shell_quote(""), "''");
        assert_eq!(shell_quote("$(rm -rf /)"), "'$(rm -rf /)'");
    }

    #[test]
    fn ssh_aliases_become_the_address_ssh_connects_to() {
        if Command::new("ssh").arg("-V").output().is_err() {
            eprintln!("skipping: no ssh client");
            return;
        }
        let cfg = std::env::temp_dir().join(format!("mlx-ssh-g-{}", std::process::id()));
        std::fs::write(&cfg, "Host alias1\n  HostName 10.1.2.3\n").unwrap();
        let mut spec = LaunchSpec::local(3, vec!["p".into()]);
        spec.ssh_config = Some(cfg.clone());
        spec.hosts[0] = super::super::RankHost::on("alias1").unwrap();
        spec.hosts[1] = super::super::RankHost::on("root@alias1").unwrap();
        spec.hosts[2] = super::super::RankHost::on("alias1").unwrap();
        spec.hosts[2].ips = vec!["10.9.9.9".into()];
        resolve_ssh_names(&mut spec);
        std::fs::remove_file(cfg).unwrap();
        assert_eq!(spec.hosts[0].ips, ["10.1.2.3"]);
        assert_eq!(spec.hosts[1].ips, ["10.1.2.3"]);
        assert_eq!(spec.hosts[2].ips, ["10.9.9.9"], "given addresses are kept");
    }

    #[test]
    fn the_ssh_command_holds_no_secret() {
        let mut spec = LaunchSpec::local(2, vec!["prog".into()]);
        spec.hosts[1] = super::super::RankHost::on("node1").unwrap();
        spec.remote_launcher = Some("/opt/my tools/mlx-launch".into());
        let c = agent_command(&spec, "node1");
        let args: Vec<String> = c
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let n = args.len();
        assert_eq!(&args[n - 3..n - 1], ["--", "node1"]);
        assert_eq!(args[n - 1], "'/opt/my tools/mlx-launch' --remote-agent");
        let order = order_for(&spec, 1, vec![("MLX_DIST_JOB_SECRET".into(), "s3".into())]);
        assert_eq!(order.ranks_on_host, 1);
        assert!(!args.iter().any(|a| a.contains("s3")));
    }
}
