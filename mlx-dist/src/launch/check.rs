//! `mlx-launch --check`: what would stop a multi-host launch, found before
//! it starts, with what to do about it.
//!
//! For every host of the job, over ssh in batch mode (as the launch itself):
//! - the host answers ssh without a password prompt;
//! - it runs the same `mlx-launch` version at the expected path;
//! - the working directory exists and the program is there, executable,
//!   and the same file as on this machine (SHA-256);
//! - the ports its ranks will listen on are free, over TCP and UDP, on the
//!   addresses the other ranks will dial (which must be this host's own);
//! - every host name of the job resolves there as it does here, and never
//!   to a loopback address (a host named by a name that resolves to
//!   127.0.1.1 on itself, or ranks given as `localhost` beside remote ones,
//!   are the classic ways to get a job that cannot connect).
//!
//! Each host is asked by `mlx-launch --check-probe` (the request on standard
//! input, the answer as JSON on standard output), all hosts at once.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{IpAddr, TcpListener, ToSocketAddrs, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::{LaunchSpec, hosts, remote};

/// The argument that makes `mlx-launch` answer a check request.
pub const PROBE_FLAG: &str = "--check-probe";

/// How long one host may take to answer (ssh connection included).
const PROBE_TIMEOUT: Duration = Duration::from_secs(20);

/// What one host is asked.
#[derive(Clone, Debug)]
pub(crate) struct Request {
    program: String,
    cwd: Option<String>,
    names: Vec<String>,
    /// `(ip, port)` for each rank of this host.
    ports: Vec<(String, u16)>,
}

impl Request {
    pub(crate) fn to_json(&self) -> String {
        serde_json::json!({
            "program": self.program,
            "cwd": self.cwd,
            "names": self.names,
            "ports": self.ports,
        })
        .to_string()
    }

    pub(crate) fn parse(text: &str) -> Result<Request, String> {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let strings = |x: &serde_json::Value| -> Vec<String> {
            x.as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|s| s.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(Request {
            program: v["program"].as_str().ok_or("no program")?.to_string(),
            cwd: v["cwd"].as_str().map(str::to_string),
            names: strings(&v["names"]),
            ports: v["ports"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|p| Some((p[0].as_str()?.to_string(), p[1].as_u64()? as u16)))
                        .collect()
                })
                .unwrap_or_default(),
        })
    }
}

/// Answers a request read on standard input (`mlx-launch --check-probe`).
pub fn run_probe() -> i32 {
    let mut text = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut text) {
        eprintln!("mlx-launch --check-probe: cannot read the request: {e}");
        return 2;
    }
    match Request::parse(&text) {
        Ok(req) => {
            println!("{}", probe(&req));
            0
        }
        Err(e) => {
            eprintln!("mlx-launch --check-probe: bad request: {e}");
            2
        }
    }
}

/// This host's answer to `req`.
pub(crate) fn probe(req: &Request) -> serde_json::Value {
    let cwd = req.cwd.as_deref().map(PathBuf::from);
    let cwd_ok = cwd.as_deref().is_none_or(Path::is_dir);
    let program = program_facts(&req.program, cwd.as_deref());
    let ports: Vec<serde_json::Value> = req
        .ports
        .iter()
        .map(|(ip, port)| {
            let (tcp, udp) = port_free(ip, *port);
            serde_json::json!({ "ip": ip, "port": port, "tcp": tcp, "udp": udp })
        })
        .collect();
    let names: serde_json::Map<String, serde_json::Value> = req
        .names
        .iter()
        .map(|n| (n.clone(), serde_json::json!(resolve(n))))
        .collect();
    serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "hostname": super::agent::hostname(),
        "cwd_ok": cwd_ok,
        "program": program,
        "ports": ports,
        "names": names,
    })
}

/// Where `program` is (a path with `/` from `cwd`, else on `PATH`),
/// whether it can be run, and its SHA-256.
fn program_facts(program: &str, cwd: Option<&Path>) -> serde_json::Value {
    let path = if program.contains('/') {
        Some(cwd.map_or_else(|| PathBuf::from(program), |d| d.join(program)))
    } else {
        std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join(program))
                .find(|p| p.is_file())
        })
    };
    let Some(path) = path.filter(|p| p.is_file()) else {
        return serde_json::json!({ "found": false });
    };
    let executable = {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(&path).is_ok_and(|m| m.permissions().mode() & 0o111 != 0)
    };
    let sha = std::fs::read(&path)
        .ok()
        .map(|b| crate::config::hex_encode(&Sha256::digest(&b)));
    serde_json::json!({
        "found": true,
        "path": path.display().to_string(),
        "executable": executable,
        "sha256": sha,
    })
}

