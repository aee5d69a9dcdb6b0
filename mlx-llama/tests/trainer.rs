//! The trainer on small configurations: data-parallel equivalence, learning,
//! exact resume, refusing bad checkpoints.

use std::path::{Path, PathBuf};

use mlx_llama::{Batching, DataSource, LlamaConfig, TrainConfig, train};

fn tiny(out: &Path, steps: u64) -> TrainConfig {
    TrainConfig {
        model: LlamaConfig {
            num_layers: 2,
            vocab_size: 0,
            dims: 32,
            mlp_dims: 64,
            num_heads: 2,
            ..LlamaConfig::default()
        },
        steps,
        global_batch: 4,
        block_size: 32,
        learning_rate: 3e-3,
        data: DataSource::Offline,
        batching: Batching::Pack,
        out_dir: out.to_path_buf(),
        data_cache: Some(PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mlx-data-cache")),
        ..TrainConfig::default()
    }
}

fn weights(out: &Path) -> Vec<(String, Vec<f32>)> {
    let dir = mlx_llama::checkpoint::latest(out)
        .unwrap()
        .expect("a checkpoint");
    let (w, _) = mlx_array::load_safetensors(dir.join("model.safetensors")).unwrap();
    w.into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect()
}

fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, va), (nb, vb))| {
            assert_eq!(na, nb);
            va.iter()
                .zip(vb)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

#[test]
fn two_ranks_with_a_global_batch_match_one_rank() {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("world1");
    let two = dir.path().join("world2");
    let s1 = train(&tiny(&one, 10), &mlx_dist::Group::single()).unwrap();
    let cfg2 = tiny(&two, 10);
    let s2 = mlx_dist::run_local(2, |g| train(&cfg2, &g).unwrap()).unwrap();
    assert_eq!(
        s2[0].losses, s2[1].losses,
        "ranks disagree on the world's loss"
    );
    for (a, b) in s1.losses.iter().zip(&s2[0].losses) {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs(),
            "world 1 {:?} vs world 2 {:?}",
            s1.losses,
            s2[0].losses
        );
    }
    // Sums over 2,044 rows at world 1 and 2 x 1,022 at world 2 round
    // differently; Adam's m/sqrt(v) magnifies that in near-zero gradients,
    // where one step moves a weight by up to lr = 3e-3.
    let d = max_diff(&weights(&one), &weights(&two));
    assert!(d < 1e-3, "parameters differ by {d} after 10 steps");
}

#[test]
fn the_loss_falls_on_the_built_in_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(dir.path(), 40);
    cfg.eval_every = 40;
    let s = train(&cfg, &mlx_dist::Group::single()).unwrap();
    let first: f32 = s.losses[..5].iter().sum::<f32>() / 5.0;
    let last: f32 = s.losses[35..].iter().sum::<f32>() / 5.0;
    assert!(last < first - 1.0, "loss went from {first} to {last}");
    let (_, val) = s.val_losses[0];
    assert!(
        val < first - 1.0,
        "validation loss {val} did not fall below {first}"
    );
}

#[test]
fn resuming_equals_an_uninterrupted_run_and_bad_checkpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let parts = dir.path().join("parts");
    let full = train(&tiny(&whole, 6), &mlx_dist::Group::single()).unwrap();
    let first = train(&tiny(&parts, 3), &mlx_dist::Group::single()).unwrap();
    let rest = train(&tiny(&parts, 6), &mlx_dist::Group::single()).unwrap();
    assert_eq!(first.losses, full.losses[..3]);
    assert_eq!(
        rest.losses,
        full.losses[3..],
        "the resumed loss curve differs"
    );
    assert_eq!(max_diff(&weights(&whole), &weights(&parts)), 0.0);

    // A different model is refused with the reason.
    let mut other = tiny(&parts, 8);
    other.model.num_layers = 3;
    let err = format!(
        "{:#}",
        train(&other, &mlx_dist::Group::single()).unwrap_err()
    );
    assert!(
        err.contains("different configuration") && err.contains("num_layers"),
        "{err}"
    );
    // A truncated weights file is refused, naming it.
    let latest = mlx_llama::checkpoint::latest(&parts).unwrap().unwrap();
    let w = latest.join("model.safetensors");
    let bytes = std::fs::read(&w).unwrap();
    std::fs::write(&w, &bytes[..bytes.len() / 2]).unwrap();
    let err = format!(
        "{:#}",
        train(&tiny(&parts, 8), &mlx_dist::Group::single()).unwrap_err()
    );
    assert!(err.contains("model.safetensors"), "{err}");
    // A garbled manifest too.
    std::fs::write(latest.join("manifest.json"), "{ not json").unwrap();
    let err = format!(
        "{:#}",
        train(&tiny(&parts, 8), &mlx_dist::Group::single()).unwrap_err()
    );
    assert!(err.contains("manifest"), "{err}");
}

#[test]
fn sharded_optimizer_state_matches_whole_state_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let run = |cfg: &TrainConfig| mlx_dist::run_local(2, |g| train(cfg, &g).unwrap()).unwrap();
    // Two ranks: each sum of two gradients has one order, so sharding the
    // state changes nothing, bit for bit.
    let sharded = dir.path().join("sharded");
    let whole = dir.path().join("whole");
    let s = run(&tiny(&sharded, 4));
    let w = run(&TrainConfig {
        shard_optimizer: false,
        ..tiny(&whole, 4)
    });
    assert_eq!(s[0].losses, w[0].losses);
    assert_eq!(max_diff(&weights(&sharded), &weights(&whole)), 0.0);
    let latest = mlx_llama::checkpoint::latest(&sharded).unwrap().unwrap();
    for r in 0..2 {
        assert!(
            latest
                .join(format!("optimizer_rank{r}.safetensors"))
                .exists()
        );
    }
    assert!(!latest.join("optimizer.safetensors").exists());

    // Resuming from the shards (with clipping by the global norm) continues
    // the uninterrupted run exactly.
    let clipped = |out: &Path, steps| TrainConfig {
        grad_clip: Some(0.5),
        ..tiny(out, steps)
    };
    let full_dir = dir.path().join("full");
    let parts = dir.path().join("parts");
    let full = run(&clipped(&full_dir, 6));
    let first = run(&clipped(&parts, 3));
    let rest = run(&clipped(&parts, 6));
    assert_eq!(first[0].losses, full[0].losses[..3]);
    assert_eq!(rest[0].losses, full[0].losses[3..]);
    assert_eq!(max_diff(&weights(&full_dir), &weights(&parts)), 0.0);

    // A checkpoint with sharded state does not resume with whole state.
    let err = mlx_dist::run_local(2, |g| {
        let cfg = TrainConfig {
            shard_optimizer: false,
            ..clipped(&parts, 8)
        };
        format!("{:#}", train(&cfg, &g).unwrap_err())
    })
    .unwrap();
    assert!(err[0].contains("shard_optimizer"), "{}", err[0]);
}

#[test]
fn a_global_batch_that_does_not_split_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(dir.path(), 1);
    cfg.global_batch = 3;
    let errs =
        mlx_dist::run_local(2, |g| train(&cfg, &g).map(|_| ()).unwrap_err().to_string()).unwrap();
    assert!(
        errs[0].contains("does not split evenly over 2 ranks"),
        "{}",
        errs[0]
    );
}
