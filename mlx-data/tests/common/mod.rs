//! Helpers shared by the integration tests.
#![allow(dead_code)]

pub mod hub_server;
pub mod parquet_files;

use mlx_data::store::{BuildSpec, StoreMeta, StoreWriter};
use mlx_data::{DataConfig, HubConfig, SourceSpec, TokenStore, TokenizerSpec, Verify};
use std::path::Path;
use std::time::Duration;

/// EOS id of the synthetic stores.
pub const EOS: u32 = 0;

/// Tokens of synthetic document `i`: a formula the tests can recompute independently.
pub fn doc_tokens(i: u64, vocab: u32) -> Vec<u32> {
    let len = 1 + (i * 37 % 53) as usize;
    (0..len)
        .map(|j| 1 + ((i as u32).wrapping_mul(31).wrapping_add(j as u32 * 7)) % (vocab - 1))
        .collect()
}

/// Build spec of a synthetic store.
pub fn spec(vocab: usize, tag: &str) -> BuildSpec {
    BuildSpec {
        meta: StoreMeta {
            source: format!("synthetic:{tag}"),
            tokenizer_hash: "none".into(),
            split: "train".into(),
        },
        vocab_size: vocab,
        eos: EOS,
        lock_deadline: Duration::from_secs(30),
    }
}

/// Writes `n_docs` synthetic documents into `w`.
pub fn fill(w: &mut StoreWriter, n_docs: u64, vocab: u32) -> mlx_data::Result<()> {
    for i in 0..n_docs {
        w.push_doc(&doc_tokens(i, vocab))?;
    }
    Ok(())
}

/// Builds (or reuses) a synthetic store at `path`.
pub fn synthetic_store(path: &Path, n_docs: u64, vocab: u32) -> TokenStore {
    let (store, _) =
        mlx_data::store::open_or_build(path, &spec(vocab as usize, &n_docs.to_string()), |w| {
            fill(w, n_docs, vocab)
        })
        .expect("build synthetic store");
    drop(store);
    TokenStore::open(path, Verify::Full).expect("reopen")
}

/// The gpt2 test files, or None (with a printed reason) when ../shared is absent
/// outside CI.
pub fn gpt2_dir() -> Option<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/gpt2");
    if dir.join("vocab.json").is_file() && dir.join("merges.txt").is_file() {
        return Some(dir);
    }
    if std::env::var_os("CI").is_some() {
        panic!(
            "CI is set but {} lacks vocab.json/merges.txt",
            dir.display()
        );
    }
    eprintln!(
        "skipping: {} not found (set CI to make this fatal)",
        dir.display()
    );
    None
}

/// A data configuration under `dir` that never touches the network (offline
/// mode, an unroutable endpoint), with its caches inside `dir`.
pub fn offline_config(dir: &Path, source: SourceSpec, tokenizer: TokenizerSpec) -> DataConfig {
    let mut hub = HubConfig::new("http://127.0.0.1:9", dir.join("hf"));
    hub.offline = true;
    DataConfig {
        source,
        tokenizer,
        cache_dir: dir.join("cache"),
        hub,
        lock_deadline: Duration::from_secs(60),
    }
}
