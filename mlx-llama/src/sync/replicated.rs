//! Every rank averages whole gradients and keeps the whole optimizer state.

use std::path::{Path, PathBuf};

use anyhow::{Result, anyhow};
use mlx_array::{Array, Dtype, Tree};
use mlx_dist::Group;
use mlx_nn::{AverageOptions, average_gradients};
use mlx_optim::{AdamW, Optimizer, OptimizerState};

use super::{CheckpointWriter, GradSync, SavedState, SparseRows, Weights, reduce_with};
use crate::{Llama, checkpoint};

/// The state file of every rank (rank 0 writes it, every rank reads it).
const STATE_FILE: &str = "optimizer.safetensors";

/// Whole gradients averaged with one `all_sum` per bucket
/// ([`mlx_nn::average_gradients`]); the whole state on every rank.
pub(crate) struct Replicated {
    opt: AdamW,
    group: Group,
    avg: AverageOptions,
}

impl Replicated {
    /// `opt` on every rank of `group`; buckets of `bucket_bytes`, gradients
    /// travelling in `communication` (`None`: their own dtype).
    pub(crate) fn new(
        opt: AdamW,
        group: &Group,
        bucket_bytes: usize,
        communication: Option<Dtype>,
    ) -> Self {
        let avg = AverageOptions {
            all_reduce_size: bucket_bytes,
            communication_dtype: communication,
        };
        Replicated {
            opt,
            group: group.clone(),
            avg,
        }
    }

    /// The same strategy holding `state` (a whole state put together from
    /// shards) instead of its own.
    pub(super) fn with_state(&self, state: OptimizerState) -> Self {
        let mut opt = self.opt.clone();
        *opt.state_mut() = state;
        Replicated {
            opt,
            group: self.group.clone(),
            avg: self.avg.clone(),
        }
    }

    /// The optimizer state, to cut into shards.
    pub(super) fn state_mut(&mut self) -> &mut OptimizerState {
        self.opt.state_mut()
    }
}

impl GradSync for Replicated {
    fn group(&self) -> &Group {
        &self.group
    }

    fn saved_mut(&mut self) -> &mut dyn SavedState {
        self
    }

    fn reduce(&self, own: Tree, sparse: Option<&SparseRows>) -> Result<Tree> {
        let dense = |g: &Tree| Ok(average_gradients(g, &self.group, &self.avg)?);
        let keep = Ok;
        let communication = self.avg.communication_dtype;
        reduce_with(own, sparse, &self.group, communication, dense, keep)
    }

    fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)> {
        mlx_optim::clip_grad_norm(&grads, max_norm).map_err(|e| anyhow!("{e}"))
    }

    fn apply(&mut self, grads: Tree, params: Tree, gate: Option<&Array>) -> Result<Tree> {
        match gate {
            Some(g) => self.opt.apply_gradients_gated(&grads, &params, g),
            None => self.opt.apply_gradients(&grads, &params),
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
        write(&self.group, &Weights::of(model), self)
    }
}

impl SavedState for Replicated {
    /// Rank 0 writes the state; the others have the same.
    fn save(&self, dir: &Path) -> Result<()> {
        if self.group.rank() == 0 {
            let path = dir.join(STATE_FILE);
            self.opt.save_state(&path).map_err(|e| anyhow!("{e}"))?;
            checkpoint::sync_path(&path)?;
        }
        Ok(())
    }

    fn load(&mut self, dir: &Path, params: &Tree) -> Result<()> {
        self.opt
            .load_state(&dir.join(STATE_FILE), params)
            .map_err(|e| anyhow!("loading the optimizer from {}: {e}", dir.display()))
    }

    fn state_files(&self) -> Vec<String> {
        vec![STATE_FILE.to_string()]
    }

    fn load_resharded(&mut self, files: &[PathBuf], params: &Tree) -> Result<()> {
        let whole = mlx_optim::read_whole_state(files, params, self.opt.slot_names())
            .map_err(|e| anyhow!("re-sharding the optimizer state: {e}"))?;
        *self.opt.state_mut() = whole;
        Ok(())
    }
}
