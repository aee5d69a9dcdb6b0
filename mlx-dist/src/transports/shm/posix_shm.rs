//! Segments as POSIX shared memory objects (`shm_open`): macOS's way, and
//! compiled everywhere so that its tests run on Linux too.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

fn shm_open(handle: &str, flags: libc::c_int) -> io::Result<File> {
    let c = CString::new(handle).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: a valid C string; the mode is passed as the variadic
    // argument `shm_open` reads when it creates.
    let fd = unsafe { libc::shm_open(c.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we own from here on.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The folder of markers: one empty file per object this user's ranks
/// created and have not yet removed. POSIX shared memory objects cannot be
/// listed on macOS (there is no `/dev/shm`), so [`sweep`] finds the objects
/// of dead creators through their markers.
fn markers() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    std::env::temp_dir().join(format!("mlx-dist-shm-{uid}"))
}

/// Creates the object `/name` (names are at most 31 bytes there), its
/// marker first, so that no object exists without one.
pub fn create(name: &str, len: usize) -> io::Result<(File, String)> {
    create_in(&markers(), name, len)
}

fn create_in(markers: &Path, name: &str, len: usize) -> io::Result<(File, String)> {
    let handle = format!("/{name}");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(markers)?;
    std::fs::write(markers.join(name), b"")?;
    let made = shm_open(&handle, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL).and_then(|f| {
        f.set_len(len as u64)?;
        Ok(f)
    });
    match made {
        Ok(f) => Ok((f, handle)),
        Err(e) => {
            remove_in(markers, &handle);
            Err(e)
        }
    }
}

/// Whether `handle` is what [`create`] returns for a segment's name (the
/// peer sends it; nothing else may be opened).
pub fn is_segment_handle(handle: &str) -> bool {
    handle
        .strip_prefix('/')
        .is_some_and(|n| super::orphans::owner_of(n).is_some())
}

pub fn open(handle: &str) -> io::Result<File> {
    shm_open(handle, libc::O_RDWR)
}

pub fn remove(handle: &str) {
    remove_in(&markers(), handle)
}

fn remove_in(markers: &Path, handle: &str) {
    if let Ok(c) = CString::new(handle) {
        // SAFETY: a valid C string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
    let _ = std::fs::remove_file(markers.join(handle.trim_start_matches('/')));
}

/// Removes the objects (and markers) whose creator is gone (see
/// [`super::orphans`]).
pub fn sweep() {
    sweep_in(&markers())
}

fn sweep_in(markers: &Path) {
    let Ok(entries) = std::fs::read_dir(markers) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if let Some(name) = name.to_str()
            && super::orphans::is_orphan(name)
        {
            tracing::debug!(segment = name, "removing a segment whose creator is gone");
            remove_in(markers, &format!("/{name}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::hex_encode as hex;
    use crate::transports::shm::negotiate::random;
    use crate::transports::shm::posix_shm;
    use crate::transports::shm::segment::{NONCE_LEN, Segment, head_at, segment_len};
    use std::sync::atomic::Ordering;

    #[test]
    fn posix_shared_memory_objects_are_made_shared_and_removed() {
        // macOS's segments, exercised wherever the tests run.
        let name = format!("mlxd{}", hex(&random::<12>().unwrap()));
        assert!(name.len() < 31, "macOS limits names to 31 bytes");
        // Markers in a folder of this test's, removed at the end.
        let markers = std::env::temp_dir().join(format!("mlx-shm-made-{}", std::process::id()));
        let (f, handle) = posix_shm::create_in(&markers, &name, segment_len()).unwrap();
        let a = Segment::map(&f).unwrap();
        let b = Segment::map(&posix_shm::open(&handle).unwrap()).unwrap();
        let n = random::<NONCE_LEN>().unwrap();
        a.write_nonce(&n);
        assert_eq!(b.nonce(), n, "both maps see one memory");
        a.counter(head_at(1)).store(7, Ordering::Release);
        assert_eq!(b.counter(head_at(1)).load(Ordering::Acquire), 7);
        posix_shm::remove_in(&markers, &handle);
        assert!(posix_shm::open(&handle).is_err(), "the name is removed");
        let (_f, again) =
            posix_shm::create_in(&markers, &name, 4096).expect("the name is free again");
        posix_shm::remove_in(&markers, &again);
        std::fs::remove_dir(&markers).expect("no marker is left");
    }

    #[test]
    fn objects_of_a_dead_creator_are_swept_and_a_live_ones_kept() {
        use crate::transports::shm::orphans::segment_name;
        let markers = std::env::temp_dir().join(format!("mlx-shm-markers-{}", std::process::id()));
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let r = random::<8>().unwrap();
        let (orphan, live) = (segment_name(dead, &r), segment_name(std::process::id(), &r));
        let (_f, orphan_h) = posix_shm::create_in(&markers, &orphan, 4096).unwrap();
        let (_g, live_h) = posix_shm::create_in(&markers, &live, 4096).unwrap();
        posix_shm::sweep_in(&markers);
        assert!(
            posix_shm::open(&orphan_h).is_err(),
            "the dead creator's object is removed"
        );
        assert!(!markers.join(&orphan).exists(), "and its marker");
        assert!(
            posix_shm::open(&live_h).is_ok(),
            "a live creator's object stays"
        );
        posix_shm::remove_in(&markers, &live_h);
        assert!(posix_shm::open(&live_h).is_err());
        assert!(!markers.join(&live).exists());
        std::fs::remove_dir(&markers).unwrap();
    }
}
