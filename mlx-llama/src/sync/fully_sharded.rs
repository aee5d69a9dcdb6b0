//! ZeRO stage 3 (FSDP's `fully_shard`): each rank keeps a flat, padded
//! shard of every parameter (as [`mlx_optim::shard_of`] cuts it, the
//! layout of the optimizer state's shards), and the optimizer updates the
//! shards in place of whole parameters.
//!
//! A step's forward pass reads every parameter gathered from the ranks'
//! shards (`all_gather`), one unit at a time (the embedding, each block,
//! the final norm, the output projection), each unit's gather made to wait
//! for the previous unit's: it travels while the previous unit computes,
//! and no unit is gathered before the one ahead of it. A gathered weight is
//! [rematerialized](mlx_array::autodiff::rematerialize_with): freed once
//! its forward readers have run and gathered again when the backward pass
//! reaches them. Its gradient comes back through the gather's own
//! (a reduce-scatter), as this rank's shard of the sum over the ranks. So a
//! rank holds its shards, their gradients and optimizer state, and the
//! weights of the units in flight.

use std::sync::Arc;

use anyhow::{Result, anyhow, bail};
use mlx_array::autodiff::{Recompute, depend, rematerialize_with};
use mlx_array::{Array, Dtype, Tree, eval};
use mlx_dist::Group;
use mlx_nn::ModuleExt;
use mlx_optim::Optimizer;

use super::{CheckpointWriter, GradSync, SavedState, Sharded, SparseRows, Weights};
use crate::Llama;

/// Parameters, gradients and optimizer state sharded over the ranks.
pub(crate) struct FullySharded {
    /// The optimizer over shards, its state files and clipping: ZeRO-1's.
    zero1: Sharded,
    /// This rank's shard of every parameter (float32 masters), by name.
    shards: Tree,
    /// Every parameter's name and whole shape, in the order the forward
    /// pass reads them.
    shapes: Vec<(String, Vec<usize>)>,
}

impl FullySharded {
    /// Parameters sharded over `zero1`'s group, with its optimizer.
    pub(crate) fn new(zero1: Sharded) -> Self {
        FullySharded {
            zero1,
            shards: Tree::new(),
            shapes: Vec::new(),
        }
    }

    fn world(&self) -> (usize, usize) {
        let g = self.zero1.group();
        (g.rank(), g.size())
    }

    /// Every parameter gathered whole from `shards` (lazy), each unit's
    /// gather waiting for the previous unit's; rematerialized under
    /// differentiation (see the module documentation). With `compute` the
    /// shards are cast to it before they travel.
    fn gathered(&self, shards: &Tree, compute: Option<Dtype>) -> Result<Tree> {
        let group = self.zero1.group().clone();
        let mut whole = Vec::with_capacity(self.shapes.len());
        let mut previous_unit: Option<Array> = None;
        let mut this_unit: (Option<&str>, Option<Array>) = (None, None);
        for (name, shape) in &self.shapes {
            let unit = unit_of(name);
            if this_unit.0 != Some(unit) {
                if let Some(last) = this_unit.1.take() {
                    previous_unit = Some(last);
                }
                this_unit.0 = Some(unit);
            }
            let shard = shards
                .get_array(name)
                .ok_or_else(|| anyhow!("no shard of `{name}`"))?;
            let shard = match compute {
                Some(d) if shard.dtype() != d && shard.dtype().is_float() => shard.astype(d)?,
                _ => shard.clone(),
            };
            let f = gather_fn(shape.clone(), group.clone());
            let waiting = match &previous_unit {
                Some(p) => depend(&shard, std::slice::from_ref(p)),
                None => shard.clone(),
            };
            let value = f(&[waiting])?.remove(0);
            let w = rematerialize_with(value, f, &[shard])?;
            this_unit.1 = Some(w.clone());
            whole.push((name.clone(), w));
        }
        Ok(Tree::unflatten(whole)?)
    }

    /// `model` with its parameters gathered whole (lazy, not
    /// rematerialized): for validation and checkpoints.
    fn whole_model(&self, model: &Llama) -> Result<Llama> {
        let mut m = model.clone();
        m.update(&self.gathered(&self.shards, None)?)?;
        Ok(m)
    }
}

/// The function that gathers a parameter of `shape` from the ranks'
/// shards: the shards concatenated, the padding cut off, the shape put back.
fn gather_fn(shape: Vec<usize>, group: Group) -> Recompute {
    Arc::new(move |x: &[Array]| {
        let n: usize = shape.iter().product();
        let all = mlx_dist::all_gather(&x[0], &group)?;
        let flat = all.slice_axis(0, 0, n as i64)?;
        Ok(vec![mlx_array::reshape_to(&flat, &shape)?])
    })
}

/// The unit a parameter is gathered with: its block (`layers.3`), or the
/// parameter itself outside the blocks (also what `--memory-budget`
/// counts as gathered together).
pub(crate) fn unit_of(name: &str) -> &str {
    match name.strip_prefix("layers.") {
        Some(rest) => {
            let block = rest.split('.').next().unwrap_or(rest);
            &name[..("layers.".len() + block.len())]
        }
        None => name,
    }
}

