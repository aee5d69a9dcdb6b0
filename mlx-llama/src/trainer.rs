//! The data-parallel training loop: the same program on 1 or N ranks.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use mlx_array::{Array, Device, Dtype, Tree, eval, memory};
use mlx_data::{
    BatchMode, BatchSize, DataConfig, DataLoader, LoaderConfig, LoaderState, Prefetcher,
    TokenStore, TokenizerSpec,
};
use mlx_dist::Group;
use mlx_nn::losses::{CrossEntropyOptions, Reduction};
use mlx_nn::{AverageOptions, ModuleExt, average_gradients, value_and_grad};
use mlx_optim::{AdamW, Optimizer, Schedule, Sharded, schedule};

use crate::checkpoint::{self, Manifest};
use crate::config::{Batching, DataSource, ScheduleKind, TokenizerChoice, TrainConfig};
use crate::metrics::{Reporter, StepMetrics};
use crate::{Llama, LlamaConfig};

/// What a finished run reports.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Summary {
    /// Training loss of every step run (the world's mean).
    pub losses: Vec<f32>,
    /// Validation losses `(step, loss)`.
    pub val_losses: Vec<(u64, f32)>,
    /// Median milliseconds per step (steps after the first).
    pub median_ms: f64,
    /// Milliseconds of every step run, in order.
    pub step_ms: Vec<f64>,
    /// Of every step, the milliseconds this rank sat blocked waiting for
    /// collectives (see [`mlx_array::eval::communication_times`]).
    pub comm_wait_ms: Vec<f64>,
    /// Of every step, the milliseconds this rank's communication thread
    /// spent in collectives, overlapped with computation or not.
    pub comm_ms: Vec<f64>,
    /// Median over the steps after the first of the time each rank waited
    /// for collectives, per rank (index: rank).
    pub median_comm_wait_ms: Vec<f64>,
    /// Tokens per second over the world at the median step time.
    pub tokens_per_s: f64,
    /// This rank's peak array memory, MiB.
    pub peak_mib: f64,
    /// Where the last checkpoint went.
    pub checkpoint: Option<PathBuf>,
    /// Which data source was used (`hub`, `local` or `offline`).
    pub source: String,
}

/// The data pipeline settings of a run (also used to find its tokenizer again).
pub fn data_config_for(cfg: &TrainConfig) -> DataConfig {
    use mlx_data::{LocalFormat, LocalSource, OfflineCorpus, SourceSpec};
    let mut d = DataConfig::default();
    if let Some(dir) = &cfg.data_cache {
        d.cache_dir = dir.clone();
    }
    d.source = match &cfg.data {
        DataSource::Auto => d.source.clone(),
        DataSource::Offline => SourceSpec::Offline(OfflineCorpus::default()),
        DataSource::Hub => match &d.source {
            SourceSpec::Auto { hub, .. } => SourceSpec::Hub(hub.clone()),
            s => s.clone(),
        },
        DataSource::Text { train, validation } => SourceSpec::Local(LocalSource {
            train: train.clone(),
            validation: validation.clone(),
            format: LocalFormat::Text {
                separator: "<|endoftext|>".into(),
            },
        }),
        DataSource::JsonLines { train, validation } => SourceSpec::Local(LocalSource {
            train: train.clone(),
            validation: validation.clone(),
            format: LocalFormat::JsonLines,
        }),
    };
    d.tokenizer = match &cfg.tokenizer {
        TokenizerChoice::Auto => TokenizerSpec::default(),
        TokenizerChoice::File(p) => TokenizerSpec::File(p.clone()),
        TokenizerChoice::Gpt2Files(dir) => TokenizerSpec::VocabMerges {
            vocab: dir.join("vocab.json"),
            merges: dir.join("merges.txt"),
        },
        TokenizerChoice::Train(n) => TokenizerSpec::TrainByteLevel { vocab_size: *n },
    };
    d
}

