//! Optimizer state: the step count and the per-parameter moments.

use std::collections::BTreeMap;

use mlx_array::{Array, Evaluable, Tree};

use crate::Result;

/// What an optimizer remembers between updates: the number of updates applied
/// so far and, for every parameter that has received a gradient, its named
/// slots (`m` and `v` for Adam, `v` for SGD with momentum).
///
/// The slots mirror the parameter tree: the slot `m` of parameter
/// `layers.0.wq.weight` is named `layers.0.wq.weight.m`, exactly as
/// `tree_flatten(optimizer.state)` names it in MLX. State is created lazily on
/// the first update that brings a gradient for a parameter; a parameter that
/// never gets a gradient never gets state.
///
/// The slots are lazy arrays after an update; evaluate them together with
/// the parameters (`OptimizerState` is [`Evaluable`]):
///
/// ```
/// use mlx_array::{eval, Array, Dtype, Tree};
/// use mlx_optim::{Adam, Optimizer};
/// let mut params = Tree::unflatten([("w".to_string(), Array::ones(&[3], Dtype::F32))]).unwrap();
/// let grads = Tree::unflatten([("w".to_string(), Array::ones(&[3], Dtype::F32))]).unwrap();
/// let mut opt = Adam::new(1e-2);
/// opt.update_tree(&mut params, &grads).unwrap();
/// eval((&params, opt.state())).unwrap();
/// assert_eq!(opt.state().step(), 1);
/// assert_eq!(opt.state().flatten()[0].0, "w.m");
/// ```
#[derive(Clone, Debug, Default)]
pub struct OptimizerState {
    step: u64,
    params: BTreeMap<String, BTreeMap<String, Array>>,
    /// The gates of the steps built since the last settled one, oldest
    /// first (see [`crate::Gate`]): 0-d float32, 1 where the step applies.
    pending: Vec<Array>,
}

impl OptimizerState {
    /// Empty state at step 0.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of updates applied so far: with gated steps pending, those
    /// the host knows of (see [`OptimizerState::settle`]).
    pub fn step(&self) -> u64 {
        self.step
    }

    /// The apply flags of the gated steps whose outcome the host has not
    /// been told yet, oldest first (lazy 0-d float32 arrays, 1 or 0).
    pub fn pending(&self) -> &[Array] {
        &self.pending
    }

    /// Records a gated step built on this state (its flag `apply`).
    pub(crate) fn push_pending(&mut self, apply: Array) {
        self.pending.push(apply);
    }

    /// Tells the state the outcome of its oldest pending gated step (read
    /// from its flag, typically with the step's loss): the step count
    /// advances when it was `applied`. Fails when no step is pending.
    ///
    /// ```
    /// use mlx_array::{Array, Dtype, Tree};
    /// use mlx_optim::{Adam, Optimizer};
    /// let mut params = Tree::unflatten([("w".to_string(), Array::ones(&[2], Dtype::F32))]).unwrap();
    /// let grads = params.clone();
    /// let mut opt = Adam::new(0.1);
    /// let skip = Array::zeros(&[], Dtype::F32);
    /// let new = opt.apply_gradients_gated(&grads, &params, &skip).unwrap();
    /// assert_eq!(new.get_array("w").unwrap().to_vec::<f32>().unwrap(), [1.0, 1.0]);
    /// assert_eq!((opt.step(), opt.state().pending().len()), (0, 1));
    /// opt.state_mut().settle(false).unwrap();
    /// assert_eq!((opt.step(), opt.state().pending().len()), (0, 0));
    /// ```
    pub fn settle(&mut self, applied: bool) -> Result<()> {
        if self.pending.is_empty() {
            return Err(crate::Error::NothingToSettle);
        }
        self.pending.remove(0);
        self.step += u64::from(applied);
        Ok(())
    }

    /// Sets the step count (the schedules read it; see [`crate::Optimizer::step`]).
    pub fn set_step(&mut self, step: u64) {
        self.step = step;
    }

    /// The slot `slot` of parameter `param`, if it exists.
    pub fn get(&self, param: &str, slot: &str) -> Option<&Array> {
        self.params.get(param)?.get(slot)
    }

    /// Every slot of parameter `param`, by slot name.
    pub fn param(&self, param: &str) -> Option<&BTreeMap<String, Array>> {
        self.params.get(param)
    }

    /// Sets (or replaces) one slot of one parameter.
    pub fn set(&mut self, param: &str, slot: &str, value: Array) {
        self.params
            .entry(param.to_string())
            .or_default()
            .insert(slot.to_string(), value);
    }

    /// The parameters that have state, by dotted path.
    pub fn param_names(&self) -> impl Iterator<Item = &str> {
        self.params.keys().map(String::as_str)
    }

    /// True when no parameter has state yet.
    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// Every slot with its dotted name (`<parameter path>.<slot>`), sorted by
    /// parameter path then slot name.
    pub fn flatten(&self) -> Vec<(String, Array)> {
        self.params
            .iter()
            .flat_map(|(p, slots)| {
                slots
                    .iter()
                    .map(move |(s, a)| (format!("{p}.{s}"), a.clone()))
            })
            .collect()
    }

    /// The slots as a tree mirroring the parameters (each parameter becomes a
    /// map of its slots).
    pub fn tree(&self) -> Result<Tree> {
        Ok(Tree::unflatten(self.flatten())?)
    }

    /// Bytes held by the slots once evaluated.
    pub fn nbytes(&self) -> usize {
        self.params
            .values()
            .flat_map(|s| s.values())
            .map(Array::nbytes)
            .sum()
    }
}

impl Evaluable for OptimizerState {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        for slots in self.params.values() {
            out.extend(slots.values().cloned());
        }
        out.extend(self.pending.iter().cloned());
    }
}
