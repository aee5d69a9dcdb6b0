//! Inter-process exclusive locks with a deadline, on a lock file beside the guarded path.

use crate::error::{DataError, IoContext, Result};
use mlx_progress::{Task, Unit};
use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An exclusive advisory lock, released when dropped (or when the process dies).
#[derive(Debug)]
pub struct FileLock {
    file: File,
    path: PathBuf,
}

impl FileLock {
    /// Takes the lock on `path`, polling until `deadline` elapses.
    pub fn acquire(path: &Path, deadline: Duration) -> Result<FileLock> {
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        FileLock::acquire_while(path, deadline, &format!("holding {name}"))
    }

    /// Takes the lock on `path` as [`FileLock::acquire`] does; while another
    /// process holds it, a spinner says "waiting for another process
    /// `doing`" (`doing`: what the holder does, as "building a.tokens").
    pub fn acquire_while(path: &Path, deadline: Duration, doing: &str) -> Result<FileLock> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).at(dir)?;
        }
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(path)
            .at(path)?;
        let start = Instant::now();
        let mut pause = Duration::from_millis(5);
        // Shown from the first refusal; dropped unfinished on an error.
        let mut waiting: Option<Task> = None;
        loop {
            match file.try_lock() {
                Ok(()) => {
                    if let Some(w) = waiting {
                        w.finish();
                    }
                    return Ok(FileLock {
                        file,
                        path: path.to_path_buf(),
                    });
                }
                Err(TryLockError::WouldBlock) => {
                    waiting.get_or_insert_with(|| {
                        let what = format!("waiting for another process {doing}");
                        Task::new(what, None, Unit::Items)
                    });
                }
                Err(TryLockError::Error(e)) => return Err(DataError::io(path, e)),
            }
            if start.elapsed() >= deadline {
                return Err(DataError::LockTimeout {
                    path: path.to_path_buf(),
                    waited: start.elapsed(),
                });
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for FileLock {
    fn drop(&mut self) {
        let _ = self.file.unlock();
    }
}

/// `path` with `suffix` appended to its file name (`a.tokens` -> `a.tokens.lock`).
pub fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(suffix);
    path.with_file_name(name)
}

/// A unique temporary sibling of `path` for write-then-rename publication.
pub fn temp_sibling(path: &Path) -> PathBuf {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    sibling(path, &format!(".tmp.{}.{n}", std::process::id()))
}

/// Renames `tmp` onto `dest` atomically and makes the rename durable.
pub fn publish(tmp: &Path, dest: &Path) -> Result<()> {
    std::fs::rename(tmp, dest).at(dest)?;
    #[cfg(unix)]
    if let Some(d) = dest.parent().and_then(|dir| File::open(dir).ok()) {
        let _ = d.sync_all();
    }
    Ok(())
}
