//! Where ranks run: local processes or ssh targets, the host files that list
//! them, and the addresses the ranks listen on.

#[cfg_attr(not(feature = "launcher"), allow(unused_imports))]
use std::net::{TcpListener, UdpSocket};

/// Where one rank runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankHost {
    /// The ssh destination (`host` or `user@host`), or `None` to start the rank locally.
    pub ssh: Option<String>,
    /// The addresses peers use to reach the rank: the first carries the
    /// control traffic, and the ring spreads its connections over all of
    /// them (one per network interface, as MLX's `ips` list).
    pub ips: Vec<String>,
}

impl RankHost {
    /// A rank on this machine, reached over loopback.
    pub fn local() -> RankHost {
        RankHost {
            ssh: None,
            ips: vec!["127.0.0.1".into()],
        }
    }

    /// A rank on `host` (local when it names this machine's loopback). The
    /// name is checked: an ssh destination is never taken as an ssh option.
    pub fn on(host: &str) -> Result<RankHost, String> {
        if matches!(host, "localhost" | "127.0.0.1" | "::1") {
            return Ok(RankHost::local());
        }
        check_ssh_destination(host)?;
        let name = host.rsplit_once('@').map_or(host, |(_, h)| h);
        Ok(RankHost {
            ssh: Some(host.to_string()),
            ips: vec![name.trim_start_matches('[').trim_end_matches(']').into()],
        })
    }

    /// The address that carries the control traffic.
    pub fn ip(&self) -> &str {
        &self.ips[0]
    }
}

/// Refuses an ssh destination that ssh could read as an option, or that
/// holds characters no host or user name has: `--hosts=-oProxyCommand=...`
/// must never reach ssh's command line.
pub fn check_ssh_destination(dest: &str) -> Result<(), String> {
    let (user, host) = match dest.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, dest),
    };
    let name_ok = |s: &str, extra: &[u8]| {
        !s.is_empty()
            && !s.starts_with('-')
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b) || extra.contains(&b))
    };
    if let Some(u) = user
        && !name_ok(u, b"")
    {
        return Err(format!(
            "host {dest:?}: the user name must be letters, digits, '.', '_' or '-' and not start with '-'"
        ));
    }
    // Host names, IPv4, and IPv6 (bare or in brackets, with a %zone).
    if !name_ok(host, b":[]%") {
        return Err(format!(
            "host {dest:?} is not a host name or address (letters, digits, '.', '-', ':'; not starting with '-')"
        ));
    }
    Ok(())
}

/// An address given in a host file: an IP or a host name, never an option.
fn check_ip(ip: &str) -> Result<(), String> {
    check_ssh_destination(ip).and_then(|()| {
        if ip.contains('@') {
            Err(format!("address {ip:?} holds a user name"))
        } else {
            Ok(())
        }
    })
}

/// One host of a host file and the number of ranks it asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostfileEntry {
    /// Where its ranks run.
    pub host: RankHost,
    /// `slots=N` (MPI style), when given: the number of ranks on this host.
    pub slots: Option<usize>,
}

/// Parses a launcher host file, in either format:
/// - MLX's JSON: `[{"ssh": "h1", "ips": ["10.0.0.1", "10.0.1.1"]}, "h2"]`
///   (every IP of `ips` is used);
/// - MPI's text: one host per line, `h1 slots=2` (Open MPI) or `h1:2`
///   (MPICH), `#` comments; the slots are the number of ranks on the host.
pub fn parse_launcher_hostfile(text: &str) -> Result<Vec<HostfileEntry>, String> {
    let hosts = if text.trim_start().starts_with('[') {
        parse_json_hostfile(text)?
    } else {
        parse_mpi_hostfile(text)?
    };
    if hosts.is_empty() {
        return Err("the host file lists no hosts".into());
    }
    Ok(hosts)
}

