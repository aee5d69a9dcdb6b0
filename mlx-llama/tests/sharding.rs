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

/// With `--grad-accumulation 2` each micro-batch is evaluated before the
/// next one (ZeRO-3's gradients reduce-scattered per micro-batch, the
/// others averaged once per step): every mode still trains as replicated
/// accumulation does at world 2.
#[test]
fn accumulated_micro_batches_train_alike_in_every_mode() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |name: &str, shard: ShardMode| TrainConfig {
        grad_accumulation: 2,
        ..config(&dir.path().join(name), shard, 8)
    };
    let want = run(2, &cfg("none", ShardMode::None))[0].losses.clone();
    for shard in [ShardMode::Gradients, ShardMode::Parameters] {
        let name = format!("{shard:?}");
        let got = run(2, &cfg(&name, shard))[0].losses.clone();
        assert_losses_close(&format!("--shard {name}, 2 micro-batches"), &got, &want);
    }
}

/// Each rank's largest `peak` in the memory log `PATH.rank<R>.jsonl`.
fn peaks(log: &Path, world: usize) -> Vec<u64> {
    (0..world)
        .map(|r| {
            let path = log.with_file_name(format!(
                "{}.rank{r}.jsonl",
                log.file_name().unwrap().to_string_lossy()
            ));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            text.lines()
                .map(|l| {
                    serde_json::from_str::<serde_json::Value>(l).unwrap()["peak"]
                        .as_u64()
                        .unwrap()
                })
                .max()
                .expect("a step")
        })
        .collect()
}

/// Four processes (the byte counters are each process's own): a model
/// whose parameters, gradients and AdamW state outweigh its activations
/// (4 blocks of 128 dims, MLP 512, a vocabulary of 64, one sequence of 16
/// tokens per rank). Replicated, a rank holds them whole; ZeRO-3, a
/// quarter of them plus the blocks in flight, also while it validates
/// and writes a checkpoint.
#[test]
fn zero3_at_world_4_holds_a_quarter_of_the_state_plus_two_blocks_weights() {
    let dir = tempfile::tempdir().unwrap();
    let (tokenizer, _) = common::word_tokenizer(dir.path(), 64);
    let text = common::word_corpus(&dir.path().join("train.txt"), 200, 60);
    let (layers, dims, mlp) = (4usize, 128usize, 512usize);
    let peak = |shard: &str| {
        let out = dir.path().join(shard);
        let log = dir.path().join(format!("{shard}-memory"));
        let o = std::process::Command::new(common::launcher())
            .args(["-n", "4", "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .arg("train")
            .args(["--layers", &layers.to_string(), "--dims", &dims.to_string()])
            .args(["--mlp-dims", &mlp.to_string(), "--heads", "2"])
            .args(["--steps", "3", "--global-batch", "4", "--block-size", "16"])
            // A validation and a checkpoint after every step: neither may
            // gather the whole model either (steps 2 and 3 record the
            // peaks of those before them).
            .args([
                "--eval-every",
                "1",
                "--eval-batches",
                "1",
                "--checkpoint-every",
                "1",
                "--report-to",
                "none",
            ])
            .args(["--shard", shard])
            .arg("--tokenizer")
            .arg(&tokenizer)
            .arg("--data")
            .arg(format!("text:{}", text.display()))
            .arg("--memory-log")
            .arg(&log)
            .arg("--out")
            .arg(&out)
            .arg("--data-cache")
            .arg(common::data_cache())
            .env_remove("MLX_PROGRESS")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "--shard {shard}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        peaks(&log, 4)
    };
    let block = 4 * (4 * dims * dims + 3 * dims * mlp);
    // Parameters, gradients and AdamW's two moments, float32.
    let state = 4 * layers * block;
    let replicated = peak("none");
    let zero3 = peak("parameters");
    eprintln!(
        "block {block} B, state {state} B; peaks: replicated {replicated:?}, ZeRO-3 {zero3:?}"
    );
    for (r, &p) in replicated.iter().enumerate() {
        assert!(
            p as usize >= state,
            "replicated rank {r}: peak {p} B under the state's {state} B"
        );
    }
    // A quarter of the state and two blocks' weights gathered whole (the
    // one computing and the next), with a quarter block for the
    // activations, the embedding and the communication buffers.
    let bound = state / 4 + 2 * block + block / 4;
    for (r, &p) in zero3.iter().enumerate() {
        assert!(
            p as usize <= bound,
            "ZeRO-3 rank {r}: peak {p} B over {bound} B"
        );
    }
}

/// A ZeRO-3 run at world 4 resumes at world 1 replicated, and a world-1
/// run resumes as ZeRO-3 at world 4: each continues the losses of a
/// straight run (the same global batch: the same samples at any world).
#[test]
fn zero3_checkpoints_resume_replicated_at_world_1_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |name: &str, shard: ShardMode, steps: u64| TrainConfig {
        checkpoint_every: 4,
        ..config(&dir.path().join(name), shard, steps)
    };
    let straight = run(1, &cfg("straight", ShardMode::None, 8))[0]
        .losses
        .clone();
    for (name, first, then) in [
        ("there", (4, ShardMode::Parameters), (1, ShardMode::None)),
        ("back", (1, ShardMode::None), (4, ShardMode::Parameters)),
    ] {
        let head = run(first.0, &cfg(name, first.1, 4))[0].losses.clone();
        let tail = run(then.0, &cfg(name, then.1, 8))[0].losses.clone();
        assert_eq!(tail.len(), 4, "{name}: the resumed run trains steps 5 to 8");
        let both: Vec<f32> = head.into_iter().chain(tail).collect();
        assert_losses_close(
            &format!("{name}: world {} then world {}", first.0, then.0),
            &both,
            &straight,
        );
    }
}

/// bf16 with fully sharded parameters: the weights gathered and the
/// gradients reduce-scattered in bf16, float32 master shards.
#[test]
fn zero3_in_bf16_trains_as_replicated_bf16() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = |name: &str, shard: ShardMode| TrainConfig {
        dtype: mlx_llama::FloatDtype::Bf16,
        ..config(&dir.path().join(name), shard, 6)
    };
    let want = run(2, &cfg("none", ShardMode::None))[0].losses.clone();
    let got = run(2, &cfg("parameters", ShardMode::Parameters))[0]
        .losses
        .clone();
    assert_eq!(got.len(), want.len());
    for (a, b) in got.iter().zip(&want) {
        assert!(
            (a - b).abs() < 2e-2 * b.abs(),
            "bf16 ZeRO-3 loss {a} against {b}"
        );
    }
}

