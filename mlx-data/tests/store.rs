//! Token store: round trip, corruption detection, stale rebuilds, concurrent builders.

mod common;

use common::*;
use mlx_data::store::{Outcome, open_or_build};
use mlx_data::{DataError, TokenStore, Verify};
use std::io::{Seek, SeekFrom, Write};
use std::sync::{Arc, Barrier};

#[test]
fn round_trip_u16_and_u32() {
    let dir = tempfile::tempdir().unwrap();
    for vocab in [300u32, 100_000] {
        let path = dir.path().join(format!("s{vocab}.tokens"));
        let store = synthetic_store(&path, 500, vocab);
        assert_eq!(store.n_docs(), 500);
        let expected_tokens: u64 = (0..500)
            .map(|i| doc_tokens(i, vocab).len() as u64 + 1)
            .sum();
        assert_eq!(store.n_tokens(), expected_tokens);
        let width = if vocab <= 65536 { 2 } else { 4 };
        assert_eq!(store.header().dtype.width(), width);
        for i in [0u64, 1, 77, 499] {
            assert_eq!(store.doc(i).unwrap().to_vec(), doc_tokens(i, vocab));
            let (_, e) = store.doc_range(i).unwrap();
            assert_eq!(store.tokens(e, e + 1).get(0), Some(EOS));
        }
        assert!(store.doc(500).is_err());
    }
}

fn corrupt_at(path: &std::path::Path, offset: u64) {
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    let mut b = [0u8; 1];
    std::io::Read::read_exact(&mut f, &mut b).unwrap();
    f.seek(SeekFrom::Start(offset)).unwrap();
    f.write_all(&[b[0] ^ 0x5a]).unwrap();
}

#[test]
fn corrupt_and_truncated_stores_are_detected_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("c.tokens");
    synthetic_store(&path, 200, 500);
    let len = std::fs::metadata(&path).unwrap().len();

    // A flipped token byte: caught by the data checksum, not by the header check.
    corrupt_at(&path, 4096 + 100);
    assert!(TokenStore::open(&path, Verify::HeaderOnly).is_ok());
    match TokenStore::open(&path, Verify::Full) {
        Err(DataError::CorruptStore { offset, .. }) => assert_eq!(offset, 4096),
        other => panic!("expected CorruptStore, got {other:?}"),
    }
    let (store, outcome) = open_or_build(&path, &spec(500, "200"), |w| fill(w, 200, 500)).unwrap();
    assert!(
        matches!(outcome, Outcome::Rebuilt(ref r) if r.contains("checksum")),
        "{outcome:?}"
    );
    assert_eq!(store.doc(3).unwrap().to_vec(), doc_tokens(3, 500));

    // A flipped header byte.
    corrupt_at(&path, 20);
    assert!(matches!(
        TokenStore::open(&path, Verify::HeaderOnly),
        Err(DataError::CorruptStore { .. })
    ));

    // Truncation.
    synthetic_store(&path, 200, 500);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    match TokenStore::open(&path, Verify::HeaderOnly) {
        Err(e @ DataError::CorruptStore { .. }) => assert!(e.to_string().contains("truncated")),
        other => panic!("expected CorruptStore, got {other:?}"),
    }
    // Empty file.
    std::fs::write(&path, b"").unwrap();
    assert!(matches!(
        TokenStore::open(&path, Verify::Full),
        Err(DataError::CorruptStore { .. })
    ));
    let (_, outcome) = open_or_build(&path, &spec(500, "200"), |w| fill(w, 200, 500)).unwrap();
    assert!(matches!(outcome, Outcome::Rebuilt(_)));
    assert!(TokenStore::open(&path, Verify::Full).is_ok());
}

