//! The parallel layout of a run: how the ranks' gradients meet, where the
//! optimizer state lives and how the model is split. One interface
//! ([`GradSync`]), chosen once per run by [`for_config`], three strategies:
//!
//! - [`Replicated`]: every rank averages whole gradients (`all_sum` per
//!   bucket) and keeps the whole optimizer state, as the seeds'
//!   `average_gradients` then `optimizer.update`;
//! - [`Sharded`]: ZeRO stage 1; each rank receives only its shard of the
//!   averaged gradients (`mean_scatter` per bucket), updates its shard of
//!   every parameter with its shard of the state, and the new parameters are
//!   gathered whole (`all_gather` per bucket);
//! - [`FullySharded`]: ZeRO stage 3 (FSDP); each rank keeps only its shard
//!   of every parameter too, gathering a unit's weights whole just before
//!   the forward and the backward pass read them;
//! - [`TensorParallel`]: the model split over the ranks of a replica, the
//!   replicas averaging their shards' gradients as [`Replicated`] does.
//!
//! The trainer calls the same methods in the same order whichever it is:
//! scatter the model once, then every step reduce, clip, apply; at
//! checkpoints the whole model and state the strategy hands it.

mod fully_sharded;
mod replicated;
mod sharded;
mod tensor;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_array::{Array, Dtype, Tree};
use mlx_dist::Group;
use mlx_optim::{AdamW, Optimizer};

use mlx_nn::ModuleExt;

use crate::{Llama, ShardMode, TrainConfig};

pub(crate) use fully_sharded::{FullySharded, unit_of};
pub(crate) use replicated::Replicated;
pub(crate) use sharded::Sharded;
pub(crate) use tensor::TensorParallel;

/// The parameter whose gradient is zero outside the rows of the batch's
/// tokens (the token embedding, unless the output projection is tied to it:
/// then every row has a gradient and it travels whole).
pub(crate) const EMBEDDING: &str = "embedding.weight";

/// The rows of the embedding's gradient that travel when only those the
/// step's tokens touch are sent (see [`mlx_nn::average_sparse_rows`]).
pub(crate) struct SparseRows {
    /// This rank's input tokens of the step, every micro-batch's.
    pub tokens: Vec<u32>,
    /// Tokens per rank and step, the same on every rank.
    pub capacity: usize,
}

/// What writes a checkpoint (the trainer's): given the data-parallel group
/// that writes it, the whole model's weights and the whole optimizer state
/// in the layout it is saved in.
pub(crate) type CheckpointWriter<'a> =
    dyn FnMut(&Group, &Weights, &dyn SavedState) -> Result<()> + 'a;

/// A checkpoint's weights: the model's own, or (parameters sharded) each
/// gathered from the ranks' shards only when the file reaches it, so that
/// no rank ever holds the whole model to write it.
pub(crate) struct Weights<'a> {
    /// The model (with its configuration; sharded, its parameters are
    /// placeholders of their shape).
    pub model: &'a Llama,
    /// Gathers one parameter by name (collectively: every rank of the
    /// group calls it, for the same names in the same order).
    gather: Option<&'a Gather<'a>>,
}

/// What gathers one parameter by name (see [`Weights::gathered`]).
pub(crate) type Gather<'a> = dyn Fn(&str) -> Result<Array> + 'a;

impl<'a> Weights<'a> {
    /// The weights `model` holds.
    pub(crate) fn of(model: &'a Llama) -> Self {
        Weights {
            model,
            gather: None,
        }
    }

    /// The parameters of `model` (placeholders of their shape and dtype),
    /// each made by `gather` when it is written.
    pub(crate) fn gathered(model: &'a Llama, gather: &'a Gather<'a>) -> Self {
        Weights {
            model,
            gather: Some(gather),
        }
    }

