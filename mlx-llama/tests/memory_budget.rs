//! `--memory-budget`: the estimate of what a rank holds, part by part,
//! against independent counts and against the peaks real runs measure; a
//! run over its budget refused before it writes anything; the BYTES values
//! the flag reads.

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use clap::FromArgMatches;
use mlx_llama::grad_checkpoint::GradCheckpoint;
use mlx_llama::memory_budget::{Estimate, Plan, estimate};
use mlx_llama::{FloatDtype, Llama, LlamaConfig, ShardMode, TrainConfig, train};
use mlx_nn::ModuleExt;

mod common;

/// The tests here that train read the process's memory counters: one at a
/// time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

const MIB: f64 = (1 << 20) as f64;

/// `args` as `mlx-llama train` reads them.
fn parse(args: &[&str]) -> Result<TrainConfig, clap::Error> {
    let argv = std::iter::once("train").chain(args.iter().copied());
    let m = TrainConfig::command().try_get_matches_from(argv)?;
    TrainConfig::from_arg_matches(&m)
}

/// A model whose sizes do not all divide by 4 (norms of 26, an embedding of
/// 101 x 26), so that shards are padded.
fn odd_model() -> LlamaConfig {
    LlamaConfig {
        num_layers: 3,
        vocab_size: 101,
        dims: 26,
        mlp_dims: 50,
        num_heads: 1,
        ..LlamaConfig::default()
    }
}

fn plan_of(cfg: &TrainConfig, world: usize) -> (Llama, Estimate) {
    let model = Llama::new(&cfg.model, cfg.seed).unwrap();
    let e = estimate(&Plan::new(cfg, &model, world));
    (model, e)
}

/// Elements of rank 0's shard of every parameter at world `n`, as the
/// sharded optimizer cuts them.
fn shard_elements(model: &Llama, n: usize) -> u64 {
    model
        .parameters()
        .flatten()
        .iter()
        .map(|(_, p)| mlx_optim::shard_of(p, 0, n).unwrap().size() as u64)
        .sum()
}

