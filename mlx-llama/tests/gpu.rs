//! The trainer on the GPU (`device = "gpu"`): the same losses as on the CPU.
//!
//! Without an adapter these tests skip with a printed reason, except when
//! `CI` or `MLX_REQUIRE_GPU` is set: there they fail (as the GPU conformance
//! suite of mlx-array does; CI installs Mesa's lavapipe).

use mlx_llama::{TrainConfig, train};

mod common;
use common::tiny_gpu as tiny;

#[test]
fn training_on_the_gpu_gives_the_cpu_losses() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cpu = train(
        &tiny(&dir.path().join("cpu"), "cpu", 4),
        &mlx_dist::Group::single(),
    )
    .unwrap();
    let gpu_dir = dir.path().join("gpu");
    let mut cfg = tiny(&gpu_dir, "gpu", 4);
    cfg.eval_every = 4;
    cfg.eval_batches = 1;
    let before = mlx_array::backend::gpu::dispatch_count();
    let gpu = train(&cfg, &mlx_dist::Group::single()).unwrap();
    assert!(
        mlx_array::backend::gpu::dispatch_count() > before + 100,
        "the model did not run on the GPU"
    );
    assert_eq!(cpu.losses.len(), 4);
    for (c, g) in cpu.losses.iter().zip(&gpu.losses) {
        assert!(
            (c - g).abs() <= 1e-4 * c.abs(),
            "cpu {:?} vs gpu {:?}",
            cpu.losses,
            gpu.losses
        );
    }
    // Validation ran on the GPU, and the checkpoint came back to the host.
    assert_eq!(gpu.eval_losses.len(), 1);
    assert!(gpu.eval_losses[0].1.is_finite());
    let ckpt = gpu.checkpoint.expect("a final checkpoint");
    let (w, _) = mlx_array::load_safetensors(ckpt.join("model.safetensors")).unwrap();
    assert!(!w.is_empty());
    // Resuming from a GPU checkpoint on the GPU continues the run.
    let mut more = tiny(&gpu_dir, "gpu", 5);
    more.eval_every = 4;
    more.eval_batches = 1;
    let resumed = train(&more, &mlx_dist::Group::single()).unwrap();
    assert_eq!(resumed.losses.len(), 1);
    assert!(resumed.losses[0].is_finite());
}

#[test]
fn two_ranks_on_the_gpu_match_one_rank_on_the_cpu() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    // The collectives run on the CPU; gradients cross to it and back.
    let dir = tempfile::tempdir().unwrap();
    let cpu = train(
        &tiny(&dir.path().join("cpu"), "cpu", 3),
        &mlx_dist::Group::single(),
    )
    .unwrap();
    let cfg = tiny(&dir.path().join("gpu2"), "gpu", 3);
    let two = mlx_dist::run_local(2, |g| train(&cfg, &g).unwrap()).unwrap();
    assert_eq!(two[0].losses, two[1].losses, "ranks disagree");
    for (c, g) in cpu.losses.iter().zip(&two[0].losses) {
        assert!(
            (c - g).abs() <= 1e-4 * c.abs(),
            "cpu {:?} vs two gpu ranks {:?}",
            cpu.losses,
            two[0].losses
        );
    }
}

/// Two query heads over one key/value head and a tied output projection,
/// on two GPU ranks (sharded AdamW state), in f32 and f16 (bf16 computes
/// in the same f32 kernels as f32 there): the losses of one rank on the
/// CPU.
#[test]
fn a_multi_query_model_with_tied_embeddings_trains_on_two_gpu_ranks_as_on_the_cpu() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (dtype, rel) in [
        (mlx_llama::FloatDtype::F32, 1e-4),
        (mlx_llama::FloatDtype::F16, 1e-3),
    ] {
        let cfg = |device: &str| {
            let mut cfg = tiny(&dir.path().join(format!("{dtype:?}-{device}")), device, 3);
            cfg.dtype = dtype;
            cfg.model.num_kv_heads = 1;
            cfg.model.tie_embeddings = true;
            cfg
        };
        let cpu = train(&cfg("cpu"), &mlx_dist::Group::single()).unwrap();
        let gpu = cfg("gpu");
        let two = mlx_dist::run_local(2, |g| train(&gpu, &g).unwrap()).unwrap();
        assert_eq!(two[0].losses, two[1].losses, "ranks disagree");
        for (c, g) in cpu.losses.iter().zip(&two[0].losses) {
            assert!(
                ((c - g) / c).abs() <= rel,
                "{dtype:?}: cpu {:?} vs two gpu ranks {:?}",
                cpu.losses,
                two[0].losses
            );
        }
    }
}