/// The order the forward pass reads parameters in: the embedding, the
/// blocks in order, then the rest (the final norm, the output projection).
fn forward_rank(name: &str) -> (usize, usize, String) {
    if name.starts_with("embedding.") {
        return (0, 0, name.to_string());
    }
    match name.strip_prefix("layers.") {
        Some(rest) => {
            let block: usize = rest
                .split('.')
                .next()
                .and_then(|b| b.parse().ok())
                .unwrap_or(usize::MAX);
            (1, block, name.to_string())
        }
        None => (2, 0, name.to_string()),
    }
}

impl GradSync for FullySharded {
    fn group(&self) -> &Group {
        self.zero1.group()
    }

    fn describe(&self) -> String {
        format!("{} rank(s), parameters sharded", self.group().size())
    }

    fn saved_mut(&mut self) -> &mut dyn SavedState {
        self.zero1.saved_mut()
    }

    /// Keeps this rank's shard of every parameter and frees the whole ones:
    /// the model's parameters become lazy placeholders of their shape.
    fn scatter(&mut self, model: &mut Llama) -> Result<()> {
        let (r, w) = self.world();
        let all = model.parameters();
        let trainable = model.trainable_parameters();
        if all.flatten().len() != trainable.flatten().len() {
            bail!(
                "--shard parameters trains every parameter, and this model has frozen ones (adapters, --fine-tune): use --shard optimizer"
            );
        }
        let mut shapes: Vec<(String, Vec<usize>)> = all
            .flatten()
            .into_iter()
            .map(|(n, p)| (n, p.shape().to_vec()))
            .collect();
        shapes.sort_by_key(|(n, _)| forward_rank(n));
        self.shards = all.map(|_, p| mlx_optim::shard_of(p, r, w))?;
        eval(&self.shards)?;
        self.shapes = shapes;
        let placeholders = all.map(|_, p| Ok(Array::zeros(p.shape(), p.dtype())))?;
        model.update(&placeholders)?;
        Ok(())
    }

    fn differentiated(&self) -> Option<&Tree> {
        Some(&self.shards)
    }

    fn bind(&self, model: &mut Llama, trained: &Tree, compute: Option<Dtype>) -> Result<()> {
        model.update(&self.gathered(trained, compute)?)?;
        Ok(())
    }

    fn forward_model(&self, model: &Llama) -> Result<Llama> {
        self.whole_model(model)
    }

    fn updated(&self, _model: &Llama) -> Vec<Array> {
        let mut shards: Vec<Array> = self
            .shapes
            .iter()
            .filter_map(|(n, _)| self.shards.get_array(n).cloned())
            .collect();
        shards.reverse();
        shards
    }

    /// The gradients reached the shards through the gathers' own (a sum
    /// over the ranks, reduce-scattered): their mean.
    fn reduce(&self, own: Tree, sparse: Option<&SparseRows>) -> Result<Tree> {
        if sparse.is_some() {
            bail!("fully sharded parameters take the embedding's gradient whole");
        }
        let w = self.group().size() as f64;
        Ok(own.map(|_, g| g.div_scalar(w))?)
    }

    fn clip(&self, grads: Tree, max_norm: f64) -> Result<(Tree, Array)> {
        self.zero1.clip(grads, max_norm)
    }

    fn apply(&mut self, grads: Tree, _params: Tree, gate: Option<&Array>) -> Result<Tree> {
        self.shards = self
            .zero1
            .optimizer_mut()
            .apply_to_shards(&grads, &self.shards, gate)
            .map_err(|e| anyhow!("{e}"))?;
        Ok(Tree::new())
    }

    fn settle(&mut self, applied: bool) -> Result<()> {
        self.zero1.settle(applied)
    }

    fn optimizer(&self) -> &dyn Optimizer {
        self.zero1.optimizer()
    }

    /// The writer gets the weights gathered one parameter at a time as the
    /// file reaches it (every rank takes part), with ZeRO-1's state files:
    /// a checkpoint as any layout's, without the whole model on any rank.
    fn checkpoint(&self, model: &Llama, write: &mut CheckpointWriter) -> Result<()> {
        let group = self.group().clone();
        let gather = |name: &str| -> Result<Array> {
            let shape = self
                .shapes
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, s)| s.clone())
                .ok_or_else(|| anyhow!("no parameter `{name}`"))?;
            let shard = self
                .shards
                .get_array(name)
                .ok_or_else(|| anyhow!("no shard of `{name}`"))?;
            Ok(gather_fn(shape, group.clone())(std::slice::from_ref(shard))?.remove(0))
        };
        write(
            self.group(),
            &Weights::gathered(model, &gather),
            &self.zero1,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_forward_order() {
        assert_eq!(
            unit_of("layers.12.attention.query_proj.weight"),
            "layers.12"
        );
        assert_eq!(unit_of("embedding.weight"), "embedding.weight");
        let mut names = vec![
            "out_proj.weight",
            "layers.10.norm1.weight",
            "norm.weight",
            "layers.2.linear1.weight",
            "embedding.weight",
        ];
        names.sort_by_key(|n| forward_rank(n));
        assert_eq!(
            names,
            [
                "embedding.weight",
                "layers.2.linear1.weight",
                "layers.10.norm1.weight",
                "norm.weight",
                "out_proj.weight"
            ]
        );
    }
}
