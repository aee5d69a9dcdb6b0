//! Token store: round trip, corruption detection, hostile headers with valid
//! checksums, stale rebuilds, concurrent builders.

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

// ---- Hostile headers: a crafted file with a correct checksum must never panic. ----

/// (offset, width) of every numeric header field after the magic, as laid out in
/// `mlx_data::store::format`.
const FIELDS: [(usize, usize); 11] = [
    (8, 4),  // version
    (12, 4), // token width
    (16, 8), // n_tokens
    (24, 8), // n_docs
    (32, 4), // eos
    (36, 4), // vocab_size
    (40, 8), // tokens_offset
    (48, 8), // index_offset
    (56, 8), // file_len
    (64, 8), // data_checksum
    (72, 4), // meta_len
];

fn get_field(b: &[u8], (at, width): (usize, usize)) -> u64 {
    let mut v = [0u8; 8];
    v[..width].copy_from_slice(&b[at..at + width]);
    u64::from_le_bytes(v)
}

fn set_field(b: &mut [u8], (at, width): (usize, usize), value: u64) {
    b[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
}

/// Recomputes both checksums the way the writer does, so that only the field
/// checks stand between a crafted file and the reader.
fn reseal(b: &mut [u8], data_too: bool) {
    use mlx_data::store::format::{HEADER_LEN, HEADER_SUM_AT, header_checksum};
    if data_too && b.len() >= HEADER_LEN {
        let sum = xxhash_rust::xxh3::xxh3_64(&b[HEADER_LEN..]);
        set_field(b, FIELDS[9], sum);
    }
    let sum = header_checksum(b);
    b[HEADER_SUM_AT..HEADER_SUM_AT + 8].copy_from_slice(&sum.to_le_bytes());
}

/// The bytes of a small valid store with 2-byte (`wide == false`) or 4-byte tokens.
fn valid_store_bytes(wide: bool) -> Vec<u8> {
    static STORES: std::sync::OnceLock<[Vec<u8>; 2]> = std::sync::OnceLock::new();
    let stores = STORES.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        [300u32, 100_000].map(|vocab| {
            let path = dir.path().join(format!("{vocab}.tokens"));
            synthetic_store(&path, 20, vocab);
            std::fs::read(&path).unwrap()
        })
    });
    stores[wide as usize].clone()
}

/// Writes `bytes` as a store and opens it both ways; any store that opens is read
/// everywhere a caller could reach, including out-of-range requests.
fn open_crafted(bytes: &[u8]) -> Vec<mlx_data::Result<()>> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crafted.tokens");
    std::fs::write(&path, bytes).unwrap();
    [Verify::Full, Verify::HeaderOnly]
        .map(|verify| -> mlx_data::Result<()> {
            let store = TokenStore::open(&path, verify)?;
            let n = store.n_tokens();
            assert_eq!(store.tokens(0, n).len() as u64, n);
            assert!(store.tokens(u64::MAX - 1, u64::MAX).is_empty());
            for i in (0..store.n_docs().min(64)).chain([store.n_docs(), u64::MAX]) {
                if let Ok((s, e)) = store.doc_range(i) {
                    assert!(s <= e && e < n, "doc {i}: {s}..{e} of {n}");
                    assert_eq!(store.doc(i)?.len() as u64, e - s);
                }
            }
            store.release(0, u64::MAX);
            store.release(u64::MAX, u64::MAX);
            Ok(())
        })
        .into_iter()
        .collect()
}

fn corrupt_message(r: mlx_data::Result<TokenStore>) -> String {
    match r {
        Err(e @ DataError::CorruptStore { .. }) => e.to_string(),
        other => panic!("expected CorruptStore, got {other:?}"),
    }
}

/// A new value for a field: anything, something small, near the top, near the
/// original (where off-by-one mistakes live), or the original plus a multiple of
/// 2^62 (a count whose byte size wraps around to the real one).
#[derive(Debug, Clone)]
enum Value {
    Exactly(u64),
    Near(i64),
    Wrapped(u64, i64),
}

fn value() -> impl proptest::strategy::Strategy<Value = Value> {
    use proptest::prelude::*;
    prop_oneof![
        any::<u64>().prop_map(Value::Exactly),
        (0u64..5000).prop_map(Value::Exactly),
        (0u64..16).prop_map(|d| Value::Exactly(u64::MAX - d)),
        (0u64..16).prop_map(|d| Value::Exactly((1 << 63) + d)),
        (-16i64..=16).prop_map(Value::Near),
        (1u64..4, -2i64..=2).prop_map(|(k, d)| Value::Wrapped(k, d)),
    ]
}

