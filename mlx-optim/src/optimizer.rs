//! The [`Optimizer`] trait: per-parameter rules applied over parameter trees.

use std::collections::HashMap;
use std::path::Path;

use mlx_array::{Array, Tree};

use crate::gate::{self, Gate};
use crate::schedule::Schedule;
use crate::state::OptimizerState;
use crate::{Error, Result};

/// What an update rule is told besides the gradient, parameter and slots.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepContext {
    /// The learning rate of this update: the schedule at the step count
    /// before the update (so the first update uses `schedule.at(0)`).
    pub learning_rate: f64,
    /// The step count including this update (1 for the first update), as
    /// MLX's `self.step` inside `apply_single`; used by bias correction.
    pub step: u64,
    /// The parameter given to the rule is a shard that will be gathered into
    /// a new buffer (see [`crate::Sharded`]), so the new parameter should
    /// not share a buffer with the slots that outlive the step.
    pub parameter_apart: bool,
}

/// One parameter's inputs to an update: what
/// [`Optimizer::apply_single`] takes, for [`Optimizer::apply_many`].
#[derive(Clone, Copy, Debug)]
pub struct ParamUpdate<'a> {
    /// The gradient.
    pub grad: &'a Array,
    /// The parameter.
    pub param: &'a Array,
    /// Its slots, in the order of [`Optimizer::slot_names`].
    pub slots: &'a [Array],
}

