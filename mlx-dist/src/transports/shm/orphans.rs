//! Segments left by ranks that died before removing them: each segment's
//! name carries its creator's pid (`mlxd<pid in hex>_<random>`), so that
//! the next rank to set up shared memory on the host can remove those whose
//! creator is gone. A rank killed between creating a segment and its peer's
//! answer (the only time a name exists) would otherwise leave 8 MiB of
//! `/dev/shm` behind for good, and a small `/dev/shm` (64 MiB in a default
//! Docker container) would soon push every job back to TCP.
//!
//! A pid is only a witness on one host and in one pid namespace: containers
//! that share `/dev/shm` but not their pids could take a live creator for a
//! dead one. The cost is bounded: the name exists only during set-up, and a
//! peer that cannot open a removed name keeps TCP.

use std::io;

/// The start of every segment's name.
pub(super) const PREFIX: &str = "mlxd";

/// A segment name owned by process `pid`, unique by `random` (at most 30
/// bytes with its leading '/': macOS limits POSIX names to 31).
pub(super) fn segment_name(pid: u32, random: &[u8; 8]) -> String {
    format!("{PREFIX}{pid:x}_{}", crate::config::hex_encode(random))
}

/// The pid of the process that created the segment called `name`, if
/// `name` is a segment name.
pub(super) fn owner_of(name: &str) -> Option<libc::pid_t> {
    let (pid, rest) = name.strip_prefix(PREFIX)?.split_once('_')?;
    if rest.is_empty() || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    libc::pid_t::from_str_radix(pid, 16).ok().filter(|&p| p > 0)
}

/// Whether process `pid` is gone (not merely someone else's).
pub(super) fn is_gone(pid: libc::pid_t) -> bool {
    // SAFETY: signal 0 only asks whether the process exists.
    unsafe {
        libc::kill(pid, 0) != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
    }
}

/// Whether the segment called `name` was left by a process that is gone.
pub(super) fn is_orphan(name: &str) -> bool {
    owner_of(name).is_some_and(is_gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_their_owner_and_fit_macos() {
        let n = segment_name(u32::MAX, &[0xab; 8]);
        assert!(n.len() < 31, "{n}");
        assert_eq!(owner_of(&segment_name(4242, &[1; 8])), Some(4242));
        for not_ours in [
            "mlxd",
            "mlxd_ab",
            "mlxdzz_ab",
            "mlxd12_",
            "mlxd12_xyz",
            "other12_ab",
            "mlxd0_ab",
        ] {
            assert_eq!(owner_of(not_ours), None, "{not_ours}");
        }
        assert!(!is_orphan(&segment_name(std::process::id(), &[2; 8])));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        assert!(is_orphan(&segment_name(dead, &[3; 8])));
    }
}