impl Value {
    fn apply(&self, old: u64) -> u64 {
        match *self {
            Value::Exactly(v) => v,
            Value::Near(d) => old.wrapping_add_signed(d),
            Value::Wrapped(k, d) => old.wrapping_add(k << 62).wrapping_add_signed(d),
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]

    #[test]
    fn crafted_headers_with_valid_checksums_never_panic(
        wide: bool,
        edits in proptest::collection::vec((0..FIELDS.len(), value()), 1..5),
        index_edits in proptest::collection::vec((0usize..64, value()), 0..3),
        consistent_offsets: bool,
        new_len in proptest::option::of(0usize..12_000),
    ) {
        let mut b = valid_store_bytes(wide);
        let index_at = get_field(&b, FIELDS[7]) as usize;
        for (i, v) in &index_edits {
            let at = (index_at + 8 * i).min(b.len() - 8);
            let old = get_field(&b, (at, 8));
            set_field(&mut b, (at, 8), v.apply(old));
        }
        if let Some(len) = new_len {
            b.resize(len.max(4096), 0);
        }
        reseal(&mut b, true);
        for (f, v) in &edits {
            let old = get_field(&b, FIELDS[*f]);
            set_field(&mut b, FIELDS[*f], v.apply(old));
        }
        if consistent_offsets {
            // What unchecked (wrapping) arithmetic would derive from the counts: the
            // overflow cases then pass every equality check and only bounds stop them.
            let width = get_field(&b, FIELDS[1]);
            let n_tokens = get_field(&b, FIELDS[2]);
            let n_docs = get_field(&b, FIELDS[3]);
            let index = n_tokens.wrapping_mul(width).wrapping_add(4096).wrapping_add(7) & !7;
            set_field(&mut b, FIELDS[7], index);
            set_field(&mut b, FIELDS[8], index.wrapping_add(n_docs.wrapping_add(1).wrapping_mul(8)));
        }
        reseal(&mut b, false);
        let _ = open_crafted(&b);
    }
}

#[test]
fn unedited_store_opens_through_the_crafting_helpers() {
    for wide in [false, true] {
        let mut b = valid_store_bytes(wide);
        reseal(&mut b, true);
        assert!(open_crafted(&b).iter().all(Result::is_ok));
    }
}

#[test]
fn token_count_so_large_that_offsets_overflow_is_refused() {
    for wide in [false, true] {
        let mut b = valid_store_bytes(wide);
        let n_tokens = get_field(&b, FIELDS[2]);
        let width = get_field(&b, FIELDS[1]);
        // n_tokens * width wraps around to the real byte count: the index offset and
        // file length in the header stay right, only the count is hostile.
        let hostile = n_tokens + (1u64 << 63) / (width / 2);
        assert_eq!(hostile.wrapping_mul(width), n_tokens * width);
        set_field(&mut b, FIELDS[2], hostile);
        // The last index entry agrees with the hostile count.
        let last = get_field(&b, FIELDS[8]) as usize - 8;
        set_field(&mut b, (last, 8), hostile);
        reseal(&mut b, true);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("overflow.tokens");
        std::fs::write(&path, &b).unwrap();
        let msg = corrupt_message(TokenStore::open(&path, Verify::HeaderOnly));
        assert!(msg.contains(&format!("n_tokens {hostile}")), "{msg}");

        // A document count whose index length overflows.
        let mut b = valid_store_bytes(wide);
        set_field(&mut b, FIELDS[3], u64::MAX);
        reseal(&mut b, false);
        std::fs::write(&path, &b).unwrap();
        let msg = corrupt_message(TokenStore::open(&path, Verify::HeaderOnly));
        assert!(msg.contains(&format!("n_docs {}", u64::MAX)), "{msg}");

        // Counts that fit on their own but whose index end does not.
        let mut b = valid_store_bytes(wide);
        let n_tokens = 1u64 << 61;
        set_field(&mut b, FIELDS[2], n_tokens);
        set_field(&mut b, FIELDS[7], n_tokens * width + 4096);
        set_field(&mut b, FIELDS[3], n_tokens);
        reseal(&mut b, false);
        std::fs::write(&path, &b).unwrap();
        let msg = corrupt_message(TokenStore::open(&path, Verify::HeaderOnly));
        assert!(
            msg.contains(&format!("n_docs {n_tokens} whose index")),
            "{msg}"
        );
    }
}

#[test]
fn lengths_past_the_end_of_the_file_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("long.tokens");
    let b0 = valid_store_bytes(false);
    let (n_tokens, index_at, file_len) = (
        get_field(&b0, FIELDS[2]),
        get_field(&b0, FIELDS[7]),
        get_field(&b0, FIELDS[8]),
    );

