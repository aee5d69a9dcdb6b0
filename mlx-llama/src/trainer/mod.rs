//! The data-parallel training loop: the same program on 1 or N ranks.
//!
//! A step reads like the seeds' loop: the loss and its gradients
//! (accumulated over micro-batches), their average over the ranks, the
//! update, the eval. How the gradients are averaged, where the optimizer
//! state lives and how the model is split is the business of the parallel
//! layout (the crate's `sync` module: replicated, sharded or tensor
//! parallel), chosen once per run.

mod batch;
mod checkpoints;
mod host;
mod loss;
mod precision;
mod record;
mod setup;
pub mod stop;
#[cfg(feature = "test-hooks")]
mod test_kill;
#[cfg(test)]
mod tests;

use std::time::Instant;

use anyhow::{Context, Result, anyhow, bail};
use mlx_array::{Array, Device, Tree, eval, memory};
use mlx_data::{BatchSize, DataLoader, Prefetcher};
use mlx_dist::Group;
use mlx_nn::ModuleExt;

use crate::Llama;
use crate::config::TrainConfig;
use crate::source::Resolved;
use crate::sync::{self, EMBEDDING, GradSync, SavedState, Weights};
use batch::StepBatch;
use precision::Precision;
use record::{Recorder, Stepped};

pub use record::{StepTransfers, Summary};
pub use setup::{data_config_for, lr_schedule, tokenizer_for};

/// Trains on `group` as configured. Every rank calls this with the same
/// configuration; rank 0 reports and writes checkpoints.
///
/// With `device = "gpu"` the model, its gradients and the optimizer run on
/// the GPU (ops built by this thread are placed there; collectives stay on
/// the CPU and transfers are inserted where arrays cross); without a usable
/// adapter it fails at once with the reason.
pub fn train(cfg: &TrainConfig, group: &Group) -> Result<Summary> {
    train_accepted(cfg, group, &mut || Ok(()))
}

/// Trains as [`train`], calling `accepted` on every rank once the run is
/// accepted (its data ready, its model built and within any
/// `--memory-budget`, its checkpoint, if any, resumed) and before the run
/// writes anything into its folder: `mlx-llama train` records the run's
/// options there, so that a refused start leaves the folder as it was.
pub fn train_accepted(
    cfg: &TrainConfig,
    group: &Group,
    accepted: &mut dyn FnMut() -> Result<()>,
) -> Result<Summary> {
    let device: Device = cfg.device.parse().map_err(|e| anyhow!("{e}"))?;
    if device == Device::Gpu {
        mlx_array::device::gpu_available()
            .map_err(|e| anyhow!("--device gpu: no usable GPU adapter: {e}"))?;
    }
    // Pretrained weights (a folder, a checkpoint, a Hub model made local)
    // set the model's shape and, unless one is named, the tokenizer:
    // recorded so in the checkpoints' manifest, for resume and generate.
    // A folder of adapters (PEFT's, mlx-lm's) starts from the base it
    // names, and its adapters train on.
    let adapters_from = cfg
        .init_from
        .as_ref()
        .filter(|s| crate::adapters::is_adapter_folder(s))
        .map(|s| std::path::PathBuf::from(s.as_str()));
    // The folder's tensors, read once with its spec.
    let mut adapter_tensors = None;
    let init = match &cfg.init_from {
        Some(source) => Some(
            crate::adapters::base_source(source)
                .and_then(|base| base.resolve(&mlx_data::HubConfig::from_env()))
                .with_context(|| format!("--init-from {source}"))?,
        ),
        None => None,
    };
    let from_source;
    let cfg = match &init {
        Some(init) => {
            let mut c = setup::from_source(cfg, init)
                .with_context(|| format!("--init-from {}", init.source))?;
            if let Some(dir) = &adapters_from {
                let (spec, tensors) = crate::adapters::load(dir, &c.model)
                    .with_context(|| format!("--init-from {}", dir.display()))?;
                c.adapters = c
                    .adapters
                    .for_spec(&spec, c.model.num_layers)
                    .map_err(|e| anyhow!("--init-from {}: {e}", dir.display()))?;
                adapter_tensors = Some(tensors);
            }
            from_source = c;
            &from_source
        }
        None => cfg,
    };
    mlx_array::device::with_device(device, || {
        train_on(cfg, init.as_ref(), adapter_tensors, group, accepted)
    })
}

