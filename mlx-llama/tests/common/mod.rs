//! What several of the trainer's test files share: the tiny model they
//! train and a checkpoint's weights.

// Each test file compiles this module on its own and uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::SystemTime;

use mlx_llama::TrainConfig;

/// The command line's tiny model (one layer of 32 dimensions, 2 heads, MLP
/// 64, blocks of 32 tokens), for the tests that run the real program: a
/// step takes a few tens of milliseconds.
pub const TINY_MODEL_ARGS: &[&str] = &[
    "--layers",
    "1",
    "--dims",
    "32",
    "--heads",
    "2",
    "--mlp-dims",
    "64",
    "--block-size",
    "32",
];

/// [`mlx_llama::testing::tiny`], its token store cached in the target folder.
pub fn tiny(out: &Path, steps: u64) -> TrainConfig {
    mlx_llama::testing::tiny(out, steps, data_cache())
}

/// One layer of 16 dimensions on blocks of 16 tokens, 2 sequences a step,
/// the gradient norm clipped to 1, on `device`: small enough for a software
/// rasteriser (lavapipe).
pub fn tiny_gpu(out: &Path, device: &str, steps: u64) -> TrainConfig {
    TrainConfig {
        model: mlx_llama::testing::tiny_model(1, 16),
        global_batch: 2,
        block_size: 16,
        grad_clip: Some(1.0),
        device: device.into(),
        ..tiny(out, steps)
    }
}

/// Where the tests' token stores are cached.
pub fn data_cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mlx-data-cache")
}

/// The f32 weights of the newest checkpoint under `out`, by name.
pub fn weights(out: &Path) -> Vec<(String, Vec<f32>)> {
    let dir = mlx_llama::checkpoint::latest(out)
        .unwrap()
        .expect("a checkpoint");
    let (w, _) = mlx_array::load_safetensors(dir.join("model.safetensors")).unwrap();
    w.into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect()
}

/// `mlx-launch`, beside `mlx-llama` in the target folder: built (`cargo
/// build -p mlx-dist --bin mlx-launch`, once per test process) when it is
/// missing or older than a source it is built from. `cargo test
/// --workspace` builds it with the rest.
pub fn launcher() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let llama = Path::new(env!("CARGO_BIN_EXE_mlx-llama"));
        let dir = llama.parent().expect("the binaries' folder");
        let p = dir.join("mlx-launch");
        let built = std::fs::metadata(&p).and_then(|m| m.modified()).ok();
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let sources = ["mlx-dist", "mlx-array", "mlx-progress", "Cargo.lock"];
        let newest = sources
            .iter()
            .filter_map(|s| newest_change(&root.join(s)))
            .max();
        if built.is_none() || newest > built {
            // The profile folder (debug, release) names the profile to build.
            let profile = dir.file_name().and_then(|n| n.to_str()).unwrap_or("debug");
            let profile = if profile == "debug" { "dev" } else { profile };
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let st = Command::new(cargo)
                .args(["build", "--quiet", "-p", "mlx-dist", "--bin", "mlx-launch"])
                .args(["--profile", profile])
                .current_dir(&root)
                .status()
                .expect("running cargo build for mlx-launch");
            assert!(
                st.success(),
                "cargo build -p mlx-dist --bin mlx-launch failed"
            );
        }
        assert!(p.exists(), "{} is missing after the build", p.display());
        p
    })
}

/// The newest modification time of `path` or of a file under it.
fn newest_change(path: &Path) -> Option<SystemTime> {
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_dir() {
        return meta.modified().ok();
    }
    std::fs::read_dir(path)
        .ok()?
        .flatten()
        .filter(|e| e.file_name() != "target")
        .filter_map(|e| newest_change(&e.path()))
        .max()
}