fn parse_json_hostfile(text: &str) -> Result<Vec<HostfileEntry>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let arr = v.as_array().ok_or("expected a JSON list of hosts")?;
    arr.iter()
        .enumerate()
        .map(|(i, e)| {
            let host = match e {
                serde_json::Value::String(h) => RankHost::on(h)?,
                serde_json::Value::Object(o) => {
                    let ssh = o
                        .get("ssh")
                        .and_then(|s| s.as_str())
                        .ok_or_else(|| format!("host {i} has no \"ssh\" name"))?;
                    let mut h = RankHost::on(ssh)?;
                    if let Some(ips) = o.get("ips") {
                        let ips: Vec<String> = ips
                            .as_array()
                            .ok_or_else(|| format!("host {i}: \"ips\" is not a list"))?
                            .iter()
                            .map(|ip| {
                                let ip = ip.as_str().ok_or_else(|| {
                                    format!("host {i}: \"ips\" holds a non-string")
                                })?;
                                check_ip(ip).map(|()| ip.to_string())
                            })
                            .collect::<Result<_, String>>()?;
                        if !ips.is_empty() {
                            h.ips = ips;
                        }
                    }
                    h
                }
                _ => return Err(format!("host {i} is neither a string nor an object")),
            };
            Ok(HostfileEntry { host, slots: None })
        })
        .collect()
}

fn parse_mpi_hostfile(text: &str) -> Result<Vec<HostfileEntry>, String> {
    let mut out = Vec::new();
    for (n, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", n + 1);
        let mut words = line.split_whitespace();
        let first = words.next().expect("the line is not empty");
        let (name, mut slots) = match first.rsplit_once(':') {
            // `host:N` (MPICH); an IPv6 address has several colons and no count.
            Some((h, k)) if !h.contains(':') && k.bytes().all(|b| b.is_ascii_digit()) => {
                (h, Some(parse_slots(k).map_err(at)?))
            }
            _ => (first, None),
        };
        for w in words {
            match w.split_once('=') {
                Some(("slots", k)) => slots = Some(parse_slots(k).map_err(at)?),
                // Open MPI's other keys limit oversubscription; they do not change placement.
                Some(("max_slots" | "max-slots", _)) => {}
                _ => return Err(at(format!("unknown word {w:?} (expected slots=N)"))),
            }
        }
        out.push(HostfileEntry {
            host: RankHost::on(name).map_err(at)?,
            slots,
        });
    }
    Ok(out)
}

fn parse_slots(k: &str) -> Result<usize, String> {
    match k.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("slots {k:?} is not a positive number")),
    }
}

/// What each rank listens on, `ip:port` joined by `|` when a rank has
/// several addresses (all on its one port): consecutive ports from
/// `starting_port` (rank `r` gets `starting_port + r`), or free loopback
/// ports chosen by the OS when unset and every rank is local.
#[cfg_attr(not(feature = "launcher"), allow(dead_code))] // Used by the launcher.
pub(crate) fn addresses(
    hosts: &[RankHost],
    starting_port: Option<u16>,
) -> std::io::Result<Vec<String>> {
    let all_local = hosts.iter().all(|h| h.ssh.is_none());
    match starting_port {
        None if all_local => {
            // Hold every socket until all ports are known so that no two ranks share one.
            let held: Vec<(TcpListener, UdpSocket)> = hosts
                .iter()
                .map(|_| free_tcp_and_udp_port())
                .collect::<Result<_, _>>()?;
            held.iter()
                .map(|(l, _)| Ok(l.local_addr()?.to_string()))
                .collect()
        }
        sp => {
            let base = sp.unwrap_or(DEFAULT_STARTING_PORT) as usize;
            if base + hosts.len() > 65536 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    format!(
                        "ports {base}..{} do not fit below 65536",
                        base + hosts.len()
                    ),
                ));
            }
            Ok(hosts
                .iter()
                .enumerate()
                .map(|(r, h)| {
                    h.ips
                        .iter()
                        .map(|ip| {
                            if ip.contains(':') {
                                format!("[{ip}]:{}", base + r)
                            } else {
                                format!("{ip}:{}", base + r)
                            }
                        })
                        .collect::<Vec<_>>()
                        .join("|")
                })
                .collect())
        }
    }
}

/// The first port of jobs with remote ranks when none is given (as MLX's launcher).
pub const DEFAULT_STARTING_PORT: u16 = 32323;