    /// Writes the weights to `path` as `save_weights` does (MLX's names
    /// and metadata), one parameter at a time. Gathered weights take every
    /// rank: the writer passes its path, the others `None`, and they make
    /// the same parameters in the same order without writing.
    pub(crate) fn save(&self, path: Option<&Path>) -> Result<()> {
        let named = self.model.named_parameters();
        let specs: Vec<mlx_array::io::TensorSpec> = named
            .iter()
            .map(|(n, a)| (n.clone(), a.shape().to_vec(), a.dtype()))
            .collect();
        let own: std::collections::HashMap<&str, &Array> =
            named.iter().map(|(n, a)| (n.as_str(), a)).collect();
        let metadata = [("format".to_string(), "mlx".to_string())].into();
        mlx_array::io::save_safetensors_streamed(path, &specs, Some(metadata), |name| {
            match self.gather {
                Some(g) => g(name).map_err(|e| mlx_array::Error::Invalid {
                    op: "gathering a parameter",
                    message: format!("`{name}`: {e:#}"),
                }),
                None => Ok(own[name].clone()),
            }
        })
        .with_context(|| match path {
            Some(p) => format!("writing {}", p.display()),
            None => "gathering the weights of a checkpoint".into(),
        })
    }

    /// Whether the other ranks must take part in [`Weights::save`].
    pub(crate) fn is_gathered(&self) -> bool {
        self.gather.is_some()
    }
}

/// A parallel layout: averages the ranks' gradients, clips them, applies
/// them with the optimizer, and puts the model and its state together for
/// checkpoints. Every method that communicates is collective: every rank
/// calls it, in the same order.
pub(crate) trait GradSync {
    /// The data-parallel ranks: those the data is split over and the
    /// gradients averaged over (the world, or with tensor parallelism the
    /// ranks holding the same shard in every replica).
    fn group(&self) -> &Group;

    /// How the world is laid out, for the start-up line ("2 rank(s)").
    fn describe(&self) -> String {
        format!("{} rank(s)", self.group().size())
    }

    /// The optimizer state as checkpoints hold it, to resume into; call it
    /// before [`GradSync::scatter`].
    fn saved_mut(&mut self) -> &mut dyn SavedState;

    /// Cuts the whole `model` and optimizer state (fresh, or as resumed
    /// from a checkpoint) into what this rank trains; called once, at the
    /// start. Only tensor parallelism cuts anything.
    fn scatter(&mut self, model: &mut Llama) -> Result<()> {
        let _ = model;
        Ok(())
    }

    /// The parameters the loss is differentiated by when they are not the
    /// model's own trainable ones (fully sharded: this rank's shards), to
    /// be put into the model by [`GradSync::bind`]. `None`: the model's.
    fn differentiated(&self) -> Option<&Tree> {
        None
    }

    /// Puts `trained` (the [`GradSync::differentiated`] parameters, traced,
    /// or cast) into `model` for a forward pass, the model computing in
    /// `compute` when given.
    fn bind(&self, model: &mut Llama, trained: &Tree, compute: Option<Dtype>) -> Result<()> {
        let _ = compute;
        model.update(trained)?;
        Ok(())
    }

    /// The model as a forward pass outside training reads it (validation):
    /// the model itself, or with its parameters gathered whole (lazy).
    fn forward_model(&self, model: &Llama) -> Result<Llama> {
        Ok(model.clone())
    }

    /// What a step updates, to evaluate, the last layer's first (see the
    /// trainer's `eval_step`): the model's parameters, or this rank's
    /// shards of them.
    fn updated(&self, model: &Llama) -> Vec<Array> {
        let mut updated = model.parameters().leaves();
        updated.reverse();
        updated
    }

    /// This rank's own gradients averaged over the world, in the form
    /// [`GradSync::clip`] and [`GradSync::apply`] take (whole, or this
    /// rank's shards). With `sparse` the embedding's gradient travels as
    /// those rows only. Gradients travel in the configured communication
    /// dtype, if any, and come back in their own. Lazy.
    fn reduce(&self, own: Tree, sparse: Option<&SparseRows>) -> Result<Tree>;

