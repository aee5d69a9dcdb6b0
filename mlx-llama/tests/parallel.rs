//! Model parallelism against one process: tensor- and pipeline-parallel
//! generation give the tokens of single-process greedy generation from the
//! same checkpoint, and a tensor-parallel step gives one process's loss and
//! gradients (each rank's slice of them).

mod common;

use mlx_array::{Array, Dtype, random};
use mlx_llama::pipeline::PipelineStage;
use mlx_llama::{Llama, LlamaConfig, train};
use mlx_nn::{ModuleExt, value_and_grad};

/// Four blocks of eight query heads grouped over four key/value heads,
/// each 8 wide (wider than dims / heads), and the output projection tied
/// to the embedding: splits over 2 and 4 ranks either way.
fn config() -> LlamaConfig {
    LlamaConfig {
        num_layers: 4,
        vocab_size: 0,
        dims: 32,
        mlp_dims: 64,
        num_heads: 8,
        num_kv_heads: 4,
        head_dim: 8,
        tie_embeddings: true,
        ..LlamaConfig::default()
    }
}

#[test]
fn tensor_and_pipeline_generation_give_the_tokens_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = common::tiny(dir.path(), 30);
    cfg.model = config();
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let load = || {
        mlx_llama::checkpoint::load_trained(dir.path())
            .unwrap()
            .model
    };
    let prompt = [464u32, 1110, 373, 257];
    let one = load().generate(&prompt, 24, 0.0, 0).unwrap();
    assert_eq!(one.len(), 24);
    for n in [2, 4] {
        let tensor = mlx_dist::run_local(n, |g| {
            let mut m = load();
            m.shard(&g).unwrap();
            assert_eq!(m.layers[0].attention.num_heads, 8 / n);
            assert_eq!(m.layers[0].attention.num_kv_heads, 4 / n);
            m.generate(&prompt, 24, 0.0, 0).unwrap()
        })
        .unwrap();
        // Each rank reading only its part of the checkpoint.
        let tensor_read = mlx_dist::run_local(n, |g| {
            let m = mlx_llama::checkpoint::load_trained_shard(dir.path(), &g).unwrap();
            m.model.generate(&prompt, 24, 0.0, 0).unwrap()
        })
        .unwrap();
        let pipeline = mlx_dist::run_local(n, |g| {
            let stage = PipelineStage::new(load(), &g).unwrap();
            assert_eq!(stage.blocks.len(), 4 / n);
            stage.generate(&prompt, 24, 0.0, 0).unwrap()
        })
        .unwrap();
        let pipeline_read = mlx_dist::run_local(n, |g| {
            let (stage, _) = PipelineStage::load(dir.path(), &g).unwrap();
            stage.generate(&prompt, 24, 0.0, 0).unwrap()
        })
        .unwrap();
        for r in 0..n {
            assert_eq!(tensor[r], one, "tensor parallel, world {n}, rank {r}");
            assert_eq!(
                tensor_read[r], one,
                "tensor parallel read in parts, world {n}, rank {r}"
            );
            assert_eq!(pipeline[r], one, "pipeline parallel, world {n}, rank {r}");
            assert_eq!(
                pipeline_read[r], one,
                "pipeline read in parts, world {n}, rank {r}"
            );
        }
    }
}

/// Which slice of a whole parameter's gradient a rank holds, by name.
fn slice_of(name: &str, whole: &Array, n: usize, r: usize) -> Array {
    let cut = |axis: i32| {
        let len = whole.shape()[axis as usize] / n;
        whole
            .slice_axis(axis, (r * len) as i64, ((r + 1) * len) as i64)
            .unwrap()
    };
    if ["query_proj", "key_proj", "value_proj", "linear1", "linear2"]
        .iter()
        .any(|p| name.contains(p))
    {
        cut(0)
    } else if name.contains("attention.out_proj") || name.contains("linear3") {
        cut(1)
    } else {
        whole.clone()
    }
}