#[test]
fn parameters_gradients_and_optimizer_state_match_an_independent_count() {
    let mut cfg = TrainConfig {
        model: odd_model(),
        ..TrainConfig::default()
    };
    let (model, _) = plan_of(&cfg, 1);
    let whole = model.num_parameters() as u64;
    let shard = shard_elements(&model, 4);
    // The sizes really do not divide: the shards are padded.
    assert!(shard * 4 > whole, "{shard} x 4 against {whole}");

    // Replicated at world 4, and every --shard mode at world 1 (the trainer
    // runs them replicated).
    let replicated = |e: &Estimate, what: &str| {
        assert_eq!(e.parameters, whole * 4, "{what}: parameters");
        assert_eq!(e.gradients, whole * 4, "{what}: gradients");
        assert_eq!(e.optimizer_state, 2 * whole * 4, "{what}: AdamW's m and v");
    };
    cfg.shard = ShardMode::None;
    replicated(&plan_of(&cfg, 4).1, "--shard none at world 4");
    for mode in [
        ShardMode::Optimizer,
        ShardMode::Gradients,
        ShardMode::Parameters,
    ] {
        cfg.shard = mode;
        replicated(&plan_of(&cfg, 1).1, &format!("--shard {mode:?} at world 1"));
    }

    // ZeRO-1 (and ZeRO-2, the same run): whole weights, sharded gradients
    // and state.
    for mode in [ShardMode::Optimizer, ShardMode::Gradients] {
        cfg.shard = mode;
        let e = plan_of(&cfg, 4).1;
        assert_eq!(e.parameters, whole * 4, "{mode:?}");
        assert_eq!(e.gradients, shard * 4, "{mode:?}");
        assert_eq!(e.optimizer_state, 2 * shard * 4, "{mode:?}");
    }
    // --no-shard-optimizer is --shard none.
    cfg.shard = ShardMode::Optimizer;
    cfg.shard_optimizer = false;
    replicated(&plan_of(&cfg, 4).1, "--no-shard-optimizer");
    cfg.shard_optimizer = true;

    // ZeRO-3: the shards, and the two largest units gathered whole.
    cfg.shard = ShardMode::Parameters;
    let e = plan_of(&cfg, 4).1;
    let mut units: std::collections::BTreeMap<String, u64> = Default::default();
    for (name, p) in model.parameters().flatten() {
        let parts: Vec<&str> = name.split('.').collect();
        let unit = if parts[0] == "layers" {
            parts[..2].join(".")
        } else {
            name.clone()
        };
        *units.entry(unit).or_default() += p.size() as u64;
    }
    let mut sizes: Vec<u64> = units.values().copied().collect();
    sizes.sort_unstable();
    let two = sizes[sizes.len() - 1] + sizes[sizes.len() - 2];
    // 3 blocks, the embedding, the final norm and the output projection.
    assert_eq!(units.len(), 6, "{units:?}");
    assert_eq!(e.parameters, shard * 4 + two * 4);
    assert_eq!(e.gradients, shard * 4);
    assert_eq!(e.optimizer_state, 2 * shard * 4);
    assert_eq!(e.communication, sizes[sizes.len() - 1] * 4);

    // bf16: float32 masters and their bf16 compute copies.
    cfg.shard = ShardMode::None;
    cfg.dtype = FloatDtype::Bf16;
    let e = plan_of(&cfg, 1).1;
    assert_eq!(e.parameters, whole * (4 + 2));
    assert_eq!(e.gradients, whole * 4);
    cfg.dtype = FloatDtype::F32;

    // Tensor parallelism over 2: the blocks' seven projections halved.
    cfg.tensor_parallel = 2;
    let e = plan_of(&cfg, 2).1;
    let c = &cfg.model;
    let projections = (c.num_layers * (4 * c.dims * c.dims + 3 * c.dims * c.mlp_dims)) as u64;
    assert_eq!(e.parameters, (whole - projections / 2) * 4);
    assert_eq!(e.optimizer_state, 2 * (whole - projections / 2) * 4);
    cfg.tensor_parallel = 1;

    // LoRA: the frozen base kept, only the adapters trained.
    let mut lora = Llama::new(&cfg.model, 0).unwrap();
    cfg.adapters = parse(&["--fine-tune", "lora", "--lora-rank", "4"])
        .unwrap()
        .adapters;
    lora.add_adapters(&cfg.adapters.spec(c.num_layers).unwrap(), 0)
        .unwrap();
    let trained = lora.trainable_parameters();
    let adapters: u64 = trained.leaves().iter().map(|a| a.size() as u64).sum();
    assert!(
        adapters > 0 && adapters < whole / 4,
        "{adapters} of {whole}"
    );
    let e = estimate(&Plan::new(&cfg, &lora, 1));
    assert_eq!(e.parameters, lora.num_parameters() as u64 * 4);
    assert_eq!(e.gradients, adapters * 4);
    assert_eq!(e.optimizer_state, 2 * adapters * 4);
}

/// A model whose activations matter: 8 blocks of 64, a vocabulary of 64.
fn activation_config(batch: usize, block: usize) -> TrainConfig {
    TrainConfig {
        model: LlamaConfig {
            vocab_size: 64,
            ..mlx_llama::testing::tiny_model(8, 64)
        },
        per_rank_batch: Some(batch),
        block_size: block,
        ..TrainConfig::default()
    }
}

fn activations(cfg: &TrainConfig) -> u64 {
    plan_of(cfg, 1).1.activations
}

