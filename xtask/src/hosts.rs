//! `cargo xtask hosts`: several emulated hosts on this one Linux machine, for
//! multi-host tests and benchmarks.
//!
//! Each host is a network namespace (`mlxh0`, `mlxh1`, ...; the prefix is
//! `--name`) with its own `eth0` at `10.77.0.{i+1}/24`, its own `/dev/shm` and
//! hostname (a mount and UTS namespace), and a real OpenSSH server that takes
//! the key written here and nothing else. The hosts' links meet on a bridge in
//! the root namespace (`mlxhbr`, `10.77.0.254/24`), so a launcher run in the
//! root namespace reaches every host, and the hosts reach each other; the
//! namespaces have no other route, so their traffic stays on this machine.
//!
//! ```text
//!   root namespace: mlxhbr 10.77.0.254 ── mlxh0h ══ eth0 10.77.0.1 (netns mlxh0, sshd)
//!                                     └── mlxh1h ══ eth0 10.77.0.2 (netns mlxh1, sshd)
//! ```
//!
//! `--rate` shapes each host's link with `tc tbf` on both ends of its veth
//! pair: what the host sends (egress of its `eth0`) and what it receives
//! (egress of the bridge port), each at most the rate: a full-duplex link.
//!
//! Everything else lives in the state folder `target/mlx-hosts/`: the keys,
//! `ssh_config` (`ssh -F target/mlx-hosts/ssh_config mlxh0 hostname`),
//! `known_hosts`, MLX's JSON hostfile `hosts.json`, an MPI `hostfile`, `env.sh`
//! (exports `MLX_LAUNCH_SSH_CONFIG`), the sshd configs, logs and pid files,
//! and `state.json`, which `down`, `shape` and `status` read.
//!
//! It needs Linux, root (network and mount namespaces), iproute2 (`ip`, `tc`),
//! OpenSSH (`/usr/sbin/sshd`, `ssh`, `ssh-keygen`) and util-linux (`unshare`);
//! [`available`] says what is missing, so tests and benchmarks can skip with
//! that reason.

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::ops::Deref;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Subcommand;

use crate::util::root;

/// The first three octets of the hosts' /24: host `i` is `.{i+1}`.
const SUBNET: &str = "10.77.0";
/// The bridge's own address (the root namespace's side), with the prefix length.
const BRIDGE_ADDR: &str = "10.77.0.254/24";
/// The prefix of the hosts' names when none is given.
pub const DEFAULT_PREFIX: &str = "mlxh";
/// `.1` to `.253`: `.254` is the bridge, `.255` the broadcast address.
const MAX_HOSTS: usize = 253;
/// Linux interface names hold at most 15 bytes (IFNAMSIZ - 1).
const IFNAME_MAX: usize = 15;
/// The OpenSSH server; it must be started by its absolute path (it re-executes itself).
const SSHD: &str = "/usr/sbin/sshd";
/// How long `up` waits for each sshd to take a login.
const SSH_READY: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------
// Command line
// ---------------------------------------------------------------------------

/// `cargo xtask hosts ...`.
#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Bring up N emulated hosts (removing any earlier ones first).
    Up {
        /// Number of hosts (1 to 253).
        n: usize,
        /// Shape each host's link to this rate, in each direction (tc syntax:
        /// 10gbit, 1gbit, 500mbit; note tc's `mbps`/`gbps` are BYTES per
        /// second). Default: unshaped.
        #[arg(long)]
        rate: Option<String>,
        /// Prefix of the hosts' names, namespaces and links.
        #[arg(long, default_value = DEFAULT_PREFIX)]
        name: String,
    },
    /// Stop every host's processes and remove the namespaces, links and state folder.
    Down {
        /// Also remove hosts of this prefix (the one in the state folder and
        /// `mlxh` are always removed).
        #[arg(long)]
        name: Option<String>,
    },
    /// Reshape the running hosts' links to RATE (tc syntax, e.g. 10gbit); `none` removes the shaping.
    Shape {
        /// The new rate per host and direction, or `none`.
        rate: String,
    },
    /// What is up: hosts, addresses, shaping, and the ssh config and hostfile paths.
    Status,
}

/// Runs `cargo xtask hosts <cmd>`.
pub fn run(cmd: Cmd) -> Result<()> {
    match cmd {
        Cmd::Up { n, rate, name } => {
            let hosts = up_named(&name, n, rate.as_deref())?;
            print!("{}", hosts.describe());
            Ok(())
        }
        Cmd::Down { name } => {
            teardown(name.as_deref())?;
            eprintln!("xtask hosts: down");
            Ok(())
        }
        Cmd::Shape { rate } => {
            shape(Some(&rate))?;
            match parse_rate(&rate).map_err(anyhow::Error::msg)? {
                Some(r) => eprintln!("xtask hosts: links {}", r.describe()),
                None => eprintln!("xtask hosts: shaping removed"),
            }
            Ok(())
        }
        Cmd::Status => {
            match Hosts::current()? {
                Some(hosts) => print!("{}", hosts.status()),
                None => println!("no emulated hosts are up (`cargo xtask hosts up N`)"),
            }
            Ok(())
        }
    }
}

// ---------------------------------------------------------------------------
// Library API (for the test runner and the benchmarks)
// ---------------------------------------------------------------------------