#[test]
fn stale_store_is_rebuilt_and_matching_store_reused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.tokens");
    let (_, o) = open_or_build(&path, &spec(500, "a"), |w| fill(w, 10, 500)).unwrap();
    assert_eq!(o, Outcome::Built);
    let (_, o) = open_or_build(&path, &spec(500, "a"), |_| panic!("must not rebuild")).unwrap();
    assert_eq!(o, Outcome::Reused);
    let (s, o) = open_or_build(&path, &spec(500, "b"), |w| fill(w, 20, 500)).unwrap();
    assert!(
        matches!(o, Outcome::Rebuilt(ref r) if r.contains("source")),
        "{o:?}"
    );
    assert_eq!(s.n_docs(), 20);
}

#[test]
fn failed_build_leaves_no_store_and_no_temp_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("f.tokens");
    let err = open_or_build(&path, &spec(500, "x"), |w| w.push_doc(&[999])).unwrap_err();
    assert!(matches!(err, DataError::Tokenizer { .. }), "{err}");
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        names
            .iter()
            .all(|n| !n.contains(".tmp.") && n != "f.tokens"),
        "{names:?}"
    );
}

#[test]
fn concurrent_threads_build_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = Arc::new(dir.path().join("t.tokens"));
    let n = 8;
    let barrier = Arc::new(Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let (path, barrier) = (path.clone(), barrier.clone());
            std::thread::spawn(move || {
                barrier.wait();
                let (store, outcome) = open_or_build(&path, &spec(1000, "c"), |w| {
                    std::thread::sleep(std::time::Duration::from_millis(100));
                    fill(w, 3000, 1000)
                })
                .unwrap();
                assert_eq!(store.doc(2999).unwrap().to_vec(), doc_tokens(2999, 1000));
                outcome
            })
        })
        .collect();
    let outcomes: Vec<Outcome> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Built).count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes.iter().filter(|o| **o == Outcome::Reused).count(),
        n - 1
    );
}

/// Child half of `concurrent_processes_build_exactly_once`; does nothing unless
/// started by it.
#[test]
#[ignore = "helper process for concurrent_processes_build_exactly_once"]
fn child_builder() {
    let Some(path) = std::env::var_os("MLX_DATA_CHILD_STORE") else {
        return;
    };
    let path = std::path::PathBuf::from(path);
    // Start together: wait for the go file.
    let go = path.with_extension("go");
    let start = std::time::Instant::now();
    while !go.exists() && start.elapsed() < std::time::Duration::from_secs(30) {
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
    let (store, outcome) = open_or_build(&path, &spec(1000, "p"), |w| {
        std::thread::sleep(std::time::Duration::from_millis(200));
        fill(w, 3000, 1000)
    })
    .unwrap();
    assert_eq!(store.doc(1234).unwrap().to_vec(), doc_tokens(1234, 1000));
    println!("OUTCOME={outcome:?}");
}

#[test]
fn concurrent_processes_build_exactly_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("p.tokens");
    let exe = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..4)
        .map(|_| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    "child_builder",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("MLX_DATA_CHILD_STORE", &path)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    std::fs::write(path.with_extension("go"), b"").unwrap();
    let mut outcomes = vec![];
    for c in children {
        let out = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "child failed: {text}");
        let at = text.find("OUTCOME=").expect(&text);
        let word: String = text[at..]
            .chars()
            .take_while(|c| !c.is_whitespace())
            .collect();
        outcomes.push(word);
    }
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| o.as_str() == "OUTCOME=Built")
            .count(),
        1,
        "{outcomes:?}"
    );
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| o.as_str() == "OUTCOME=Reused")
            .count(),
        3,
        "{outcomes:?}"
    );
}

#[test]
fn lock_wait_has_a_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("x.lock");
    let _held =
        mlx_data::lockfile::FileLock::acquire(&lock, std::time::Duration::from_secs(1)).unwrap();
    let t = std::time::Instant::now();
    let err = mlx_data::lockfile::FileLock::acquire(&lock, std::time::Duration::from_millis(300))
        .unwrap_err();
    assert!(matches!(err, DataError::LockTimeout { .. }), "{err}");
    assert!(t.elapsed() < std::time::Duration::from_secs(3));
}
