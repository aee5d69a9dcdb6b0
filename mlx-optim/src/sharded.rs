//! Optimizer state sharded over the ranks of a data-parallel group (ZeRO
//! stage 1, PyTorch's `ZeroRedundancyOptimizer`): each rank keeps the
//! moments of only its share of every parameter.
//!
//! Every parameter of `N` elements is flattened and cut into `W` equal shards
//! of `ceil(N / W)` elements (the last padded with zeros), one per rank. A step:
//!
//! 1. the ranks' own gradients are averaged with one `mean_scatter` per
//!    bucket (a `sum_scatter` divided by `W` in its own buffer), so rank `r`
//!    receives only shard `r` of every averaged gradient;
//! 2. the wrapped optimizer updates shard `r` of every parameter and its slots;
//! 3. one `all_gather` per bucket rebuilds the whole new parameters on every rank.
//!
//! The traffic equals one all-reduce (a reduce-scatter plus an all-gather),
//! the results equal averaging the gradients and updating every parameter
//! everywhere (bit for bit on two ranks, where each sum has one order), and
//! each rank holds `1 / W` of the optimizer state.

use std::collections::HashMap;
use std::ops::Range;
use std::path::Path;

use mlx_array::{Array, Dtype, Tree, concatenate};
use mlx_dist::Group;

use crate::gate::Gate;
use crate::optimizer::{Optimizer, StepContext};
use crate::schedule::Schedule;
use crate::state::OptimizerState;
use crate::{Error, Result};

/// An optimizer whose state is sharded over the ranks of `group`.
///
/// Give it each rank's *own* gradients: it averages them itself, shard by
/// shard (do not call `average_gradients` first). On a group of one it is
/// the wrapped optimizer unchanged.
///
/// ```
/// use mlx_array::{eval, Array, Dtype, Tree};
/// use mlx_optim::{AdamW, Optimizer, Sharded};
/// let world = mlx_dist::init(mlx_dist::Backend::Any).unwrap();
/// let mut opt = Sharded::new(AdamW::new(1e-2), &world);
/// let mut params = Tree::unflatten([("w".to_string(), Array::ones(&[5], Dtype::F32))]).unwrap();
/// let grads = Tree::unflatten([("w".to_string(), Array::ones(&[5], Dtype::F32))]).unwrap();
/// opt.update_tree(&mut params, &grads).unwrap();
/// eval((&params, opt.state())).unwrap();
/// // Each rank keeps ceil(5 / world) elements of `m` and of `v`.
/// let m = opt.state().get("w", "m").unwrap();
/// assert_eq!(m.size(), 5usize.div_ceil(world.size()));
/// ```
#[derive(Clone, Debug)]
pub struct Sharded<O> {
    inner: O,
    group: Group,
    bucket_bytes: usize,
}

/// Elements per shard of a parameter of `n` elements over `world` ranks.
fn shard_len(n: usize, world: usize) -> usize {
    n.div_ceil(world)
}

impl<O: Optimizer> Sharded<O> {
    /// Shards `inner`'s state over `group`; buckets of 32 MiB (as
    /// `average_gradients`).
    pub fn new(inner: O, group: &Group) -> Self {
        Sharded {
            inner,
            group: group.clone(),
            bucket_bytes: 32 << 20,
        }
    }

    /// Sets the bytes per communication bucket (0: one tensor per collective).
    pub fn bucket_bytes(mut self, bytes: usize) -> Self {
        self.bucket_bytes = bytes;
        self
    }

    /// The wrapped optimizer.
    pub fn inner(&self) -> &O {
        &self.inner
    }

    /// The group the state is sharded over.
    pub fn group(&self) -> &Group {
        &self.group
    }

    /// This rank's shard of `whole` (a parameter, or a gradient or slot
    /// of one), cut as this optimizer cuts every parameter: see
    /// [`shard_of`]. Lazy.
    pub fn own_shard(&self, whole: &Array) -> Result<Array> {
        let (r, w) = self.world();
        Ok(shard_of(whole, r, w)?)
    }

    fn world(&self) -> (usize, usize) {
        (self.group.rank(), self.group.size())
    }

    /// The buckets of `arrays` (in order), by dtype and about `bucket_bytes`.
    fn buckets(&self, arrays: &[&Array]) -> Vec<Vec<usize>> {
        let items: Vec<(Dtype, usize)> = arrays.iter().map(|a| (a.dtype(), a.size())).collect();
        mlx_nn::gradient_buckets(&items, self.bucket_bytes)
            .into_iter()
            .map(|(_, b)| b)
            .collect()
    }

