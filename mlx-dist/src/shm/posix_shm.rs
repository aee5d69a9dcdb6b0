//! Segments as POSIX shared memory objects (`shm_open`): macOS's way, and
//! compiled everywhere so that its tests run on Linux too.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::FromRawFd;

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

/// Creates the object `/name` (names are at most 31 bytes there).
pub fn create(name: &str, len: usize) -> io::Result<(File, String)> {
    let handle = format!("/{name}");
    let f = shm_open(&handle, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL)?;
    f.set_len(len as u64)?;
    Ok((f, handle))
}

pub fn open(handle: &str) -> io::Result<File> {
    shm_open(handle, libc::O_RDWR)
}

pub fn remove(handle: &str) {
    if let Ok(c) = CString::new(handle) {
        // SAFETY: a valid C string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

#[cfg(test)]
mod tests {
    use crate::shm::negotiate::{hex, random};
    use crate::shm::posix_shm;
    use crate::shm::segment::{NONCE_LEN, Segment, head_at, segment_len};
    use std::sync::atomic::Ordering;

    #[test]
    fn posix_shared_memory_objects_are_made_shared_and_removed() {
        // macOS's segments, exercised wherever the tests run.
        let name = format!("mlxd{}", hex(&random::<12>().unwrap()));
        assert!(name.len() < 31, "macOS limits names to 31 bytes");
        let (f, handle) = posix_shm::create(&name, segment_len()).unwrap();
        let a = Segment::map(&f).unwrap();
        let b = Segment::map(&posix_shm::open(&handle).unwrap()).unwrap();
        let n = random::<NONCE_LEN>().unwrap();
        a.write_nonce(&n);
        assert_eq!(b.nonce(), n, "both maps see one memory");
        a.counter(head_at(1)).store(7, Ordering::Release);
        assert_eq!(b.counter(head_at(1)).load(Ordering::Acquire), 7);
        posix_shm::remove(&handle);
        assert!(posix_shm::open(&handle).is_err(), "the name is removed");
        let (_f, again) = posix_shm::create(&name, 4096).expect("the name is free again");
        posix_shm::remove(&again);
    }
}