/// Whether `ip:port` can be bound over TCP and over UDP: `null` when it can,
/// else the reason.
fn port_free(ip: &str, port: u16) -> (Option<String>, Option<String>) {
    let Ok(addr) = ip.parse::<IpAddr>() else {
        // A host name: the ranks bind what it resolves to.
        return match resolve(ip).first().and_then(|a| a.parse::<IpAddr>().ok()) {
            Some(a) => port_free(&a.to_string(), port),
            None => (Some(format!("{ip} does not resolve")), None),
        };
    };
    let why = |e: std::io::Error| {
        if e.raw_os_error() == Some(libc::EADDRNOTAVAIL) {
            format!("{ip} is not an address of this host")
        } else {
            e.to_string()
        }
    };
    (
        TcpListener::bind((addr, port)).err().map(why),
        UdpSocket::bind((addr, port)).err().map(why),
    )
}

/// The addresses `name` resolves to here, sorted (empty when it does not).
fn resolve(name: &str) -> Vec<String> {
    let set: BTreeSet<String> = (name, 0)
        .to_socket_addrs()
        .map(|it| it.map(|a| a.ip().to_string()).collect())
        .unwrap_or_default();
    set.into_iter().collect()
}

fn is_loopback(ip: &str) -> bool {
    ip.parse::<IpAddr>().is_ok_and(|a| a.is_loopback())
}

/// One host of the job and what it is asked.
struct Target {
    /// ssh destination, or `None` for this machine.
    ssh: Option<String>,
    request: Request,
}

/// Checks every host of `spec`, printing a line per host and what to fix;
/// returns whether everything is ready.
pub fn check(spec: &LaunchSpec, out: &mut impl Write) -> std::io::Result<bool> {
    let mut resolved = spec.clone();
    remote::resolve_ssh_names(&mut resolved);
    let spec = &resolved;
    let addrs = match hosts::addresses(&spec.hosts, spec.starting_port) {
        Ok(a) => a,
        Err(e) => {
            writeln!(out, "cannot assign ports: {e}")?;
            return Ok(false);
        }
    };
    let mut problems: Vec<String> = launch_problems(spec);
    // The names to resolve everywhere: every address the ranks are given.
    let names: Vec<String> = spec
        .hosts
        .iter()
        .flat_map(|h| h.ips.iter().cloned())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let cwd = spec
        .cwd
        .clone()
        .or_else(|| std::env::current_dir().ok())
        .map(|d| d.display().to_string());
    let mut targets: Vec<Target> = Vec::new();
    for (rank, h) in spec.hosts.iter().enumerate() {
        let ports = addrs[rank].split('|').filter_map(split_host_port);
        let t = match targets.iter_mut().find(|t| t.ssh == h.ssh) {
            Some(t) => t,
            None => {
                targets.push(Target {
                    ssh: h.ssh.clone(),
                    request: Request {
                        program: spec.command[0].clone(),
                        cwd: cwd.clone(),
                        names: names.clone(),
                        ports: Vec::new(),
                    },
                });
                targets.last_mut().expect("pushed")
            }
        };
        // Local jobs with free ports chosen by the OS need no port check.
        if h.ssh.is_some() || spec.starting_port.is_some() {
            t.request.ports.extend(ports);
        }
    }
    let here = probe(&Request {
        program: spec.command[0].clone(),
        cwd: cwd.clone(),
        names: names.clone(),
        ports: Vec::new(),
    });
    let answers: Vec<Result<serde_json::Value, String>> = std::thread::scope(|s| {
        let jobs: Vec<_> = targets.iter().map(|t| s.spawn(|| ask(spec, t))).collect();
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .unwrap_or_else(|_| Err("the probe panicked".into()))
            })
            .collect()
    });
    writeln!(
        out,
        "mlx-launch --check: {} rank(s) on {} host(s), backend {}",
        spec.hosts.len(),
        targets.len(),
        spec.backend
    )?;
    for (t, answer) in targets.iter().zip(answers) {
        let who = t.ssh.clone().unwrap_or_else(|| "this machine".into());
        let found = match answer {
            Ok(a) => host_problems(&t.request, &a, &here),
            Err(e) => vec![e],
        };
        if found.is_empty() {
            writeln!(out, "  {who}: ok")?;
        }
        for p in found {
            writeln!(out, "  {who}: {p}")?;
            problems.push(format!("{who}: {p}"));
        }
    }
    for p in launch_problems(spec) {
        writeln!(out, "  job: {p}")?;
    }
    if problems.is_empty() {
        writeln!(out, "ready")?;
    } else {
        writeln!(out, "{} problem(s) to fix before launching", problems.len())?;
    }
    Ok(problems.is_empty())
}

