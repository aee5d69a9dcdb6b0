//! Bringing hosts down: killing what runs in their namespaces, deleting
//! the namespaces, links and bridge, and removing the state folder.

use std::fs;
use std::time::Duration;

use anyhow::{Result, bail};

use super::DEFAULT_PREFIX;
use super::exec::{exec, list_namespaces};
use super::layout::{bridge_name, valid_prefix};
use super::sshd::sshd_pid;
use super::state::{State, state_dir};

/// Brings the hosts down: kills every process inside their namespaces (sshd
/// and whatever was started over ssh), deletes the namespaces, links and
/// bridge, and removes the state folder. Idempotent and best-effort: it goes
/// on past failures and returns an error only if something is left.
pub fn down() -> Result<()> {
    teardown(None)
}

/// Removes the hosts with the recorded prefix, `mlxh` and `extra`: their
/// processes, namespaces, links, bridge and the state folder. Goes on past
/// failures; fails only if something is left.
pub(super) fn teardown(extra: Option<&str>) -> Result<()> {
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
pub(super) fn numbered(name: &str, prefix: &str, suffix: &str) -> bool {
    name.strip_prefix(prefix)
        .and_then(|rest| rest.strip_suffix(suffix))
        .is_some_and(|digits| !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()))
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