    /// `grads` (from [`GradSync::reduce`]) clipped to the global norm
    /// `max_norm` of the whole model's averaged gradients, and that norm.
    /// Lazy.
    fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)>;

    /// One optimizer step: the new parameters of `params` (the model as
    /// this rank trains it) from `grads` (from [`GradSync::reduce`] or
    /// [`GradSync::clip`]). With `gate` (a 0-d float32, 1 or 0, the same
    /// on every rank) the device applies the step only where it is 1
    /// (see [`mlx_optim::Gate`]); [`GradSync::settle`] it later. Lazy.
    fn apply(&mut self, grads: Tree, params: Tree, gate: Option<&Array>) -> Result<Tree>;

    /// Tells the optimizer whether its oldest gated step was applied (its
    /// gate read on the host), so that its step count follows.
    fn settle(&mut self, applied: bool) -> Result<()>;

    /// The optimizer: its learning rate and state.
    fn optimizer(&self) -> &dyn Optimizer;

    /// Hands `write` what a checkpoint of `model` (as this rank trains it)
    /// holds: the whole model and optimizer state, and the group that
    /// writes them. Collective over the world; ranks that write nothing
    /// (the other shards of a tensor-parallel replica) only take part in
    /// putting the model together.
    fn checkpoint(&self, model: &Llama, write: &mut CheckpointWriter) -> Result<()>;
}

/// The optimizer state as a checkpoint holds it: saved into its folder and
/// loaded back, also when another layout saved it.
pub(crate) trait SavedState {
    /// Writes the optimizer state into the checkpoint folder `dir`,
    /// flushed to disk: this rank's part of it, if any.
    fn save(&self, dir: &Path) -> Result<()>;

    /// Reads this rank's optimizer state from the checkpoint folder `dir`,
    /// checked against `params` (the parameters being trained).
    fn load(&mut self, dir: &Path, params: &Tree) -> Result<()>;

    /// The files [`SavedState::save`] writes over the world, in rank order.
    fn state_files(&self) -> Vec<String>;

    /// Reads an optimizer state another layout saved, `files` in its rank
    /// order (one whole state, or the shards of some number of ranks), and
    /// keeps what this strategy keeps of it on this rank.
    fn load_resharded(&mut self, files: &[PathBuf], params: &Tree) -> Result<()>;
}

/// The layout `cfg` asks for on `world`: with `tensor_parallel` > 1 the
/// model split over replicas of that many ranks; otherwise, with more than
/// one rank, as `--shard` says (parameters, or the optimizer state), and
/// replicated else.
pub(crate) fn for_config(
    cfg: &TrainConfig,
    world: &Group,
    adamw: AdamW,
) -> Result<Box<dyn GradSync>> {
    let (group, tensor) = tensor::groups(cfg, world)?;
    let communication = cfg.communication_dtype.map(|d| d.dtype());
    let bucket = cfg.all_reduce_size;
    Ok(match tensor {
        Some(_) if cfg.sharding() == ShardMode::Parameters => {
            bail!(
                "--shard parameters and --tensor-parallel each cut the weights: use one (tensor parallelism with --shard optimizer or none)"
            );
        }
        Some(t) => {
            let replicas = Replicated::new(adamw, &group, bucket, communication);
            Box::new(TensorParallel::new(replicas, t, world))
        }
        None if cfg.sharding() == ShardMode::Parameters && group.size() > 1 => {
            if communication.is_some() {
                bail!(
                    "--shard parameters gathers the weights and reduce-scatters the gradients in the compute dtype (--dtype): leave out --communication-dtype"
                );
            }
            let zero1 = Sharded::new(adamw, &group, bucket, None);
            Box::new(FullySharded::new(zero1))
        }
        None if cfg.shards_optimizer() && group.size() > 1 => {
            Box::new(Sharded::new(adamw, &group, bucket, communication))
        }
        None => Box::new(Replicated::new(adamw, &group, bucket, communication)),
    })
}

/// The skeleton of [`GradSync::reduce`]: `own`'s gradients but the
/// embedding's averaged by `dense`, then with `sparse` the embedding's
/// averaged as rows and cut to this rank's part by `keep`.
fn reduce_with(
    own: Tree,
    sparse: Option<&SparseRows>,
    group: &Group,
    communication: Option<Dtype>,
    dense: impl FnOnce(&Tree) -> Result<Tree>,
    keep: impl FnOnce(Array) -> Result<Array>,
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
    let mut averaged = dense(&rest)?.flatten();
    drop(rest);
    if let (Some(rows), Some(e)) = (sparse, embedding) {
        let mean =
            mlx_nn::average_sparse_rows(&e, &rows.tokens, rows.capacity, group, communication)?;
        drop(e);
        averaged.push((EMBEDDING.to_string(), keep(mean)?));
    }
    Ok(Tree::unflatten(averaged)?)
}