    // A self-consistent header describing 1000 more tokens than the file holds.
    let mut b = b0.clone();
    set_field(&mut b, FIELDS[2], n_tokens + 1000);
    set_field(&mut b, FIELDS[7], index_at + 2000);
    set_field(&mut b, FIELDS[8], file_len + 2000);
    reseal(&mut b, false);
    std::fs::write(&path, &b).unwrap();
    let msg = corrupt_message(TokenStore::open(&path, Verify::HeaderOnly));
    assert!(
        msg.contains(&format!("file length {}", file_len + 2000)),
        "{msg}"
    );

    // A file length that disagrees with the counts, and one past u64::MAX's reach.
    for bad in [file_len + 8, u64::MAX] {
        let mut b = b0.clone();
        set_field(&mut b, FIELDS[8], bad);
        reseal(&mut b, false);
        std::fs::write(&path, &b).unwrap();
        let msg = corrupt_message(TokenStore::open(&path, Verify::HeaderOnly));
        assert!(msg.contains(&format!("file_len {bad}")), "{msg}");
    }

    // Metadata longer than the header, an EOS outside the vocabulary, and a
    // vocabulary that does not fit the token width.
    for (field, value, name) in [
        (10, 5000, "meta_len 5000"),
        (4, 300, "eos 300"),
        (5, 70_000, "vocab_size 70000"),
    ] {
        let mut b = b0.clone();
        set_field(&mut b, FIELDS[field], value);
        reseal(&mut b, false);
        std::fs::write(&path, &b).unwrap();
        let msg = corrupt_message(TokenStore::open(&path, Verify::HeaderOnly));
        assert!(msg.contains(name), "{msg}");
    }
}

// ---- Token ids: an id outside the vocabulary is refused when the store opens. ----

/// (first token's offset, token width, token count, vocabulary) of `b`.
fn token_layout(b: &[u8]) -> (usize, usize, usize, u64) {
    (
        mlx_data::store::format::HEADER_LEN,
        get_field(b, FIELDS[1]) as usize,
        get_field(b, FIELDS[2]) as usize,
        get_field(b, FIELDS[5]),
    )
}

#[test]
fn a_token_id_beyond_the_vocabulary_is_refused_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ids.tokens");
    for wide in [false, true] {
        let b0 = valid_store_bytes(wide);
        let (at, width, n_tokens, vocab) = token_layout(&b0);
        let k = n_tokens / 2;
        for (id, ok) in [
            (vocab - 1, true),
            (vocab, false),
            ((1u64 << (8 * width)) - 1, false),
        ] {
            let mut b = b0.clone();
            set_field(&mut b, (at + k * width, width), id);
            reseal(&mut b, true);
            std::fs::write(&path, &b).unwrap();
            let r = TokenStore::open(&path, Verify::Full);
            if ok {
                assert_eq!(
                    r.unwrap().tokens(0, n_tokens as u64).get(k),
                    Some(id as u32)
                );
            } else {
                let msg = corrupt_message(r);
                assert!(msg.contains(&format!("token {k} is id {id}")), "{msg}");
                assert!(msg.contains(&format!("vocab_size {vocab}")), "{msg}");
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    #[test]
    fn arbitrary_bytes_never_open_into_a_panic(
        bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..6000),
        valid_header: bool,
        sealed: bool,
    ) {
        // Anything, or anything behind a valid store's header (then resealed
        // so the checksums hold and only the field checks stand in the way).
        let mut b = bytes;
        if valid_header {
            let v = valid_store_bytes(false);
            let h = mlx_data::store::format::HEADER_LEN;
            let mut with = v[..h].to_vec();
            with.extend_from_slice(&b);
            b = with;
        }
        if sealed && b.len() >= mlx_data::store::format::HEADER_LEN {
            reseal(&mut b, true);
        }
        let _ = open_crafted(&b);
    }

    #[test]
    fn edited_token_ids_open_only_when_all_are_in_the_vocabulary(
        wide: bool,
        edits in proptest::collection::vec(
            (proptest::prelude::any::<proptest::sample::Index>(), value()),
            1..6,
        ),
    ) {
        let mut b = valid_store_bytes(wide);
        let (at, width, n_tokens, vocab) = token_layout(&b);
        let mask = (1u64 << (8 * width)) - 1;
        for (i, v) in &edits {
            let k = i.index(n_tokens);
            let field = (at + k * width, width);
            // Values near the vocabulary's edge as often as anywhere.
            let old = get_field(&b, field);
            let new = match v {
                Value::Near(d) => vocab.wrapping_add_signed(*d),
                _ => v.apply(old),
            } & mask;
            set_field(&mut b, field, new);
        }
        reseal(&mut b, true);
        let all_in = (0..n_tokens).all(|k| get_field(&b, (at + k * width, width)) < vocab);
        let results = open_crafted(&b);
        proptest::prop_assert_eq!(results[0].is_ok(), all_in, "{:?}", results[0]);
        // Header-only opening does not read the data; the store still reads
        // back in bounds.
        proptest::prop_assert!(results[1].is_ok());
    }
}
