//! ZeRO stage 1: each rank keeps the optimizer state of its shard of every
//! parameter (see [`mlx_optim::Sharded`]).

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use mlx_array::{Array, Dtype, Tree};
use mlx_dist::Group;
use mlx_optim::{AdamW, Optimizer};

use super::{CheckpointWriter, GradSync, SavedState, SparseRows, Weights, reduce_with};
use crate::{Llama, checkpoint};

/// Gradients averaged with one `mean_scatter` per bucket, so that each rank
/// receives its shards only; the new parameters gathered whole.
pub(crate) struct Sharded {
    opt: mlx_optim::Sharded<AdamW>,
    communication: Option<Dtype>,
}

impl Sharded {
    /// `opt`'s state sharded over `group`; buckets of `bucket_bytes`,
    /// gradients travelling in `communication` (`None`: their own dtype).
    pub(crate) fn new(
        opt: AdamW,
        group: &Group,
        bucket_bytes: usize,
        communication: Option<Dtype>,
    ) -> Self {
        Sharded {
            opt: mlx_optim::Sharded::new(opt, group).bucket_bytes(bucket_bytes),
            communication,
        }
    }

    /// This rank's shards of the world's average of the dense `grads`.
    fn shard(&self, grads: &Tree) -> Result<Tree> {
        let shard = |g: &Tree| self.opt.shard_gradients(g).map_err(|e| anyhow!("{e}"));
        match self.communication {
            Some(d) => {
                let cast = grads.map(|_, g| cast_float(g, d))?;
                let shards = shard(&cast)?;
                drop(cast);
                Ok(shards.zip_map(grads, |_, s, g| cast_float(s, g.dtype()))?)
            }
            None => shard(grads),
        }
    }

    /// The optimizer over shards.
    pub(super) fn optimizer_mut(&mut self) -> &mut mlx_optim::Sharded<AdamW> {
        &mut self.opt
    }

    /// This rank's state file in a checkpoint folder.
    fn state_file(&self) -> String {
        state_file(self.opt.group().rank())
    }
}

impl GradSync for Sharded {
    fn group(&self) -> &Group {
        self.opt.group()
    }

    fn saved_mut(&mut self) -> &mut dyn SavedState {
        self
    }

    fn reduce(&self, own: Tree, sparse: Option<&SparseRows>) -> Result<Tree> {
        let dense = |g: &Tree| self.shard(g);
        let keep = |mean: Array| self.opt.own_shard(&mean).map_err(|e| anyhow!("{e}"));
        reduce_with(
            own,
            sparse,
            self.opt.group(),
            self.communication,
            dense,
            keep,
        )
    }

    /// The shards' squared norms are summed over the world (one `all_sum`).
    fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)> {
        self.opt
            .clip_grad_norm(&grads, max_norm)
            .map_err(|e| anyhow!("{e}"))
    }

    fn apply(&mut self, grads: Tree, params: Tree, gate: Option<&Array>) -> Result<Tree> {
        match gate {
            Some(g) => self.opt.apply_shards_gated(&grads, &params, g),
            None => self.opt.apply_shards(&grads, &params),
        }
        .map_err(|e| anyhow!("{e}"))
    }

    fn settle(&mut self, applied: bool) -> Result<()> {
        self.opt
            .state_mut()
            .settle(applied)
            .map_err(|e| anyhow!("{e}"))
    }

    fn optimizer(&self) -> &dyn Optimizer {
        &self.opt
    }

    fn checkpoint(&self, model: &Llama, write: &mut CheckpointWriter) -> Result<()> {
        write(self.opt.group(), &Weights::of(model), self)
    }
}

impl SavedState for Sharded {
    /// Every rank writes its own shard, then waits for the others (a barrier).
    fn save(&self, dir: &Path) -> Result<()> {
        let path = dir.join(self.state_file());
        self.opt.save_state(&path).map_err(|e| anyhow!("{e}"))?;
        checkpoint::sync_path(&path)?;
        self.opt.group().barrier()?;
        Ok(())
    }

    fn load(&mut self, dir: &Path, params: &Tree) -> Result<()> {
        let path = dir.join(self.state_file());
        self.opt
            .load_state(&path, params)
            .map_err(|e| anyhow!("loading the optimizer from {}: {e}", dir.display()))
    }

    fn state_files(&self) -> Vec<String> {
        (0..self.opt.group().size()).map(state_file).collect()
    }

    fn load_resharded(&mut self, files: &[PathBuf], params: &Tree) -> Result<()> {
        mlx_optim::read_whole_state(files, params, self.opt.slot_names())
            .and_then(|whole| self.opt.set_whole_state(&whole))
            .map_err(|e| anyhow!("re-sharding the optimizer state: {e}"))
    }
}

/// The state file of `rank` in a checkpoint folder.
fn state_file(rank: usize) -> String {
    format!("optimizer_rank{rank}.safetensors")
}

/// `x` cast to the float dtype `to`; arrays of other dtypes as they are.
fn cast_float(x: &Array, to: Dtype) -> mlx_array::Result<Array> {
    if x.dtype().is_float() && x.dtype() != to {
        x.astype(to)
    } else {
        Ok(x.clone())
    }
}
