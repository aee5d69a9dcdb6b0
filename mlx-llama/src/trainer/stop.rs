//! Stopping a run on SIGINT or SIGTERM (Ctrl-C, a cluster's preemption)
//! without losing it: the first signal asks every rank to finish its step,
//! write a checkpoint and the run's artefacts, and exit saying how to
//! resume; a second one ends the process at once.
//!
//! The handler only sets a flag; the ranks agree on it after each step
//! (see `agree`), so every rank stops after the same step, whichever got
//! the signal first.

use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::{Context, Result};
use mlx_dist::Group;

/// Signals received (SIGINT, SIGTERM, SIGHUP).
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

/// The exit code of a process ended by a second signal (128 + SIGINT, as a
/// shell reports Ctrl-C).
const STOPPED_AT_ONCE: i32 = 130;

/// What a signal does: the first asks the run to stop, the second ends
/// the process.
fn on_signal() {
    use std::io::Write;
    let n = SIGNALS.fetch_add(1, Ordering::SeqCst) + 1;
    let mut err = std::io::stderr();
    if n == 1 {
        let _ = writeln!(
            err,
            "signal received: stopping after this step with a checkpoint (a second signal stops at once, losing the steps since the last checkpoint)"
        );
    } else {
        let _ = writeln!(err, "second signal: stopping at once");
        // SAFETY: _exit ends the process without running atexit handlers
        // or destructors, which may wait on the other ranks.
        unsafe { libc::_exit(STOPPED_AT_ONCE) };
    }
}

/// The disposition of the signals taken by `sigwait`: blocked in every
/// thread, it is never called.
extern "C" fn never_runs(_: libc::c_int) {}

/// Installs the process's handling of SIGINT, SIGTERM and SIGHUP: the
/// first asks the run to stop after its step ([`requested`]), a second
/// ends the process at once. A binary calls it once, before it starts any
/// thread: the signals are blocked in the calling thread, so in every
/// thread started after it, and one thread takes them with `sigwait`. No
/// asynchronous handler runs, so no blocking call of a thread (a socket
/// read in a collective, a poll) is ever interrupted with EINTR, which
/// would fail the rank. Written by hand (libc) for that reason: handler
/// crates (ctrlc) install an asynchronous handler.
pub fn install_signal_handlers() -> Result<()> {
    // SAFETY: plain libc calls on a sigset_t owned here.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        // A signal ignored (SIG_IGN, as a launcher may leave it for its
        // children) is dropped even while blocked: give each a handler,
        // which never runs while they are blocked everywhere.
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = never_runs as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut());
        }
        let r = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if r != 0 {
            return Err(std::io::Error::from_raw_os_error(r))
                .context("blocking SIGINT/SIGTERM for the signal thread");
        }
        set
    };
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            loop {
                let mut sig = 0;
                // SAFETY: waits for one of the signals of `set`, blocked in
                // every thread.
                if unsafe { libc::sigwait(&set, &mut sig) } == 0 {
                    on_signal();
                }
            }
        })
        .context("starting the signal thread")?;
    Ok(())
}

/// Whether a signal asked this process to stop.
pub fn requested() -> bool {
    SIGNALS.load(Ordering::SeqCst) > 0
}

/// What the ranks decided after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Verdict {
    /// Some rank was asked to stop: all stop after this step.
    pub stop: bool,
    /// Rank 0's clock says a periodic checkpoint is due.
    pub checkpoint_due: bool,
}

/// The world's verdict after a step: stop when any rank was signalled; a
/// checkpoint when rank 0 finds one `due`. One tiny collective over the
/// world (none on one rank).
pub(super) fn agree(world: &Group, due: bool) -> Result<Verdict> {
    let mut flags = [i64::from(requested()), i64::from(due && world.rank() == 0)];
    if world.size() > 1 {
        world.all_sum(&mut flags)?;
    }
    Ok(Verdict {
        stop: flags[0] > 0,
        checkpoint_due: flags[1] > 0,
    })
}
