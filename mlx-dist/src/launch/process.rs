//! The processes the launcher starts: each in a process group of its own
//! that dies with the launcher, signalled as a group, and its exit status as
//! a code. Below both the local supervisor (`supervise`) and the remote
//! agent (`agent`), which start and stop ranks alike.

use std::process::{Child, Command, ExitStatus};

use super::parent;

/// The exit code that reports `st`: its code, or 128 + the signal that killed it.
pub(crate) fn status_code(st: &ExitStatus) -> i32 {
    match (st.code(), signal_of(st)) {
        (Some(c), _) => c,
        (None, Some(s)) => 128 + s,
        _ => 1,
    }
}

/// The signal that killed the process of `st`, if one did.
pub(super) fn signal_of(st: &ExitStatus) -> Option<i32> {
    std::os::unix::process::ExitStatusExt::signal(st)
}

/// Sends `sig` to the process group `pgid` (a rank and the processes it
/// started); a stopped group is continued so that it acts on the signal.
pub(crate) fn signal_group(pgid: u32, sig: i32) {
    // SAFETY: kill(2) on a process group we created; the group id stays
    // reserved while any member lives.
    unsafe {
        libc::kill(-(pgid as libc::pid_t), sig);
        if sig != libc::SIGKILL {
            libc::kill(-(pgid as libc::pid_t), libc::SIGCONT);
        }
    }
}

/// Kills what is left in the process group `pgid` of a process the launcher
/// started, once the launch is over. A group whose leader is not yet
/// reaped (`reaped` false) is ours. After the leader was reaped, the group
/// is still ours while processes it left live (no new process can take its
/// id then), and once it is empty its id may become a stranger's: a group
/// id is its creator's pid, so a live process with pid `pgid` is a stranger
/// that reused the pid, and its group is left alone.
pub(crate) fn kill_group_if_ours(pgid: u32, reaped: bool) {
    // SAFETY: signal 0 only asks whether the process exists.
    if reaped && unsafe { libc::kill(pgid as libc::pid_t, 0) } == 0 {
        tracing::debug!(
            pgid,
            "pid reused since its rank was reaped; not signalling its group"
        );
        return;
    }
    signal_group(pgid, libc::SIGKILL);
}

/// Starts `cmd` in a process group of its own that dies with the launcher
/// (see [`parent`]). Call it from the thread that waits for the launch: on
/// Linux the child is killed when the thread that started it exits.
pub(crate) fn spawn_guarded(cmd: &mut Command) -> std::io::Result<Child> {
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    parent::die_with_launcher(cmd);
    cmd.spawn()
}
