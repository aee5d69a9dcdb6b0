//! Whether emulated hosts can run here: Linux, root, and the tools they need.

use std::fs;

use super::exec::find_tool;
use super::sshd::SSHD;

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