fn lr_schedule(cfg: &TrainConfig) -> Result<Schedule> {
    let lr = cfg.learning_rate;
    let main = match cfg.schedule {
        ScheduleKind::Constant => schedule::constant(lr),
        ScheduleKind::Cosine => {
            schedule::cosine_decay(lr, cfg.steps.saturating_sub(cfg.warmup).max(1), lr * 0.1)?
        }
    };
    if cfg.warmup == 0 {
        return Ok(main);
    }
    let warm = schedule::linear_schedule(0.0, lr, cfg.warmup)?;
    Ok(schedule::join_schedules(vec![warm, main], &[cfg.warmup])?)
}

fn loader(
    store: Arc<TokenStore>,
    cfg: &TrainConfig,
    group: &Group,
    batch: BatchSize,
) -> Result<DataLoader> {
    let lc = LoaderConfig {
        block_size: cfg.block_size,
        batch,
        mode: match cfg.batching {
            Batching::Pad => BatchMode::Pad,
            Batching::Pack => BatchMode::Pack,
        },
        seed: cfg.seed,
        rank: group.rank(),
        world: group.size(),
        release_pages: true,
    };
    Ok(DataLoader::new(store, lc)?)
}

/// The per-rank batch size, or a clear error.
fn per_rank(cfg: &TrainConfig, world: usize) -> Result<BatchSize> {
    if let Some(b) = cfg.per_rank_batch {
        return Ok(BatchSize::PerRank(b));
    }
    if cfg.global_batch == 0 || !cfg.global_batch.is_multiple_of(world) {
        bail!(
            "the global batch of {} sequences does not split evenly over {world} ranks (use a multiple of {world}, or --per-rank-batch)",
            cfg.global_batch
        );
    }
    Ok(BatchSize::Global(cfg.global_batch))
}

/// AdamW with its state whole on every rank, or sharded over the ranks.
enum Adam {
    /// Every rank averages whole gradients and keeps the whole state.
    Whole(AdamW),
    /// Each rank keeps the state of its shard of every parameter.
    Sharded(Sharded<AdamW>),
}

impl Adam {
    fn get(&self) -> &dyn Optimizer {
        match self {
            Adam::Whole(o) => o,
            Adam::Sharded(o) => o,
        }
    }

    fn get_mut(&mut self) -> &mut dyn Optimizer {
        match self {
            Adam::Whole(o) => o,
            Adam::Sharded(o) => o,
        }
    }

    /// The state file of `rank` in a checkpoint folder.
    fn file_name(&self, rank: usize) -> String {
        match self {
            Adam::Whole(_) => "optimizer.safetensors".into(),
            Adam::Sharded(_) => format!("optimizer_rank{rank}.safetensors"),
        }
    }
}

/// A micro-batch's inputs, targets and loss weights.
struct Micro {
    x: Array,
    y: Array,
    mask: Array,
    /// The input tokens (`x`), on the host: the rows of the embedding that
    /// get a gradient.
    tokens: Vec<u32>,
    /// The targets that count in the loss, counted on the host.
    targets: usize,
}

/// The batch's arrays, built once, and what the step needs of it on the host.
fn micro(b: &mlx_data::Batch) -> Result<Micro> {
    let a = b.to_arrays()?;
    Ok(Micro {
        x: a.inputs,
        y: a.targets,
        mask: a.loss_mask,
        tokens: (0..b.batch_size)
            .flat_map(|r| b.inputs(r).iter().copied())
            .collect(),
        targets: b.n_target_tokens(),
    })
}

/// The parameter whose gradient is zero outside the rows of the batch's
/// tokens (the token embedding; the output projection is not tied to it).
const EMBEDDING: &str = "embedding.weight";

