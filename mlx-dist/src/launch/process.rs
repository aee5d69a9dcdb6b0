//! The processes the launcher starts: each in a process group of its own
//! that dies with the launcher, with its children (a [`Guard`] in the
//! group), signalled as a group, and its exit status as a code. Below both
//! the local supervisor (`supervise`) and the remote agent (`agent`), which
//! start and stop ranks alike.

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
/// (see [`parent`]), with a [`Guard`] in that group. Call it from the
/// thread that waits for the launch: on Linux the child is killed when the
/// thread that started it exits.
pub(crate) fn spawn_guarded(cmd: &mut Command) -> std::io::Result<(Child, Guard)> {
    std::os::unix::process::CommandExt::process_group(cmd, 0);
    parent::die_with_launcher(cmd);
    let child = cmd.spawn()?;
    let guard = Guard::start(child.id());
    Ok((child, guard))
}

/// What the guard runs: it ignores the signals the launcher sends to the
/// group (so that it outlives a forwarded Ctrl-C), waits for the end of
/// its standard input, and then kills its whole process group.
const GUARD_SCRIPT: &str =
    "trap '' HUP INT QUIT TERM USR1 USR2 ALRM PIPE; while read -r _; do :; done; kill -KILL 0";

/// A watchdog in a rank's process group: `/bin/sh` reading a pipe whose
/// only writer is the launcher. When the launcher exits, however it exits
/// (SIGKILL included), the pipe ends and the guard kills the group: the
/// rank and every process it started that stayed in its group, grandchildren
/// too, on Linux and macOS alike. While the guard lives, the group's id
/// cannot be reused by another process. [`Guard::end`] (or dropping it)
/// ends the pipe: whatever is left in the group is killed.
pub(crate) struct Guard(Option<Child>);

impl Guard {
    /// Starts the guard of the process group `pgid`. A guard that cannot
    /// start (no `/bin/sh`, or the group is already empty) is noted and
    /// left out: the rank still dies with the launcher, its children may not.
    fn start(pgid: u32) -> Guard {
        let mut cmd = Command::new("/bin/sh");
        cmd.args(["-c", GUARD_SCRIPT])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        std::os::unix::process::CommandExt::process_group(&mut cmd, pgid as i32);
        match cmd.spawn() {
            Ok(c) => Guard(Some(c)),
            Err(e) => {
                tracing::warn!(pgid, error = %e, "cannot start the guard of a rank's process group; what the rank starts may outlive a killed launcher");
                Guard(None)
            }
        }
    }

    /// Ends the guard: it kills whatever is left in its group, itself
    /// included, and is reaped.
    pub fn end(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if let Some(mut c) = self.0.take() {
            drop(c.stdin.take());
            // SAFETY: kill(2) on our own child, not yet reaped: a stopped
            // guard goes on to read the end of its input.
            unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGCONT) };
            let _ = c.wait();
        }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.finish();
    }
}
