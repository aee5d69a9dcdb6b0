//! The trainer on two and three ranks: sparse embedding gradients and
//! communication in bf16, with the optimizer state replicated and sharded.

use std::path::Path;

use super::*;
use crate::checkpoint;
use crate::config::CommunicationDtype;

fn tiny(out: &Path, steps: u64) -> TrainConfig {
    let cache = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp/mlx-data-cache");
    crate::testing::tiny(out, steps, cache)
}

/// The last checkpoint's weights, as bits.
fn weights(out: &Path) -> Vec<(String, Vec<u32>)> {
    let dir = checkpoint::latest(out).unwrap().expect("a checkpoint");
    let (w, _) = mlx_array::load_safetensors(dir.join("model.safetensors")).unwrap();
    w.into_iter()
        .map(|(n, a)| {
            let bits = a.to_vec::<f32>().unwrap().into_iter().map(f32::to_bits);
            (n, bits.collect())
        })
        .collect()
}

fn run(world: usize, cfg: &TrainConfig) -> Vec<Summary> {
    mlx_dist::run_local(world, |g| train(cfg, &g).unwrap()).unwrap()
}

#[test]
fn sparse_embedding_gradients_equal_the_dense_ones() {
    let dir = tempfile::tempdir().unwrap();
    for shard in [true, false] {
        // Two micro-batches: the rows are the union of their tokens.
        let cfg = |name: &str, sparse: bool| TrainConfig {
            shard_optimizer: shard,
            grad_accumulation: 2,
            sparse_embedding_gradients: sparse,
            ..tiny(&dir.path().join(format!("{name}-{shard}")), 3)
        };
        let sparse = run(2, &cfg("sparse", true));
        let dense = run(2, &cfg("dense", false));
        // At world 2 each element is one sum of two values either way.
        assert_eq!(sparse[0].losses, dense[0].losses);
        assert_eq!(
            weights(&dir.path().join(format!("sparse-{shard}"))),
            weights(&dir.path().join(format!("dense-{shard}")))
        );
    }
    // Three ranks add in another order than the ring: close, not equal.
    let cfg = |name: &str, sparse: bool| TrainConfig {
        global_batch: 3,
        sparse_embedding_gradients: sparse,
        ..tiny(&dir.path().join(name), 3)
    };
    let sparse = run(3, &cfg("sparse3", true));
    let dense = run(3, &cfg("dense3", false));
    for (a, b) in sparse[0].losses.iter().zip(&dense[0].losses) {
        assert!((a - b).abs() < 1e-4, "{a} vs {b}");
    }
}

#[test]
fn bf16_communication_trains_like_f32_and_steps_report_their_waits() {
    let dir = tempfile::tempdir().unwrap();
    for shard in [true, false] {
        let cfg = |name: &str, comm| TrainConfig {
            shard_optimizer: shard,
            communication_dtype: comm,
            ..tiny(&dir.path().join(format!("{name}-{shard}")), 4)
        };
        let f32s = run(2, &cfg("f32", None));
        let bf16 = run(2, &cfg("bf16", Some(CommunicationDtype::Bf16)));
        assert_ne!(f32s[0].losses, bf16[0].losses, "bf16 rounds the gradients");
        for (a, b) in f32s[0].losses.iter().zip(&bf16[0].losses) {
            assert!((a - b).abs() < 2e-2 * a.abs(), "{a} vs {b}");
        }
        for s in f32s.iter().chain(&bf16) {
            assert_eq!(s.step_ms.len(), 4);
            assert_eq!(s.comm_wait_ms.len(), 4);
            assert_eq!(s.median_comm_wait_ms.len(), 2);
            assert!(s.comm_ms.iter().all(|&c| c > 0.0), "{:?}", s.comm_ms);
            for (w, t) in s.comm_wait_ms.iter().zip(&s.step_ms) {
                assert!(*w >= 0.0 && w <= t, "waited {w} ms of a {t} ms step");
            }
        }
    }
}

/// float16 on two ranks, the optimizer state replicated and sharded: each
/// step's overflow flag is summed over the ranks on the device and gates
/// every rank's update, so every rank skips the same steps, both layouts
/// skip alike (their ranks compute the same gradients) and overlapping the
/// steps changes no loss or scale. A first scale of 2^22 overflows the
/// first few steps (at world 2 a rank's loss weighs its tokens twice, so
/// its scaled gradients are twice one rank's: it skips more steps).
#[test]
fn float16_on_two_ranks_skips_the_same_steps_on_every_rank() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |name: &str, shard: bool, overlap: bool| TrainConfig {
        dtype: crate::FloatDtype::F16,
        loss_scale: Some(2f64.powi(22)),
        shard_optimizer: shard,
        overlap_steps: overlap,
        ..tiny(&dir.path().join(name), 8)
    };
    let scale = |name: &str| {
        let last = checkpoint::latest(&dir.path().join(name)).unwrap().unwrap();
        std::fs::read_to_string(last.join("loss_scale.json")).unwrap()
    };
    let mut runs = vec![];
    for shard in [false, true] {
        for overlap in [true, false] {
            let name = format!("{shard}-{overlap}");
            runs.push((name.clone(), run(2, &cfg(&name, shard, overlap))));
        }
    }
    let (first, want) = &runs[0];
    let skipped = want[0].skipped_steps;
    assert!(
        (1..8).contains(&skipped),
        "some steps skipped, some applied: {skipped}"
    );
    // Each skip halved the scale once: 2^22 / 2^skipped, no growth in 8 steps.
    let settled: serde_json::Value = serde_json::from_str(&scale(first)).unwrap();
    assert_eq!(
        settled["scale"].as_f64(),
        Some(2f64.powi(22 - skipped as i32))
    );
    for (name, ranks) in &runs {
        for s in ranks {
            assert_eq!(s.skipped_steps, skipped, "{name}");
            assert_eq!(s.losses, want[0].losses, "{name}");
        }
        assert_eq!(scale(name), scale(first), "{name}");
    }
}