/// A loopback port free for both TCP and UDP, held by both sockets: the TCP
/// backends listen on it, QUIC binds it over UDP. A port the OS hands out as
/// free for TCP may be held over UDP by another job's QUIC endpoint.
#[cfg_attr(not(feature = "launcher"), allow(dead_code))] // Used by the launcher.
fn free_tcp_and_udp_port() -> std::io::Result<(TcpListener, UdpSocket)> {
    let mut last = None;
    for _ in 0..64 {
        let tcp = TcpListener::bind("127.0.0.1:0")?;
        match UdpSocket::bind(tcp.local_addr()?) {
            Ok(udp) => return Ok((tcp, udp)),
            Err(e) => last = Some(e),
        }
    }
    Err(last.expect("the loop ran"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn remote(ssh: &str, ips: &[&str]) -> RankHost {
        RankHost {
            ssh: Some(ssh.into()),
            ips: ips.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn json_hostfiles_keep_every_ip() {
        let h = parse_launcher_hostfile(
            r#"[{"ssh": "a", "ips": ["10.0.0.1", "10.0.1.1"]}, "localhost", "me@b"]"#,
        )
        .unwrap();
        let hosts: Vec<RankHost> = h.iter().map(|e| e.host.clone()).collect();
        assert_eq!(hosts[0], remote("a", &["10.0.0.1", "10.0.1.1"]));
        assert_eq!(hosts[1], RankHost::local());
        assert_eq!(hosts[2], remote("me@b", &["b"]));
        assert_eq!(
            addresses(&hosts, Some(5000)).unwrap(),
            vec!["10.0.0.1:5000|10.0.1.1:5000", "127.0.0.1:5001", "b:5002"]
        );
        let local = addresses(&[RankHost::local(), RankHost::local()], None).unwrap();
        assert_ne!(local[0], local[1]);
        assert!(parse_launcher_hostfile("[3]").is_err());
        assert!(parse_launcher_hostfile("[]").is_err());
        assert!(parse_launcher_hostfile(r#"[{"ssh": "a", "ips": ["-oX"]}]"#).is_err());
    }

    #[test]
    fn mpi_hostfiles_give_slots() {
        let h = parse_launcher_hostfile(
            "# cluster\nnode1 slots=2 max_slots=4\n\nnode2:3  # MPICH\n10.0.0.9\n::1\n",
        )
        .unwrap();
        let got: Vec<(Option<String>, Option<usize>)> =
            h.iter().map(|e| (e.host.ssh.clone(), e.slots)).collect();
        assert_eq!(
            got,
            vec![
                (Some("node1".into()), Some(2)),
                (Some("node2".into()), Some(3)),
                (Some("10.0.0.9".into()), None),
                (None, None),
            ]
        );
        for bad in [
            "node1 slots=0",
            "node1 slots=x",
            "node1 cores=2",
            "-oProxyCommand=x",
        ] {
            let e = parse_launcher_hostfile(bad).unwrap_err();
            assert!(e.starts_with("line 1:"), "{bad}: {e}");
        }
        assert!(parse_launcher_hostfile("# nothing\n").is_err());
    }

    #[test]
    fn hosts_are_never_options() {
        for bad in [
            "-oProxyCommand=touch /tmp/x",
            "-p22",
            "a b",
            "a;b",
            "$(x)",
            "-u@h",
            "u@-h",
            "",
        ] {
            assert!(RankHost::on(bad).is_err(), "{bad:?} was accepted");
        }
        for good in [
            "node-1.example.org",
            "root@10.0.0.1",
            "fe80::1%eth0",
            "[fe80::1]",
        ] {
            assert!(RankHost::on(good).is_ok(), "{good:?} was refused");
        }
    }

    #[test]
    fn ports_must_fit() {
        assert!(addresses(&[remote("a", &["a"]), remote("b", &["b"])], Some(65535)).is_err());
    }

    #[test]
    fn a_chosen_port_is_held_over_tcp_and_udp() {
        let (tcp, udp) = free_tcp_and_udp_port().unwrap();
        let port = tcp.local_addr().unwrap().port();
        assert_eq!(udp.local_addr().unwrap().port(), port);
        // While held, no other job can take it over UDP (where QUIC listens).
        assert!(UdpSocket::bind(("127.0.0.1", port)).is_err());
    }
}
