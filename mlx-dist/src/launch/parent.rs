//! Ranks die with their launcher, even when it is killed with SIGKILL and
//! can clean nothing up.
//!
//! - Linux: the launcher asks the kernel to SIGKILL every process it starts
//!   when the launcher goes away (`PR_SET_PDEATHSIG`, set between fork and
//!   exec, see `die_with_launcher`). The kernel sends it when the *thread*
//!   that forked exits, so the launcher forks from the thread that waits for
//!   the whole launch.
//! - macOS has no such request: the rank watches the launcher itself.
//!   [`watch_parent`] (called by the rank's `init`) waits on a kqueue for the
//!   exit of the process named by [`ENV_PARENT_PID`], which the launcher sets
//!   for the ranks it starts locally, and then kills the rank's process group.

#[cfg_attr(not(feature = "launcher"), allow(unused_imports))]
use std::process::Command;

/// Environment variable: the pid of the launcher that started this rank on
/// this machine. Ranks started over ssh do not get it.
pub const ENV_PARENT_PID: &str = "MLX_LAUNCH_PARENT_PID";

/// Makes the process `cmd` starts die with this one (Linux: `PR_SET_PDEATHSIG`
/// with SIGKILL; elsewhere nothing, see [`watch_parent`]). If this process
/// died before the request took effect, the child exits at once.
#[cfg_attr(not(feature = "launcher"), allow(dead_code))] // Used by the launcher.
pub(crate) fn die_with_launcher(cmd: &mut Command) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        let launcher = std::process::id() as libc::pid_t;
        // SAFETY: the hook runs in the forked child before exec and calls
        // only async-signal-safe functions (prctl, getppid, _exit).
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // The launcher died between fork and prctl: the kernel will
                // not signal us, and nobody waits for us.
                if libc::getppid() != launcher {
                    libc::_exit(1);
                }
                Ok(())
            });
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cmd;
}

/// When this process was started locally by `mlx-launch` ([`ENV_PARENT_PID`]
/// is set), kills its process group (the launcher gives each rank a group
/// of its own) as soon as the launcher exits, however it exits.
///
/// On macOS a thread waits for the launcher's exit on a kqueue
/// (`EVFILT_PROC`, `NOTE_EXIT`). Elsewhere this does nothing: on Linux the
/// launcher already had the kernel tie each rank's life to its own
/// (`PR_SET_PDEATHSIG`). Calling it more than once starts one watcher.
pub fn watch_parent() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let Some(pid) = std::env::var(ENV_PARENT_PID)
        .ok()
        .and_then(|v| v.trim().parse::<libc::pid_t>().ok())
        .filter(|&p| p > 1)
    else {
        return;
    };
    ONCE.call_once(|| watch(pid));
}

#[cfg(target_os = "macos")]
fn watch(pid: libc::pid_t) {
    // SAFETY: kqueue has no preconditions.
    let kq = unsafe { libc::kqueue() };
    if kq < 0 {
        tracing::warn!(error = %std::io::Error::last_os_error(), "kqueue failed; this rank will not notice its launcher's death");
        return;
    }
    // SAFETY: kevent is plain data; all zeros is a valid value.
    let mut ev: libc::kevent = unsafe { std::mem::zeroed() };
    ev.ident = pid as libc::uintptr_t;
    ev.filter = libc::EVFILT_PROC;
    ev.flags = libc::EV_ADD | libc::EV_ONESHOT;
    ev.fflags = libc::NOTE_EXIT;
    // SAFETY: one valid change, no events wanted back.
    let r = unsafe { libc::kevent(kq, &ev, 1, std::ptr::null_mut(), 0, std::ptr::null()) };
    if r < 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ESRCH) {
            // The launcher is already gone; this does not return.
            kill_own_group();
        }
        tracing::warn!(error = %e, pid, "cannot watch the launcher; this rank will not notice its death");
        // SAFETY: kq is our descriptor.
        unsafe { libc::close(kq) };
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("mlx-launch-watch".into())
        .spawn(move || {
            loop {
                // SAFETY: kevent is plain data; all zeros is a valid value.
                let mut out: libc::kevent = unsafe { std::mem::zeroed() };
                // SAFETY: room for one event; no timeout.
                let n =
                    unsafe { libc::kevent(kq, std::ptr::null(), 0, &mut out, 1, std::ptr::null()) };
                if n > 0 {
                    break;
                }
                if n < 0
                    && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return;
                }
            }
            kill_own_group();
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the launcher watch thread");
    }
}

#[cfg(not(target_os = "macos"))]
fn watch(_pid: libc::pid_t) {}

/// SIGKILL to this process's group: the rank and whatever it started.
#[cfg(target_os = "macos")]
fn kill_own_group() {
    // SAFETY: kill(2) on our own process group.
    unsafe {
        libc::kill(0, libc::SIGKILL);
    }
}