/// An optimizer over parameter trees, with MLX's semantics.
///
/// An implementation supplies the per-parameter rule ([`Optimizer::apply_single`]),
/// the names of its per-parameter slots, and access to its schedule and
/// state; the tree-level methods come for free.
///
/// The update is lazy: [`Optimizer::apply_gradients`] returns new parameter
/// arrays and stores new slot arrays without computing anything. Evaluate the
/// parameters and [`Optimizer::state`] together:
///
/// ```
/// use mlx_array::{eval, Array, Dtype, Tree};
/// use mlx_optim::{AdamW, Optimizer};
/// let mut params = Tree::unflatten([
///     ("w".to_string(), Array::ones(&[2, 2], Dtype::F32)),
///     ("b".to_string(), Array::zeros(&[2], Dtype::F32)),
/// ]).unwrap();
/// // Only `w` has a gradient: `b` is left untouched and gets no state.
/// let grads = Tree::unflatten([("w".to_string(), Array::ones(&[2, 2], Dtype::F32))]).unwrap();
/// let mut opt = AdamW::new(1e-3);
/// opt.update_tree(&mut params, &grads).unwrap();
/// eval((&params, opt.state())).unwrap();
/// assert!(opt.state().param("b").is_none());
/// ```
///
/// With a module (`mlx-nn`), the MLX-style `optimizer.update(model, grads)` is
/// one line over [`Optimizer::apply_gradients`]:
/// `model.update(opt.apply_gradients(&grads, &model.trainable_parameters())?)`.
/// The name `update` is left free for that module-level method; over plain
/// trees use [`Optimizer::update_tree`].
pub trait Optimizer {
    /// The names of the slots each parameter gets (`["m", "v"]` for Adam);
    /// empty for a stateless rule.
    fn slot_names(&self) -> &[&'static str];

    /// The update of one parameter: returns the new parameter and the new
    /// slots, in the order of [`Optimizer::slot_names`].
    fn apply_single(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        ctx: &StepContext,
    ) -> Result<(Array, Vec<Array>)>;

    /// The update of one parameter in a gated step (see [`Gate`]): the
    /// new parameter and slots where the gate applies the step (with the
    /// candidate context it chooses), the given ones where it keeps them.
    /// The default builds every candidate op by op and selects; rules
    /// with a fused kernel read the gate inside it.
    fn apply_single_gated(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        gate: &Gate,
    ) -> Result<(Array, Vec<Array>)> {
        gate::select(self, grad, param, slots, gate)
    }

    /// The updates of several parameters of one step, in order: each the
    /// new parameter and slots of [`Optimizer::apply_single`]. The default
    /// applies each alone; a rule may build them together (Adam(W)'s
    /// fused kernel steps many parameters a dispatch on the GPU), with the
    /// same values.
    fn apply_many(
        &self,
        updates: &[ParamUpdate<'_>],
        ctx: &StepContext,
    ) -> Result<Vec<(Array, Vec<Array>)>> {
        updates
            .iter()
            .map(|u| self.apply_single(u.grad, u.param, u.slots, ctx))
            .collect()
    }

    /// [`Optimizer::apply_many`] for a gated step: each the result of
    /// [`Optimizer::apply_single_gated`].
    fn apply_many_gated(
        &self,
        updates: &[ParamUpdate<'_>],
        gate: &Gate,
    ) -> Result<Vec<(Array, Vec<Array>)>> {
        updates
            .iter()
            .map(|u| self.apply_single_gated(u.grad, u.param, u.slots, gate))
            .collect()
    }

    /// The learning-rate schedule.
    fn schedule(&self) -> &Schedule;

    /// Replaces the learning-rate schedule (a number converts to a constant).
    fn set_schedule(&mut self, schedule: Schedule);

    /// The step count and per-parameter slots.
    fn state(&self) -> &OptimizerState;

    /// Mutable access to the state.
    fn state_mut(&mut self) -> &mut OptimizerState;

    /// Checks the hyper-parameters; called before every update.
    fn validate(&self) -> Result<()> {
        Ok(())
    }

    /// The initial value of slot `slot` for a parameter with gradient `grad`
    /// (MLX: zeros like the gradient).
    fn init_slot(&self, slot: &str, grad: &Array) -> Result<Array> {
        let _ = slot;
        Ok(mlx_array::zeros_like(grad))
    }

    /// Number of updates applied so far.
    fn step(&self) -> u64 {
        self.state().step()
    }

    /// The learning rate of the most recent update (before any update, the
    /// one the first update will use), as MLX's `optimizer.learning_rate`.
    fn learning_rate(&self) -> f64 {
        self.schedule().at(self.step().saturating_sub(1))
    }

    /// The learning rate the next update will use: the schedule at the
    /// step count (what [`Optimizer::learning_rate`] returns after it).
    /// A step's log reads this before its update.
    fn next_learning_rate(&self) -> f64 {
        self.schedule().at(self.step())
    }

    /// Sets a constant learning rate (replacing any schedule).
    fn set_learning_rate(&mut self, learning_rate: f64) {
        self.set_schedule(learning_rate.into());
    }

    /// Creates the state of every parameter in `params` that has none yet
    /// (optional: updates create state lazily).
    fn init(&mut self, params: &Tree) -> Result<()> {
        let names: Vec<&'static str> = self.slot_names().to_vec();
        for (path, p) in params.flatten() {
            for slot in &names {
                if self.state().get(&path, slot).is_none() {
                    let v = self.init_slot(slot, &p)?;
                    self.state_mut().set(&path, slot, v);
                }
            }
        }
        Ok(())
    }

    /// Applies `grads` to `params` and returns the updated parameters as a
    /// tree with the structure of `grads` (MLX's `apply_gradients`).
    ///
    /// `params` may hold more parameters than `grads` (those are neither
    /// returned nor given state); a gradient without a parameter, or of
    /// another shape, is an error naming it. Increments the step. On error
    /// the state is unchanged.
    fn apply_gradients(&mut self, grads: &Tree, params: &Tree) -> Result<Tree> {
        apply_tree(self, grads, params, None)
    }

    /// [`Optimizer::apply_gradients`] decided on the device: where `apply`
    /// (a 0-d float32 array holding exactly 1 or 0, typically "the
    /// gradients are finite") is 0 the returned parameters and the new
    /// slots equal the old ones, bit for bit. Nothing is read back: the
    /// step is recorded as pending in the state, and the step count
    /// advances when the host settles it
    /// ([`OptimizerState::settle`]) with the flag's value.
    fn apply_gradients_gated(
        &mut self,
        grads: &Tree,
        params: &Tree,
        apply: &Array,
    ) -> Result<Tree> {
        apply_tree(self, grads, params, Some(apply))
    }

    /// Applies `grads` and writes the updated arrays into `params` in place
    /// (parameters without a gradient keep their arrays): MLX's
    /// `optimizer.update(model, grads)` for a plain parameter tree.
    fn update_tree(&mut self, params: &mut Tree, grads: &Tree) -> Result<()> {
        let updated = self.apply_gradients(grads, params)?;
        for (path, a) in updated.flatten() {
            crate::tree_util::replace_leaf(params, &path, a)?;
        }
        Ok(())
    }

    /// Saves the step count and every slot to a safetensors file (names
    /// `step`, `learning_rate` and `<parameter>.<slot>`), evaluating them.
    fn save_state(&self, path: &Path) -> Result<()> {
        crate::io::save_state(path, self.state(), self.learning_rate())
    }

    /// Loads state saved by [`Optimizer::save_state`], checking it against
    /// `params` (pass the parameters being trained): a slot for a parameter
    /// `params` lacks, a parameter of `params` without its slots, or a slot of
    /// another shape is an error naming the parameter. Replaces the state
    /// only on success.
    fn load_state(&mut self, path: &Path, params: &Tree) -> Result<()> {
        let state = crate::io::load_state(path, params, self.slot_names())?;
        *self.state_mut() = state;
        Ok(())
    }
}

/// [`Optimizer::apply_gradients`], gated by `apply` when given (see
/// [`Optimizer::apply_gradients_gated`]).
fn apply_tree<O: Optimizer + ?Sized>(
    opt: &mut O,
    grads: &Tree,
    params: &Tree,
    apply: Option<&Array>,
) -> Result<Tree> {
    opt.validate()?;
    let step = opt.step();
    let gate = match apply {
        Some(a) => Some(Gate::next(opt, a, false)?),
        None if !opt.state().pending().is_empty() => {
            return Err(Error::Unsettled(
                "an ungated step",
                opt.state().pending().len(),
            ));
        }
        None => None,
    };
    let ctx = StepContext {
        learning_rate: opt.next_learning_rate(),
        step: step + 1,
        parameter_apart: false,
    };
    let names: Vec<&'static str> = opt.slot_names().to_vec();
    let mut inputs = Vec::new();
    for (path, g) in grads.flatten() {
        let p = params
            .get_array(&path)
            .ok_or_else(|| Error::NoParameter(path.clone()))?;
        if p.shape() != g.shape() {
            return Err(Error::GradientShape {
                param: path,
                expected: p.shape().to_vec(),
                grad: g.shape().to_vec(),
            });
        }
        let slots = names
            .iter()
            .map(|s| match opt.state().get(&path, s) {
                Some(a) => Ok(a.clone()),
                None => opt.init_slot(s, &g),
            })
            .collect::<Result<Vec<_>>>()?;
        inputs.push((path, g, p, slots));
    }
    let updates: Vec<ParamUpdate> = inputs
        .iter()
        .map(|(_, grad, param, slots)| ParamUpdate { grad, param, slots })
        .collect();
    let results = match &gate {
        Some(gate) => opt.apply_many_gated(&updates, gate)?,
        None => opt.apply_many(&updates, &ctx)?,
    };
    if results.len() != inputs.len() {
        return Err(Error::Config(format!(
            "the rule's apply_many returned {} updates for {} parameters",
            results.len(),
            inputs.len()
        )));
    }
    let mut new_params: HashMap<String, Array> = HashMap::new();
    let mut new_slots = Vec::new();
    for ((path, ..), (np, ns)) in inputs.into_iter().zip(results) {
        debug_assert_eq!(ns.len(), names.len());
        new_slots.push((path.clone(), ns));
        new_params.insert(path, np);
    }
    let state = opt.state_mut();
    for (path, slots) in new_slots {
        for (name, a) in names.iter().zip(slots) {
            state.set(&path, name, a);
        }
    }
    match apply {
        Some(a) => state.push_pending(a.astype(mlx_array::Dtype::F32)?),
        None => state.set_step(step + 1),
    }
    Ok(grads.map(|path, _| Ok(new_params[path].clone()))?)
}
