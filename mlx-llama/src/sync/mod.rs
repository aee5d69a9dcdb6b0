//! Gradient synchronisation: how the ranks' gradients meet and where the
//! optimizer state lives. One interface ([`GradSync`]), two strategies:
//!
//! - [`Replicated`]: every rank averages whole gradients (`all_sum` per
//!   bucket) and keeps the whole optimizer state, as the seeds'
//!   `average_gradients` then `optimizer.update`;
//! - [`Sharded`]: ZeRO stage 1; each rank receives only its shard of the
//!   averaged gradients (`mean_scatter` per bucket), updates its shard of
//!   every parameter with its shard of the state, and the new parameters are
//!   gathered whole (`all_gather` per bucket).
//!
//! The trainer picks one with [`for_config`] and calls the same methods in
//! the same order either way: reduce, clip, apply; save and load at
//! checkpoints.

mod replicated;
mod sharded;

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use mlx_array::{Array, Dtype, Tree};
use mlx_dist::Group;
use mlx_optim::{AdamW, Optimizer};

use crate::TrainConfig;

pub(crate) use replicated::Replicated;
pub(crate) use sharded::Sharded;

/// The parameter whose gradient is zero outside the rows of the batch's
/// tokens (the token embedding; the output projection is not tied to it).
pub(crate) const EMBEDDING: &str = "embedding.weight";

/// The rows of the embedding's gradient that travel when only those the
/// step's tokens touch are sent (see [`mlx_nn::average_sparse_rows`]).
pub(crate) struct SparseRows {
    /// This rank's input tokens of the step, every micro-batch's.
    pub tokens: Vec<u32>,
    /// Tokens per rank and step, the same on every rank.
    pub capacity: usize,
}

/// A gradient-synchronisation strategy: averages the ranks' gradients,
/// clips them, applies them with the optimizer, and saves and loads the
/// optimizer's state. Every method that communicates is collective: every
/// rank calls it, in the same order.
pub(crate) trait GradSync {
    /// This rank's own gradients averaged over the world, in the form
    /// [`GradSync::clip`] and [`GradSync::apply`] take (whole, or this
    /// rank's shards). With `sparse` the embedding's gradient travels as
    /// those rows only. Gradients travel in the configured communication
    /// dtype, if any, and come back in their own. Lazy.
    fn reduce(&self, own: Tree, sparse: Option<&SparseRows>) -> Result<Tree>;

    /// `grads` (from [`GradSync::reduce`]) clipped to the global norm
    /// `max_norm` of the whole averaged gradients, and that norm. Lazy.
    fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)>;

    /// One optimizer step: the new (whole) parameters of `params` from
    /// `grads` (from [`GradSync::reduce`] or [`GradSync::clip`]). Lazy.
    fn apply(&mut self, grads: Tree, params: Tree) -> Result<Tree>;

    /// Writes the optimizer state into the checkpoint folder `dir`,
    /// flushed to disk: this rank's part of it, if any.
    fn save(&self, dir: &Path) -> Result<()>;

    /// Reads this rank's optimizer state from the checkpoint folder `dir`,
    /// checked against `params` (the parameters being trained).
    fn load(&mut self, dir: &Path, params: &Tree) -> Result<()>;

    /// The files [`GradSync::save`] writes over the world, in rank order.
    fn state_files(&self) -> Vec<String>;

    /// Reads an optimizer state another layout saved, `files` in its rank
    /// order (one whole state, or the shards of some number of ranks), and
    /// keeps what this strategy keeps of it on this rank.
    fn load_resharded(&mut self, files: &[PathBuf], params: &Tree) -> Result<()>;

    /// The optimizer: its learning rate and state.
    fn optimizer(&self) -> &dyn Optimizer;

    /// The optimizer, to change its state (tensor parallelism cuts a
    /// resumed whole state into this rank's shards).
    fn optimizer_mut(&mut self) -> &mut dyn Optimizer;
}

/// The strategy `cfg` asks for on `group`: sharded with more than one rank
/// and `shard_optimizer` (without tensor parallelism), replicated otherwise.
pub(crate) fn for_config(cfg: &TrainConfig, group: &Group, adamw: AdamW) -> Box<dyn GradSync> {
    let communication = cfg.communication_dtype.map(|d| d.dtype());
    if cfg.shard_optimizer && group.size() > 1 && cfg.tensor_parallel <= 1 {
        Box::new(Sharded::new(
            adamw,
            group,
            cfg.all_reduce_size,
            communication,
        ))
    } else {
        Box::new(Replicated::new(
            adamw,
            group,
            cfg.all_reduce_size,
            communication,
        ))
    }
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
