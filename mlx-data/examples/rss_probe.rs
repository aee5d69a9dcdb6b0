//! Measures the resident memory of ranks reading a large token store.
//!
//! ```text
//! cargo run --release -p mlx-data --example rss_probe -- [--mb 200] [--max-world 8] [--no-release]
//! ```
//! The parent builds (once) a synthetic store of about `--mb` megabytes, then for
//! each world size 1..=max-world starts `world` child processes at once, one per
//! rank. Each child records its RSS before opening the store (its baseline),
//! opens and fully verifies the store, reads its whole shard for one epoch in
//! pack mode (block 512, 4 rows per batch), and reports RSS above baseline.

use mlx_data::store::{BuildSpec, StoreMeta, open_or_build};
use mlx_data::{BatchMode, BatchSize, DataLoader, LoaderConfig, TokenStore, Verify};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Current and peak resident set in KiB (peak only where /proc is missing).
fn rss_kib() -> (u64, u64) {
    if let Ok(s) = std::fs::read_to_string("/proc/self/status") {
        let field = |name: &str| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        return (field("VmRSS:"), field("VmHWM:"));
    }
    // macOS and other Unixes: getrusage gives the peak (bytes on macOS, KiB elsewhere).
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let peak = if cfg!(target_os = "macos") {
        ru.ru_maxrss as u64 / 1024
    } else {
        ru.ru_maxrss as u64
    };
    (peak, peak)
}

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn child(path: PathBuf, rank: usize, world: usize, release: bool) {
    let (base, _) = rss_kib();
    let store = Arc::new(TokenStore::open(&path, Verify::Full).expect("open store"));
    let (after_open, _) = rss_kib();
    let cfg = LoaderConfig {
        block_size: 512,
        batch: BatchSize::PerRank(4),
        mode: BatchMode::Pack,
        seed: 42,
        rank,
        world,
        release_pages: release,
    };
    let mut loader = DataLoader::new(store, cfg).expect("loader");
    let t = Instant::now();
    let n = loader.batches_per_epoch();
    let mut checksum = 0u64;
    for _ in 0..n {
        let b = loader.next_batch().expect("batch");
        checksum = checksum.wrapping_add(b.tokens[0] as u64);
    }
    let secs = t.elapsed().as_secs_f64();
    if std::env::var_os("RSS_DEBUG").is_some() {
        let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        eprintln!(
            "{}",
            s.lines()
                .filter(|l| l.starts_with("Rss"))
                .collect::<Vec<_>>()
                .join(" ")
        );
    }
    let (end, peak) = rss_kib();
    println!(
        "RESULT world={world} rank={rank} baseline_kib={base} open_delta_kib={} epoch_delta_kib={} peak_delta_kib={} batches={n} batches_per_s={:.0} sum={checksum}",
        after_open.saturating_sub(base),
        end.saturating_sub(base),
        peak.saturating_sub(base),
        n as f64 / secs
    );
}

fn build(path: &PathBuf, mb: u64) {
    let vocab = 50257usize;
    let n_tokens = mb * 1_000_000 / 2;
    let spec = BuildSpec {
        meta: StoreMeta {
            source: format!("synthetic-rss-probe:{mb}MB"),
            tokenizer_hash: "none".into(),
            split: "train".into(),
        },
        vocab_size: vocab,
        eos: 50256,
        lock_deadline: Duration::from_secs(600),
    };
    let t = Instant::now();
    let (store, outcome) = open_or_build(path, &spec, |w| {
        let mut rng = mlx_data::rng::SplitMix64::new(1);
        let mut written = 0;
        let mut doc = Vec::new();
        while written < n_tokens {
            let len = 50 + rng.below(400);
            doc.clear();
            doc.extend((0..len).map(|_| rng.below(50256) as u32));
            w.push_doc(&doc)?;
            written += len as u64 + 1;
        }
        Ok(())
    })
    .expect("build store");
    eprintln!(
        "store {} ({:?}): {} tokens, {} docs, {:.1} MB, in {:.1?}",
        path.display(),
        outcome,
        store.n_tokens(),
        store.n_docs(),
        std::fs::metadata(path).unwrap().len() as f64 / 1e6,
        t.elapsed()
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let release = !args.iter().any(|a| a == "--no-release");
    if let (Some(rank), Some(world), Some(path)) = (
        arg(&args, "--rank"),
        arg(&args, "--world"),
        arg(&args, "--store"),
    ) {
        child(
            path.into(),
            rank.parse().unwrap(),
            world.parse().unwrap(),
            release,
        );
        return;
    }
    let mb: u64 = arg(&args, "--mb")
        .map(|v| v.parse().unwrap())
        .unwrap_or(200);
    let max_world: usize = arg(&args, "--max-world")
        .map(|v| v.parse().unwrap())
        .unwrap_or(8);
    let path = arg(&args, "--store")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join(format!("mlx-data-rss-probe-{mb}mb.tokens")));
    build(&path, mb);
    let exe = std::env::current_exe().unwrap();
    println!(
        "world  max RSS above baseline per rank (KiB): after open / after epoch / peak   (release_pages={release})"
    );
    for world in 1..=max_world {
        let children: Vec<_> = (0..world)
            .map(|rank| {
                let mut c = std::process::Command::new(&exe);
                c.args(["--rank", &rank.to_string(), "--world", &world.to_string()]);
                c.arg("--store").arg(&path);
                if !release {
                    c.arg("--no-release");
                }
                c.stdout(std::process::Stdio::piped()).spawn().unwrap()
            })
            .collect();
        let mut worst = (0u64, 0u64, 0u64);
        let mut rate = 0f64;
        for c in children {
            let out = c.wait_with_output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| l.starts_with("RESULT"))
                .unwrap_or_else(|| panic!("{text}"));
            let get = |k: &str| -> f64 {
                line.split_whitespace()
                    .find_map(|f| f.strip_prefix(k))
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0.0)
            };
            worst.0 = worst.0.max(get("open_delta_kib=") as u64);
            worst.1 = worst.1.max(get("epoch_delta_kib=") as u64);
            worst.2 = worst.2.max(get("peak_delta_kib=") as u64);
            rate += get("batches_per_s=");
            eprintln!("  {line}");
        }
        println!(
            "{world:>5}  {:>8} / {:>8} / {:>8}   (all ranks together: {:.0} batches/s)",
            worst.0, worst.1, worst.2, rate
        );
    }
}
