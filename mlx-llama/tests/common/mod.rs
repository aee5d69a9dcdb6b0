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

/// The number `key` of every line of the metrics file `path` (JSON lines),
/// in order; panics where a line lacks it.
pub fn metric_column(path: &Path, key: &str) -> Vec<f64> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()[key]
                .as_f64()
                .unwrap_or_else(|| panic!("{}: no number {key} in {l}", path.display()))
        })
        .collect()
}

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

/// Trains `cfg` twice, overlapping each step with the next (the default)
/// and waiting at every step (`--no-overlap-steps`), and checks that both
/// give the same losses bit for bit, the same metrics rows in step order
/// (loss, gradient norm, validation loss, learning rate, loss scale), the
/// same skipped steps and the same checkpoints (with their loss scales). `cfg` should validate and checkpoint in the middle of the
/// run, so that steps finished at once and steps left queued alternate.
///
/// `rel` is the relative difference allowed between the two runs' values:
/// 0 on the CPU; on the GPU the embedding's gradient is summed with atomic
/// additions in whatever order the threads arrive (as PyTorch's
/// `index_add_` on CUDA), so two runs may differ in the last bits.
pub fn overlapping_steps_change_nothing(cfg: &TrainConfig, rel: f64) {
    let run = |overlap: bool, name: &str| {
        let out = cfg.out_dir.join(name);
        let c = TrainConfig {
            overlap_steps: overlap,
            out_dir: out.clone(),
            ..cfg.clone()
        };
        let summary = mlx_llama::train(&c, &mlx_dist::Group::single()).unwrap();
        let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let kept = [
            "step",
            "loss",
            "grad_norm",
            "eval_loss",
            "learning_rate",
            "loss_scale",
        ];
        let rows: Vec<Vec<serde_json::Value>> = rows
            .iter()
            .map(|r| kept.iter().map(|k| r[*k].clone()).collect())
            .collect();
        let mut checkpoints: Vec<_> = std::fs::read_dir(out.join("checkpoints"))
            .unwrap()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("step_"))
            .collect();
        checkpoints.sort();
        let scales: Vec<Option<String>> = checkpoints
            .iter()
            .map(|c| {
                let path = out.join("checkpoints").join(c).join("loss_scale.json");
                std::fs::read_to_string(path).ok()
            })
            .collect();
        (summary, rows, (checkpoints, scales), weights(&out))
    };
    let (overlapped, rows, checkpoints, w) = run(true, "overlapped");
    let (waited, rows_waited, checkpoints_waited, w_waited) = run(false, "waited");
    // Differences relative to the largest magnitude of the values compared.
    let close = |what: &str, a: &[f64], b: &[f64]| {
        assert_eq!(a.len(), b.len(), "{what}");
        let scale = a.iter().chain(b).fold(0f64, |m, x| m.max(x.abs()));
        for (x, y) in a.iter().zip(b) {
            assert!((x - y).abs() <= rel * scale, "{what}: {x} against {y}");
        }
    };
    let f64s = |l: &[f32]| l.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    close("losses", &f64s(&overlapped.losses), &f64s(&waited.losses));
    assert_eq!(overlapped.losses.len() as u64, cfg.steps);
    let (e, e_waited): (Vec<_>, Vec<_>) =
        (overlapped.eval_losses.clone(), waited.eval_losses.clone());
    assert_eq!(
        e.iter().map(|x| x.0).collect::<Vec<_>>(),
        e_waited.iter().map(|x| x.0).collect::<Vec<_>>()
    );
    close(
        "validation losses",
        &e.iter().map(|x| f64::from(x.1)).collect::<Vec<_>>(),
        &e_waited.iter().map(|x| f64::from(x.1)).collect::<Vec<_>>(),
    );
    assert_eq!(rows.len(), rows_waited.len());
    for (r, r_waited) in rows.iter().zip(&rows_waited) {
        // The same fields, present or absent alike, with the same values.
        let shape = |r: &[serde_json::Value]| r.iter().map(|v| v.is_null()).collect::<Vec<_>>();
        assert_eq!(shape(r), shape(r_waited), "{r:?} against {r_waited:?}");
        let nums =
            |r: &[serde_json::Value]| r.iter().filter_map(|v| v.as_f64()).collect::<Vec<_>>();
        close("a metrics row", &nums(r), &nums(r_waited));
    }
    let steps: Vec<u64> = rows.iter().map(|r| r[0].as_u64().unwrap()).collect();
    assert_eq!(
        steps,
        (1..=cfg.steps).collect::<Vec<_>>(),
        "rows in step order"
    );
    assert_eq!(checkpoints, checkpoints_waited);
    assert!(checkpoints.0.len() >= 2, "{checkpoints:?}");
    assert_eq!(w.len(), w_waited.len());
    for ((n, a), (n_waited, b)) in w.iter().zip(&w_waited) {
        assert_eq!(n, n_waited);
        close(n, &f64s(a), &f64s(b));
    }
    assert_eq!(overlapped.step_ms.len(), waited.step_ms.len());
    assert_eq!(overlapped.skipped_steps, waited.skipped_steps);
}

