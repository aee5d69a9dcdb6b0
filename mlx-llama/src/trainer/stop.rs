//! Stopping a run on SIGINT or SIGTERM (Ctrl-C, a cluster's preemption)
//! without losing it: the first signal asks every rank to finish its step,
//! write a checkpoint and the run's artefacts, and exit saying how to
//! resume; a second one ends the process at once.
//!
//! The handler only sets a flag; the ranks agree on it after each step
//! (see `agree`), so every rank stops after the same step, whichever got
//! the signal first.

use std::sync::atomic::{AtomicI32, AtomicUsize, Ordering};

use anyhow::{Context, Result};
use mlx_dist::Group;

/// Signals received (SIGINT, SIGTERM, SIGHUP).
static SIGNALS: AtomicUsize = AtomicUsize::new(0);

/// The first signal received (0: none).
static FIRST: AtomicI32 = AtomicI32::new(0);

/// The signals that stop a run, in the order that names a stop which
/// several ranks saw differently: a cluster's SIGTERM before Ctrl-C's
/// SIGINT before a closed terminal's SIGHUP.
const STOPPING: [i32; 3] = [libc::SIGTERM, libc::SIGINT, libc::SIGHUP];

/// The exit status of a process stopped by signal `sig`, as a shell
/// reports one killed by it (130 for Ctrl-C's SIGINT, 143 for SIGTERM),
/// whether it stopped with a checkpoint (the first signal) or at once (a
/// second).
pub fn exit_status(sig: i32) -> i32 {
    128 + sig
}

/// What a signal does: the first asks the run to stop, the second ends
/// the process.
fn on_signal(sig: i32) {
    use std::io::Write;
    let _ = FIRST.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
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
        unsafe { libc::_exit(exit_status(sig)) };
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
                    on_signal(sig);
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

/// The first signal this process received, if any.
pub fn received() -> Option<i32> {
    Some(FIRST.load(Ordering::SeqCst)).filter(|&s| s != 0)
}

/// What the ranks decided after a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Verdict {
    /// Some rank was asked to stop by this signal (the first of
    /// [`STOPPING`] that any rank received): all stop after this step.
    pub stop: Option<i32>,
    /// Rank 0's clock says a periodic checkpoint is due.
    pub checkpoint_due: bool,
}

/// The world's verdict after a step: stop when any rank was signalled
/// (naming the signal every rank exits by); a checkpoint when rank 0 finds
/// one `due`. One tiny collective over the world (none on one rank).
pub(super) fn agree(world: &Group, due: bool) -> Result<Verdict> {
    let mine = received().filter(|_| requested());
    let mut flags = [0i64; STOPPING.len() + 1];
    for (flag, sig) in flags.iter_mut().zip(STOPPING) {
        *flag = i64::from(mine == Some(sig));
    }
    flags[STOPPING.len()] = i64::from(due && world.rank() == 0);
    if world.size() > 1 {
        world.all_sum(&mut flags)?;
    }
    Ok(Verdict {
        stop: STOPPING
            .iter()
            .zip(flags)
            .find(|&(_, n)| n > 0)
            .map(|(&sig, _)| sig),
        checkpoint_due: flags[STOPPING.len()] > 0,
    })
}