    /// This rank's shard of the world's average of every gradient: a tree
    /// shaped like `grads` whose leaves are flat, `ceil(N / W)` elements
    /// (zero past the parameter's end). Lazy; one `mean_scatter` per bucket.
    pub fn shard_gradients(&self, grads: &Tree) -> Result<Tree> {
        let (_, w) = self.world();
        let flat = grads.flatten();
        let arrays: Vec<&Array> = flat.iter().map(|(_, g)| g).collect();
        let mut shards: HashMap<String, Array> = HashMap::new();
        for bucket in self.buckets(&arrays) {
            // Row `r` of the bucket holds shard `r` of each of its gradients.
            let rows = bucket
                .iter()
                .map(|&i| {
                    let g = arrays[i];
                    padded(g, w * shard_len(g.size(), w))?.reshape(&[w as i64, -1])
                })
                .collect::<mlx_array::Result<Vec<_>>>()?;
            let mine =
                mlx_dist::mean_scatter(&concatenate(&rows, 1)?, &self.group)?.reshape(&[-1])?;
            let mut at = 0i64;
            for &i in &bucket {
                let len = shard_len(arrays[i].size(), w) as i64;
                shards.insert(flat[i].0.clone(), mine.slice_axis(0, at, at + len)?);
                at += len;
            }
        }
        Ok(grads.map(|path, _| Ok(shards[path].clone()))?)
    }

    /// Clips gradient shards (from [`Self::shard_gradients`]) by the global
    /// norm of the whole gradients, as [`crate::clip_grad_norm`] would clip
    /// the averaged gradients: the squared norms of the shards are summed
    /// over the group. Returns the clipped shards and the norm.
    pub fn clip_grad_norm(&self, shards: &Tree, max_norm: f64) -> Result<(Tree, Array)> {
        crate::clip::clip_by_norm_squared(shards, max_norm, |sq| {
            Ok(mlx_dist::all_sum(&sq, &self.group)?)
        })
    }

    /// Updates this rank's shard of every parameter of `params` named in
    /// `shards` (from [`Self::shard_gradients`]) and gathers the new
    /// parameters from every rank: returns them whole, as a tree shaped
    /// like `shards`. Increments the step; lazy; on error the state is
    /// unchanged.
    pub fn apply_shards(&mut self, shards: &Tree, params: &Tree) -> Result<Tree> {
        self.apply_shards_with(shards, params, None)
    }

    /// [`Self::apply_shards`] decided on the device, as
    /// [`Optimizer::apply_gradients_gated`]: where `apply` is 0 every
    /// shard (and so every gathered parameter) and slot keeps its value.
    /// Every rank must pass the same flag (sum the ranks' overflow flags).
    pub fn apply_shards_gated(
        &mut self,
        shards: &Tree,
        params: &Tree,
        apply: &Array,
    ) -> Result<Tree> {
        self.apply_shards_with(shards, params, Some(apply))
    }

    /// Updates the parameters' shards `params` (this rank's, as
    /// [`shard_of`] cuts them: fully sharded parameters, ZeRO stage 3) with
    /// the gradient shards `shards` and returns the new shards, gathering
    /// nothing. With `apply` the step is decided on the device, as
    /// [`Self::apply_shards_gated`]. Increments the step; lazy; on error the
    /// state is unchanged.
    pub fn apply_to_shards(
        &mut self,
        shards: &Tree,
        params: &Tree,
        apply: Option<&Array>,
    ) -> Result<Tree> {
        let updated = self.update_shards(shards, apply, |path, g| {
            let p = params
                .get_array(path)
                .ok_or_else(|| Error::NoParameter(path.to_string()))?;
            if g.shape() != p.shape() {
                return Err(Error::GradientShape {
                    param: path.to_string(),
                    expected: p.shape().to_vec(),
                    grad: g.shape().to_vec(),
                });
            }
            Ok(p.clone())
        })?;
        let new: HashMap<String, Array> = updated.into_iter().map(|(p, n, _)| (p, n)).collect();
        Ok(shards.map(|path, _| Ok(new[path].clone()))?)
    }