#[test]
fn checkpointing_shrinks_activations_which_scale_with_batch_and_block_size() {
    let mut cfg = activation_config(2, 2048);
    let none = activations(&cfg);
    cfg.grad_checkpoint = GradCheckpoint::ALL;
    let all = activations(&cfg);
    cfg.grad_checkpoint = GradCheckpoint::every(2);
    let every_second = activations(&cfg);
    assert!(
        all * 4 < none,
        "every block checkpointed: {all} B against {none} B"
    );
    assert!(all < every_second && every_second < none);
    // The checkpointed blocks keep their inputs, [B, L, dims] in float32
    // each, and one block is recomputed at a time: against none, that saves
    // 7 blocks' activations but their inputs.
    let per_block = (none - all) / 7;
    let input = 2 * 2048 * 64 * 4;
    assert!(per_block > 10 * input, "a block keeps {per_block} B");

    // With a small vocabulary (the loss's rows in one block) every term is
    // proportional to the tokens: twice the batch or the block, twice the
    // activations, checkpointed or not.
    for policy in [GradCheckpoint::default(), GradCheckpoint::ALL] {
        let at = |batch, block| {
            let mut c = activation_config(batch, block);
            c.grad_checkpoint = policy;
            activations(&c)
        };
        assert_eq!(at(4, 256), 2 * at(2, 256), "batch, {policy}");
        assert_eq!(at(2, 512), 2 * at(2, 256), "block size, {policy}");
    }
    // One micro-batch of a step is held at a time: more of them cost the
    // running sums of the gradients (whole per rank), and until the first
    // sums exist the 17 norms' input gradients (8 blocks of 64 dims, 2 x
    // 256 tokens), not activations.
    let one = activation_config(2, 256);
    let mut four = one.clone();
    four.grad_accumulation = 4;
    assert_eq!(activations(&four), activations(&one));
    let gradients = |c: &TrainConfig| plan_of(c, 1).1.gradients;
    let views = 17 * 2 * 256 * 64 * 4;
    assert_eq!(gradients(&four), 2 * gradients(&one) + views);
    // An additive mask (packed examples) keeps the [B, H, L, L]
    // probabilities: quadratic in the block size.
    let masked = |block| {
        let c = activation_config(2, block);
        let model = Llama::new(&c.model, 0).unwrap();
        let plan = Plan {
            masked_attention: true,
            ..Plan::new(&c, &model, 1)
        };
        estimate(&plan).activations
    };
    // Past twice the tokens' share: each block's float32 probabilities
    // [B, H, L, L] (8 blocks, 2 sequences, 2 heads) and the mask [B, L, L].
    let quadratic = |l: u64| 8 * 4 * 2 * 2 * l * l + 4 * 2 * l * l;
    assert_eq!(
        masked(512) - 2 * masked(256),
        quadratic(512) - 2 * quadratic(256)
    );
    assert!(masked(256) > activations(&activation_config(2, 256)));
}

/// One step of 8 blocks of 32 on 8 sequences of 256 tokens, at world 1.
fn long_sequences(dir: &Path, out: &str) -> TrainConfig {
    let mut cfg = common::tiny(&dir.join(out), 1);
    common::word_data(dir, &mut cfg);
    cfg.model = mlx_llama::testing::tiny_model(8, 32);
    cfg.block_size = 256;
    cfg.global_batch = 8;
    cfg
}

/// The estimate of `cfg` at world 1 for its model with the words'
/// vocabulary.
fn estimate_words(cfg: &TrainConfig) -> Estimate {
    let model_cfg = LlamaConfig {
        vocab_size: 64,
        ..cfg.model.clone()
    };
    let model = Llama::new(&model_cfg, cfg.seed).unwrap();
    estimate(&Plan::new(cfg, &model, 1))
}

#[test]
fn the_estimate_bounds_the_peak_a_run_measures() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("none", GradCheckpoint::default(), FloatDtype::F32, 1),
        ("all", GradCheckpoint::ALL, FloatDtype::F32, 1),
        ("second", GradCheckpoint::every(2), FloatDtype::Bf16, 1),
        ("accumulated", GradCheckpoint::ALL, FloatDtype::F32, 2),
    ];
    for (name, policy, dtype, micro) in cases {
        let mut cfg = long_sequences(dir.path(), name);
        cfg.grad_checkpoint = policy;
        cfg.dtype = dtype;
        cfg.grad_accumulation = micro;
        // Given, the budget changes nothing: the run trains.
        cfg.memory_budget = Some(1 << 30);
        let measured = train(&cfg, &mlx_dist::Group::single()).unwrap().peak_mib;
        let e = estimate_words(&cfg);
        let (est, act) = (e.total() as f64 / MIB, e.activations as f64 / MIB);
        eprintln!(
            "{name}: measured {measured:.2} MiB, estimated {est:.2} MiB (activations {act:.2})"
        );
        assert!(act > est / 2.0, "{name}: activations should matter");
        assert!(
            measured <= est && est <= 2.0 * measured,
            "{name}: estimated {est:.2} MiB against a measured peak of {measured:.2} MiB"
        );
    }
}