#[test]
fn an_unknown_device_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let err = train(&tiny(dir.path(), "tpu", 1), &mlx_dist::Group::single())
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown device `tpu`"), "{err}");
}

/// bfloat16 and float16 (stored natively where the adapter has
/// `shader-f16`) on the GPU: f32 master weights, and the losses of the same
/// run on the CPU in the same dtype, up to the two backends' different
/// transcendentals and summation orders, rounded to half precision
/// (measured on lavapipe: bf16 within 8.3e-5, f16 within 1.1e-5).
#[test]
fn half_precision_training_on_the_gpu_follows_the_cpu() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (dtype, name) in [
        (mlx_llama::FloatDtype::Bf16, "bf16"),
        (mlx_llama::FloatDtype::F16, "f16"),
    ] {
        let run = |device: &str| {
            let cfg = TrainConfig {
                dtype,
                ..tiny(&dir.path().join(format!("{name}-{device}")), device, 8)
            };
            train(&cfg, &mlx_dist::Group::single()).unwrap()
        };
        let (cpu, gpu) = (run("cpu"), run("gpu"));
        let worst = cpu
            .losses
            .iter()
            .zip(&gpu.losses)
            .map(|(c, g)| ((c - g) / c).abs())
            .fold(0f32, f32::max);
        eprintln!(
            "{name} (f16 native: {}): gpu losses within {worst:.2e} of the cpu's",
            mlx_array::backend::gpu::native_f16()
        );
        assert!(
            worst < 1e-3,
            "{name}: cpu {:?} vs gpu {:?}",
            cpu.losses,
            gpu.losses
        );
        assert_eq!(gpu.skipped_steps, 0, "{name}");
        let ckpt = gpu.checkpoint.expect("a final checkpoint");
        let (w, _) = mlx_array::load_safetensors(ckpt.join("model.safetensors")).unwrap();
        assert!(
            w.iter().all(|(_, a)| a.dtype() == mlx_array::Dtype::F32),
            "{name}: f32 master weights"
        );
    }
}

#[test]
fn overlapping_steps_on_the_gpu_changes_no_loss_record_or_checkpoint() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    // Validation after steps 3 and 6, checkpoints after 4 and 7: those are
    // finished at once, steps 1, 2 and 5 wait for the next step.
    let dir = tempfile::tempdir().unwrap();
    let cfg = mlx_llama::TrainConfig {
        eval_every: 3,
        eval_batches: 1,
        checkpoint_every: 4,
        ..tiny(dir.path(), "gpu", 7)
    };
    common::overlapping_steps_change_nothing(&cfg, 1e-4);
}

/// float16 on the GPU with a first loss scale that overflows (2^20): the
/// skip decisions, the scale's updates and the gated AdamW kernel run on
/// the device, and overlapped steps give the waited run's losses, loss
/// scales, skipped steps and checkpoints.
#[test]
fn overlapping_float16_steps_on_the_gpu_skip_as_waited_ones() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let cfg = mlx_llama::TrainConfig {
        dtype: mlx_llama::FloatDtype::F16,
        loss_scale: Some(2f64.powi(20)),
        // Every step's rate differs: a wrong step count shows.
        warmup: 3,
        eval_every: 3,
        eval_batches: 1,
        checkpoint_every: 4,
        ..tiny(dir.path(), "gpu", 6)
    };
    common::overlapping_steps_change_nothing(&cfg, 1e-4);
    let text = std::fs::read_to_string(dir.path().join("overlapped/metrics.jsonl")).unwrap();
    let scales: Vec<f64> = text
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["loss_scale"].as_f64().unwrap()
        })
        .collect();
    assert!(scales[5] < 2f64.powi(20), "some steps skipped: {scales:?}");
    assert!(
        scales.windows(2).any(|w| w[1] == w[0]),
        "some steps applied: {scales:?}"
    );
}

/// Fully sharded parameters on the GPU at world 2: the gathers and
/// reduce-scatters run on the host, the blocks on the GPU, and the losses
/// are replicated training's.
#[test]
fn fully_sharded_parameters_on_the_gpu_train_as_replicated() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, shard: mlx_llama::ShardMode| {
        let mut cfg = tiny(&dir.path().join(name), "gpu", 3);
        cfg.global_batch = 4;
        cfg.shard = shard;
        mlx_dist::run_local(2, |g| train(&cfg, &g).unwrap()).unwrap()[0]
            .losses
            .clone()
    };
    let want = run("replicated", mlx_llama::ShardMode::None);
    let got = run("zero3", mlx_llama::ShardMode::Parameters);
    assert_eq!(got.len(), 3);
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() <= 1e-4 * b.abs(),
            "ZeRO-3 {got:?} vs replicated {want:?}"
        );
    }
}