    fn apply_shards_with(
        &mut self,
        shards: &Tree,
        params: &Tree,
        apply: Option<&Array>,
    ) -> Result<Tree> {
        let (r, w) = self.world();
        let flat = shards.flatten();
        let updated = self.update_shards(shards, apply, |path, g| {
            let p = params
                .get_array(path)
                .ok_or_else(|| Error::NoParameter(path.to_string()))?;
            let len = shard_len(p.size(), w);
            if g.shape() != [len] {
                return Err(Error::GradientShape {
                    param: path.to_string(),
                    expected: vec![len],
                    grad: g.shape().to_vec(),
                });
            }
            Ok(shard_of(p, r, w)?)
        })?;
        let whole: Vec<&Array> = flat
            .iter()
            .map(|(path, _)| params.get_array(path).expect("checked above"))
            .collect();
        let new_shards: Vec<Array> = updated.into_iter().map(|(_, n, _)| n).collect();
        let mut gathered: HashMap<String, Array> = HashMap::new();
        for bucket in self.buckets(&whole) {
            let parts: Vec<Array> = bucket.iter().map(|&i| new_shards[i].clone()).collect();
            let all = mlx_dist::all_gather(&concatenate(&parts, 0)?, &self.group)?
                .reshape(&[w as i64, -1])?;
            let mut at = 0i64;
            for &i in &bucket {
                let p = whole[i];
                let len = shard_len(p.size(), w) as i64;
                let rows = all.slice_axis(1, at, at + len)?.reshape(&[-1])?;
                let param = rows.slice_axis(0, 0, p.size() as i64)?;
                gathered.insert(flat[i].0.clone(), mlx_array::reshape_to(&param, p.shape())?);
                at += len;
            }
        }
        Ok(shards.map(|path, _| Ok(gathered[path].clone()))?)
    }

    /// One optimizer step on shards: for every gradient shard of `shards`
    /// (in flattened order), `shard_of(path, grad)` gives the parameter's
    /// shard it updates (checking the gradient's shape). Sets the new
    /// slots and the step; returns (path, new shard, its gradient).
    fn update_shards(
        &mut self,
        shards: &Tree,
        apply: Option<&Array>,
        shard_of: impl Fn(&str, &Array) -> Result<Array>,
    ) -> Result<Vec<(String, Array, Array)>> {
        self.inner.validate()?;
        let gate = match apply {
            Some(a) => Some(Gate::next(&self.inner, a, true)?),
            None if !self.inner.state().pending().is_empty() => {
                return Err(Error::Unsettled(
                    "an ungated step",
                    self.inner.state().pending().len(),
                ));
            }
            None => None,
        };
        let step = self.inner.step();
        let ctx = StepContext {
            learning_rate: self.inner.next_learning_rate(),
            step: step + 1,
            parameter_apart: true,
        };
        let names: Vec<&'static str> = self.inner.slot_names().to_vec();
        let flat = shards.flatten();
        let mut updated = Vec::with_capacity(flat.len());
        let mut new_slots = Vec::with_capacity(flat.len());
        for (path, g) in &flat {
            let shard = shard_of(path, g)?;
            let slots = names
                .iter()
                .map(|s| match self.inner.state().get(path, s) {
                    Some(a) => Ok(a.clone()),
                    None => self.inner.init_slot(s, g),
                })
                .collect::<Result<Vec<_>>>()?;
            let (np, ns) = match &gate {
                Some(gate) => self.inner.apply_single_gated(g, &shard, &slots, gate)?,
                None => self.inner.apply_single(g, &shard, &slots, &ctx)?,
            };
            updated.push((path.clone(), np, g.clone()));
            new_slots.push((path.clone(), ns));
        }
        let state = self.inner.state_mut();
        for (path, slots) in new_slots {
            for (name, a) in names.iter().zip(slots) {
                state.set(&path, name, a);
            }
        }
        match apply {
            Some(a) => state.push_pending(a.astype(Dtype::F32)?),
            None => state.set_step(step + 1),
        }
        Ok(updated)
    }
}

/// A tree shaped like `params` whose leaves have the shard shapes of a
/// world of `w` (lazy zeros, never computed): what a shard's state is
/// checked against.
pub(crate) fn shard_shapes(params: &Tree, w: usize) -> Result<Tree> {
    Ok(params.map(|_, p| Ok(Array::zeros(&[shard_len(p.size(), w)], p.dtype())))?)
}

/// `x` flattened and padded with zeros to `len` elements.
fn padded(x: &Array, len: usize) -> mlx_array::Result<Array> {
    let flat = x.reshape(&[-1])?;
    if len == x.size() {
        return Ok(flat);
    }
    concatenate(&[flat, Array::zeros(&[len - x.size()], x.dtype())], 0)
}

