//! The machine-wide lock on the emulated hosts (`/tmp/mlx-hosts.lock`):
//! tests and benchmarks that bring hosts up take it, so that two of them
//! never share or tear down each other's namespaces.

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result};

/// The lock file; `flock /tmp/mlx-hosts.lock ...` takes the same lock.
pub const LOCK: &str = "/tmp/mlx-hosts.lock";

/// Takes `/tmp/mlx-hosts.lock` for as long as the returned file lives,
/// waiting for whoever holds it.
pub fn take() -> Result<File> {
    // Run under `flock /tmp/mlx-hosts.lock cargo xtask ...`, this process
    // inherits the descriptor that holds the lock: a lock of our own on a
    // fresh descriptor would wait for it forever.
    if let Some(f) = inherited_lock(Path::new(LOCK)) {
        eprintln!("xtask: {LOCK} is held for us (inherited from flock)");
        return Ok(f);
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(LOCK)
        .with_context(|| format!("opening {LOCK}"))?;
    match f.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            eprintln!("xtask: waiting for {LOCK} (someone else is using the emulated hosts)");
            f.lock().with_context(|| format!("locking {LOCK}"))?;
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("locking {LOCK}"));
        }
    }
    Ok(f)
}

/// A descriptor of `path` this process has open (inherited) whose open
/// file holds the lock (or takes it at once), duplicated; Linux only.
fn inherited_lock(path: &Path) -> Option<File> {
    use std::os::fd::{BorrowedFd, RawFd};
    let entries = std::fs::read_dir("/proc/self/fd").ok()?;
    for e in entries.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        if target != path {
            continue;
        }
        let Some(fd) = e.file_name().to_str().and_then(|n| n.parse::<RawFd>().ok()) else {
            continue;
        };
        // SAFETY: the descriptor is open (listed just now) and only borrowed
        // for the duplication; nothing in this process closes it meanwhile.
        let dup = unsafe { BorrowedFd::borrow_raw(fd) }.try_clone_to_owned();
        let Ok(file) = dup.map(File::from) else {
            continue;
        };
        // flock(2) locks belong to the open file: on the one that holds the
        // lock, taking it again succeeds at once.
        if file.try_lock().is_ok() {
            return Some(file);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_held_by_an_open_descriptor_is_found() {
        let path = std::env::temp_dir().join(format!("mlx-multihost-lock-{}", std::process::id()));
        assert!(inherited_lock(&path).is_none(), "nothing open yet");
        let held = File::create(&path).unwrap();
        held.lock().unwrap();
        // A fresh open file of the same path would wait: the held one is found.
        let fresh = File::open(&path).unwrap();
        assert!(matches!(
            fresh.try_lock(),
            Err(std::fs::TryLockError::WouldBlock)
        ));
        assert!(inherited_lock(&path).is_some());
        drop((held, fresh));
        let _ = std::fs::remove_file(&path);
    }
}