/// A word-level tokenizer of `vocab` tokens (`w0`, `w1`, ... and
/// `<|endoftext|>`, the last id, its end of text) written to
/// `dir/words.json`.
pub fn word_tokenizer(dir: &Path, vocab: usize) -> (PathBuf, mlx_data::TextTokenizer) {
    let words: serde_json::Map<String, serde_json::Value> = (0..vocab - 1)
        .map(|i| (format!("w{i}"), i.into()))
        .chain([("<|endoftext|>".to_string(), (vocab - 1).into())])
        .collect();
    let json = serde_json::json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{
            "id": vocab - 1, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true
        }],
        "normalizer": null,
        "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": null,
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": words, "unk_token": "<|endoftext|>"}
    });
    let path = dir.join("words.json");
    std::fs::write(&path, json.to_string()).unwrap();
    let t = mlx_data::TextTokenizer::from_file(&path).unwrap();
    assert_eq!((t.vocab_size(), t.eos_id()), (vocab, vocab as u32 - 1));
    (path, t)
}

/// Asserts `got` equals `want` within `rel` of `want`'s largest magnitude.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], rel: f32) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    let scale = want.iter().fold(0f32, |s, x| s.max(x.abs())).max(1e-12);
    let worst = got
        .iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(
        worst <= rel * scale,
        "{what}: largest difference {worst} against a largest value {scale}"
    );
}

/// `docs` documents of `words` words each, drawn from `w0` .. `w59` (tokens
/// of [`word_tokenizer`] with 64 tokens), separated by `<|endoftext|>`,
/// written to `path`.
pub fn word_corpus(path: &Path, docs: usize, words: usize) -> PathBuf {
    let text: Vec<String> = (0..docs)
        .map(|d| {
            let w: Vec<String> = (0..words)
                .map(|i| format!("w{}", (d * 31 + i * 7) % 60))
                .collect();
            w.join(" ")
        })
        .collect();
    std::fs::write(path, text.join(" <|endoftext|> ")).unwrap();
    path.to_path_buf()
}

/// `cfg` training on a corpus of 400 documents of 200 words in `dir` with
/// its word-level tokenizer of 64 tokens: a tiny vocabulary, so that
/// activations outweigh the weights.
pub fn word_data(dir: &Path, cfg: &mut TrainConfig) {
    let (tokenizer, _) = word_tokenizer(dir, 64);
    let text = word_corpus(&dir.join("train.txt"), 400, 200);
    cfg.tokenizer = mlx_llama::TokenizerChoice::File(tokenizer);
    cfg.data = mlx_llama::DataSource::Text {
        train: text,
        validation: None,
    };
}
