//! Tensor parallelism in the trainer, combined with data parallelism: the
//! world is cut ([`mlx_dist::Group::split`]) into replicas of
//! `tensor_parallel` consecutive ranks. The ranks of a replica hold the
//! shards of one model ([`Llama::shard`]) and read the same batches; the
//! ranks holding the same shard in every replica form a data-parallel group,
//! over which the data is split and the gradients averaged as without
//! tensor parallelism. Checkpoints hold the whole model and optimizer state,
//! put together from the shards: they are those of a data-parallel run over
//! the replicas, so they resume at any split and load anywhere.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use mlx_array::{Array, Dtype, Tree, eval};
use mlx_dist::Group;
use mlx_nn::{ModuleExt, gather_axis, shard_axis};
use mlx_optim::{Optimizer, OptimizerState};

use crate::Llama;
use crate::config::TrainConfig;

/// The data-parallel group of this rank and, with `tensor_parallel` > 1,
/// the group its model is split over. Every rank of `world` calls it.
pub(super) fn groups(cfg: &TrainConfig, world: &Group) -> Result<(Group, Option<Group>)> {
    let t = cfg.tensor_parallel;
    let n = world.size();
    if t == 0 || !n.is_multiple_of(t) {
        bail!(
            "--tensor-parallel {t}: the {n} rank(s) do not split into models of {t} ranks (the world must be a multiple of it)"
        );
    }
    if t == 1 {
        return Ok((world.clone(), None));
    }
    let rank = world.rank();
    let tensor = world.split((rank / t) as i32, rank as i32)?;
    let data = world.split((rank % t) as i32, rank as i32)?;
    Ok((data, Some(tensor)))
}

/// A model split over a group, and which parameters are cut along which axis.
pub(super) struct TensorShards {
    /// The ranks the model is split over.
    pub group: Group,
    /// The sharded parameters and the axis each is cut along.
    cuts: BTreeMap<String, i32>,
}

impl TensorShards {
    /// Cuts the whole `model` and the whole state of `opt` (fresh, or as
    /// resumed from a checkpoint) into this rank's shards.
    pub fn shard(group: Group, model: &mut Llama, opt: &mut dyn Optimizer) -> Result<Self> {
        let whole: BTreeMap<String, Vec<usize>> = model
            .named_parameters()
            .into_iter()
            .map(|(n, a)| (n, a.shape().to_vec()))
            .collect();
        model.shard(&group)?;
        let cuts: BTreeMap<String, i32> = model
            .named_parameters()
            .into_iter()
            .filter_map(|(name, a)| {
                let axis = a
                    .shape()
                    .iter()
                    .zip(&whole[&name])
                    .position(|(s, w)| s != w)?;
                Some((name, axis as i32))
            })
            .collect();
        let state = opt.state_mut();
        for (param, &axis) in &cuts {
            if let Some(slots) = state.param(param).cloned() {
                for (slot, v) in slots {
                    state.set(param, &slot, shard_axis(&v, axis, 1, &group)?);
                }
            }
        }
        Ok(TensorShards { group, cuts })
    }

    /// `grads` (this rank's shards, averaged over the replicas) clipped to
    /// the global norm `max_norm` of the whole model's gradient, and that
    /// norm: the sharded parameters' squares summed over the group, the
    /// whole ones' (the same on every rank) counted once. Lazy.
    pub fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)> {
        let mut sharded = Array::scalar(0.0f32);
        let mut whole = Array::scalar(0.0f32);
        for (name, g) in grads.flatten() {
            let sq = g.astype(Dtype::F32)?.square()?.sum_all()?;
            if self.cuts.contains_key(&name) {
                sharded = sharded.add(&sq)?;
            } else {
                whole = whole.add(&sq)?;
            }
        }
        let total = mlx_dist::sum_partials(&sharded, &self.group)?.add(&whole)?;
        Ok(mlx_optim::clip_by_norm_squared(&grads, max_norm, |_| {
            Ok(total)
        })?)
    }

    /// The whole model and optimizer state, gathered from the group's
    /// shards and evaluated. Every rank of the group calls it.
    pub fn whole(&self, model: &Llama, state: &OptimizerState) -> Result<(Llama, OptimizerState)> {
        let model = model.unshard()?;
        let mut whole = state.clone();
        for (param, &axis) in &self.cuts {
            if let Some(slots) = state.param(param) {
                for (slot, v) in slots {
                    whole.set(param, slot, gather_axis(v, axis, &self.group)?);
                }
            }
        }
        eval((&model.parameters(), &whole.tree()?))?;
        Ok((model, whole))
    }
}