/// The elements (in flat order) of a parameter of `n` elements that rank
/// `rank` of `world` owns in [`Sharded`]'s layout: `ceil(n / world)` per
/// rank, in rank order, so the last ranks' ranges may be short or empty.
pub fn shard_range(n: usize, rank: usize, world: usize) -> Range<usize> {
    let len = shard_len(n, world);
    (rank * len).min(n)..((rank + 1) * len).min(n)
}

/// Shard `rank` of `world` of `x`, as [`Sharded`] cuts every parameter,
/// gradient and slot: the elements of [`shard_range`], flat, zero padded
/// to `ceil(N / world)`. Lazy.
pub fn shard_of(x: &Array, rank: usize, world: usize) -> mlx_array::Result<Array> {
    let own = shard_range(x.size(), rank, world);
    let flat = x.reshape(&[-1])?;
    let mine = flat.slice_axis(0, own.start as i64, own.end as i64)?;
    padded(&mine, shard_len(x.size(), world))
}

impl<O: Optimizer> Optimizer for Sharded<O> {
    fn slot_names(&self) -> &[&'static str] {
        self.inner.slot_names()
    }

    fn apply_single(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        ctx: &StepContext,
    ) -> Result<(Array, Vec<Array>)> {
        self.inner.apply_single(grad, param, slots, ctx)
    }

    fn apply_single_gated(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        gate: &Gate,
    ) -> Result<(Array, Vec<Array>)> {
        self.inner.apply_single_gated(grad, param, slots, gate)
    }

    fn schedule(&self) -> &Schedule {
        self.inner.schedule()
    }

    fn set_schedule(&mut self, schedule: Schedule) {
        self.inner.set_schedule(schedule);
    }

    fn state(&self) -> &OptimizerState {
        self.inner.state()
    }

    fn state_mut(&mut self) -> &mut OptimizerState {
        self.inner.state_mut()
    }

    fn validate(&self) -> Result<()> {
        self.inner.validate()
    }

    fn init_slot(&self, slot: &str, grad: &Array) -> Result<Array> {
        self.inner.init_slot(slot, grad)
    }

    /// Creates shard-shaped state for every parameter without any.
    fn init(&mut self, params: &Tree) -> Result<()> {
        if self.group.size() == 1 {
            return self.inner.init(params);
        }
        let shapes = shard_shapes(params, self.group.size())?;
        self.inner.init(&shapes)
    }

    /// Averages this rank's own `grads` over the group, shard by shard, and
    /// applies them: [`Self::shard_gradients`] then [`Self::apply_shards`].
    fn apply_gradients(&mut self, grads: &Tree, params: &Tree) -> Result<Tree> {
        if self.group.size() == 1 {
            return self.inner.apply_gradients(grads, params);
        }
        let shards = self.shard_gradients(grads)?;
        self.apply_shards(&shards, params)
    }

    /// [`Optimizer::apply_gradients`]'s sharding, gated by `apply`.
    fn apply_gradients_gated(
        &mut self,
        grads: &Tree,
        params: &Tree,
        apply: &Array,
    ) -> Result<Tree> {
        if self.group.size() == 1 {
            return self.inner.apply_gradients_gated(grads, params, apply);
        }
        let shards = self.shard_gradients(grads)?;
        self.apply_shards_gated(&shards, params, apply)
    }

    /// Saves this rank's shard of the state (give every rank its own path),
    /// with the rank and world size in the file's metadata.
    fn save_state(&self, path: &Path) -> Result<()> {
        let (r, w) = self.world();
        let shard = (w > 1).then_some((r, w));
        crate::io::save_state_sharded(path, self.state(), self.learning_rate(), shard)
    }

    /// Loads a state saved by [`Optimizer::save_state`] on this rank of a
    /// group of the same size; a file of another rank or world size, or
    /// whose shards do not fit `params`, is an error naming it.
    fn load_state(&mut self, path: &Path, params: &Tree) -> Result<()> {
        let (r, w) = self.world();
        let shard = (w > 1).then_some((r, w));
        let checked = if w > 1 {
            shard_shapes(params, w)?
        } else {
            params.clone()
        };
        let state = crate::io::load_state_sharded(path, &checked, self.slot_names(), shard)?;
        *self.state_mut() = state;
        Ok(())
    }
}
