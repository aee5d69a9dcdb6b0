//! The whole pipeline as the trainer uses it: prepare data (TinyStories from the
//! Hub when reachable, else the built-in offline corpus), then read this rank's
//! batches through the prefetcher and show one decoded row.
//!
//! ```text
//! cargo run --release -p mlx-data --example tinystories -- [RANK WORLD]
//! ```

use mlx_data::{BatchSize, DataConfig, DataLoader, LoaderConfig, Prefetcher, prepare};

fn main() -> mlx_data::Result<()> {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rank, world) = match args[..] {
        [r, w] => (r, w),
        _ => (0, 1),
    };
    let t = std::time::Instant::now();
    let data = prepare(&DataConfig::default())?;
    println!(
        "source: {}, tokenizer: {} (vocab {}), train: {} docs / {} tokens, validation: {} docs; ready in {:.2?}",
        data.source_kind,
        data.tokenizer.description(),
        data.tokenizer.vocab_size(),
        data.train.n_docs(),
        data.train.n_tokens(),
        data.validation.n_docs(),
        t.elapsed()
    );
    let cfg = LoaderConfig {
        rank,
        world,
        batch: BatchSize::Global(4 * world),
        ..Default::default()
    };
    let loader = DataLoader::new(data.train.clone(), cfg)?;
    println!(
        "rank {rank}/{world}: {} batches per epoch",
        loader.batches_per_epoch()
    );
    let mut batches = Prefetcher::spawn(loader, 4)?;
    for step in 0..3 {
        let b = batches.next_batch()?;
        println!(
            "step {step}: {} rows x {} tokens, {} targets count in the loss",
            b.batch_size,
            b.row_len(),
            b.n_target_tokens()
        );
    }
    let b = batches.next_batch()?;
    let n = b.mask(0).iter().filter(|&&m| m == 1).count();
    println!("row 0: {:?}", data.tokenizer.decode(&b.inputs(0)[..n])?);
    println!("resume state: {}", batches.state().to_json());
    Ok(())
}
