//! `--shard optimizer|gradients|parameters|none`: every mode trains the
//! same model, at several world sizes, and checkpoints resume across
//! modes and world sizes.

use std::path::Path;

use mlx_llama::{ShardMode, Summary, TrainConfig, train};

mod common;

fn config(out: &Path, shard: ShardMode, steps: u64) -> TrainConfig {
    let mut cfg = common::tiny(out, steps);
    cfg.model = mlx_llama::testing::tiny_model(3, 32);
    cfg.shard = shard;
    cfg.grad_clip = Some(1.0);
    cfg
}

fn run(world: usize, cfg: &TrainConfig) -> Vec<Summary> {
    mlx_dist::run_local(world, |g| train(cfg, &g).unwrap()).unwrap()
}

fn assert_losses_close(what: &str, got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len(), "{what}: steps");
    for (step, (a, b)) in got.iter().zip(want).enumerate() {
        assert!(
            (a - b).abs() <= 2e-5 * b.abs().max(1.0),
            "{what}: step {} loss {a} against {b}",
            step + 1
        );
    }
}

#[test]
fn every_mode_trains_as_replicated_training_at_worlds_2_and_4() {
    let dir = tempfile::tempdir().unwrap();
    for world in [2, 4] {
        let out = |name: &str| dir.path().join(format!("{name}-{world}"));
        let want = run(world, &config(&out("none"), ShardMode::None, 20));
        for shard in [
            ShardMode::Optimizer,
            ShardMode::Gradients,
            ShardMode::Parameters,
        ] {
            let name = format!("{shard:?}");
            let got = run(world, &config(&out(&name), shard, 20));
            assert_losses_close(
                &format!("--shard {name} at world {world}"),
                &got[0].losses,
                &want[0].losses,
            );
            let (got_w, want_w) = (common::weights(&out(&name)), common::weights(&out("none")));
            for ((n, a), (_, b)) in got_w.iter().zip(&want_w) {
                common::assert_close(&format!("{name} world {world} {n}"), a, b, 1e-3);
            }
        }
    }
}
