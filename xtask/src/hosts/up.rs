//! Bringing hosts up: the bridge, a namespace and veth pair per host, the
//! files, the ssh servers, and the checks that each takes a login and
//! reaches the next.

use std::fs;

use anyhow::{Context, Result, bail};

use super::DEFAULT_PREFIX;
use super::available::available;
use super::down::teardown;
use super::exec::{exec, path_str, read, write};
use super::layout::{Layout, SUBNET};
use super::rate::parse_rate;
use super::running::Hosts;
use super::shape::shape_link;
use super::ssh_files::{keygen, known_hosts, ssh_config, write_hostfiles};
use super::sshd::{start_sshd, wait_for_login};
use super::state::{State, state_dir};

/// The bridge's own address (the root namespace's side), with the prefix length.
const BRIDGE_ADDR: &str = "10.77.0.254/24";

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