#[test]
fn a_tensor_parallel_step_gives_the_loss_and_gradients_of_one_process() {
    let config = LlamaConfig {
        vocab_size: 64,
        ..config()
    };
    let k = random::split_keys(&random::key(3), 2).unwrap();
    let tokens = random::randint(&k[0], 0, 64, &[2, 12], Dtype::U32).unwrap();
    let targets = random::randint(&k[1], 0, 64, &[2, 12], Dtype::U32).unwrap();
    let weights = Array::full(&[2, 12], 1.0 / 24.0, Dtype::F32);
    let step = value_and_grad(|m: &Llama, (t, y, w): &(Array, Array, Array)| m.loss(t, y, w));
    let batch = (tokens, targets, weights);
    let (want_loss, want) = step(&mut Llama::new(&config, 0).unwrap(), &batch).unwrap();
    let want_loss = want_loss.item::<f32>().unwrap();
    let want = want.flatten();
    for n in [2, 4] {
        let got = mlx_dist::run_local(n, |g| {
            let mut m = Llama::new(&config, 0).unwrap();
            m.shard(&g).unwrap();
            let (loss, grads) = step(&mut m, &batch).unwrap();
            // Evaluated here, together: the backward pass's collectives
            // need every rank.
            mlx_array::eval((&loss, &grads)).unwrap();
            (loss.item::<f32>().unwrap(), grads.flatten())
        })
        .unwrap();
        for (r, (loss, grads)) in got.into_iter().enumerate() {
            assert!(
                (loss - want_loss).abs() <= 1e-5 * want_loss.abs(),
                "world {n}, rank {r}: loss {loss} vs {want_loss}"
            );
            assert_eq!(grads.len(), want.len());
            for ((name, g), (wname, w)) in grads.iter().zip(&want) {
                assert_eq!(name, wname);
                let w = slice_of(name, w, n, r);
                assert_eq!(g.shape(), w.shape(), "world {n}, rank {r}: {name}");
                let (g, w) = (g.to_vec::<f32>().unwrap(), w.to_vec::<f32>().unwrap());
                let scale = w.iter().fold(0f32, |m, v| m.max(v.abs()));
                for (i, (a, b)) in g.iter().zip(&w).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * scale + 1e-7,
                        "world {n}, rank {r}: {name}[{i}] {a} vs {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn sharding_refuses_what_does_not_split_and_unshard_restores_the_model() {
    let config = LlamaConfig {
        vocab_size: 64,
        num_kv_heads: 2,
        ..config()
    };
    let whole = Llama::new(&config, 0).unwrap();
    let want: Vec<(String, Vec<f32>)> = whole
        .named_parameters()
        .into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect();
    let got = mlx_dist::run_local(4, |g| {
        let mut m = Llama::new(&config, 0).unwrap();
        m.shard(&g).unwrap_err().to_string()
    })
    .unwrap();
    assert!(
        got[0].contains("8 heads, 2 key/value heads and an MLP of 64 do not split over 4 ranks"),
        "{}",
        got[0]
    );
    let back = mlx_dist::run_local(2, |g| {
        let mut m = Llama::new(&config, 0).unwrap();
        m.shard(&g).unwrap();
        assert!(m.is_sharded());
        assert!(m.num_parameters() < whole.num_parameters());
        let e = m.shard(&g).unwrap_err().to_string();
        assert!(e.contains("sharded already"), "{e}");
        m.unshard()
            .unwrap()
            .named_parameters()
            .into_iter()
            .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
            .collect::<Vec<_>>()
    })
    .unwrap();
    assert_eq!(back[0], want);
    assert_eq!(back[1], want);
}

#[test]
fn tensor_parallel_training_alone_and_mixed_with_data_parallel_trains_as_one_process() {
    let run = |world: usize, tensor: usize| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = common::tiny(dir.path(), 4);
        cfg.model = config();
        cfg.grad_clip = Some(0.5);
        cfg.tensor_parallel = tensor;
        let s = mlx_dist::run_local(world, |g| train(&cfg, &g).unwrap()).unwrap();
        (s[0].losses.clone(), common::weights(dir.path()), dir)
    };
    let (want, want_weights, _d1) = run(1, 1);
    for (world, tensor) in [(2, 2), (4, 2)] {
        let (losses, weights, _d) = run(world, tensor);
        let what = format!(
            "world {world} as {} replica(s) of {tensor} shards",
            world / tensor
        );
        assert_eq!(losses.len(), want.len(), "{what}");
        for (step, (a, b)) in losses.iter().zip(&want).enumerate() {
            assert!(
                (a - b).abs() <= 2e-4 * b.abs(),
                "{what}, step {}: loss {a} vs {b}",
                step + 1
            );
        }
        // The checkpoint holds the whole model, as one process's does.
        assert_eq!(weights.len(), want_weights.len(), "{what}");
        for ((n, a), (m, b)) in weights.iter().zip(&want_weights) {
            assert_eq!(n, m);
            let scale = b.iter().fold(0f32, |s, v| s.max(v.abs()));
            let worst = a.iter().zip(b).fold(0f32, |s, (x, y)| s.max((x - y).abs()));
            assert!(
                worst <= 1e-3 * scale,
                "{what}: {n} differs by {worst} (scale {scale})"
            );
        }
    }
    let e = mlx_dist::run_local(2, |g| {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = common::tiny(dir.path(), 1);
        cfg.tensor_parallel = 3;
        format!("{:#}", train(&cfg, &g).unwrap_err())
    })
    .unwrap();
    assert!(
        e[0].contains("--tensor-parallel 3: the 2 rank(s) do not split"),
        "{}",
        e[0]
    );
}

#[test]
fn a_tensor_parallel_run_resumes_at_another_split_as_one_process_trains() {
    let cfg = |dir: &std::path::Path, steps: u64, tensor: usize| {
        let mut cfg = common::tiny(dir, steps);
        cfg.model = config();
        cfg.tensor_parallel = tensor;
        cfg.checkpoint_every = 2;
        cfg
    };
    let one = tempfile::tempdir().unwrap();
    let want = train(&cfg(one.path(), 4, 1), &mlx_dist::Group::single())
        .unwrap()
        .losses;
    let split = tempfile::tempdir().unwrap();
    let first = cfg(split.path(), 2, 2);
    mlx_dist::run_local(4, |g| train(&first, &g).unwrap()).unwrap();
    // Two replicas of two shards wrote it; one model over four ranks goes on.
    let rest = cfg(split.path(), 4, 4);
    let s = mlx_dist::run_local(4, |g| train(&rest, &g).unwrap()).unwrap();
    assert_eq!(s[0].losses.len(), 2, "steps 3 and 4 only");
    for (i, (a, b)) in s[0].losses.iter().zip(&want[2..]).enumerate() {
        assert!(
            (a - b).abs() <= 2e-4 * b.abs(),
            "step {}: loss {a} vs {b}",
            i + 3
        );
    }
}
