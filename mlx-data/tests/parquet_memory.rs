//! Streaming keeps memory to about one row group (parquet) or one line (JSON
//! Lines) plus one batch of documents, measured with a counting allocator. The only
//! test in its binary, so no other test's allocations are counted.

mod common;

use common::parquet_files::{expected_docs, text_parquet};
use mlx_data::source::Resolved;
use mlx_data::{LocalFormat, LocalSource, Split};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::SeqCst) + by;
    PEAK.fetch_max(now, Ordering::SeqCst);
}

// SAFETY: forwards to the system allocator and only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            CURRENT.fetch_sub(layout.size(), Ordering::SeqCst);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Peak heap bytes above the level at the start of `f`.
fn peak_during(f: impl FnOnce()) -> usize {
    let base = CURRENT.load(Ordering::SeqCst);
    PEAK.store(base, Ordering::SeqCst);
    f();
    PEAK.load(Ordering::SeqCst) - base
}

fn source(path: &std::path::Path, format: LocalFormat) -> Resolved {
    Resolved::Local(LocalSource {
        train: path.to_path_buf(),
        validation: Some(path.to_path_buf()),
        format,
        options: Default::default(),
    })
}

#[test]
fn streaming_holds_a_row_group_or_a_line_not_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<Option<String>> = mlx_data::corpus::stories(9, 8 << 20)
        .into_iter()
        .map(Some)
        .collect();
    let docs = expected_docs(&texts);
    let text_bytes: usize = docs.iter().map(String::len).sum();
    let groups = 64;
    let rows_per_group = texts.len().div_ceil(groups);
    let group_bytes = text_bytes / groups;
    let pq = dir.path().join("big.parquet");
    std::fs::write(&pq, text_parquet(&texts, rows_per_group)).unwrap();
    let jsonl = dir.path().join("big.jsonl");
    let lines: String = docs
        .iter()
        .map(|t| serde_json::json!({ "text": t }).to_string() + "\n")
        .collect();
    std::fs::write(&jsonl, lines).unwrap();
    drop((texts, docs));

    let batch_docs = 32;
    let longest = |r: &Resolved| {
        let (mut n, mut bytes) = (0usize, 0usize);
        let peak = peak_during(|| {
            r.for_each_batch(Split::Train, batch_docs, |batch| {
                n += batch.len();
                bytes += batch.iter().map(String::len).sum::<usize>();
                Ok(())
            })
            .unwrap()
        });
        assert_eq!(bytes, text_bytes);
        (peak, n)
    };

    let parquet = source(
        &pq,
        LocalFormat::Parquet {
            column: "text".into(),
        },
    );
    let (pq_peak, n) = longest(&parquet);
    let (js_peak, n_js) = longest(&source(&jsonl, LocalFormat::JsonLines));
    assert_eq!(n, n_js);
    // Loading the whole file, as `load` does, is what streaming avoids; the meter sees it.
    let whole = peak_during(|| {
        let c = parquet.load(Split::Train).unwrap();
        assert_eq!(c.len(), n);
    });
    eprintln!(
        "text {text_bytes} B in {groups} row groups of {group_bytes} B: parquet peak {pq_peak} B, \
         JSON Lines peak {js_peak} B, whole-file load {whole} B"
    );
    assert!(whole > text_bytes, "load() peak {whole} B");
    // A row group's text decoded plus its compressed pages, a batch of documents and
    // the reader's fixed buffers: far below the file's 64 row groups.
    assert!(
        pq_peak < 4 * group_bytes + (1 << 20),
        "parquet streaming peaked at {pq_peak} B; one row group is {group_bytes} B"
    );
    // JSON Lines: a 1 MiB read buffer, one line and a batch of documents.
    assert!(
        js_peak < 2 << 20,
        "JSON Lines streaming peaked at {js_peak} B for a {text_bytes} B file"
    );
}