#[test]
fn a_run_over_its_budget_is_refused_before_it_writes_anything() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = long_sequences(dir.path(), "refused");
    cfg.memory_budget = Some(4 << 20);
    let err = format!("{:#}", train(&cfg, &mlx_dist::Group::single()).unwrap_err());
    let e = estimate_words(&cfg);
    assert_eq!(e.largest().0.name(), "activations");
    let needs = format!(
        "this configuration needs about {:.1} MiB per rank, over the budget of 4.0 MiB; the largest part is activations ({:.1} MiB): try --grad-checkpoint",
        e.total() as f64 / MIB,
        e.activations as f64 / MIB
    );
    assert!(err.contains(&needs), "{err}");
    assert!(err.contains("a smaller --per-rank-batch"), "{err}");
    assert!(
        !cfg.out_dir.exists(),
        "the refused run wrote {}",
        cfg.out_dir.display()
    );
    // Checkpointing every block already, the advice no longer names it.
    cfg.grad_checkpoint = GradCheckpoint::ALL;
    let err = format!("{:#}", train(&cfg, &mlx_dist::Group::single()).unwrap_err());
    assert!(
        err.contains("the largest part is activations") && !err.contains("--grad-checkpoint"),
        "{err}"
    );
    assert!(!cfg.out_dir.exists());

    // A large vocabulary: the weights and their state are the largest
    // parts, and sharding is the advice (more ranks at world 1).
    let mut big = TrainConfig {
        model: LlamaConfig {
            vocab_size: 50257,
            ..LlamaConfig::default()
        },
        block_size: 64,
        global_batch: 4,
        ..TrainConfig::default()
    };
    let model = Llama::new(&big.model, 0).unwrap();
    let at = |cfg: &TrainConfig, world| {
        let plan = Plan::new(cfg, &model, world);
        estimate(&plan).check_plan(64 << 20, &plan).unwrap_err()
    };
    let one = at(&big, 1);
    assert!(
        one.contains("the largest part is optimizer state")
            && one.contains("more ranks with --shard optimizer"),
        "{one}"
    );
    big.shard = ShardMode::Optimizer;
    let four = at(&big, 4);
    assert!(
        four.contains("the largest part is parameters") && four.contains("try --shard parameters"),
        "{four}"
    );
    // Tensor parallel, the optimizer state is not sharded: more of it.
    big.tensor_parallel = 2;
    let split = at(&big, 2);
    assert!(
        split.contains("try a larger --tensor-parallel") && !split.contains("--shard"),
        "{split}"
    );
}

/// `--memory-log`'s largest `peak` of each of `world` ranks.
fn logged_peaks(log: &Path, world: usize) -> Vec<f64> {
    (0..world)
        .map(|r| {
            let path = PathBuf::from(format!("{}.rank{r}.jsonl", log.display()));
            common::metric_column(&path, "peak")
                .into_iter()
                .fold(0.0, f64::max)
                / MIB
        })
        .collect()
}

