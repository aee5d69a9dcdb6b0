//! Tensor parallelism combined with data parallelism: the world is cut
//! ([`mlx_dist::Group::split`]) into replicas of `tensor_parallel`
//! consecutive ranks. The ranks of a replica hold the shards of one model
//! ([`Llama::shard`]) and read the same batches; the ranks holding the same
//! shard in every replica form a data-parallel group, over which the data
//! is split and the gradients averaged as without tensor parallelism
//! ([`Replicated`]). Checkpoints hold the whole model and optimizer state,
//! put together from the shards: they are those of a data-parallel run over
//! the replicas, so they resume at any split and load anywhere.

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use mlx_array::{Array, Dtype, Tree, eval};
use mlx_dist::Group;
use mlx_nn::{ModuleExt, gather_axis, shard_axis};
use mlx_optim::Optimizer;

use super::{CheckpointWriter, GradSync, Replicated, SavedState, SparseRows, Weights};
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

/// A model split over the ranks of a replica, its shards' gradients
/// averaged over the replicas.
pub(crate) struct TensorParallel {
    /// The data-parallel strategy over the replicas; it holds the whole
    /// optimizer state until [`GradSync::scatter`], this rank's shards of
    /// it after.
    replicas: Replicated,
    /// The ranks the model is split over.
    tensor: Group,
    /// Every rank of the run.
    world: Group,
    /// The sharded parameters and the axis each is cut along (set by
    /// [`GradSync::scatter`]).
    cuts: BTreeMap<String, i32>,
}

impl TensorParallel {
    /// The model split over `tensor`, its gradients averaged by `replicas`;
    /// `world` is every rank of the run.
    pub(crate) fn new(replicas: Replicated, tensor: Group, world: &Group) -> Self {
        TensorParallel {
            replicas,
            tensor,
            world: world.clone(),
            cuts: BTreeMap::new(),
        }
    }
}

impl GradSync for TensorParallel {
    fn group(&self) -> &Group {
        self.replicas.group()
    }

    fn describe(&self) -> String {
        format!(
            "{} data-parallel replica(s) of {} tensor-parallel shards",
            self.group().size(),
            self.tensor.size()
        )
    }

    /// The whole state, as a data-parallel run over the replicas keeps it.
    fn saved_mut(&mut self) -> &mut dyn SavedState {
        &mut self.replicas
    }

    /// Cuts the model ([`Llama::shard`]) and every slot of the optimizer
    /// state of a cut parameter along the same axis.
    fn scatter(&mut self, model: &mut Llama) -> Result<()> {
        let whole: BTreeMap<String, Vec<usize>> = model
            .named_parameters()
            .into_iter()
            .map(|(n, a)| (n, a.shape().to_vec()))
            .collect();
        model.shard(&self.tensor)?;
        self.cuts = model
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
        let state = self.replicas.state_mut();
        for (param, &axis) in &self.cuts {
            if let Some(slots) = state.param(param).cloned() {
                for (slot, v) in slots {
                    state.set(param, &slot, shard_axis(&v, axis, 1, &self.tensor)?);
                }
            }
        }
        Ok(())
    }

    fn reduce(&self, own: Tree, sparse: Option<&SparseRows>) -> Result<Tree> {
        self.replicas.reduce(own, sparse)
    }

    /// The sharded parameters' squares summed over the replica, the whole
    /// ones' (the same on every rank) counted once.
    fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)> {
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
        let total = mlx_dist::sum_partials(&sharded, &self.tensor)?.add(&whole)?;
        Ok(mlx_optim::clip_by_norm_squared(&grads, max_norm, |_| {
            Ok(total)
        })?)
    }

    fn apply(&mut self, grads: Tree, params: Tree, gate: Option<&Array>) -> Result<Tree> {
        self.replicas.apply(grads, params, gate)
    }

    fn settle(&mut self, applied: bool) -> Result<()> {
        self.replicas.settle(applied)
    }

    fn optimizer(&self) -> &dyn Optimizer {
        self.replicas.optimizer()
    }

    /// Gathers the whole model and optimizer state from the replica's
    /// shards; the first shard of every replica writes what a
    /// data-parallel run would, then the world meets (a barrier).
    fn checkpoint(&self, model: &Llama, write: &mut CheckpointWriter) -> Result<()> {
        let model = model.unshard()?;
        let state = self.replicas.optimizer().state();
        let mut whole = state.clone();
        for (param, &axis) in &self.cuts {
            if let Some(slots) = state.param(param) {
                for (slot, v) in slots {
                    whole.set(param, slot, gather_axis(v, axis, &self.tensor)?);
                }
            }
        }
        eval((&model.parameters(), &whole.tree()?))?;
        if self.tensor.rank() == 0 {
            write(
                self.group(),
                &Weights::of(&model),
                &self.replicas.with_state(whole),
            )?;
        }
        self.world.barrier()?;
        Ok(())
    }
}
