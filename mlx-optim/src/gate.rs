//! Optimizer steps that the device applies or skips, with no host read
//! inside the step (PyTorch's fused optimizers taking `found_inf`).
//!
//! A float16 step whose gradients overflowed must leave the parameters, the
//! moments and the step count as they were. Deciding that on the host means
//! reading the overflow flag back in the middle of every step, so the host
//! waits there for the whole backward pass. Instead the step is built with
//! a *gate*: a 0-d float32 flag on the device, 1 to apply and 0 to keep.
//!
//! Why in the kernel and not `where(apply, new, old)`: the fused Adam(W)
//! kernel reads the gate itself (one more scalar binding) and, on a skip,
//! writes nothing when it updates in place. A select after it would cost a
//! second pass over every parameter and both moments each step (a third of
//! the step's optimizer traffic again) and would break the in-place update,
//! since the old state must then live until the select has read it. Rules
//! without a fused kernel (SGD, or Adam on other dtypes) fall back to that
//! select ([`Optimizer::apply_single_gated`]'s default): correct, slower.
//!
//! The step count: it stays a host integer (the schedules read it, and the
//! checkpoints save it), and counts the steps the host *knows* were
//! applied. The flags of the gated steps built since then wait in
//! [`crate::OptimizerState::pending`] until the host reads them, with the
//! step's loss, and settles them ([`crate::OptimizerState::settle`]). A
//! step built while `k` steps are pending may follow `0..=k` applied ones,
//! so its learning rate (and bias correction) is one of `k + 1`
//! candidates: the host computes each as it always did, and the device
//! picks the one whose index is the sum of the pending flags. With one
//! step in flight that is two candidates; without overlap, one.

use mlx_array::{Array, Dtype, where_};

use crate::Result;
use crate::optimizer::{Optimizer, StepContext};

/// What a gated step is told besides the gradient, parameter and slots:
/// the contexts of every step count it may have, and the device's choice.
#[derive(Clone, Debug)]
pub struct Gate {
    /// 0-d float32 on the device: 0 keeps the state, `j + 1` applies the
    /// step with `candidates[j]`.
    control: Array,
    candidates: Vec<StepContext>,
}

impl Gate {
    /// The gate of the next step of `opt` applied where `apply` (a 0-d
    /// float32 array holding exactly 1 or 0) is 1; the candidates follow
    /// the pending steps of its state.
    pub(crate) fn next<O: Optimizer + ?Sized>(
        opt: &O,
        apply: &Array,
        parameter_apart: bool,
    ) -> Result<Gate> {
        let known = opt.step();
        let pending = opt.state().pending();
        let candidates = (0..=pending.len() as u64)
            .map(|j| StepContext {
                learning_rate: opt.schedule().at(known + j),
                step: known + j + 1,
                parameter_apart,
            })
            .collect();
        let apply = apply.astype(Dtype::F32)?;
        // apply * (applied pending steps + 1), written without a constant
        // (a constant would travel to the GPU every step): apply * (sum +
        // apply) is 0 on a skip and sum + 1 otherwise.
        let control = match pending.split_first() {
            None => apply,
            Some((first, rest)) => {
                let mut sum = first.clone();
                for p in rest {
                    sum = sum.add(p)?;
                }
                apply.mul(&sum.add(&apply)?)?
            }
        };
        Ok(Gate {
            control,
            candidates,
        })
    }

    /// The device's choice (see the type's doc): what fused kernels bind.
    pub fn control(&self) -> &Array {
        &self.control
    }

    /// The contexts of the step counts the step may have, fewest first.
    pub fn candidates(&self) -> &[StepContext] {
        &self.candidates
    }
}

/// The gated update of one parameter by selection, for any rule: each
/// candidate's update built op by op, then `where` the control chooses it
/// (and the old parameter and slots where it says keep). Lazy.
pub(crate) fn select<O: Optimizer + ?Sized>(
    opt: &O,
    grad: &Array,
    param: &Array,
    slots: &[Array],
    gate: &Gate,
) -> Result<(Array, Vec<Array>)> {
    let mut param_out = param.clone();
    let mut slots_out = slots.to_vec();
    for (j, ctx) in gate.candidates().iter().enumerate() {
        let (p, s) = opt.apply_single(grad, param, slots, ctx)?;
        let chosen = gate
            .control()
            .equal(&gate.control().scalar_like((j + 1) as f64))?;
        param_out = where_(&chosen, &p, &param_out)?;
        for (out, new) in slots_out.iter_mut().zip(&s) {
            *out = where_(&chosen, new, out)?;
        }
    }
    Ok((param_out, slots_out))
}
