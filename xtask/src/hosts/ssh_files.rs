//! The files `up` writes for ssh and the launchers: the keys,
//! `known_hosts`, `ssh_config`, each host's sshd config, the MLX and MPI
//! hostfiles and `env.sh`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};

use super::exec::{exec, path_str, write};
use super::layout::{Layout, SUBNET};
use super::state::State;

/// `ssh-keygen` for an ed25519 key without passphrase at `path` (`path.pub` beside it).
pub(super) fn keygen(path: &Path, comment: &str) -> Result<()> {
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
pub(super) fn known_hosts(l: &Layout, host_pub: &str) -> Result<String> {
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
pub(super) fn ssh_config(l: &Layout, dir: &Path) -> Result<String> {
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
pub(super) fn write_hostfiles(state: &State) -> Result<()> {
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
pub(super) fn sshd_config(state: &State, i: usize) -> Result<String> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