/// A running set of emulated hosts, as [`up`] made them.
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
    /// The hosts that `cargo xtask hosts up` (or [`up`]) left running, as
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

    /// Whether there are no hosts (never, for a set [`up`] returned).
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
    fn describe(&self) -> String {
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
    fn status(&self) -> String {
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

/// Hosts that are brought down when this is dropped, so a test or benchmark
/// that fails or panics still leaves nothing behind.
#[allow(dead_code)] // Library API for tests and benchmarks.
pub struct HostsGuard(pub Hosts);

#[allow(dead_code)] // Library API for tests and benchmarks.
impl HostsGuard {
    /// [`up`] with `n` hosts, guarded.
    pub fn up(n: usize, rate: Option<&str>) -> Result<HostsGuard> {
        up(n, rate).map(HostsGuard)
    }
}

impl Deref for HostsGuard {
    type Target = Hosts;
    fn deref(&self) -> &Hosts {
        &self.0
    }
}

impl Drop for HostsGuard {
    fn drop(&mut self) {
        if let Err(e) = down() {
            eprintln!("xtask hosts: bringing the hosts down failed: {e:#}");
        }
    }
}

/// Why emulated hosts cannot run here (what is missing, and how to get it),
/// or `Ok` when they can. Tests and benchmarks skip with this reason.
pub fn available() -> Result<(), String> {
    if !cfg!(target_os = "linux") {
        return Err("emulated hosts need Linux network namespaces".into());
    }
    let mut missing = Vec::new();
    if !has_admin_caps() {
        missing.push(
            "root (CAP_NET_ADMIN and CAP_SYS_ADMIN, for the network and mount namespaces): \
             run it as root"
                .to_string(),
        );
    }
    let groups: [(&[&str], &str); 6] = [
        (&["ip", "tc"], "Debian: iproute2"),
        (&[SSHD], "Debian: openssh-server"),
        (&["ssh", "ssh-keygen"], "Debian: openssh-client"),
        (&["unshare"], "Debian: util-linux"),
        (&["mount"], "Debian: mount"),
        (&["hostname"], "Debian: hostname"),
    ];
    for (tools, fix) in groups {
        let absent: Vec<&str> = tools
            .iter()
            .copied()
            .filter(|t| find_tool(t).is_none())
            .collect();
        if !absent.is_empty() {
            missing.push(format!("{} ({fix})", absent.join(", ")));
        }
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(format!("emulated hosts need {}", missing.join("; ")))
    }
}

/// Brings up `n` hosts named `mlxh0..`, each link shaped to `rate` (tc syntax,
/// each direction; `None` or `"none"`: unshaped). Any earlier hosts are
/// removed first; if a step fails, what was made is removed before the error
/// returns. Returns once every host's sshd takes a login and the hosts reach
/// each other. There is one set of hosts per machine (one state folder, one
/// subnet): a later `up` replaces it, so tests that use hosts take turns.
pub fn up(n: usize, rate: Option<&str>) -> Result<Hosts> {
    up_named(DEFAULT_PREFIX, n, rate)
}

/// [`up`] with another name prefix than `mlxh` (the addresses stay
/// `10.77.0.0/24`: one set of hosts runs at a time).
pub fn up_named(prefix: &str, n: usize, rate: Option<&str>) -> Result<Hosts> {
    available().map_err(anyhow::Error::msg)?;
    let layout = Layout::new(prefix, n)?;
    let rate = match rate {
        Some(r) => parse_rate(r).map_err(anyhow::Error::msg)?,
        None => None,
    };
    teardown(Some(prefix)).context("removing the hosts of an earlier run")?;
    let state = State {
        layout,
        rate,
        dir: state_dir(),
    };
    match bring_up(&state) {
        Ok(()) => Ok(state.hosts()),
        Err(e) => {
            if let Err(e2) = teardown(Some(prefix)) {
                eprintln!("xtask hosts: cleaning up after the failure also failed: {e2:#}");
            }
            Err(e.context(format!(
                "bringing up {n} emulated host(s) failed (what was made is removed)"
            )))
        }
    }
}

/// Brings the hosts down: kills every process inside their namespaces (sshd
/// and whatever was started over ssh), deletes the namespaces, links and
/// bridge, and removes the state folder. Idempotent and best-effort: it goes
/// on past failures and returns an error only if something is left.
pub fn down() -> Result<()> {
    teardown(None)
}

/// Reshapes the running hosts' links to `rate` (tc syntax, each direction);
/// `None` or `"none"` removes the shaping.
pub fn shape(rate: Option<&str>) -> Result<()> {
    let rate = match rate {
        Some(r) => parse_rate(r).map_err(anyhow::Error::msg)?,
        None => None,
    };
    let Some(mut state) = State::load()? else {
        bail!("no emulated hosts are up (`cargo xtask hosts up N`)");
    };
    for i in 0..state.layout.n {
        shape_link(&state.layout, i, rate.as_ref())?;
    }
    state.rate = rate;
    state.save()
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

/// The state folder: `target/mlx-hosts` in the workspace root.
pub fn state_dir() -> PathBuf {
    root().join("target").join("mlx-hosts")
}

// ---------------------------------------------------------------------------
// Rates and shaping
// ---------------------------------------------------------------------------

/// A link rate that `tc` understands.
#[derive(Debug, Clone, PartialEq)]
pub struct Rate {
    /// As given, lower-cased (`10gbit`).
    pub text: String,
    /// In bits per second.
    pub bits_per_sec: u64,
}

/// tc's rate units (`tc(8)`, "RATES"), lower case, and their worth in bits
/// per second. The `bps` family is BYTES per second, as in tc.
const RATE_UNITS: [(&str, f64); 18] = [
    ("bit", 1.0),
    ("kbit", 1e3),
    ("mbit", 1e6),
    ("gbit", 1e9),
    ("tbit", 1e12),
    ("kibit", 1024.0),
    ("mibit", 1_048_576.0),
    ("gibit", 1_073_741_824.0),
    ("tibit", 1_099_511_627_776.0),
    ("bps", 8.0),
    ("kbps", 8e3),
    ("mbps", 8e6),
    ("gbps", 8e9),
    ("tbps", 8e12),
    ("kibps", 8.0 * 1024.0),
    ("mibps", 8.0 * 1_048_576.0),
    ("gibps", 8.0 * 1_073_741_824.0),
    ("tibps", 8.0 * 1_099_511_627_776.0),
];

/// Parses a rate in tc syntax: digits (with an optional fraction) and a unit,
/// e.g. `10gbit`, `1gbit`, `500mbit`, `2.5gbit`; `none` gives `None` (no
/// shaping). The error says what is accepted.
pub fn parse_rate(s: &str) -> Result<Option<Rate>, String> {
    let text = s.trim().to_ascii_lowercase();
    if text == "none" {
        return Ok(None);
    }
    let bad = |why: &str| {
        format!(
            "invalid rate `{s}`: {why}; write digits and a tc unit, e.g. 10gbit, 1gbit, 500mbit \
             (units: bit, kbit, mbit, gbit, tbit, kibit..tibit; bps, kbps, mbps, gbps, tbps \
             are BYTES per second), or `none` for no shaping"
        )
    };
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| bad("no unit"))?;
    let (number, unit) = text.split_at(split);
    let (int, frac) = number.split_once('.').unwrap_or((number, "0"));
    if int.is_empty()
        || frac.is_empty()
        || !int.bytes().all(|b| b.is_ascii_digit())
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(bad("the number must be digits, with an optional fraction"));
    }
    let Some(&(_, per_unit)) = RATE_UNITS.iter().find(|(u, _)| *u == unit) else {
        return Err(bad(&format!("unknown unit `{unit}`")));
    };
    let value: f64 = number
        .parse()
        .map_err(|_| bad("the number does not parse"))?;
    let bits = value * per_unit;
    if !(1.0..=1e15).contains(&bits) {
        return Err(bad("it must be between 1bit and 1000tbit"));
    }
    Ok(Some(Rate {
        text,
        bits_per_sec: bits.round() as u64,
    }))
}

impl Rate {
    /// Bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        self.bits_per_sec / 8
    }

    /// e.g. `1gbit (0.125 GB/s) each way`.
    fn describe(&self) -> String {
        format!(
            "shaped to {} ({:.3} GB/s) per host, each way",
            self.text,
            self.bytes_per_sec() as f64 / 1e9
        )
    }

    /// The token bucket's size in bytes.
    ///
    /// tbf only reaches its rate when the bucket holds what the link sends
    /// between two of its timer wake-ups; a bigger bucket lets a host send
    /// that much faster than the rate after an idle spell (a real link never
    /// does), so it should be no bigger than it must. Measured here (veth
    /// pair through the bridge, one TCP stream, MTU 1500; the most TCP
    /// payload a 1500-byte MTU leaves is 1448/1514 = 95.6% of the rate):
    /// at 10gbit, a 64 KiB bucket gave 3.3 Gbit/s, 256 KiB 9.35, 1.25 MB
    /// (1 ms) 9.37, 2.5 MB (2 ms) 9.53 and 5 MB (4 ms, one tick at HZ=250)
    /// 9.52; at 1gbit, 64 KiB gave 0.92 Gbit/s and 125 KB (1 ms) or more
    /// 0.96. So: 2 ms of the rate, and at least 128 KiB (two 64 KiB GSO
    /// packets; tbf would cut a GSO packet bigger than the bucket).
    pub fn burst_bytes(&self) -> u64 {
        (self.bytes_per_sec() / 500).max(128 * 1024)
    }
}

