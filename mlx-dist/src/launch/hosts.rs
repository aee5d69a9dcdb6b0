//! Where ranks run: local processes or ssh targets, and the addresses they listen on.

use std::net::{TcpListener, UdpSocket};

/// Where one rank runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankHost {
    /// The ssh destination, or `None` to start the rank locally.
    pub ssh: Option<String>,
    /// The address peers use to reach the rank.
    pub ip: String,
}

impl RankHost {
    /// A rank on this machine, reached over loopback.
    pub fn local() -> RankHost {
        RankHost {
            ssh: None,
            ip: "127.0.0.1".into(),
        }
    }

    /// A rank on `host` (local when it names this machine).
    pub fn on(host: &str) -> RankHost {
        if matches!(host, "localhost" | "127.0.0.1" | "::1") {
            RankHost::local()
        } else {
            RankHost {
                ssh: Some(host.to_string()),
                ip: host.to_string(),
            }
        }
    }
}

/// Parses a launcher host file: MLX's `[{"ssh": "h", "ips": ["10.0.0.1"]}, ...]`
/// or a plain list of host names.
pub fn parse_launcher_hostfile(text: &str) -> Result<Vec<RankHost>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
    let arr = v.as_array().ok_or("expected a JSON list of hosts")?;
    arr.iter()
        .enumerate()
        .map(|(i, e)| match e {
            serde_json::Value::String(h) => Ok(RankHost::on(h)),
            serde_json::Value::Object(o) => {
                let ssh = o
                    .get("ssh")
                    .and_then(|s| s.as_str())
                    .ok_or_else(|| format!("host {i} has no \"ssh\" name"))?;
                let mut h = RankHost::on(ssh);
                if let Some(ip) = o
                    .get("ips")
                    .and_then(|a| a.as_array())
                    .and_then(|a| a.first())
                    .and_then(|s| s.as_str())
                {
                    h.ip = ip.to_string();
                }
                Ok(h)
            }
            _ => Err(format!("host {i} is neither a string nor an object")),
        })
        .collect()
}

/// `ip:port` for every rank: consecutive ports from `starting_port`, or free
/// loopback ports chosen by the OS when unset and every rank is local.
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
            let base = sp.unwrap_or(32323);
            Ok(hosts
                .iter()
                .enumerate()
                .map(|(r, h)| {
                    let ip = if h.ip.contains(':') {
                        format!("[{}]", h.ip)
                    } else {
                        h.ip.clone()
                    };
                    format!("{ip}:{}", base as usize + r)
                })
                .collect())
        }
    }
}

/// A loopback port free for both TCP and UDP, held by both sockets: the TCP
/// backends listen on it, QUIC binds it over UDP. A port the OS hands out as
/// free for TCP may be held over UDP by another job's QUIC endpoint.
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

    #[test]
    fn hostfiles_and_addresses() {
        let h =
            parse_launcher_hostfile(r#"[{"ssh": "a", "ips": ["10.0.0.1"]}, "localhost"]"#).unwrap();
        assert_eq!(
            h[0],
            RankHost {
                ssh: Some("a".into()),
                ip: "10.0.0.1".into()
            }
        );
        assert_eq!(h[1], RankHost::local());
        assert_eq!(
            addresses(&h, Some(5000)).unwrap(),
            vec!["10.0.0.1:5000", "127.0.0.1:5001"]
        );
        let local = addresses(&[RankHost::local(), RankHost::local()], None).unwrap();
        assert_ne!(local[0], local[1]);
        assert!(parse_launcher_hostfile("3").is_err());
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
