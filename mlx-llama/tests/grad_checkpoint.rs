//! `--grad-checkpoint`: the same training, bit for bit on the CPU, with
//! blocks' activations recomputed in the backward pass, under every
//! parallel layout, precision and adapters; and less memory held.

use std::path::Path;
use std::sync::Mutex;

use mlx_llama::adapters::FineTune;
use mlx_llama::grad_checkpoint::GradCheckpoint;
use mlx_llama::{FloatDtype, Summary, TrainConfig, train};

mod common;

/// The tests here read the process's memory counters: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Four blocks, so that "every second block" differs from "every block".
fn config(out: &Path) -> TrainConfig {
    let mut cfg = common::tiny(out, 3);
    cfg.model = mlx_llama::testing::tiny_model(4, 32);
    cfg
}

fn run(world: usize, cfg: &TrainConfig) -> Vec<Summary> {
    mlx_dist::run_local(world, |g| train(cfg, &g).unwrap()).unwrap()
}

/// Every tensor of the newest checkpoint under `out`, as bits: the
/// weights (or an adapter run's adapters) and the optimizer state.
fn tensor_files(out: &Path) -> Vec<(String, Vec<u32>)> {
    let dir = mlx_llama::checkpoint::latest(out)
        .unwrap()
        .expect("a checkpoint");
    let mut tensors = Vec::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "safetensors") {
            continue;
        }
        let (loaded, _) = mlx_array::load_safetensors(&path).unwrap();
        let file = path.file_name().unwrap().to_string_lossy().into_owned();
        for (name, a) in loaded {
            let values = a
                .astype(mlx_array::Dtype::F32)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            tensors.push((
                format!("{file}:{name}"),
                values.into_iter().map(f32::to_bits).collect(),
            ));
        }
    }
    tensors.sort();
    assert!(!tensors.is_empty(), "no tensors in {}", dir.display());
    tensors
}

/// Losses and final weights of `cfg` with each policy equal the run
/// without checkpointing, bit for bit.
fn same_with_every_policy(what: &str, world: usize, cfg: impl Fn(&Path) -> TrainConfig) {
    let dir = tempfile::tempdir().unwrap();
    let bits = |out: &Path, policy: GradCheckpoint| {
        let mut c = cfg(out);
        c.grad_checkpoint = policy;
        let summaries = run(world, &c);
        let losses: Vec<u32> = summaries[0].losses.iter().map(|l| l.to_bits()).collect();
        (losses, tensor_files(out))
    };
    let (want_losses, want_weights) = bits(&dir.path().join("plain"), GradCheckpoint::default());
    assert_eq!(want_losses.len(), 3, "{what}");
    for policy in [GradCheckpoint::ALL, GradCheckpoint::every(2)] {
        let out = dir.path().join(policy.to_string());
        let (losses, weights) = bits(&out, policy);
        assert_eq!(
            losses, want_losses,
            "{what}, --grad-checkpoint {policy}: losses"
        );
        assert!(
            weights == want_weights,
            "{what}, --grad-checkpoint {policy}: the checkpoint's tensors differ"
        );
    }
}

#[test]
fn checkpointed_training_equals_plain_training_bit_for_bit() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    same_with_every_policy("world 1", 1, config);
    same_with_every_policy("world 2, optimizer sharded", 2, config);
    same_with_every_policy("world 2, replicated", 2, |out| TrainConfig {
        shard_optimizer: false,
        ..config(out)
    });
    same_with_every_policy("world 2, parameters sharded (ZeRO-3)", 2, |out| {
        TrainConfig {
            shard: mlx_llama::ShardMode::Parameters,
            ..config(out)
        }
    });
    same_with_every_policy("world 2, tensor parallel", 2, |out| TrainConfig {
        tensor_parallel: 2,
        ..config(out)
    });
    same_with_every_policy("bf16", 1, |out| TrainConfig {
        dtype: FloatDtype::Bf16,
        ..config(out)
    });
    same_with_every_policy("LoRA with dropout, two micro-batches", 2, |out| {
        let mut c = config(out);
        c.grad_accumulation = 2;
        c.adapters.fine_tune = FineTune::Lora;
        c.adapters.lora_dropout = 0.1;
        c.adapters.lora_layers = 0;
        c
    });
}

#[test]
fn checkpointing_every_block_holds_less_memory() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // Long sequences, many blocks and a small vocabulary: activations
    // outweigh the weights and their optimizer state.
    let peak = |policy: GradCheckpoint| {
        let mut cfg = config(&dir.path().join(policy.to_string()));
        common::word_data(dir.path(), &mut cfg);
        cfg.model = mlx_llama::testing::tiny_model(8, 32);
        cfg.block_size = 256;
        cfg.global_batch = 8;
        cfg.steps = 1;
        cfg.grad_checkpoint = policy;
        run(1, &cfg)[0].peak_mib
    };
    let plain = peak(GradCheckpoint::default());
    let every_block = peak(GradCheckpoint::ALL);
    let every_second = peak(GradCheckpoint::every(2));
    assert!(
        every_block < 0.6 * plain,
        "checkpointing every block: peak {every_block:.2} MiB against {plain:.2} MiB"
    );
    assert!(
        every_block < every_second && every_second < plain,
        "every block {every_block:.2} MiB, every second {every_second:.2}, none {plain:.2}"
    );
}

#[test]
fn the_policy_parses_as_the_flag_documents() {
    let parse = |args: &[&str]| {
        let mut argv = vec!["train"];
        argv.extend(args);
        let m = TrainConfig::command().try_get_matches_from(argv).unwrap();
        <TrainConfig as clap::FromArgMatches>::from_arg_matches(&m)
            .unwrap()
            .grad_checkpoint
    };
    assert_eq!(parse(&[]), GradCheckpoint::default());
    assert_eq!(parse(&["--grad-checkpoint"]), GradCheckpoint::ALL);
    assert_eq!(parse(&["--grad-checkpoint", "3"]), GradCheckpoint::every(3));
    assert_eq!(
        parse(&["--grad-checkpoint=none"]),
        GradCheckpoint::default()
    );
    let err = TrainConfig::command()
        .try_get_matches_from(["train", "--grad-checkpoint", "most"])
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`most` is not a checkpointing policy"),
        "{err}"
    );
}