/// Four processes (each its own memory counters), each mode printing its
/// estimate: the measured peak of every rank is under it, and not far.
#[test]
fn at_world_4_every_shard_mode_peaks_under_its_estimate() {
    let dir = tempfile::tempdir().unwrap();
    let mut data = TrainConfig::default();
    common::word_data(dir.path(), &mut data);
    let mlx_llama::DataSource::Text { train: text, .. } = &data.data else {
        unreachable!()
    };
    let mlx_llama::TokenizerChoice::File(tokenizer) = &data.tokenizer else {
        unreachable!()
    };
    let mut estimates = Vec::new();
    for shard in ["none", "optimizer", "parameters"] {
        let out = dir.path().join(shard);
        let log = dir.path().join(format!("{shard}-memory"));
        let args: Vec<String> = [
            "--layers",
            "4",
            "--dims",
            "128",
            "--mlp-dims",
            "512",
            "--heads",
            "2",
            "--steps",
            "2",
            "--global-batch",
            "8",
            "--block-size",
            "64",
            // Validation after each step: ZeRO-3 gathers the whole model.
            "--eval-every",
            "1",
            "--eval-batches",
            "1",
            "--checkpoint-every",
            "0",
            "--report-to",
            "none",
            "--memory-budget",
            "1GiB",
            "--shard",
            shard,
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            "--tokenizer".into(),
            tokenizer.display().to_string(),
            "--data".into(),
            format!("text:{}", text.display()),
            "--memory-log".into(),
            log.display().to_string(),
            "--out".into(),
            out.display().to_string(),
            "--data-cache".into(),
            common::data_cache().display().to_string(),
        ])
        .collect();
        let o = std::process::Command::new(common::launcher())
            .args(["-n", "4", "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .arg("train")
            .args(&args)
            .env_remove("MLX_PROGRESS")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "--shard {shard}: {stdout}{}",
            String::from_utf8_lossy(&o.stderr)
        );
        // The same estimate as this process makes of the same options.
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let cfg = parse(&args).unwrap();
        let model = Llama::new(
            &LlamaConfig {
                vocab_size: 64,
                ..cfg.model.clone()
            },
            cfg.seed,
        )
        .unwrap();
        let e = estimate(&Plan::new(&cfg, &model, 4));
        // Rank 0 printed it, a line per part.
        for (part, bytes) in e.parts() {
            let line = format!("{:<22}{:>10.1} MiB", part.name(), bytes as f64 / MIB);
            assert!(stdout.contains(&line), "no `{line}` in:\n{stdout}");
        }
        assert!(stdout.contains("memory estimate per rank (4 data-parallel rank(s)"));
        let est = e.total() as f64 / MIB;
        let peaks = logged_peaks(&log, 4);
        eprintln!("--shard {shard}: estimated {est:.2} MiB, measured {peaks:.2?}");
        for (r, &p) in peaks.iter().enumerate() {
            assert!(
                p <= est && est <= 2.0 * p,
                "--shard {shard}, rank {r}: estimated {est:.2} MiB, measured {p:.2} MiB"
            );
        }
        estimates.push(est);
    }
    assert!(
        estimates[2] < estimates[1] && estimates[1] < estimates[0],
        "{estimates:?}"
    );
}

#[test]
fn the_budget_reads_bytes_with_units_or_says_what_it_expects() {
    let budget = |v: &str| parse(&[&format!("--memory-budget={v}")]).map(|c| c.memory_budget);
    assert_eq!(budget("1.5GiB").unwrap(), Some(1536 << 20));
    assert_eq!(budget("800MiB").unwrap(), Some(800 << 20));
    assert_eq!(budget("2GB").unwrap(), Some(2_000_000_000));
    assert_eq!(budget("123").unwrap(), Some(123));
    assert_eq!(parse(&[]).unwrap().memory_budget, None);
    for garbage in ["lots", "1.5.2GiB", "-3MiB", ""] {
        let e = budget(garbage).unwrap_err().to_string();
        assert!(
            e.contains("--memory-budget") && e.contains("like 1.5GiB, 800MiB, 2GB or 123"),
            "{garbage:?}: {e}"
        );
    }
    let e = budget("3 furlongs").unwrap_err().to_string();
    assert!(e.contains("unknown unit `furlongs`"), "{e}");
    let e = budget("0").unwrap_err().to_string();
    assert!(e.contains("holds nothing"), "{e}");
    // Not part of what a checkpoint must agree with to resume.
    let a = parse(&["--memory-budget", "1GiB"]).unwrap();
    assert_eq!(a.resume_key(), TrainConfig::default().resume_key());
}

/// Within its budget, a run keeps freed buffers for reuse only within what
/// the budget leaves over the estimate: the whole process, not only its
/// arrays, stays within the budget.
#[test]
fn the_budget_caps_the_buffer_cache_at_what_the_estimate_leaves() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let before = mlx_array::memory::set_cache_limit(usize::MAX);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = long_sequences(dir.path(), "capped");
    cfg.steps = 2;
    let spare = 1u64 << 20;
    cfg.memory_budget = Some(estimate_words(&cfg).total() + spare);
    let log = dir.path().join("memory");
    cfg.memory_log = Some(log.clone());
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let path = PathBuf::from(format!("{}.rank0.jsonl", log.display()));
    let cached = common::metric_column(&path, "cache");
    mlx_array::memory::set_cache_limit(before);
    assert_eq!(cached.len(), 2);
    for c in cached {
        assert!(
            c <= spare as f64,
            "{c} bytes cached, over the {spare} the budget leaves"
        );
    }
}
