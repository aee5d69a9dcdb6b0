//! Resident memory stays flat while a rank reads its shard of a large store
//! (Linux: reads RssFile, the file-backed pages mapped into this process).

#[cfg(target_os = "linux")]
mod common;

#[cfg(target_os = "linux")]
fn rss_file_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find(|l| l.starts_with("RssFile:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap()
}

#[cfg(target_os = "linux")]
#[test]
fn reading_an_epoch_does_not_grow_resident_memory_when_pages_are_released() {
    use mlx_data::{BatchMode, BatchSize, DataLoader, LoaderConfig, TokenStore, Verify};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.tokens");
    // About 24 MB of u16 tokens.
    let spec = common::spec(50_000, "big");
    mlx_data::store::open_or_build(&path, &spec, |w| {
        let doc: Vec<u32> = (0..999).map(|i| 1 + i * 37 % 49_000).collect();
        for _ in 0..12_000 {
            w.push_doc(&doc)?;
        }
        Ok(())
    })
    .unwrap();
    let store = Arc::new(TokenStore::open(&path, Verify::Full).unwrap());
    let size_kib = std::fs::metadata(&path).unwrap().len() / 1024;
    let epoch_growth = |release_pages: bool, rank: usize| {
        let cfg = LoaderConfig {
            block_size: 512,
            batch: BatchSize::PerRank(4),
            mode: BatchMode::Pack,
            rank,
            world: 4,
            release_pages,
            ..Default::default()
        };
        let mut l = DataLoader::new(store.clone(), cfg).unwrap();
        let before = rss_file_kib();
        for _ in 0..l.batches_per_epoch() {
            l.next_batch().unwrap();
        }
        rss_file_kib().saturating_sub(before)
    };
    let released = epoch_growth(true, 0);
    assert!(
        released < 8 * 1024,
        "grew {released} KiB with release_pages"
    );
    // Without releasing, shuffled windows plus the kernel's fault-around map most of
    // the file even though this rank reads only a quarter of the windows: the test
    // can tell the difference.
    let kept = epoch_growth(false, 1);
    assert!(
        kept > size_kib / 4,
        "grew only {kept} KiB of {size_kib} without release_pages"
    );
}