/// This rank's gradients averaged over the world, or with a sharded
/// optimizer its shards of the average. With `sparse` (this rank's input
/// tokens and the tokens per rank, the same on every rank) the embedding's
/// gradient travels as the rows of those tokens only (see
/// [`mlx_nn::average_sparse_rows`]); its shard is then cut here as
/// [`Sharded`] cuts every parameter: flat, `ceil(N / W)` elements per rank,
/// zero padded. Gradients travel in `avg.communication_dtype` when one is
/// set, and come back in their own dtype.
fn average(
    own: Tree,
    sparse: Option<(&[u32], usize)>,
    opt: &Adam,
    group: &Group,
    avg: &AverageOptions,
) -> Result<Tree> {
    let (rest, embedding) = match sparse {
        Some(_) => {
            let mut rest = own.flatten();
            let at = rest
                .iter()
                .position(|(n, _)| n == EMBEDDING)
                .context("the model has no embedding gradient")?;
            let (_, e) = rest.remove(at);
            (Tree::unflatten(rest)?, Some(e))
        }
        None => (own, None),
    };
    let mut averaged = match opt {
        Adam::Whole(_) => average_gradients(&rest, group, avg)?,
        Adam::Sharded(o) => match avg.communication_dtype {
            Some(d) => {
                let cast = rest.map(|_, g| cast_float(g, d))?;
                let shards = o.shard_gradients(&cast).map_err(|e| anyhow!("{e}"))?;
                drop(cast);
                shards.zip_map(&rest, |_, s, g| cast_float(s, g.dtype()))?
            }
            None => o.shard_gradients(&rest).map_err(|e| anyhow!("{e}"))?,
        },
    }
    .flatten();
    drop(rest);
    if let (Some((tokens, capacity)), Some(e)) = (sparse, embedding) {
        let mean =
            mlx_nn::average_sparse_rows(&e, tokens, capacity, group, avg.communication_dtype)?;
        drop(e);
        let mean = match opt {
            Adam::Whole(_) => mean,
            Adam::Sharded(_) => {
                let (r, w) = (group.rank(), group.size());
                let n = mean.size();
                let len = n.div_ceil(w);
                let (lo, hi) = ((r * len).min(n), ((r + 1) * len).min(n));
                let mine = mean.reshape(&[-1])?.slice_axis(0, lo as i64, hi as i64)?;
                if hi - lo < len {
                    let zeros = Array::zeros(&[len - (hi - lo)], mean.dtype());
                    mlx_array::concatenate(&[mine, zeros], 0)?
                } else {
                    mine
                }
            }
        };
        averaged.push((EMBEDDING.to_string(), mean));
    }
    Ok(Tree::unflatten(averaged)?)
}

/// Sum of the masked per-token losses of a micro-batch.
fn loss_sum(model: &Llama, m: &Micro) -> mlx_array::Result<Array> {
    let opts = CrossEntropyOptions {
        reduction: Reduction::Sum,
        weights: Some(m.mask.clone()),
        ..Default::default()
    };
    model.loss(&m.x, &m.y, &opts)
}

/// Mean validation loss over every rank's shard (`eval_batches` batches each).
fn evaluate(model: &Llama, val: &mut DataLoader, batches: usize, group: &Group) -> Result<f32> {
    let mut sum = Array::zeros(&[], Dtype::F32);
    let mut count = Array::zeros(&[], Dtype::F32);
    for _ in 0..batches {
        let m = micro(&val.next_batch()?)?;
        sum = sum.add(&loss_sum(model, &m)?)?;
        count = count.add(&m.mask.sum_all()?)?;
        eval((&sum, &count))?;
    }
    let both = mlx_dist::all_sum(&mlx_array::stack(&[sum, count], 0)?, group)?.to_vec::<f32>()?;
    Ok(both[0] / both[1].max(1.0))
}

/// Trains on `group` as configured. Every rank calls this with the same
/// configuration; rank 0 reports and writes checkpoints.
///
/// With `device = "gpu"` the model, its gradients and the optimizer run on
/// the GPU (ops built by this thread are placed there; collectives stay on
/// the CPU and transfers are inserted where arrays cross); without a usable
/// adapter it fails at once with the reason.
pub fn train(cfg: &TrainConfig, group: &Group) -> Result<Summary> {
    let device: Device = cfg.device.parse().map_err(|e| anyhow!("{e}"))?;
    if device == Device::Gpu {
        mlx_array::device::gpu_available()
            .map_err(|e| anyhow!("--device gpu: no usable GPU adapter: {e}"))?;
    }
    mlx_array::device::with_device(device, || train_on(cfg, group))
}