/// How long a packet may wait in a tbf queue: the queue's length is what the
/// link sends in this time (plus the bucket). TCP's small queues keep each
/// stream's share far below it; it only bounds many streams at once.
const TBF_LATENCY: &str = "50ms";

/// Shapes (or, with `None`, unshapes) both ends of host `i`'s veth pair.
fn shape_link(layout: &Layout, i: usize, rate: Option<&Rate>) -> Result<()> {
    let ns = layout.name(i);
    let ns_side = ["ip", "netns", "exec", &ns, "tc"];
    let (host_dev, bridge_dev) = ("eth0", layout.veth(i));
    for (prefix, dev) in [(&ns_side[..], host_dev), (&["tc"][..], bridge_dev.as_str())] {
        match rate {
            Some(r) => {
                let args = format!(
                    "qdisc replace dev {dev} root tbf rate {}bit burst {} latency {TBF_LATENCY}",
                    r.bits_per_sec,
                    r.burst_bytes()
                );
                let args: Vec<&str> = args.split(' ').collect();
                exec(&[prefix, &args[..]].concat())?;
            }
            None => {
                let show = exec(&[prefix, &["qdisc", "show", "dev", dev, "root"][..]].concat())?;
                if show.contains("tbf") {
                    exec(&[prefix, &["qdisc", "del", "dev", dev, "root"][..]].concat())?;
                }
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Names, and what is recorded in the state folder
// ---------------------------------------------------------------------------

/// The names and addresses of `n` hosts with one prefix.
#[derive(Debug, Clone, PartialEq)]
struct Layout {
    prefix: String,
    n: usize,
}

impl Layout {
    /// Checks the prefix (lower-case letters and digits, starting and ending
    /// with a letter, so that no prefix's names match another's) and `n`.
    fn new(prefix: &str, n: usize) -> Result<Layout> {
        if n == 0 || n > MAX_HOSTS {
            bail!("the number of hosts must be 1 to {MAX_HOSTS} (they share 10.77.0.0/24)");
        }
        valid_prefix(prefix)?;
        let layout = Layout {
            prefix: prefix.to_string(),
            n,
        };
        let longest = layout.veth(n - 1);
        if longest.len() > IFNAME_MAX || layout.bridge().len() > IFNAME_MAX {
            bail!(
                "the name prefix `{prefix}` is too long: interface names like `{longest}` \
                 must fit in {IFNAME_MAX} characters"
            );
        }
        Ok(layout)
    }

    /// Host `i`'s name: its namespace, hostname and ssh alias.
    fn name(&self, i: usize) -> String {
        format!("{}{i}", self.prefix)
    }

    /// Host `i`'s address.
    fn ip(&self, i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }

    /// The root namespace's end of host `i`'s veth pair (on the bridge).
    fn veth(&self, i: usize) -> String {
        format!("{}{i}h", self.prefix)
    }

    /// The bridge.
    fn bridge(&self) -> String {
        bridge_name(&self.prefix)
    }
}

/// The bridge of the hosts with this prefix.
fn bridge_name(prefix: &str) -> String {
    format!("{prefix}br")
}

/// Lower-case letters and digits, starting and ending with a letter.
fn valid_prefix(prefix: &str) -> Result<()> {
    let b = prefix.as_bytes();
    let ok = !b.is_empty()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        && b[0].is_ascii_lowercase()
        && b[b.len() - 1].is_ascii_lowercase();
    if !ok {
        bail!(
            "invalid host name prefix `{prefix}`: use lower-case letters and digits, \
             starting and ending with a letter (e.g. mlxh)"
        );
    }
    Ok(())
}

/// What `state.json` records: enough to rebuild [`Hosts`] and to find
/// everything again for `down` and `shape`.
struct State {
    layout: Layout,
    rate: Option<Rate>,
    dir: PathBuf,
}

impl State {
    /// The state folder's `state.json`, if hosts are up.
    fn load() -> Result<Option<State>> {
        let dir = state_dir();
        let path = dir.join("state.json");
        let text = match fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
        };
        let parse = || -> Option<(String, usize, Option<String>)> {
            let v: serde_json::Value = serde_json::from_str(&text).ok()?;
            let prefix = v.get("prefix")?.as_str()?.to_string();
            let n = usize::try_from(v.get("n")?.as_u64()?).ok()?;
            let rate = v.get("rate").and_then(|r| r.as_str()).map(String::from);
            Some((prefix, n, rate))
        };
        let (prefix, n, rate) = parse().with_context(|| {
            format!(
                "{} is damaged: run `cargo xtask hosts down`",
                path.display()
            )
        })?;
        let layout = Layout::new(&prefix, n)?;
        let rate = match rate {
            Some(r) => parse_rate(&r).map_err(anyhow::Error::msg)?,
            None => None,
        };
        Ok(Some(State { layout, rate, dir }))
    }

    /// Writes `state.json`.
    fn save(&self) -> Result<()> {
        let v = serde_json::json!({
            "prefix": self.layout.prefix,
            "n": self.layout.n,
            "rate": self.rate.as_ref().map(|r| r.text.clone()),
        });
        write(&self.dir.join("state.json"), &format!("{v:#}\n"))
    }

    /// The public view.
    fn hosts(&self) -> Hosts {
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

// ---------------------------------------------------------------------------
// Bringing hosts up
// ---------------------------------------------------------------------------

/// Every step of `up` after the leftovers are gone; the caller removes what
/// was made if this fails.
fn bring_up(state: &State) -> Result<()> {
    let l = &state.layout;
    let dir = &state.dir;
    check_subnet_free(&l.bridge())?;
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // Recorded first, so that `down` finds a half-made set too.
    state.save()?;

    // Keys: one for the user (root, on every host), one for the hosts.
    let user_key = dir.join("id_ed25519");
    let host_key = dir.join("host_key");
    keygen(&user_key, "mlx-hosts user")?;
    keygen(&host_key, "mlx-hosts host")?;
    let user_pub = read(&dir.join("id_ed25519.pub"))?;
    write(&dir.join("authorized_keys"), &user_pub)?;
    let host_pub = read(&dir.join("host_key.pub"))?;
    write(&dir.join("known_hosts"), &known_hosts(l, &host_pub)?)?;
    write(&dir.join("ssh_config"), &ssh_config(l, dir)?)?;
    write_hostfiles(state)?;

    // The network: a bridge, and per host a namespace joined to it by a veth pair.
    let bridge = l.bridge();
    exec(&["ip", "link", "add", &bridge, "type", "bridge"])?;
    exec(&["ip", "addr", "add", BRIDGE_ADDR, "dev", &bridge])?;
    exec(&["ip", "link", "set", &bridge, "up"])?;
    for i in 0..l.n {
        let (ns, veth, cidr) = (l.name(i), l.veth(i), format!("{}/24", l.ip(i)));
        exec(&["ip", "netns", "add", &ns])?;
        // The namespace's end is made inside it, as `eth0`. The MTU stays at
        // 1500, the usual default (also of most cloud 10G links); jumbo frames
        // (9000) gave 9.9 instead of 9.5 Gbit/s of TCP payload at 10gbit here.
        exec(&[
            "ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
        ])?;
        exec(&["ip", "link", "set", &veth, "master", &bridge])?;
        exec(&["ip", "link", "set", &veth, "up"])?;
        exec(&["ip", "-n", &ns, "addr", "add", &cidr, "dev", "eth0"])?;
        exec(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
        exec(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        if let Some(rate) = &state.rate {
            shape_link(l, i, Some(rate))?;
        }
    }

    // The ssh servers.
    fs::create_dir_all("/run/sshd")
        .context("creating /run/sshd (sshd's privilege separation folder)")?;
    for i in 0..l.n {
        start_sshd(state, i)?;
    }
    // Each takes a login, then each reaches the next over the bridge (a
    // firewall may filter bridged traffic); the hosts are checked at once.
    for_each_host(l.n, |i| wait_for_login(state, i))?;
    if l.n > 1 {
        for_each_host(l.n, |i| check_peer(state, i, (i + 1) % l.n))?;
    }
    Ok(())
}

/// Runs `check` for hosts `0..n`, up to 16 at once on their own threads,
/// and returns the first error, if any.
fn for_each_host(n: usize, check: impl Fn(usize) -> Result<()> + Sync) -> Result<()> {
    let check = &check;
    let hosts: Vec<usize> = (0..n).collect();
    for batch in hosts.chunks(16) {
        std::thread::scope(|s| {
            let threads: Vec<_> = batch.iter().map(|&i| s.spawn(move || check(i))).collect();
            threads
                .into_iter()
                .map(|t| {
                    t.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a check panicked")))
                })
                .collect::<Result<Vec<()>>>()
        })?;
    }
    Ok(())
}

/// Fails if another interface already has an address in 10.77.0.0/24.
fn check_subnet_free(bridge: &str) -> Result<()> {
    let addrs = exec(&["ip", "-o", "-4", "addr", "show"])?;
    for line in addrs.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        if let [_, dev, "inet", addr, ..] = fields[..]
            && addr.starts_with(&format!("{SUBNET}."))
            && dev != bridge
        {
            bail!(
                "{SUBNET}.0/24 is already in use here ({addr} on {dev}); \
                 the emulated hosts need it"
            );
        }
    }
    Ok(())
}

/// `ssh-keygen` for an ed25519 key without passphrase at `path` (`path.pub` beside it).
fn keygen(path: &Path, comment: &str) -> Result<()> {
    let p = path_str(path)?;
    exec(&[
        "ssh-keygen",
        "-q",
        "-t",
        "ed25519",
        "-N",
        "",
        "-C",
        comment,
        "-f",
        p,
    ])
    .map(drop)
}

/// One `name,address key` line per host, so ssh checks the host key by either.
fn known_hosts(l: &Layout, host_pub: &str) -> Result<String> {
    let key: Vec<&str> = host_pub.split_whitespace().take(2).collect();
    if key.len() != 2 {
        bail!("the host key's public half is malformed: {host_pub:?}");
    }
    let key = key.join(" ");
    Ok((0..l.n)
        .map(|i| format!("{},{} {key}\n", l.name(i), l.ip(i)))
        .collect())
}

/// A path for an ssh config file: quoted, with `%` (a token there) doubled.
fn ssh_path(p: &Path) -> Result<String> {
    let s = path_str(p)?;
    if s.contains('"') || s.contains('\n') {
        bail!("ssh cannot be given a path with quotes or newlines: {s:?}");
    }
    Ok(format!("\"{}\"", s.replace('%', "%%")))
}

/// The client config: one block per host, and the same options for the
/// addresses themselves. The key exchange is plain curve25519: OpenSSH 9's
/// default (post-quantum sntrup761x25519) cost ~90 ms of CPU per login here,
/// which adds up when a test opens many sessions, and the traffic never
/// leaves this machine.
fn ssh_config(l: &Layout, dir: &Path) -> Result<String> {
    let common = format!(
        "    User root\n\
         \x20   IdentityFile {}\n\
         \x20   IdentitiesOnly yes\n\
         \x20   UserKnownHostsFile {}\n\
         \x20   GlobalKnownHostsFile /dev/null\n\
         \x20   StrictHostKeyChecking yes\n\
         \x20   UpdateHostKeys no\n\
         \x20   BatchMode yes\n\
         \x20   ConnectTimeout 10\n\
         \x20   KexAlgorithms curve25519-sha256,curve25519-sha256@libssh.org\n\
         \x20   LogLevel ERROR\n",
        ssh_path(&dir.join("id_ed25519"))?,
        ssh_path(&dir.join("known_hosts"))?,
    );
    let mut s = format!(
        "# Written by `cargo xtask hosts up`: the emulated hosts {}..{}.\n\
         # ssh -F {} {} hostname\n",
        l.name(0),
        l.name(l.n - 1),
        ssh_path(&dir.join("ssh_config"))?,
        l.name(0),
    );
    for i in 0..l.n {
        let _ = write!(
            s,
            "\nHost {}\n    HostName {}\n{common}",
            l.name(i),
            l.ip(i)
        );
    }
    let _ = write!(s, "\nHost {SUBNET}.*\n{common}");
    Ok(s)
}

/// `hosts.json` (MLX's launcher), `hostfile` (MPI) and `env.sh`.
fn write_hostfiles(state: &State) -> Result<()> {
    let l = &state.layout;
    let json: Vec<serde_json::Value> = (0..l.n)
        .map(|i| serde_json::json!({"ssh": l.name(i), "ips": [l.ip(i)]}))
        .collect();
    let json = serde_json::to_string_pretty(&json).context("writing hosts.json")?;
    write(&state.dir.join("hosts.json"), &format!("{json}\n"))?;
    let mpi: String = (0..l.n)
        .map(|i| format!("{} slots=1\n", l.name(i)))
        .collect();
    write(&state.dir.join("hostfile"), &mpi)?;
    let config = path_str(&state.dir.join("ssh_config"))?.replace('\'', r"'\''");
    write(
        &state.dir.join("env.sh"),
        &format!(
            "# Written by `cargo xtask hosts up`. Source it to point mlx-launch at the emulated hosts.\n\
             export MLX_LAUNCH_SSH_CONFIG='{config}'\n"
        ),
    )
}

/// sshd's config for host `i`: key-only logins as root, with the key from
/// the state folder, and room for many sessions at once.
fn sshd_config(state: &State, i: usize) -> Result<String> {
    let (l, dir) = (&state.layout, &state.dir);
    let name = l.name(i);
    Ok(format!(
        "# Written by `cargo xtask hosts up` for the emulated host {name}.\n\
         ListenAddress {ip}\n\
         HostKey {host_key}\n\
         AuthorizedKeysFile {authorized}\n\
         PidFile {pid}\n\
         PasswordAuthentication no\n\
         KbdInteractiveAuthentication no\n\
         PubkeyAuthentication yes\n\
         PermitRootLogin prohibit-password\n\
         UsePAM no\n\
         StrictModes no\n\
         PrintMotd no\n\
         MaxStartups 100:30:200\n\
         MaxSessions 100\n",
        ip = l.ip(i),
        host_key = ssh_path(&dir.join("host_key"))?,
        authorized = ssh_path(&dir.join("authorized_keys"))?,
        pid = ssh_path(&dir.join(format!("sshd-{name}.pid")))?,
    ))
}

/// Starts host `i`'s sshd in its network namespace and in new mount and UTS
/// namespaces, where `/dev/shm` is a fresh tmpfs and the hostname is the
/// host's name; every session inherits them. sshd daemonizes.
fn start_sshd(state: &State, i: usize) -> Result<()> {
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
fn wait_for_login(state: &State, i: usize) -> Result<()> {
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

/// Host `from` logs into host `to` (over the bridge).
fn check_peer(state: &State, from: usize, to: usize) -> Result<()> {
    let l = &state.layout;
    let config = path_str(&state.dir.join("ssh_config"))?.to_string();
    let (from_name, to_name) = (l.name(from), l.name(to));
    exec(&[
        "ip", "netns", "exec", &from_name, "ssh", "-F", &config, &to_name, "true",
    ])
    .with_context(|| {
        format!(
            "{from_name} cannot reach {to_name} over the bridge {}. If \
             /proc/sys/net/bridge/bridge-nf-call-iptables is 1, the firewall's FORWARD chain \
             filters bridged traffic (Docker sets its policy to DROP); allow it with \
             `iptables -I FORWARD -i {br} -o {br} -j ACCEPT`",
            l.bridge(),
            br = l.bridge()
        )
    })
    .map(drop)
}

// ---------------------------------------------------------------------------
// Bringing hosts down
// ---------------------------------------------------------------------------

/// Removes the hosts with the recorded prefix, `mlxh` and `extra`: their
/// processes, namespaces, links, bridge and the state folder. Goes on past
/// failures; fails only if something is left.
fn teardown(extra: Option<&str>) -> Result<()> {
    let dir = state_dir();
    let mut prefixes = vec![DEFAULT_PREFIX.to_string()];
    if let Ok(Some(state)) = State::load() {
        prefixes.push(state.layout.prefix);
    }
    if let Some(p) = extra {
        valid_prefix(p)?;
        prefixes.push(p.to_string());
    }
    prefixes.sort();
    prefixes.dedup();

    // sshd first (so it starts no new sessions), from its pid files: also
    // found where its namespace was deleted by hand.
    if let Ok(entries) = fs::read_dir(&dir) {
        for entry in entries.flatten() {
            let path = entry.path();
            let is_pid_file = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("sshd-") && n.ends_with(".pid"));
            if let Some(pid) = is_pid_file.then(|| sshd_pid(&path, &dir)).flatten() {
                kill(&[pid]);
            }
        }
    }

    let mut warnings = Vec::new();
    let namespaces = list_namespaces().unwrap_or_else(|e| {
        warnings.push(format!("{e:#}"));
        Vec::new()
    });
    let links = list_links().unwrap_or_else(|e| {
        warnings.push(format!("{e:#}"));
        Vec::new()
    });
    for prefix in &prefixes {
        let ours: Vec<&String> = namespaces
            .iter()
            .filter(|n| numbered(n, prefix, ""))
            .collect();
        // Everything inside: sshd, its sessions, and what they started.
        for ns in &ours {
            if let Err(e) = kill_namespace(ns) {
                warnings.push(format!("{e:#}"));
            }
        }
        // Deleting the root namespace's end deletes the pair.
        for link in links.iter().filter(|l| numbered(l, prefix, "h")) {
            if let Err(e) = exec(&["ip", "link", "del", link]) {
                warnings.push(format!("{e:#}"));
            }
        }
        for ns in &ours {
            if let Err(e) = exec(&["ip", "netns", "del", ns]) {
                warnings.push(format!("{e:#}"));
            }
        }
        let bridge = bridge_name(prefix);
        if links.contains(&bridge)
            && let Err(e) = exec(&["ip", "link", "del", &bridge])
        {
            warnings.push(format!("{e:#}"));
        }
    }
    if dir.exists()
        && let Err(e) = fs::remove_dir_all(&dir)
    {
        warnings.push(format!("removing {}: {e}", dir.display()));
    }

    // What is left, if anything.
    let mut left = Vec::new();
    let namespaces = list_namespaces().unwrap_or_default();
    let links = list_links().unwrap_or_default();
    for prefix in &prefixes {
        left.extend(
            namespaces
                .iter()
                .filter(|n| numbered(n, prefix, ""))
                .map(|n| format!("namespace {n}")),
        );
        left.extend(
            links
                .iter()
                .filter(|l| numbered(l, prefix, "h") || **l == bridge_name(prefix))
                .map(|l| format!("link {l}")),
        );
    }
    if dir.exists() {
        left.push(format!("folder {}", dir.display()));
    }
    if !left.is_empty() {
        bail!(
            "could not remove {}:\n{}",
            left.join(", "),
            warnings.join("\n")
        );
    }
    Ok(())
}

/// Whether `name` is `prefix`, digits, then `suffix`.
fn numbered(name: &str, prefix: &str, suffix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(suffix))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
}

/// The named network namespaces (`ip netns list`).
fn list_namespaces() -> Result<Vec<String>> {
    Ok(exec(&["ip", "netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect())
}

/// The root namespace's interfaces (`ip -o link show`), without their `@peer`.
fn list_links() -> Result<Vec<String>> {
    Ok(exec(&["ip", "-o", "link", "show"])?
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|name| name.split('@').next().unwrap_or(name).to_string())
        .collect())
}

/// Kills every process in network namespace `ns` until none is left
/// (sshd may fork a session while it is being killed).
fn kill_namespace(ns: &str) -> Result<()> {
    let me = std::process::id();
    for _ in 0..50 {
        let pids: Vec<u32> = exec(&["ip", "netns", "pids", ns])?
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .filter(|&p| p != me)
            .collect();
        if pids.is_empty() {
            return Ok(());
        }
        kill(&pids);
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("processes in namespace {ns} survive SIGKILL")
}

/// The pid in an sshd pid file, if that process still runs and is one of
/// ours (its command line names the state folder; pids are reused).
fn sshd_pid(pid_file: &Path, dir: &Path) -> Option<u32> {
    let pid: u32 = fs::read_to_string(pid_file).ok()?.trim().parse().ok()?;
    let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let ours = String::from_utf8_lossy(&cmdline).contains(dir.to_str()?);
    ours.then_some(pid)
}

/// SIGKILL to each of `pids` that still runs.
fn kill(pids: &[u32]) {
    use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, Signal, System};
    let Ok(mut sys) = System::new() else { return };
    let pids: Vec<Pid> = pids.iter().map(|&p| Pid::from_u32(p)).collect();
    sys.refresh_processes_specifics(
        ProcessesToUpdate::Some(&pids),
        true,
        ProcessRefreshKind::nothing(),
    );
    for pid in pids {
        if let Some(p) = sys.process(pid)
            && p.kill_with(Signal::Kill).is_none()
        {
            p.kill();
        }
    }
}

// ---------------------------------------------------------------------------
// Running commands and files
// ---------------------------------------------------------------------------

/// Where `name` is: itself if it is a path, else the first match on `PATH`,
/// then in the sbin folders (not on every user's `PATH`).
fn find_tool(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin", "/usr/bin", "/bin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// `name`'s full path where found, else `name` (to fail when run).
fn tool(name: &str) -> PathBuf {
    find_tool(name).unwrap_or_else(|| PathBuf::from(name))
}

/// Runs `argv` and returns its stdout; fails with its stderr if it fails.
fn exec(argv: &[&str]) -> Result<String> {
    let (program, args) = argv.split_first().context("an empty command")?;
    let out = Command::new(tool(program))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .with_context(|| format!("could not start `{program}`"))?;
    if !out.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            argv.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this process may create network and mount namespaces: its
/// effective capabilities hold CAP_NET_ADMIN (12) and CAP_SYS_ADMIN (21).
fn has_admin_caps() -> bool {
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << 12) != 0 && caps & (1 << 21) != 0)
}

/// A path as UTF-8 (to pass to commands and write into configs).
fn path_str(p: &Path) -> Result<&str> {
    p.to_str()
        .with_context(|| format!("the path {} is not UTF-8", p.display()))
}

fn read(p: &Path) -> Result<String> {
    fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))
}

fn write(p: &Path, text: &str) -> Result<()> {
    let mut f = fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", p.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rate(s: &str) -> u64 {
        parse_rate(s).unwrap().unwrap().bits_per_sec
    }

    #[test]
    fn rates_parse_in_tc_syntax() {
        assert_eq!(rate("10gbit"), 10_000_000_000);
        assert_eq!(rate("1gbit"), 1_000_000_000);
        assert_eq!(rate("500mbit"), 500_000_000);
        assert_eq!(rate("2.5gbit"), 2_500_000_000);
        assert_eq!(rate("1Gbit"), 1_000_000_000);
        assert_eq!(rate("100kbit"), 100_000);
        assert_eq!(rate("1mibit"), 1_048_576);
        // tc's `bps` units are bytes per second.
        assert_eq!(rate("1gbps"), 8_000_000_000);
        assert_eq!(rate("125mbps"), 1_000_000_000);
        assert_eq!(parse_rate("none"), Ok(None));
        assert_eq!(parse_rate("10gbit").unwrap().unwrap().text, "10gbit");
    }

    #[test]
    fn bad_rates_are_refused_with_the_syntax() {
        for bad in [
            "",
            "10",
            "gbit",
            "10g",
            "10 gbit",
            "-1gbit",
            "1.gbit",
            ".5gbit",
            "1e9bit",
            "0gbit",
            "10gbits",
            "1.2.3gbit",
            "fast",
        ] {
            let err = parse_rate(bad).expect_err(bad);
            assert!(err.contains("10gbit, 1gbit, 500mbit"), "{bad}: {err}");
        }
    }

    #[test]
    fn the_bucket_holds_two_ms_of_the_rate_and_at_least_128_kib() {
        let burst = |s: &str| parse_rate(s).unwrap().unwrap().burst_bytes();
        assert_eq!(burst("10gbit"), 2_500_000);
        assert_eq!(burst("1gbit"), 250_000);
        assert_eq!(burst("100mbit"), 128 * 1024);
    }

    #[test]
    fn names_addresses_and_prefixes() {
        let l = Layout::new("mlxh", 3).unwrap();
        assert_eq!(
            (l.name(2), l.ip(2), l.veth(2), l.bridge()),
            (
                "mlxh2".into(),
                "10.77.0.3".into(),
                "mlxh2h".into(),
                "mlxhbr".into()
            )
        );
        assert!(Layout::new("mlxh", 0).is_err());
        assert!(Layout::new("mlxh", 253).is_ok());
        assert!(Layout::new("mlxh", 254).is_err());
        for bad in ["", "Mlx", "mlx1", "1mlx", "ml-x", "averyveryverylongprefix"] {
            assert!(Layout::new(bad, 2).is_err(), "{bad}");
        }
        assert!(numbered("mlxh12", "mlxh", ""));
        assert!(numbered("mlxh12h", "mlxh", "h"));
        assert!(!numbered("mlxhbr", "mlxh", "h"));
        assert!(!numbered("mlxh", "mlxh", ""));
        assert!(!numbered("mlxh1x", "mlxh", ""));
    }

    #[test]
    fn ssh_files_name_every_host() {
        let l = Layout::new("mlxh", 2).unwrap();
        let dir = Path::new("/w/target/mlx-hosts");
        let config = ssh_config(&l, dir).unwrap();
        assert!(config.contains("Host mlxh1\n    HostName 10.77.0.2\n    User root\n"));
        assert!(config.contains("Host 10.77.0.*\n"));
        assert!(config.contains("IdentityFile \"/w/target/mlx-hosts/id_ed25519\""));
        assert!(config.contains("StrictHostKeyChecking yes"));
        let known = known_hosts(&l, "ssh-ed25519 AAAAkey mlx-hosts host\n").unwrap();
        assert_eq!(
            known,
            "mlxh0,10.77.0.1 ssh-ed25519 AAAAkey\nmlxh1,10.77.0.2 ssh-ed25519 AAAAkey\n"
        );
        assert_eq!(
            ssh_path(Path::new("/a%b/c")).unwrap(),
            "\"/a%%b/c\"".to_string()
        );
    }

    /// Brings two hosts up for real and down again; run it as root with
    /// `cargo test -p xtask -- --ignored hosts`. Skips where [`available`] says no.
    #[test]
    #[ignore = "changes this machine's network namespaces; needs root"]
    fn hosts_up_ssh_and_down() {
        if let Err(why) = available() {
            eprintln!("skipped: {why}");
            return;
        }
        {
            let hosts = HostsGuard::up(2, Some("1gbit")).unwrap();
            for i in 0..2 {
                let out = ssh(&hosts, i, "hostname").unwrap();
                assert!(out.status.success(), "{out:?}");
                assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), hosts.names[i]);
            }
            // A file in mlxh0's /dev/shm, and a process left running there.
            let cmd = "touch /dev/shm/mlx-hosts-test && (sleep 6007 </dev/null >/dev/null 2>&1 &)";
            let out = ssh(&hosts, 0, cmd).unwrap();
            assert!(out.status.success(), "{out:?}");
            let out = ssh(&hosts, 1, "ls /dev/shm").unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "");
            assert!(!Path::new("/dev/shm/mlx-hosts-test").exists());
            shape(None).unwrap();
            assert_eq!(Hosts::current().unwrap().unwrap().rate, None);
        }
        assert!(Hosts::current().unwrap().is_none());
        assert!(
            !list_namespaces()
                .unwrap()
                .iter()
                .any(|n| numbered(n, "mlxh", ""))
        );
        // The process started over ssh did not survive.
        let survivors = fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
            .filter(|c| c.as_slice() == b"sleep\x006007\x00")
            .count();
        assert_eq!(survivors, 0);
    }
}
