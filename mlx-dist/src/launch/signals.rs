//! The launcher's own handling of SIGINT, SIGTERM and SIGHUP: which signal
//! came matters, as the launcher forwards that one to the ranks (a trainer
//! reports the signal that stopped it) and exits with 128 + it (130 for
//! Ctrl-C, 143 for a SIGTERM such as Slurm's preemption).
//!
//! The handler only writes the signal's number to a pipe (write(2) is
//! async-signal-safe); a thread reads the pipe and calls the receiver
//! [`install`] was given, outside the signal's context.

use std::sync::atomic::{AtomicI32, Ordering};

/// The pipe's write end, for the handler; -1 until installed.
static PIPE: AtomicI32 = AtomicI32::new(-1);

/// The signals the launcher takes.
pub(crate) const INTERRUPTS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// This thread's `errno`, which the handler must leave as it found it.
#[cfg(target_os = "linux")]
fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__errno_location() }
}

/// This thread's `errno`, which the handler must leave as it found it.
#[cfg(target_os = "macos")]
fn errno() -> *mut libc::c_int {
    // SAFETY: always valid for the calling thread.
    unsafe { libc::__error() }
}

extern "C" fn on_signal(sig: libc::c_int) {
    let fd = PIPE.load(Ordering::Relaxed);
    if fd < 0 {
        return;
    }
    let byte = sig as u8;
    #[cfg(any(target_os = "linux", target_os = "macos"))]
    // SAFETY: reading and restoring this thread's errno; write(2) is
    // async-signal-safe and the pipe's write end does not block.
    unsafe {
        let saved = *errno();
        libc::write(fd, (&byte as *const u8).cast(), 1);
        *errno() = saved;
    }
    #[cfg(not(any(target_os = "linux", target_os = "macos")))]
    // SAFETY: write(2) is async-signal-safe; the write end does not block.
    unsafe {
        libc::write(fd, (&byte as *const u8).cast(), 1);
    }
}

/// Installs the handler of [`INTERRUPTS`] for this process: from now on
/// each of those signals calls `receiver` with its number, on a thread of
/// its own. Call it once.
pub(crate) fn install(receiver: impl Fn(i32) + Send + 'static) -> std::io::Result<()> {
    let mut fds = [0 as libc::c_int; 2];
    // SAFETY: pipe(2) writes two descriptors into `fds`; fcntl on them.
    unsafe {
        if libc::pipe(fds.as_mut_ptr()) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        for fd in fds {
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        let fl = libc::fcntl(fds[1], libc::F_GETFL);
        libc::fcntl(fds[1], libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    let read_end = fds[0];
    std::thread::Builder::new()
        .name("mlx-launch-signals".into())
        .spawn(move || {
            loop {
                let mut byte = 0u8;
                // SAFETY: reads one byte into `byte` from our pipe.
                let n = unsafe { libc::read(read_end, (&mut byte as *mut u8).cast(), 1) };
                if n == 1 {
                    receiver(byte as i32);
                } else if n == 0
                    || std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted
                {
                    return;
                }
            }
        })?;
    PIPE.store(fds[1], Ordering::SeqCst);
    for sig in INTERRUPTS {
        // SAFETY: a handler that only writes to a pipe; sigaction is
        // plain data, zeroed then filled.
        let r = unsafe {
            let mut action: libc::sigaction = std::mem::zeroed();
            action.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            action.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut action.sa_mask);
            libc::sigaction(sig, &action, std::ptr::null_mut())
        };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The name of signal `sig` for messages ("SIGTERM"), or its number.
pub(crate) fn name(sig: i32) -> String {
    match sig {
        libc::SIGINT => "SIGINT".into(),
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGKILL => "SIGKILL".into(),
        s => format!("signal {s}"),
    }
}
