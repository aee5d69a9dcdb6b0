//! One libFuzzer binary for every fuzz target of the workspace: the target
//! is named by `MLX_FUZZ_TARGET` (one build and one link serve them all;
//! `cargo xtask fuzz` sets it; `MLX_FUZZ_LIST=1` lists them, and
//! `MLX_FUZZ_SEEDS=<dir>` writes their seeds). Each target feeds its input
//! to a reader of bytes from a file or a peer, as production calls it; a
//! panic that reaches the target, an abort, a timeout or a runaway
//! allocation is a crash.

#![no_main]

mod targets;

use std::sync::{Mutex, OnceLock};

/// The target this process runs, chosen once.
static TARGET: OnceLock<fn(&[u8])> = OnceLock::new();

/// The place and message of the last panic, on any thread (printed when
/// one is not caught).
static LAST_PANIC: Mutex<String> = Mutex::new(String::new());

libfuzzer_sys::fuzz_target!(
    init: {
        if std::env::var_os("MLX_FUZZ_LIST").is_some() {
            for t in targets::TARGETS {
                println!("{}", t.name);
            }
            std::process::exit(0);
        }
        if let Some(dir) = std::env::var_os("MLX_FUZZ_SEEDS") {
            write_seeds(std::path::Path::new(&dir));
            std::process::exit(0);
        }
        // libfuzzer-sys's panic hook aborts on every panic, even one caught:
        // the readers catch the panics of crates that still panic on
        // malformed files (parquet/arrow, tokenizers) and return an error,
        // which is what they must do. This hook only keeps the panic's
        // place and message; one that is not caught reaches the closure
        // below, which prints it and aborts: still a crash.
        std::panic::set_hook(Box::new(|info| {
            *LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner()) = info.to_string();
        }));
        let name = std::env::var("MLX_FUZZ_TARGET").unwrap_or_default();
        match targets::TARGETS.iter().find(|t| t.name == name) {
            Some(t) => {
                let _ = TARGET.set(t.run);
            }
            None => {
                let names: Vec<&str> = targets::TARGETS.iter().map(|t| t.name).collect();
                eprintln!(
                    "mlx-fuzz: set MLX_FUZZ_TARGET to one of: {}",
                    names.join(", ")
                );
                std::process::exit(2);
            }
        }
    },
    |data: &[u8]| {
        if let Some(f) = TARGET.get()
            && std::panic::catch_unwind(|| f(data)).is_err()
        {
            let last = LAST_PANIC.lock().unwrap_or_else(|p| p.into_inner());
            eprintln!("mlx-fuzz: a panic reached the target: {last}");
            std::process::abort();
        }
    }
);

/// `MLX_FUZZ_SEEDS=<dir>`: writes every target's seeds to `<dir>/<target>/`
/// (named by their content's hash, as libFuzzer names what it adds), each
/// checked first by running it through its target.
fn write_seeds(dir: &std::path::Path) {
    for t in targets::TARGETS {
        let d = dir.join(t.name);
        std::fs::create_dir_all(&d).expect("creating the corpus folder");
        for seed in (t.seeds)() {
            (t.run)(&seed);
            let name = format!("seed-{:016x}", fnv1a(&seed));
            std::fs::write(d.join(name), &seed).expect("writing a seed");
        }
        println!("{}: seeds written to {}", t.name, d.display());
    }
}

/// FNV-1a: a stable name for a seed (the same bytes, the same file).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