/// `--shard parameters` under `mlx-launch` over every transport of one
/// host: the TCP ring (large payloads through shared memory, and without
/// it), the ring over TLS and QUIC, and, built with feature `mpi`, Open
/// MPI under mpirun; each trains as replicated training over the plain
/// ring.
#[test]
fn zero3_trains_alike_over_every_transport() {
    let dir = tempfile::tempdir().unwrap();
    let launch = |name: &str, shard: &str, backend: &str, env: &[(&str, &str)]| {
        let out = dir.path().join(name);
        let mut c = std::process::Command::new(common::launcher());
        c.args(["-n", "2", "--backend", backend, "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .arg("train")
            // Each rank's collectives over MPI itself, not a ring beside it.
            .args(if backend == "mpi" {
                &["--backend", "mpi"][..]
            } else {
                &[]
            })
            .args(common::TINY_MODEL_ARGS)
            .args([
                "--global-batch",
                "4",
                "--block-size",
                "32",
                "--data",
                "offline",
            ])
            .args(["--eval-every", "0", "--steps", "4", "--lr", "3e-3"])
            .args(["--report-to", "jsonl", "--shard", shard])
            .arg("--out")
            .arg(&out)
            .arg("--data-cache")
            .arg(common::data_cache())
            .env_remove("MLX_PROGRESS")
            .stdin(std::process::Stdio::null());
        for (k, v) in env {
            c.env(k, v);
        }
        let o = c.output().unwrap();
        assert!(
            o.status.success(),
            "{name}: {}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        let losses: Vec<f32> = common::metric_column(&out.join("metrics.jsonl"), "loss")
            .into_iter()
            .map(|l| l as f32)
            .collect();
        assert_eq!(losses.len(), 4, "{name}: a loss a step");
        losses
    };
    let want = launch("replicated", "none", "ring", &[("MLX_DIST_SHM", "0")]);
    for (name, backend, env) in [
        ("ring", "ring", &[][..]),
        ("ring-tcp", "ring", &[("MLX_DIST_SHM", "0")][..]),
        ("tls", "tls", &[][..]),
        ("quic", "quic", &[][..]),
    ] {
        let got = launch(name, "parameters", backend, env);
        assert_losses_close(&format!("--shard parameters over {name}"), &got, &want);
    }
    if cfg!(feature = "mpi") {
        let got = launch("mpi", "parameters", "mpi", &[]);
        assert_losses_close("--shard parameters over MPI", &got, &want);
    }
}