/// Adapter tensors under our names, as [`crate::adapters::load`] reads them.
type AdapterTensors = Vec<(String, Array)>;

fn train_on(
    cfg: &TrainConfig,
    init: Option<&Resolved>,
    adapter_tensors: Option<AdapterTensors>,
    group: &Group,
    accepted: &mut dyn FnMut() -> Result<()>,
) -> Result<Summary> {
    if cfg.grad_accumulation == 0 || cfg.steps == 0 || cfg.block_size == 0 {
        bail!("steps, block size and gradient accumulation must all be at least 1");
    }
    let mut run = Run::start(cfg, init, adapter_tensors, group, accepted)?;
    if run.first_step >= cfg.steps {
        if group.rank() == 0 {
            crate::console::line(&format!(
                "the run in {} is finished: its checkpoint is at step {}, and --steps is {}; nothing to train (pass a larger --steps to train further)",
                cfg.out_dir.display(),
                run.first_step,
                cfg.steps
            ));
        }
        let mut summary = run.record.finish(run.tokens, group)?;
        summary.resumed_at = run.first_step;
        return Ok(summary);
    }
    let (mut stopped_at, mut stop_signal) = (None, None);
    for step in run.first_step..cfg.steps {
        match run.step(step) {
            Ok(None) => {}
            Ok(Some(signal)) => {
                stopped_at = Some(step + 1);
                stop_signal = Some(signal);
                break;
            }
            Err(e) => {
                // The step before the failed one still gets its records.
                if let Err(also) = run.finish_queued(None) {
                    tracing::warn!("the last good step's records were not written: {also:#}");
                }
                return Err(e);
            }
        }
    }
    let mut summary = run.record.finish(run.tokens, group)?;
    summary.skipped_steps = run.precision.skipped();
    summary.resumed_at = run.first_step;
    summary.stopped_at = stopped_at;
    summary.stop_signal = stop_signal;
    if group.rank() == 0 && cfg.report_to.csv {
        // The pictures are for people: a run that trained is not failed by them.
        match crate::curves::write(&cfg.out_dir) {
            Ok(w) => crate::console::line(&format!(
                "loss curve {}, metrics {}",
                w.png.display(),
                w.csv.display()
            )),
            Err(e) => eprintln!("warning: no loss curve: {e:#}"),
        }
    }
    Ok(summary)
}

/// A run between its steps.
struct Run<'a> {
    cfg: &'a TrainConfig,
    /// Every rank of the run.
    world: &'a Group,
    /// The data-parallel ranks: the world, or with tensor parallelism the
    /// ranks holding the same shard in every replica.
    group: Group,
    model: Llama,
    /// The parallel layout: how the gradients meet, the optimizer state is
    /// kept and the model is split.
    sync: Box<dyn GradSync>,
    batches: Prefetcher,
    val_loader: DataLoader,
    /// Steps done before this run (resumed from a checkpoint).
    first_step: u64,
    /// Tokens per optimizer step across the world.
    tokens: f64,
    /// Whether the embedding's gradient travels as the rows of the batch's tokens.
    sparse_embedding: bool,
    /// The compute dtype and, for float16, the loss scale.
    precision: Precision,
    record: Recorder,
    /// When the last checkpoint was written (or the run started), and how
    /// long it took: the periodic checkpoint's clock.
    last_checkpoint: (Instant, std::time::Duration),
    /// Whether this run has written a checkpoint yet.
    checkpointed: bool,
    /// The previous step, when its records wait for its loss to reach the
    /// host while this step is recorded (see [`Run::step`]).
    queued: Option<Queued>,
}

/// A step evaluated (its work queued on the device) whose loss and
/// gradient norm are on their way to the host.
struct Queued {
    /// The step's number, 1-based.
    done: u64,
    /// When the step began.
    started: Instant,
    /// The world's mean loss.
    loss: mlx_array::HostRead,
    grad_norm: Option<mlx_array::HostRead>,
    /// A float16 step's flag: 1 when its gradients were finite and its
    /// update applied, 0 when the device skipped it.
    finite: Option<mlx_array::HostRead>,
    /// The learning rate of an ungated step (a gated one's is known once
    /// the steps before it are settled).
    learning_rate: f64,
    comm: mlx_array::eval::CommunicationTimes,
    drawn: Vec<batch::Drawn>,
}

