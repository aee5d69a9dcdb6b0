//! Segments as files in `/dev/shm` (the temporary directory without it).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;

/// The folder of the segments: `/dev/shm`, else the temporary folder.
fn dir() -> PathBuf {
    let shm = std::path::Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn path(name: &str) -> PathBuf {
    dir().join(name)
}

/// Creates the segment `name` of `len` bytes, readable by this user only;
/// returns it and what the peer passes to [`open`]. The memory is
/// reserved now: a full `/dev/shm` (64 MiB in a default Docker
/// container) is then a refusal here, and the link keeps TCP, instead
/// of a `SIGBUS` when a page is first touched mid-collective.
pub fn create(name: &str, len: usize) -> io::Result<(File, String)> {
    use std::os::fd::AsRawFd;
    let p = path(name);
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&p)?;
    let handle = p.to_string_lossy().into_owned();
    // SAFETY: a valid descriptor; the range is the segment.
    let r = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, len as libc::off_t) };
    if r != 0 {
        remove(&handle);
        return Err(io::Error::from_raw_os_error(r));
    }
    Ok((f, handle))
}

/// Whether `handle` is what [`create`] returns for a segment's name (the
/// peer sends it; nothing else may be opened).
pub fn is_segment_handle(handle: &str) -> bool {
    let p = std::path::Path::new(handle);
    p.parent() == Some(dir().as_path())
        && p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| super::orphans::owner_of(n).is_some())
}

pub fn open(handle: &str) -> io::Result<File> {
    OpenOptions::new().read(true).write(true).open(handle)
}

pub fn remove(handle: &str) {
    let _ = std::fs::remove_file(handle);
}

/// Removes the segments of this user whose creator is gone (see
/// [`super::orphans`]).
pub fn sweep() {
    sweep_in(&dir());
}

fn sweep_in(dir: &std::path::Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if super::orphans::is_orphan(name)
            && e.metadata().is_ok_and(|m| m.is_file() && m.uid() == me)
        {
            tracing::debug!(segment = name, "removing a segment whose creator is gone");
            let _ = std::fs::remove_file(e.path());
        }
    }
}
