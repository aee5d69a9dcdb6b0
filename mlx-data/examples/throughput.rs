//! Tokenization throughput (MB/s) and loader throughput (batches/s).
//!
//! ```text
//! cargo run --release -p mlx-data --example throughput -- [--mb 8]
//! ```
//! Tokenizes `--mb` megabytes of offline-corpus stories with GPT-2 (embedded) and
//! with a byte-level BPE trained on the corpus, on one thread and on the whole
//! rayon pool; then builds a GPT-2 token store and times the loader (block 512,
//! batch 4) in pad and pack mode, plain and prefetched.

use mlx_data::{
    BatchMode, BatchSize, Corpus, DataLoader, LoaderConfig, Prefetcher, TextTokenizer, Verify,
};
use std::sync::Arc;
use std::time::Instant;

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn tokenize(name: &str, t: &TextTokenizer, docs: &[String]) {
    let bytes: usize = docs.iter().map(|d| d.len()).sum();
    let t0 = Instant::now();
    let mut n = 0;
    for d in docs {
        n += t.encode(d).unwrap().len();
    }
    let one = t0.elapsed().as_secs_f64();
    let t0 = Instant::now();
    let m: usize = t.encode_docs(docs).unwrap().iter().map(|v| v.len()).sum();
    let all = t0.elapsed().as_secs_f64();
    assert_eq!(n, m);
    println!(
        "tokenize {name:<28} {:>6.1} MB text -> {n:>9} tokens: 1 thread {:>6.2} MB/s, {} threads {:>6.2} MB/s",
        bytes as f64 / 1e6,
        bytes as f64 / 1e6 / one,
        rayon::current_num_threads(),
        bytes as f64 / 1e6 / all
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = arg(&args, "--mb").map(|v| v.parse().unwrap()).unwrap_or(8);
    let docs = mlx_data::corpus::stories(7, mb << 20);

    let t0 = Instant::now();
    let trained = TextTokenizer::train_byte_level(&docs[..docs.len().min(5000)], 4096).unwrap();
    println!(
        "train byte-level BPE (4096) on {} docs: {:.2?}",
        docs.len().min(5000),
        t0.elapsed()
    );
    tokenize("trained byte-level BPE 4096", &trained, &docs);
    let t0 = Instant::now();
    let tok = TextTokenizer::gpt2().unwrap();
    println!("build GPT-2 from the embedded ranks: {:.2?}", t0.elapsed());
    tokenize("GPT-2 (embedded)", &tok, &docs);

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.tokens");
    let corpus = Corpus::from_docs(&docs);
    let t0 = Instant::now();
    let mut w =
        mlx_data::store::StoreWriter::create(&path, tok.vocab_size(), tok.eos_id()).unwrap();
    mlx_data::pipeline::tokenize_into(&corpus, &tok, &mut w).unwrap();
    let h = w
        .finish(mlx_data::store::StoreMeta {
            source: "bench".into(),
            tokenizer_hash: tok.hash().into(),
            split: "train".into(),
        })
        .unwrap();
    println!(
        "build store: {} docs, {} tokens in {:.2?} ({:.2} MB/s of text, end to end)",
        h.n_docs,
        h.n_tokens,
        t0.elapsed(),
        corpus.text_bytes() as f64 / 1e6 / t0.elapsed().as_secs_f64()
    );
    let t0 = Instant::now();
    let store = Arc::new(mlx_data::TokenStore::open(&path, Verify::Full).unwrap());
    println!("open + verify store: {:.2?}", t0.elapsed());

    for mode in [BatchMode::Pad, BatchMode::Pack] {
        let cfg = LoaderConfig {
            mode,
            batch: BatchSize::PerRank(4),
            block_size: 512,
            ..Default::default()
        };
        let mut l = DataLoader::new(store.clone(), cfg.clone()).unwrap();
        let n = 20_000;
        let t0 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(l.next_batch().unwrap());
        }
        let plain = n as f64 / t0.elapsed().as_secs_f64();
        let mut p = Prefetcher::spawn(DataLoader::new(store.clone(), cfg).unwrap(), 8).unwrap();
        let t0 = Instant::now();
        for _ in 0..n {
            std::hint::black_box(p.next_batch().unwrap());
        }
        let pre = n as f64 / t0.elapsed().as_secs_f64();
        println!(
            "loader {mode:?} (4 x 513): {plain:>9.0} batches/s plain, {pre:>9.0} batches/s through the prefetcher"
        );
    }
}