fn train_on(cfg: &TrainConfig, group: &Group) -> Result<Summary> {
    if cfg.grad_accumulation == 0 || cfg.steps == 0 || cfg.block_size == 0 {
        bail!("steps, block size and gradient accumulation must all be at least 1");
    }
    let (rank, world) = (group.rank(), group.size());
    let batch = per_rank(cfg, world)?;
    // Sequences per optimizer step across the world.
    let sequences = match batch {
        BatchSize::Global(b) => b,
        BatchSize::PerRank(b) => b * world,
    } * cfg.grad_accumulation;
    let tokens = (sequences * cfg.block_size) as f64;
    let data = mlx_data::prepare(&data_config_for(cfg)).context("preparing the data")?;
    if rank == 0 {
        tracing::info!(
            rank,
            source = data.source_kind,
            vocab = data.tokenizer.vocab_size(),
            "data ready"
        );
    }
    let vocab = if cfg.model.vocab_size == 0 {
        data.tokenizer.vocab_size()
    } else {
        cfg.model.vocab_size.max(data.tokenizer.vocab_size())
    };
    let model_cfg = LlamaConfig {
        vocab_size: vocab,
        ..cfg.model.clone()
    };
    let mut model = Llama::new(&model_cfg, cfg.seed)?;
    // mlx-optim's fused Adam kernel is CPU-only; on the GPU the op-by-op
    // update (bit-identical to it) runs instead.
    let adamw = AdamW::new(lr_schedule(cfg)?)
        .weight_decay(cfg.weight_decay)
        .fused(mlx_array::default_device() == Device::Cpu);
    let mut opt = if cfg.shard_optimizer && world > 1 {
        Adam::Sharded(Sharded::new(adamw, group).bucket_bytes(cfg.all_reduce_size))
    } else {
        Adam::Whole(adamw)
    };
    let mut train_loader = loader(data.train.clone(), cfg, group, batch)?;
    let mut val_loader = loader(data.validation.clone(), cfg, group, batch)?;

    let resume_key = cfg.resume_key();
    let mut first_step = 0;
    if let Some(dir) = resume_from(cfg, group)? {
        let m = checkpoint::read_manifest(&dir, &resume_key, world)?;
        model
            .load_weights(dir.join("model.safetensors"))
            .with_context(|| format!("loading the model from {}", dir.display()))?;
        let state_file = dir.join(opt.file_name(rank));
        opt.get_mut()
            .load_state(&state_file, &model.trainable_parameters())
            .map_err(|e| anyhow!("loading the optimizer from {}: {e}", dir.display()))?;
        let state_path = dir.join(format!("loader_rank{rank}.json"));
        let state = LoaderState::from_json(
            &std::fs::read_to_string(&state_path)
                .with_context(|| format!("reading {}", state_path.display()))?,
        )?;
        train_loader.restore(&state)?;
        first_step = m.step;
        if rank == 0 {
            println!("resuming from {} at step {}", dir.display(), m.step);
        }
    }
    eval(model.parameters())?;
    if rank == 0 {
        println!(
            "training {} parameters on {world} rank(s): {} steps, {} sequences of {} tokens per step, {} data, vocabulary {vocab}",
            model.num_parameters(),
            cfg.steps,
            sequences,
            cfg.block_size,
            data.source_kind
        );
    }
    let mut batches = Prefetcher::spawn(train_loader, 4)?;
    let mut reporter = if rank == 0 {
        Some(Reporter::new(&cfg.out_dir, cfg.steps, first_step)?)
    } else {
        None
    };
    let avg = AverageOptions {
        all_reduce_size: cfg.all_reduce_size,
        communication_dtype: cfg.communication_dtype.map(|d| d.dtype()),
    };
    // The embedding's gradient travels as the rows of the batch's tokens.
    let sparse_embedding = cfg.sparse_embedding_gradients
        && world > 1
        && model.trainable_parameters().get_array(EMBEDDING).is_some();
    // The loss of a micro-batch is its masked token losses times `scale`,
    // summed; the fused loss computes its gradient in the same pass.
    let vg = value_and_grad(|m: &Llama, (micro, scale): &(Micro, f64)| {
        m.loss_for_training(&micro.x, &micro.y, &micro.mask.mul_scalar(*scale)?)
    });

    let mut summary = Summary {
        losses: vec![],
        val_losses: vec![],
        median_ms: 0.0,
        step_ms: vec![],
        comm_wait_ms: vec![],
        comm_ms: vec![],
        median_comm_wait_ms: vec![],
        tokens_per_s: 0.0,
        peak_mib: 0.0,
        checkpoint: None,
        source: data.source_kind.into(),
    };
    let mut times = vec![];
    let mut memory_log = match &cfg.memory_log {
        Some(p) => {
            let path = PathBuf::from(format!("{}.rank{rank}.jsonl", p.display()));
            Some(
                std::fs::File::create(&path)
                    .with_context(|| format!("creating {}", path.display()))?,
            )
        }
        None => None,
    };
    memory::reset_peak();
    for step in first_step..cfg.steps {
        let t0 = Instant::now();
        let comm0 = mlx_array::eval::communication_times();
        let micros: Vec<Micro> = (0..cfg.grad_accumulation)
            .map(|_| micro(&batches.next_batch()?))
            .collect::<Result<_>>()?;
        // Normalise by the tokens counted across the world, so that the
        // averaged gradient is the gradient of the global mean loss.
        let count = if cfg.batching == Batching::Pack {
            // Packed rows have no padding: every target of every rank counts,
            // so the world's count is known without asking the other ranks.
            tokens
        } else {
            // Counted on the host; one small message sums the world's
            // (exact: whole numbers far below f32's 2^24).
            let mut count = [micros.iter().map(|m| m.targets as f32).sum::<f32>()];
            group.all_sum(&mut count)?;
            count[0].max(1.0) as f64
        };
        let scale = world as f64 / count;
        let sparse_rows: Option<(Vec<u32>, usize)> = sparse_embedding.then(|| {
            let tokens: Vec<u32> = micros
                .iter()
                .flat_map(|m| m.tokens.iter().copied())
                .collect();
            let capacity = tokens.len();
            (tokens, capacity)
        });
        let mut loss = Array::zeros(&[], Dtype::F32);
        // Each stage of the gradients replaces the previous one, which is
        // dropped here so that the graph holds the only references to it:
        // the evaluator can then free every buffer once its last reader ran.
        let grads = {
            let mut grads: Option<Tree> = None;
            for m in micros {
                let (l, g) = vg(&mut model, &(m, scale))?;
                loss = loss.add(&l)?;
                grads = Some(match grads {
                    None => g,
                    Some(acc) => acc.zip_map(&g, |_, a, b| a.add(b))?,
                });
            }
            let own = grads.expect("at least one micro-batch");
            let sparse = sparse_rows.as_ref().map(|(t, c)| (t.as_slice(), *c));
            average(own, sparse, &opt, group, &avg)?
        };
        let (grads, norm) = match cfg.grad_clip {
            Some(max) => {
                let (g, n) = match &opt {
                    Adam::Sharded(o) => o.clip_grad_norm(&grads, max),
                    Adam::Whole(_) => mlx_optim::clip_grad_norm(&grads, max),
                }
                .map_err(|e| anyhow!("{e}"))?;
                drop(grads);
                (g, Some(n))
            }
            None => (grads, None),
        };
        let lr = opt.get().learning_rate();
        let params = model.trainable_parameters();
        let new = match &mut opt {
            Adam::Sharded(o) => o.apply_shards(&grads, &params),
            Adam::Whole(o) => o.apply_gradients(&grads, &params),
        }
        .map_err(|e| anyhow!("{e}"))?;
        drop((grads, params));
        model.update(&new)?;
        // New parameters last layer first: at world 1 the evaluator runs
        // each one's update as soon as the backward pass has produced its
        // gradient, so the activations a gradient needs and the gradient
        // itself are freed early instead of all being held until the
        // backward pass is done. With more ranks, each gradient's collective
        // starts as soon as the gradient exists and the backward pass goes
        // on while it travels; the updates that read the collectives run
        // after it (see `mlx_array::eval`).
        let mut updated = model.parameters().leaves();
        updated.reverse();
        eval((&loss, &updated, opt.get().state(), &norm))?;
        // The world's loss only after the step: summed in the middle of it,
        // it made each rank wait there for the slower one, on top of the
        // waits at the gradients' collectives; here the ranks have just met
        // at those, so it costs one small message.
        let world_loss = mlx_dist::all_sum(&loss, group)?.div_scalar(world as f64)?;
        let loss_value = world_loss.item::<f32>()?;
        if !loss_value.is_finite() {
            bail!("the loss became {loss_value} at step {}", step + 1);
        }
        let dt = t0.elapsed().as_secs_f64();
        let comm = mlx_array::eval::communication_times() - comm0;
        times.push(dt);
        summary.step_ms.push(dt * 1e3);
        summary.comm_wait_ms.push(comm.waited.as_secs_f64() * 1e3);
        summary.comm_ms.push(comm.busy.as_secs_f64() * 1e3);
        if let Some(f) = memory_log.as_mut() {
            use std::io::Write;
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default()
                .as_millis();
            writeln!(
                f,
                "{{\"unix_ms\":{now},\"rank\":{rank},\"step\":{},\"active\":{},\"peak\":{},\"cache\":{}}}",
                step + 1,
                memory::active(),
                memory::peak(),
                memory::cache()
            )?;
        }
        summary.losses.push(loss_value);
        let done = step + 1;
        let val_loss = if cfg.eval_every > 0 && (done % cfg.eval_every == 0 || done == cfg.steps) {
            let v = evaluate(&model, &mut val_loader, cfg.eval_batches, group)?;
            summary.val_losses.push((done, v));
            Some(v)
        } else {
            None
        };
        if let Some(r) = reporter.as_mut() {
            r.step(
                &StepMetrics {
                    step: done,
                    loss: loss_value,
                    learning_rate: lr,
                    tokens_per_s: tokens / dt,
                    ms_per_step: dt * 1e3,
                    comm_wait_ms: comm.waited.as_secs_f64() * 1e3,
                    comm_ms: comm.busy.as_secs_f64() * 1e3,
                    peak_mib: memory::peak() as f64 / (1 << 20) as f64,
                    active_mib: memory::active() as f64 / (1 << 20) as f64,
                    val_loss,
                    grad_norm: norm.as_ref().map(|n| n.item::<f32>()).transpose()?,
                },
                done % cfg.log_every.max(1) == 0,
            )?;
        }
        if (cfg.checkpoint_every > 0 && done % cfg.checkpoint_every == 0) || done == cfg.steps {
            summary.checkpoint = Some(save_checkpoint(
                cfg, &model, &opt, &batches, group, done, vocab,
            )?);
        }
    }
    if let Some(r) = &reporter {
        r.finish();
    }
    summary.median_ms = median_after_first(&times) * 1e3;
    summary.tokens_per_s = if summary.median_ms > 0.0 {
        tokens / (summary.median_ms / 1e3)
    } else {
        0.0
    };
    summary.peak_mib = memory::peak() as f64 / (1 << 20) as f64;
    // Every rank's median wait (the faster ranks wait for the slower ones).
    let waits = median_after_first(&summary.comm_wait_ms);
    summary.median_comm_wait_ms = if world > 1 {
        let mine = Array::from_slice(&[waits as f32], &[1])?;
        mlx_dist::all_gather(&mine, group)?
            .to_vec::<f32>()?
            .into_iter()
            .map(f64::from)
            .collect()
    } else {
        vec![waits]
    };
    Ok(summary)
}

