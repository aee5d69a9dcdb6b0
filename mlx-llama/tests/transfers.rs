//! No host round trips in a GPU training step: after the first step (which
//! brings the optimizer's fresh zero moments over, one element each), a
//! step moves only what the user asked for between the host and the GPU:
//! the batch's tokens, targets and loss mask to the GPU, the loss and the
//! gradient norm of the progress line to the host, and the 0-d scalar
//! constants of a few ops (the loss scale times the mask, the clip's
//! threshold). Never a parameter, a gradient or a moment: the smallest
//! parameter here (a norm's 16 weights, 64 bytes) is larger than any of
//! those scalars, and the batch's arrays are counted exactly.
//!
//! In float32, bfloat16 and float16 (f32 master weights and moments; float16
//! also brings its gradients' overflow flag to the host each step, read
//! with the loss: the loss scale and its update stay on the GPU, so a
//! float16 step sends the GPU no more than a float32 one).
//! Alone in its test binary: the transfer counters are the process's.
//! Without an adapter it skips, except under `CI` or `MLX_REQUIRE_GPU`.

use mlx_llama::{FloatDtype, StepTransfers, TrainConfig, train};

mod common;

const BATCH: usize = 2;
const BLOCK: usize = 16;
const STEPS: u64 = 5;

#[test]
fn a_gpu_step_moves_no_parameter_between_host_and_device() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    // The dtype and the scalars each step brings to the host: the loss and
    // the gradient norm of the progress line, and with float16 the flag
    // saying whether the scaled gradients overflowed.
    let steady: Vec<StepTransfers> = [
        (FloatDtype::F32, 2),
        (FloatDtype::Bf16, 2),
        (FloatDtype::F16, 3),
    ]
    .into_iter()
    .map(|(dtype, to_host)| check(dtype, to_host))
    .collect();
    assert_eq!(
        steady[2].to_device, steady[0].to_device,
        "a float16 step uploads no scalar of its loss scale: {steady:?}"
    );
}

/// Trains the tiny model in `dtype` on the GPU and checks each step's
/// transfers; `to_host` scalars come back per step. Returns what a step
/// between the first and the last moves.
fn check(dtype: FloatDtype, to_host: u64) -> StepTransfers {
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        global_batch: BATCH,
        block_size: BLOCK,
        dtype,
        ..common::tiny_gpu(dir.path(), "gpu", STEPS)
    };
    let run = train(&cfg, &mlx_dist::Group::single()).unwrap();
    let steps = &run.transfers;
    assert_eq!(steps.len(), STEPS as usize);
    for (i, t) in steps.iter().enumerate() {
        eprintln!("{dtype:?} step {}: {t:?}", i + 1);
    }
    // The last step also writes the checkpoint: parameters and moments
    // come to the host then, as asked.
    let (w, _) =
        mlx_array::load_safetensors(run.checkpoint.unwrap().join("model.safetensors")).unwrap();
    let model_bytes: usize = w.values().map(|a| a.nbytes()).sum();
    let last = steps.last().unwrap();
    assert!(
        last.to_host_bytes as usize >= 3 * model_bytes,
        "{dtype:?}: the checkpoint brings the parameters and both moments to the host: {last:?}"
    );

    // Every step between: the batch and scalars only.
    let batch_bytes = (3 * BATCH * BLOCK * 4) as u64;
    let steady: Vec<StepTransfers> = steps[1..steps.len() - 1].to_vec();
    for (i, t) in steady.iter().enumerate() {
        let what = format!("{dtype:?} step {}: {t:?}", i + 2);
        assert_eq!(
            *t, steady[0],
            "{what}: every step after the first moves the same"
        );
        // The three batch arrays (int32 tokens and targets, a float32
        // mask), then only 0-d scalars of at most 4 bytes: one parameter
        // more (64 bytes at least) breaks the count.
        assert!(t.to_device >= 3, "{what}: the batch goes to the GPU");
        assert!(
            t.to_device_bytes - batch_bytes <= 4 * (t.to_device - 3),
            "{what}: besides the batch, only 0-d scalars go to the GPU"
        );
        assert!(
            t.to_device <= 3 + 12,
            "{what}: a handful of scalars, not one per parameter"
        );
        assert_eq!(
            (t.to_host, t.to_host_bytes),
            (to_host, 4 * to_host),
            "{what}: only {to_host} float32 scalars come back"
        );
    }
    steady[0]
}