/// Problems of the job's layout itself, found without asking any host.
pub fn launch_problems(spec: &LaunchSpec) -> Vec<String> {
    let mut v = Vec::new();
    let any_remote = spec.hosts.iter().any(|h| h.ssh.is_some());
    if any_remote {
        for (rank, h) in spec.hosts.iter().enumerate() {
            if h.ips.iter().any(|ip| is_loopback(ip) || ip == "localhost") {
                v.push(format!(
                    "rank {rank} would listen on {} (loopback), which the other hosts cannot reach: name this machine by its address on the network instead of localhost",
                    h.ip()
                ));
            }
        }
    }
    v
}

fn split_host_port(a: &str) -> Option<(String, u16)> {
    let (h, p) = a.rsplit_once(':')?;
    let h = h.trim_start_matches('[').trim_end_matches(']');
    Some((h.to_string(), p.parse().ok()?))
}

/// Sends the request to `t` (over ssh, or answers it here).
fn ask(spec: &LaunchSpec, t: &Target) -> Result<serde_json::Value, String> {
    let Some(host) = &t.ssh else {
        return Ok(probe(&t.request));
    };
    let launcher = spec
        .remote_launcher
        .clone()
        .unwrap_or_else(remote::default_remote_launcher);
    let mut cmd = remote::ssh_base(spec.ssh_config.as_deref());
    cmd.args(["-o", "ConnectTimeout=10", "--", host])
        .arg(format!("{} {PROBE_FLAG}", remote::shell_quote(&launcher)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot run ssh: {e} (is the OpenSSH client installed?)"))?;
    let mut stdin = child.stdin.take().expect("piped");
    let _ = stdin.write_all(t.request.to_json().as_bytes());
    drop(stdin);
    let (tx, rx) = std::sync::mpsc::channel();
    let pid = child.id();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let out = match rx.recv_timeout(PROBE_TIMEOUT) {
        Ok(Ok(o)) => o,
        Ok(Err(e)) => return Err(format!("ssh failed: {e}")),
        Err(_) => {
            // SAFETY: kill(2) on the ssh we started.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
            return Err(format!(
                "no answer in {PROBE_TIMEOUT:?}: the host is slow or the network drops ssh"
            ));
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
    match out.status.code() {
        Some(0) => serde_json::from_slice(&out.stdout)
            .map_err(|e| format!("unreadable answer ({e}): {stderr}")),
        Some(255) => Err(format!(
            "cannot ssh in batch mode: {stderr}. Fix: key-based login without a prompt (ssh-copy-id {host}), the host name or address, or --ssh-config"
        )),
        Some(126 | 127) => Err(format!(
            "mlx-launch is not at {launcher} there ({stderr}). Fix: install the same mlx-launch on every host at one path, or pass --remote-launcher PATH"
        )),
        _ => Err(format!(
            "its mlx-launch cannot answer the check ({stderr}): it is probably another version; install the same version everywhere"
        )),
    }
}

/// What is wrong on one host, from its answer, compared with this machine's (`here`).
pub(crate) fn host_problems(
    req: &Request,
    a: &serde_json::Value,
    here: &serde_json::Value,
) -> Vec<String> {
    let mut v = Vec::new();
    let version = a["version"].as_str().unwrap_or("?");
    if version != env!("CARGO_PKG_VERSION") {
        v.push(format!(
            "runs mlx-launch {version}, this machine {}: install the same version everywhere",
            env!("CARGO_PKG_VERSION")
        ));
    }
    if a["cwd_ok"] == false {
        v.push(format!(
            "the working directory {} does not exist there: use --cwd, or a file system shared by the hosts",
            req.cwd.as_deref().unwrap_or("?")
        ));
    }
    let p = &a["program"];
    if p["found"] != true {
        v.push(format!(
            "the program {} is not there (relative paths start from the working directory)",
            req.program
        ));
    } else if p["executable"] != true {
        v.push(format!(
            "the program {} is not executable there",
            p["path"].as_str().unwrap_or("?")
        ));
    } else if here["program"]["found"] == true && p["sha256"] != here["program"]["sha256"] {
        v.push(format!(
            "the program {} differs from this machine's (SHA-256 {} here, {} there): copy the same build to every host",
            req.program,
            short(&here["program"]["sha256"]),
            short(&p["sha256"])
        ));
    }
    for port in a["ports"].as_array().into_iter().flatten() {
        for proto in ["tcp", "udp"] {
            if let Some(e) = port[proto].as_str() {
                v.push(format!(
                    "cannot listen on {}:{} over {}: {e}{}",
                    port["ip"].as_str().unwrap_or("?"),
                    port["port"],
                    proto.to_uppercase(),
                    if e.contains("in use") {
                        " (another job holds it: pick another --starting-port)"
                    } else {
                        ""
                    }
                ));
            }
        }
    }
    let theirs: BTreeMap<String, Vec<String>> =
        serde_json::from_value(a["names"].clone()).unwrap_or_default();
    let ours: BTreeMap<String, Vec<String>> =
        serde_json::from_value(here["names"].clone()).unwrap_or_default();
    for name in &req.names {
        let t = theirs.get(name).cloned().unwrap_or_default();
        let o = ours.get(name).cloned().unwrap_or_default();
        if t.is_empty() {
            v.push(format!(
                "{name} does not resolve there: use IP addresses, or the same /etc/hosts or DNS everywhere"
            ));
        } else if t.iter().any(|ip| is_loopback(ip)) && !is_loopback(name) && name != "localhost" {
            v.push(format!(
                "{name} resolves to loopback ({}) there, so peers would dial themselves: give the fast network's IP address instead of the name",
                t.join(", ")
            ));
        } else if t != o {
            v.push(format!(
                "{name} resolves to {} there but to {} here: give the IP address of the fast link",
                t.join(", "),
                if o.is_empty() {
                    "nothing".into()
                } else {
                    o.join(", ")
                }
            ));
        }
    }
    v
}

fn short(v: &serde_json::Value) -> String {
    v.as_str()
        .map_or("?".into(), |s| s.chars().take(12).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_with_any_text_is_described_without_panicking() {
        // A SHA-256 of multi-byte characters: cut at 12 bytes, it split one.
        let req = Request::parse(r#"{"program":"p","names":[]}"#).unwrap();
        let here = serde_json::json!({"program": {"found": true, "sha256": "0123456789abcdef"}});
        let there = serde_json::json!({
            "version": env!("CARGO_PKG_VERSION"),
            "program": {"found": true, "executable": true, "sha256": "aééééééééééééé"},
        });
        let p = host_problems(&req, &there, &here);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(
            p[0].contains("0123456789ab here, aééééééééééé there"),
            "{p:?}"
        );
    }

    #[test]
    fn requests_round_trip() {
        let r = Request {
            program: "./a b".into(),
            cwd: Some("/x".into()),
            names: vec!["h1".into()],
            ports: vec![("10.0.0.1".into(), 5000)],
        };
        let back = Request::parse(&r.to_json()).unwrap();
        assert_eq!(back.program, r.program);
        assert_eq!(back.ports, r.ports);
        assert_eq!(back.names, r.names);
    }

    #[test]
    fn a_busy_port_and_a_foreign_address_are_found() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = held.local_addr().unwrap().port();
        let (tcp, _) = port_free("127.0.0.1", port);
        assert!(tcp.is_some());
        // TEST-NET-1 is never an address of this machine.
        let (tcp, _) = port_free("192.0.2.1", 0);
        assert_eq!(
            tcp.as_deref(),
            Some("192.0.2.1 is not an address of this host")
        );
    }

    #[test]
    fn problems_are_named() {
        let here = probe(&Request {
            program: "/bin/sh".into(),
            cwd: None,
            names: vec!["localhost".into()],
            ports: vec![],
        });
        assert_eq!(here["program"]["found"], true);
        let req = Request {
            program: "/bin/sh".into(),
            cwd: Some("/nonexistent-dir".into()),
            names: vec!["h1".into(), "h2".into()],
            ports: vec![],
        };
        let mut there = here.clone();
        there["version"] = "0.0.1".into();
        there["cwd_ok"] = false.into();
        there["program"]["sha256"] = "00".into();
        there["names"] = serde_json::json!({ "h1": ["127.0.1.1"], "h2": [] });
        let p = host_problems(&req, &there, &here).join("\n");
        for want in [
            "0.0.1",
            "/nonexistent-dir",
            "differs",
            "h1 resolves to loopback",
            "h2 does not resolve",
        ] {
            assert!(p.contains(want), "missing {want:?} in:\n{p}");
        }
        assert!(
            host_problems(&req, &here, &here)
                .iter()
                .all(|l| !l.contains("version"))
        );
    }

    #[test]
    fn localhost_beside_remote_hosts_is_refused() {
        let mut spec = LaunchSpec::local(2, vec!["p".into()]);
        assert!(launch_problems(&spec).is_empty());
        spec.hosts[1] = super::super::RankHost::on("node1").unwrap();
        let p = launch_problems(&spec);
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("rank 0"), "{p:?}");
    }
}