/// The median of `xs` past the first (all of them when there is one).
fn median_after_first(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().skip(1).copied().collect();
    if v.is_empty() {
        v = xs.to_vec();
    }
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// `x` cast to the float dtype `to`; arrays of other dtypes as they are.
fn cast_float(x: &Array, to: Dtype) -> mlx_array::Result<Array> {
    if x.dtype().is_float() && x.dtype() != to {
        x.astype(to)
    } else {
        Ok(x.clone())
    }
}

/// The checkpoint to resume from: rank 0 picks the newest intact one
/// ([`checkpoint::latest_good`]) and tells the others its step.
fn resume_from(cfg: &TrainConfig, group: &Group) -> Result<Option<PathBuf>> {
    let found = match group.rank() {
        0 => checkpoint::latest_good(&cfg.out_dir),
        _ => Ok(None),
    };
    // The step chosen, 0 for none, -1 when rank 0 failed (every rank must
    // take part in the collective before any returns an error).
    let mut code = [match &found {
        Ok(Some(f)) => i64::try_from(f.manifest.step).unwrap_or(i64::MAX),
        Ok(None) => 0,
        Err(_) => -1,
    }];
    group.all_sum(&mut code)?;
    if let Some(f) = found? {
        return Ok(Some(f.dir));
    }
    match code[0] {
        0 => Ok(None),
        step if step > 0 => Ok(Some(checkpoint::step_dir(&cfg.out_dir, step as u64))),
        _ => bail!("rank 0 found no intact checkpoint to resume from (see its error)"),
    }
}

fn save_checkpoint(
    cfg: &TrainConfig,
    model: &Llama,
    opt: &Adam,
    batches: &Prefetcher,
    group: &Group,
    step: u64,
    vocab: usize,
) -> Result<PathBuf> {
    let out = &cfg.out_dir;
    let tmp = out.join("checkpoints").join(format!(".step_{step:08}.tmp"));
    if group.rank() == 0 {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    }
    group.barrier()?;
    // Each rank syncs the files it writes; once all are written (the
    // barriers), rank 0 hashes every one into the manifest and publishes.
    let state_path = tmp.join(format!("loader_rank{}.json", group.rank()));
    checkpoint::write_synced(&state_path, batches.state().to_json().as_bytes())?;
    group.barrier()?;
    let dir = checkpoint::step_dir(out, step);
    if let Adam::Sharded(o) = opt {
        // Every rank writes its own shard of the optimizer state.
        let path = tmp.join(opt.file_name(group.rank()));
        o.save_state(&path).map_err(|e| anyhow!("{e}"))?;
        checkpoint::sync_path(&path)?;
        group.barrier()?;
    }
    if group.rank() == 0 {
        let weights = tmp.join("model.safetensors");
        model.save_weights(&weights)?;
        checkpoint::sync_path(&weights)?;
        if let Adam::Whole(o) = opt {
            let path = tmp.join(opt.file_name(0));
            o.save_state(&path).map_err(|e| anyhow!("{e}"))?;
            checkpoint::sync_path(&path)?;
        }
        let manifest = Manifest {
            format: checkpoint::FORMAT,
            step,
            world: group.size(),
            resume_key: cfg.resume_key(),
            config: serde_json::to_value(cfg)?,
            vocab_size: vocab,
            files: checkpoint::file_entries(&tmp)?,
        };
        checkpoint::write_manifest(&tmp, &manifest)?;
        checkpoint::publish(out, &tmp, step)?;
        for old in checkpoint::prune(out, cfg.keep_checkpoints)? {
            tracing::info!(rank = 0, checkpoint = %old.display(), "deleted an old checkpoint");
        }
    }
    group.barrier()?;
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::LlamaConfig;
    use crate::config::CommunicationDtype;

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
            data_cache: Some(
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/tmp/mlx-data-cache"),
            ),
            ..TrainConfig::default()
        }
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
}