impl<'a> Run<'a> {
    /// Chooses the parallel layout, prepares the data, builds the model,
    /// resumes from the newest intact checkpoint, if any, and cuts the
    /// model as the layout trains it.
    fn start(
        cfg: &'a TrainConfig,
        init: Option<&Resolved>,
        adapter_tensors: Option<AdapterTensors>,
        world: &'a Group,
        accepted: &mut dyn FnMut() -> Result<()>,
    ) -> Result<Run<'a>> {
        let mut sync = sync::for_config(cfg, world, setup::adamw(cfg)?)?;
        let group = sync.group().clone();
        let (rank, replicas) = (world.rank(), group.size());
        let batch = setup::per_rank(cfg, replicas)?;
        // Sequences per optimizer step across the world.
        let sequences = match batch {
            BatchSize::Global(b) => b,
            BatchSize::PerRank(b) => b * replicas,
        } * cfg.grad_accumulation;
        let data = mlx_data::prepare(&data_config_for(cfg)).context("preparing the data")?;
        if rank == 0 {
            tracing::info!(
                rank,
                source = data.source_kind,
                vocab = data.tokenizer.vocab_size(),
                "data ready"
            );
        }
        let mut model = setup::model(cfg, init, data.tokenizer.vocab_size())?;
        model.grad_checkpoint = cfg.grad_checkpoint;
        setup::adapt(cfg, &mut model)?;
        if let Some(tensors) = adapter_tensors {
            // The adapters trained on from where they were (a checkpoint of
            // this run, if any, replaces them below).
            model.load_adapter_tensors(tensors)?;
        }
        // --memory-budget: the model's shape is known and nothing of it
        // computed yet (built lazily), nothing written to the run folder.
        let masked = cfg.batching == crate::Batching::Pack && data.train.is_examples();
        crate::memory_budget::check_run(cfg, &model, world.size(), masked, rank == 0)?;
        let mut train_loader = setup::loader(data.train.clone(), cfg, &group, batch)?;
        let val_loader = setup::loader(data.validation.clone(), cfg, &group, batch)?;
        let mut precision = Precision::for_config(cfg)?;
        // Resumed whole (a checkpoint holds the whole model), then cut.
        let first_step = checkpoints::resume(
            cfg,
            &group,
            &mut model,
            sync.saved_mut(),
            &mut train_loader,
            &mut precision,
        )?;
        accepted()?;
        let parameters = model.num_parameters();
        sync.scatter(&mut model)?;
        eval(sync.updated(&model))?;
        if rank == 0 {
            crate::console::line(&format!(
                "training {} parameters on {}: {} steps, {} sequences of {} tokens per step, {} data, vocabulary {}",
                parameters,
                sync.describe(),
                cfg.steps,
                sequences,
                cfg.block_size,
                data.source_kind,
                model.config.vocab_size
            ));
        }
        let epoch = (train_loader.batches_per_epoch(), cfg.grad_accumulation);
        let batches = Prefetcher::spawn(train_loader, 4)?;
        let record = Recorder::new(cfg, (rank, world.size()), first_step, data.source_kind)?
            .with_epoch_length(epoch.0, epoch.1);
        // Tied to the output projection, every row of the embedding has a
        // gradient: it travels whole.
        let sparse_embedding = cfg.sparse_embedding_gradients
            && replicas > 1
            && !model.config.tie_embeddings
            && sync.differentiated().is_none()
            && model.trainable_parameters().get_array(EMBEDDING).is_some();
        memory::reset_peak();
        Ok(Run {
            cfg,
            world,
            group,
            model,
            sync,
            batches,
            val_loader,
            first_step,
            tokens: (sequences * cfg.block_size) as f64,
            sparse_embedding,
            precision,
            record,
            last_checkpoint: (Instant::now(), std::time::Duration::ZERO),
            checkpointed: false,
            queued: None,
        })
    }

    /// Optimizer step `step` (0-based), as the seeds' loop: loss and
    /// gradients, average, update, eval; then the records, validation and
    /// checkpoint. Returns whether the ranks agreed to stop after it (a
    /// signal: see [`stop`]), its checkpoint written.
    ///
    /// The host does not wait for the device at the end of a step: its loss
    /// (and gradient norm) start their way to the host, and its records are
    /// written after the next step has been recorded, so that the GPU runs
    /// one step while the host builds and records the next (as MLX's
    /// `async_eval` loops do). A step after which anything reads the model
    /// (validation, a checkpoint, the end, a stop) is finished at once.
    /// `--no-overlap-steps` finishes every step at once.
    fn step(&mut self, step: u64) -> Result<Option<i32>> {
        let t0 = Instant::now();
        let host0 = host::HostTime::now();
        let comm0 = mlx_array::eval::communication_times();
        let batch = StepBatch::next(
            &mut self.batches,
            self.cfg,
            &self.group,
            self.tokens,
            self.sparse_embedding,
        )?;
        let drawn = batch.micros.iter().map(|m| m.drawn.clone()).collect();
        let loss_scale = self.precision.loss_scale().cloned();
        let dropout = self.dropout_key(step);
        let (loss, grads) = loss::loss_and_grads(
            &mut self.model,
            &*self.sync,
            batch.micros,
            batch.scale,
            loss_scale.as_ref(),
            self.precision.compute,
            dropout,
        )?;
        let grads = self.sync.reduce(grads, batch.sparse.as_ref())?;
        // The rate this step's update uses (read before it; a float16
        // step's is read when the steps before it are settled).
        let learning_rate = self.sync.optimizer().next_learning_rate();
        // With a loss scale, every rank of the world agrees on the device
        // whether to apply the step (the shards' gradients differ): the
        // update is gated by the flag, and the host reads it with the loss.
        let (grads, finite) = self.precision.check(grads, self.world)?;
        let (grads, grad_norm) = self.clip(grads)?;
        self.update(grads, finite.as_ref())?;
        self.eval_step(&loss, &grad_norm)?;
        let loss = match &loss_scale {
            Some(s) => loss.div(s)?,
            None => loss,
        };
        let queued = Queued {
            done: step + 1,
            started: t0,
            loss: self.world_loss(&loss)?.read_later()?,
            grad_norm: grad_norm.map(|n| n.read_later()).transpose()?,
            finite: finite.map(|f| f.read_later()).transpose()?,
            learning_rate,
            comm: mlx_array::eval::communication_times() - comm0,
            drawn,
        };
        // The previous step's loss has travelled while this one was recorded.
        self.finish_queued(Some(t0))?;
        let stop = match self.after_actions(step + 1)? {
            None => {
                self.queued = Some(queued);
                None
            }
            Some(verdict) => {
                // Timed once its loss is read: the device has finished it.
                // The validation after it is timed apart (`eval_ms`).
                let (done, stepped) = self.read(queued, None)?;
                let at = Instant::now();
                let eval = self
                    .validate(step + 1)?
                    .map(|loss| (loss, at.elapsed().as_secs_f64() * 1e3));
                self.write_records(done, &stepped, eval)?;
                self.after(step + 1, verdict)?
            }
        };
        let host = host::HostTime::now() - host0;
        self.record.transfers(host.transfers.into());
        if mlx_array::profile::enabled() && self.world.rank() == 0 {
            eprintln!("step={} {}", step + 1, host.describe(t0.elapsed()));
        }
        // The launcher sizes the time it gives the ranks to stop on Ctrl-C
        // or SIGTERM from the last step and checkpoint (`mlx-launch --grace`).
        mlx_dist::report::step_took(t0.elapsed());
        Ok(stop)
    }

    /// The key of step `step`'s adapter dropout on this rank, when the
    /// run's adapters have dropout: from the seed, the step and the rank,
    /// so a resumed run draws the same masks.
    fn dropout_key(&self, step: u64) -> Option<Array> {
        let on = self.cfg.adapters.lora_dropout > 0.0
            && self.cfg.adapters.fine_tune != crate::adapters::FineTune::Full;
        on.then(|| {
            let rank = self.world.rank() as u64;
            let mixed = self
                .cfg
                .seed
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add(step.wrapping_mul(0xBF58_476D_1CE4_E5B9))
                .wrapping_add(rank.wrapping_mul(0x94D0_49BB_1331_11EB));
            mlx_array::random::key(mixed)
        })
    }

    /// The averaged gradients clipped by their global norm, and that norm,
    /// when clipping is configured.
    fn clip(&self, grads: Tree) -> Result<(Tree, Option<Array>)> {
        Ok(match self.cfg.grad_clip {
            Some(max) => {
                let (g, n) = self.sync.clip(grads, max)?;
                (g, Some(n))
            }
            None => (grads, None),
        })
    }

    /// The optimizer's update of the model's parameters, applied where
    /// `gate` says so when given (lazy).
    fn update(&mut self, grads: Tree, gate: Option<&Array>) -> Result<()> {
        let new = self
            .sync
            .apply(grads, self.model.trainable_parameters(), gate)?;
        self.model.update(&new)?;
        Ok(())
    }

    /// Evaluates the step: its loss, the new parameters, the optimizer
    /// state (with a float16 step's flag), the loss scale and the gradient
    /// norm.
    fn eval_step(&self, loss: &Array, grad_norm: &Option<Array>) -> Result<()> {
        // New parameters last layer first: at world 1 the evaluator runs
        // each one's update as soon as the backward pass has produced its
        // gradient, so the activations a gradient needs and the gradient
        // itself are freed early instead of all being held until the
        // backward pass is done. With more ranks, each gradient's collective
        // starts as soon as the gradient exists and the backward pass goes
        // on while it travels; the updates that read the collectives run
        // after it (see `mlx_array::eval`).
        let updated = self.sync.updated(&self.model);
        eval((
            loss,
            &updated,
            self.sync.optimizer().state(),
            &self.precision,
            grad_norm,
        ))?;
        Ok(())
    }

    /// The world's mean of this rank's (evaluated) loss (lazy).
    fn world_loss(&self, loss: &Array) -> Result<Array> {
        // The world's loss only after the step: summed in the middle of it,
        // it made each rank wait there for the slower one, on top of the
        // waits at the gradients' collectives; here the ranks have just met
        // at those, so it costs one small message.
        Ok(mlx_dist::all_sum(loss, &self.group)?.div_scalar(self.group.size() as f64)?)
    }

    /// Writes the records of the step left queued, if any, whose time ran
    /// `until` the next step began (`None`: until its loss is read).
    fn finish_queued(&mut self, until: Option<Instant>) -> Result<()> {
        match self.queued.take() {
            Some(q) => {
                let (done, stepped) = self.read(q, until)?;
                self.write_records(done, &stepped, None)
            }
            None => Ok(()),
        }
    }

    /// Reads step `q`'s loss (waiting for the device if it is not there
    /// yet) and returns its number and figures, with its time from its
    /// start `until` the given moment (the next step's start for a step
    /// that overlapped it, so that the steps' times add up to the run's),
    /// or with `None` until its loss has been read (a step finished at
    /// once: timing it before the read measured only the host's recording,
    /// not the device's work); fails when the loss is not finite.
    fn read(&mut self, q: Queued, until: Option<Instant>) -> Result<(u64, Stepped)> {
        let loss = q.loss.item::<f32>()?;
        let mut grad_norm = q.grad_norm.map(|n| n.item::<f32>()).transpose()?;
        let until = until.unwrap_or_else(Instant::now);
        let mut learning_rate = q.learning_rate;
        if let Some(flag) = q.finite {
            let finite = flag.item::<f32>()? == 1.0;
            // The steps before this one are settled: the optimizer's step
            // count is the one this step's update was built for.
            learning_rate = self.sync.optimizer().next_learning_rate();
            self.sync.settle(finite)?;
            if !self.precision.settle(finite) {
                grad_norm = None;
                if self.world.rank() == 0 {
                    tracing::warn!(
                        step = q.done,
                        loss_scale = self.precision.scale_if_any(),
                        skipped = self.precision.skipped(),
                        "float16 gradients overflowed: the step is skipped and the loss scale halved"
                    );
                }
            }
        }
        if !loss.is_finite() {
            bail!("the loss became {loss} at step {}", q.done);
        }
        let stepped = Stepped {
            loss,
            learning_rate,
            seconds: (until - q.started).as_secs_f64(),
            comm: q.comm,
            grad_norm,
            drawn: q.drawn,
            loss_scale: self.precision.scale_if_any(),
        };
        Ok((q.done, stepped))
    }

    /// Writes the records of step `done`, with its validation loss and
    /// milliseconds if it had one; the line of every `--log-every`-th step,
    /// and of the last, reports the means since the line before.
    fn write_records(&mut self, done: u64, s: &Stepped, eval: Option<(f32, f64)>) -> Result<()> {
        self.record.step(done, s)?;
        if let Some((v, _)) = eval {
            self.record.eval_loss(done, v);
        }
        let log = done.is_multiple_of(self.cfg.log_every.max(1)) || done == self.cfg.steps;
        self.record.report(done, s, eval, self.tokens, log)
    }

    /// Writes the checkpoint after step `done`; returns its folder. It
    /// holds the whole model and optimizer state, whoever writes them (see
    /// [`GradSync::checkpoint`]).
    fn checkpoint(&self, done: u64) -> Result<std::path::PathBuf> {
        let (cfg, batches, precision) = (self.cfg, &self.batches, &self.precision);
        let mut write = |group: &Group, weights: &Weights, state: &dyn SavedState| {
            let parts = checkpoints::Parts {
                weights,
                state,
                batches,
                precision,
            };
            checkpoints::save(cfg, group, parts, done).map(drop)
        };
        self.sync.checkpoint(&self.model, &mut write)?;
        Ok(crate::checkpoint::step_dir(&cfg.out_dir, done))
    }

    /// Whether rank 0's clock calls for a periodic checkpoint: the
    /// configured interval has passed since the last one, and 50 times as
    /// long as that one took (so checkpoints cost under 2% of the run).
    /// The first comes sooner, `--first-checkpoint-s` into the run, so
    /// that a run killed in its first interval does not lose all its steps.
    fn checkpoint_due_by_time(&self) -> bool {
        let (at, took) = self.last_checkpoint;
        let mut every = std::time::Duration::from_secs(self.cfg.checkpoint_interval_s);
        if !self.checkpointed {
            every = every.min(std::time::Duration::from_secs(self.cfg.first_checkpoint_s));
        }
        self.cfg.checkpoint_interval_s > 0 && at.elapsed() >= every.max(took * 50)
    }

    /// What the world decides after step `done` (1-based): `None` when
    /// nothing reads the model before the next step, so the step's records
    /// can wait for its loss; otherwise the verdict, and the step is
    /// finished at once (validation, a checkpoint, the last step, a stop,
    /// a test's kill, or `--no-overlap-steps`).
    fn after_actions(&self, done: u64) -> Result<Option<stop::Verdict>> {
        let cfg = self.cfg;
        let verdict = stop::agree(self.world, self.checkpoint_due_by_time())?;
        let now = !cfg.overlap_steps
            || done == cfg.steps
            || self.validation_due(done)
            || (cfg.checkpoint_every > 0 && done.is_multiple_of(cfg.checkpoint_every))
            || verdict.checkpoint_due
            || verdict.stop.is_some();
        #[cfg(feature = "test-hooks")]
        let now = now || test_kill::asked(self.world.rank(), done)?;
        Ok(now.then_some(verdict))
    }

    /// Whether the validation loss is measured after step `done`.
    fn validation_due(&self, done: u64) -> bool {
        let cfg = self.cfg;
        cfg.eval_every > 0 && (done.is_multiple_of(cfg.eval_every) || done == cfg.steps)
    }

    /// The validation loss after step `done`, when due.
    fn validate(&mut self, done: u64) -> Result<Option<f32>> {
        if !self.validation_due(done) {
            return Ok(None);
        }
        let (sync, model) = (&self.sync, &self.model);
        let v = loss::evaluate(
            &|| sync.forward_model(model),
            &mut self.val_loader,
            self.cfg.eval_batches,
            &self.group,
            self.precision.compute,
        )?;
        Ok(Some(v))
    }

    /// After step `done` (1-based) is finished (its records written): a
    /// test's kill, and a checkpoint when due (every `checkpoint_every`
    /// steps, by time, at the end, or when the ranks agreed to stop);
    /// returns the signal that stopped them, if they did before the end.
    fn after(&mut self, done: u64, verdict: stop::Verdict) -> Result<Option<i32>> {
        let cfg = self.cfg;
        let last = done == cfg.steps;
        #[cfg(feature = "test-hooks")]
        test_kill::die_if_asked(self.world.rank(), done)?;
        let every = cfg.checkpoint_every > 0 && done.is_multiple_of(cfg.checkpoint_every);
        if every || last || verdict.checkpoint_due || verdict.stop.is_some() {
            let t = Instant::now();
            let dir = self.checkpoint(done)?;
            self.last_checkpoint = (Instant::now(), t.elapsed());
            mlx_dist::report::checkpoint_took(self.last_checkpoint.1);
            self.checkpointed = true;
            if self.world.rank() == 0 {
                tracing::info!(
                    step = done,
                    ms = t.elapsed().as_millis() as u64,
                    checkpoint = %dir.display(),
                    "checkpoint written"
                );
            }
            self.record.checkpoint(dir);
        }
        Ok(verdict.stop.filter(|_| !last))
    }
}
