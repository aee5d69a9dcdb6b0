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
//! [`available()`] says what is missing, so tests and benchmarks can skip with
//! that reason.
//!
//! One file a job: this one holds the command line; `running.rs` the running
//! set of hosts as callers see it ([`Hosts`]) and `guard.rs` the guard that
//! brings it down; `available.rs` says whether hosts can run here; `up.rs`
//! brings them up and `down.rs` down; `rate.rs` parses link rates and
//! `shape.rs` shapes the links; `layout.rs` names the hosts and their links;
//! `state.rs` is what the state folder records; `ssh_files.rs` writes the
//! keys and the ssh, sshd and launcher files; `sshd.rs` starts and finds the
//! ssh servers; `exec.rs` runs the system's tools and writes files.

mod available;
mod down;
mod exec;
mod guard;
mod layout;
mod rate;
mod running;
mod shape;
mod ssh_files;
mod sshd;
mod state;
mod up;

use anyhow::Result;
use clap::Subcommand;

pub use available::available;
pub use guard::HostsGuard;
pub use rate::parse_rate;
pub use running::Hosts;
pub use shape::shape;

use down::teardown;
use up::up_named;

/// The prefix of the hosts' names when none is given.
pub const DEFAULT_PREFIX: &str = "mlxh";

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

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::Path;

    use super::down::numbered;
    use super::exec::list_namespaces;
    use super::running::ssh;
    use super::*;

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
