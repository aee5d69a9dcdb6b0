//! Adam and AdamW.

use mlx_array::{Array, Device, Dtype};

use crate::gate::{self, Gate};
use crate::optimizer::{Optimizer, ParamUpdate, StepContext};
use crate::schedule::Schedule;
use crate::state::OptimizerState;
use crate::{Result, fused};

/// The hyper-parameters Adam and AdamW share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamConfig {
    /// `(beta1, beta2)`, the decay of the running averages of the gradient
    /// and of its square. Default `(0.9, 0.999)`.
    pub betas: (f64, f64),
    /// Added to the denominator. Default `1e-8`.
    pub eps: f64,
    /// Divide the moments by `1 - beta^step`. Default `false`, as in MLX.
    pub bias_correction: bool,
    /// Use the single-pass fused kernel when the parameter, gradient and
    /// moments are all float32 (bit-identical to the op-by-op graph, about
    /// four times less memory traffic). Default `true`. The new parameter,
    /// `m` and `v` are then three views of one buffer, freed when all three
    /// are dropped.
    pub fused: bool,
    /// With the fused kernel, also write each new parameter cast to this
    /// dtype (float16 or bfloat16) in the same pass, recorded as the
    /// parameter's cast ([`mlx_array::Array::remember_cast`]): a
    /// mixed-precision forward pass that casts the float32 master weights
    /// (`mlx_nn::value_and_grad_in`) then reads the copies instead of
    /// casting every weight again, one kernel fewer per parameter a step
    /// on the GPU. The copies live as long as their parameters (two bytes a
    /// parameter). Default `None`.
    pub cast_copy: Option<Dtype>,
}

impl Default for AdamConfig {
    fn default() -> Self {
        AdamConfig {
            betas: (0.9, 0.999),
            eps: 1e-8,
            bias_correction: false,
            fused: true,
            cast_copy: None,
        }
    }
}

/// One Adam step on one parameter, with MLX's operation order and its
/// float32 arithmetic on the scalar coefficients. `decay` is AdamW's factor
/// `1 - lr * wd` (in float32), applied to the parameter first.
pub(crate) fn adam_single(
    cfg: &AdamConfig,
    grad: &Array,
    param: &Array,
    m: &Array,
    v: &Array,
    decay: Option<f32>,
    ctx: &StepContext,
) -> Result<(Array, Vec<Array>)> {
    let (b1, b2) = cfg.betas;
    check_cast_copy(cfg)?;
    if cfg.fused && fused::applies(&[param, grad, m, v]) {
        let c = coefficients(cfg, decay, ctx);
        let (p, m, v) = if ctx.parameter_apart {
            fused::adam_step_apart(c, param, grad, m, v)?
        } else {
            fused::adam_step(c, cfg.cast_copy, param, grad, m, v)?
        };
        return Ok((p, vec![m, v]));
    }
    let param = &match decay {
        Some(f) => param.mul_scalar(f as f64)?,
        None => param.clone(),
    };
    let m = m.mul_scalar(b1)?.add(&grad.mul_scalar(1.0 - b1)?)?;
    let v = v
        .mul_scalar(b2)?
        .add(&grad.square()?.mul_scalar(1.0 - b2)?)?;
    let lr = ctx.learning_rate as f32;
    let new = if cfg.bias_correction {
        let step = ctx.step as f32;
        let c1 = lr / (1.0 - (b1 as f32).powf(step));
        let c2 = (1.0 - (b2 as f32).powf(step)).sqrt();
        let numerator = m.mul_scalar(c1 as f64)?;
        let denominator = v.sqrt()?.div_scalar(c2 as f64)?.add_scalar(cfg.eps)?;
        param.sub(&numerator.div(&denominator)?)?
    } else {
        let numerator = m.mul_scalar(lr as f64)?;
        param.sub(&numerator.div(&v.sqrt()?.add_scalar(cfg.eps)?)?)?
    };
    Ok((new, vec![m, v]))
}

/// Fails when [`AdamConfig::cast_copy`] names no half-precision dtype.
fn check_cast_copy(cfg: &AdamConfig) -> Result<()> {
    match cfg.cast_copy {
        None | Some(Dtype::F16 | Dtype::BF16) => Ok(()),
        Some(d) => Err(mlx_array::Error::Invalid {
            op: "adam",
            message: format!("AdamConfig::cast_copy is float16 or bfloat16, not {d}"),
        }
        .into()),
    }
}

/// The fused kernel's coefficients of one step: the op-by-op graph's
/// float32 scalars.
pub(crate) fn coefficients(
    cfg: &AdamConfig,
    decay: Option<f32>,
    ctx: &StepContext,
) -> fused::AdamCoefficients {
    let (b1, b2) = cfg.betas;
    let lr = ctx.learning_rate as f32;
    let step = ctx.step as f32;
    let (numerator, denominator) = if cfg.bias_correction {
        (
            lr / (1.0 - (b1 as f32).powf(step)),
            Some((1.0 - (b2 as f32).powf(step)).sqrt()),
        )
    } else {
        (lr, None)
    };
    fused::AdamCoefficients {
        decay,
        b1: b1 as f32,
        one_minus_b1: (1.0 - b1) as f32,
        b2: b2 as f32,
        one_minus_b2: (1.0 - b2) as f32,
        numerator,
        denominator,
        eps: cfg.eps as f32,
    }
}

/// The fused kernel's coefficients of a gated step: one candidate per
/// step count the gate may choose, `decay` giving AdamW's factor for each.
fn gated_coefficients(
    cfg: &AdamConfig,
    decay: &impl Fn(&StepContext) -> Option<f32>,
    gate: &Gate,
) -> fused::StepCoefficients {
    fused::StepCoefficients {
        candidates: gate
            .candidates()
            .iter()
            .map(|ctx| coefficients(cfg, decay(ctx), ctx))
            .collect(),
        gated: true,
    }
}

/// A gated Adam step on one parameter (see [`Gate`]): the fused kernel
/// reading the gate when it applies, else [`gate::select`] over the
/// op-by-op rule. `decay` gives AdamW's factor for a step's context.
#[allow(clippy::too_many_arguments)]
fn adam_gated<O: Optimizer + ?Sized>(
    opt: &O,
    cfg: &AdamConfig,
    grad: &Array,
    param: &Array,
    slots: &[Array],
    decay: impl Fn(&StepContext) -> Option<f32>,
    gate: &Gate,
) -> Result<(Array, Vec<Array>)> {
    let (m, v) = (&slots[0], &slots[1]);
    check_cast_copy(cfg)?;
    if !(cfg.fused && fused::applies(&[param, grad, m, v])) {
        return gate::select(opt, grad, param, slots, gate);
    }
    let c = gated_coefficients(cfg, &decay, gate);
    let control = Some(gate.control());
    let apart = gate.candidates()[0].parameter_apart;
    let (p, m, v) = if apart {
        fused::adam_step_apart_with(c, control, param, grad, m, v)?
    } else {
        fused::adam_step_with(c, control, cfg.cast_copy, param, grad, m, v)?
    };
    Ok((p, vec![m, v]))
}

/// Adam(W) over several parameters of one step: those the fused kernel
/// takes whole (float32 throughout, the parameter kept with its moments)
/// and may step in place (their state the rows of an earlier fused step's
/// buffer: [`fused::state_in_rows`]), when the step is built for the GPU,
/// go into one fused node, which the GPU steps many parameters a dispatch
/// (`fused/group.rs`); the others,
/// and every one on the CPU (where a kernel launch costs nothing and each
/// parameter's node may run as soon as its gradient exists), step alone
/// through `single`. `c` and `control`: the fused step's coefficients and
/// a gated step's control.
fn adam_many(
    cfg: &AdamConfig,
    updates: &[ParamUpdate<'_>],
    apart: bool,
    c: impl FnOnce() -> fused::StepCoefficients,
    control: Option<&Array>,
    single: impl Fn(&ParamUpdate<'_>) -> Result<(Array, Vec<Array>)>,
) -> Result<Vec<(Array, Vec<Array>)>> {
    check_cast_copy(cfg)?;
    let on_gpu = mlx_array::device::default_device() == Device::Gpu;
    let grouped = |u: &ParamUpdate<'_>| {
        cfg.fused
            && !apart
            && on_gpu
            && fused::applies(&[u.param, u.grad, &u.slots[0], &u.slots[1]])
            && fused::state_in_rows(u.param, &u.slots[0], &u.slots[1])
    };
    let members: Vec<usize> = (0..updates.len())
        .filter(|&i| grouped(&updates[i]))
        .collect();
    if members.len() < 2 {
        return updates.iter().map(single).collect();
    }
    let c = c();
    let mut stepped = Vec::with_capacity(members.len());
    for chunk in group_chunks(&members, |i| updates[i].param.size()) {
        let inputs: Vec<[&Array; 4]> = chunk
            .iter()
            .map(|&i| {
                let u = &updates[i];
                [u.param, u.grad, &u.slots[0], &u.slots[1]]
            })
            .collect();
        stepped.extend(fused::adam_group_with(
            c.clone(),
            control,
            cfg.cast_copy,
            &inputs,
        )?);
    }
    let mut stepped = stepped.into_iter().map(|(p, m, v)| (p, vec![m, v]));
    let mut next_member = members.iter().peekable();
    let mut out = Vec::with_capacity(updates.len());
    for (i, u) in updates.iter().enumerate() {
        if next_member.next_if_eq(&&i).is_some() {
            out.push(stepped.next().expect("one result per member"));
        } else {
            out.push(single(u)?);
        }
    }
    Ok(out)
}

/// How many groups a step's grouped parameters make at least: a group's
/// node runs once its last gradient exists, so its members' gradients live
/// until then, and a group holding an eighth of the elements keeps at most
/// an eighth of the gradients alive longer than stepping alone would.
const GROUPS: usize = 8;

/// `members` (in the gradients' order, which keeps a layer's parameters
/// together) cut into consecutive groups of at most an [`GROUPS`]th of
/// their elements (`size` of each), or one member where it alone is more.
fn group_chunks(members: &[usize], size: impl Fn(usize) -> usize) -> Vec<&[usize]> {
    let total: usize = members.iter().map(|&i| size(i)).sum();
    let budget = total.div_ceil(GROUPS);
    let mut chunks = Vec::new();
    let (mut start, mut held) = (0, 0);
    for (k, &i) in members.iter().enumerate() {
        if k > start && held + size(i) > budget {
            chunks.push(&members[start..k]);
            (start, held) = (k, 0);
        }
        held += size(i);
    }
    if start < members.len() {
        chunks.push(&members[start..]);
    }
    chunks
}

/// [`adam_many`] for an ungated step with AdamW's `decay` (none for Adam).
fn adam_many_step<O: Optimizer + ?Sized>(
    opt: &O,
    cfg: &AdamConfig,
    updates: &[ParamUpdate<'_>],
    decay: Option<f32>,
    ctx: &StepContext,
) -> Result<Vec<(Array, Vec<Array>)>> {
    adam_many(
        cfg,
        updates,
        ctx.parameter_apart,
        || fused::StepCoefficients::always(coefficients(cfg, decay, ctx)),
        None,
        |u| opt.apply_single(u.grad, u.param, u.slots, ctx),
    )
}

/// [`adam_many`] for a gated step; `decay` gives AdamW's factor for a
/// step's context.
fn adam_many_gated<O: Optimizer + ?Sized>(
    opt: &O,
    cfg: &AdamConfig,
    updates: &[ParamUpdate<'_>],
    decay: impl Fn(&StepContext) -> Option<f32>,
    gate: &Gate,
) -> Result<Vec<(Array, Vec<Array>)>> {
    adam_many(
        cfg,
        updates,
        gate.candidates()[0].parameter_apart,
        || gated_coefficients(cfg, &decay, gate),
        Some(gate.control()),
        |u| opt.apply_single_gated(u.grad, u.param, u.slots, gate),
    )
}

/// Adam as in MLX (`mlx.optimizers.Adam`):
///
/// ```text
/// m = b1 * m + (1 - b1) * g
/// v = b2 * v + (1 - b2) * g^2
/// w = w - lr * m / (sqrt(v) + eps)                                    (default)
/// w = w - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)     (bias_correction)
/// ```
///
/// `m` and `v` start at zero; `t` counts updates from 1.
///
/// ```
/// use mlx_optim::{Adam, AdamConfig, Optimizer};
/// let opt = Adam::new(1e-3).betas(0.9, 0.95).bias_correction(true);
/// assert_eq!(opt.config().betas, (0.9, 0.95));
/// assert_eq!(opt.slot_names(), &["m", "v"]);
/// ```
#[derive(Clone, Debug)]
pub struct Adam {
    schedule: Schedule,
    config: AdamConfig,
    state: OptimizerState,
}

impl Adam {
    /// Adam with the given learning rate (a number or a [`Schedule`]) and MLX's defaults.
    pub fn new(learning_rate: impl Into<Schedule>) -> Self {
        Adam {
            schedule: learning_rate.into(),
            config: AdamConfig::default(),
            state: OptimizerState::new(),
        }
    }

    /// Replaces every shared hyper-parameter.
    pub fn with_config(mut self, config: AdamConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets `(beta1, beta2)`.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.config.betas = (beta1, beta2);
        self
    }

    /// Sets epsilon.
    pub fn eps(mut self, eps: f64) -> Self {
        self.config.eps = eps;
        self
    }

    /// Enables or disables bias correction.
    pub fn bias_correction(mut self, on: bool) -> Self {
        self.config.bias_correction = on;
        self
    }

    /// Enables or disables the fused float32 kernel (see [`AdamConfig::fused`]).
    pub fn fused(mut self, on: bool) -> Self {
        self.config.fused = on;
        self
    }

    /// Has the fused kernel also write each new parameter cast to `dtype`
    /// (see [`AdamConfig::cast_copy`]).
    pub fn cast_copy(mut self, dtype: Option<Dtype>) -> Self {
        self.config.cast_copy = dtype;
        self
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }
}

/// AdamW as in MLX (`mlx.optimizers.AdamW`): Adam applied to the decayed
/// parameter `w * (1 - lr * weight_decay)` (decoupled weight decay).
/// Default weight decay 0.01; with weight decay 0 it is exactly Adam.
///
/// ```
/// use mlx_optim::{AdamW, Optimizer};
/// let opt = AdamW::new(3e-4).weight_decay(0.1);
/// assert_eq!(opt.weight_decay_value(), 0.1);
/// assert_eq!(opt.learning_rate(), 3e-4);
/// ```
#[derive(Clone, Debug)]
pub struct AdamW {
    schedule: Schedule,
    config: AdamConfig,
    weight_decay: f64,
    state: OptimizerState,
}

impl AdamW {
    /// AdamW with the given learning rate and MLX's defaults (weight decay 0.01).
    pub fn new(learning_rate: impl Into<Schedule>) -> Self {
        AdamW {
            schedule: learning_rate.into(),
            config: AdamConfig::default(),
            weight_decay: 0.01,
            state: OptimizerState::new(),
        }
    }

    /// Replaces every hyper-parameter shared with Adam.
    pub fn with_config(mut self, config: AdamConfig) -> Self {
        self.config = config;
        self
    }

    /// Sets `(beta1, beta2)`.
    pub fn betas(mut self, beta1: f64, beta2: f64) -> Self {
        self.config.betas = (beta1, beta2);
        self
    }

    /// Sets epsilon.
    pub fn eps(mut self, eps: f64) -> Self {
        self.config.eps = eps;
        self
    }

    /// Enables or disables bias correction.
    pub fn bias_correction(mut self, on: bool) -> Self {
        self.config.bias_correction = on;
        self
    }

    /// Enables or disables the fused float32 kernel (see [`AdamConfig::fused`]).
    pub fn fused(mut self, on: bool) -> Self {
        self.config.fused = on;
        self
    }

    /// Has the fused kernel also write each new parameter cast to `dtype`
    /// (see [`AdamConfig::cast_copy`]).
    pub fn cast_copy(mut self, dtype: Option<Dtype>) -> Self {
        self.config.cast_copy = dtype;
        self
    }

    /// Sets the decoupled weight decay.
    pub fn weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// The weight decay.
    pub fn weight_decay_value(&self) -> f64 {
        self.weight_decay
    }

    /// The hyper-parameters shared with Adam.
    pub fn config(&self) -> &AdamConfig {
        &self.config
    }

    /// MLX's decay of the parameter in a step: `1 - lr * weight_decay`,
    /// the scalar in float32 (none without weight decay).
    pub(crate) fn decay(&self, ctx: &StepContext) -> Option<f32> {
        (self.weight_decay != 0.0)
            .then_some(1.0f32 - ctx.learning_rate as f32 * self.weight_decay as f32)
    }
}

macro_rules! common_impl {
    () => {
        fn slot_names(&self) -> &[&'static str] {
            &["m", "v"]
        }

        fn schedule(&self) -> &Schedule {
            &self.schedule
        }

        fn set_schedule(&mut self, schedule: Schedule) {
            self.schedule = schedule;
        }

        fn state(&self) -> &OptimizerState {
            &self.state
        }

        fn state_mut(&mut self) -> &mut OptimizerState {
            &mut self.state
        }
    };
}

impl Optimizer for Adam {
    common_impl!();

    fn apply_single(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        ctx: &StepContext,
    ) -> Result<(Array, Vec<Array>)> {
        adam_single(&self.config, grad, param, &slots[0], &slots[1], None, ctx)
    }

    fn apply_single_gated(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        gate: &Gate,
    ) -> Result<(Array, Vec<Array>)> {
        adam_gated(self, &self.config, grad, param, slots, |_| None, gate)
    }

    fn apply_many(
        &self,
        updates: &[ParamUpdate<'_>],
        ctx: &StepContext,
    ) -> Result<Vec<(Array, Vec<Array>)>> {
        adam_many_step(self, &self.config, updates, None, ctx)
    }

    fn apply_many_gated(
        &self,
        updates: &[ParamUpdate<'_>],
        gate: &Gate,
    ) -> Result<Vec<(Array, Vec<Array>)>> {
        adam_many_gated(self, &self.config, updates, |_| None, gate)
    }
}

impl Optimizer for AdamW {
    common_impl!();

    fn apply_single(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        ctx: &StepContext,
    ) -> Result<(Array, Vec<Array>)> {
        adam_single(
            &self.config,
            grad,
            param,
            &slots[0],
            &slots[1],
            self.decay(ctx),
            ctx,
        )
    }

    fn apply_single_gated(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        gate: &Gate,
    ) -> Result<(Array, Vec<Array>)> {
        let decay = |ctx: &StepContext| self.decay(ctx);
        adam_gated(self, &self.config, grad, param, slots, decay, gate)
    }

    fn apply_many(
        &self,
        updates: &[ParamUpdate<'_>],
        ctx: &StepContext,
    ) -> Result<Vec<(Array, Vec<Array>)>> {
        adam_many_step(self, &self.config, updates, self.decay(ctx), ctx)
    }

    fn apply_many_gated(
        &self,
        updates: &[ParamUpdate<'_>],
        gate: &Gate,
    ) -> Result<Vec<(Array, Vec<Array>)>> {
        let decay = |ctx: &StepContext| self.decay(ctx);
        adam_many_gated(self, &self.config, updates, decay, gate)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The groups of members of `sizes`, as lists of sizes.
    fn groups(sizes: &[usize]) -> Vec<Vec<usize>> {
        let members: Vec<usize> = (0..sizes.len()).collect();
        group_chunks(&members, |i| sizes[i])
            .into_iter()
            .map(|c| c.iter().map(|&i| sizes[i]).collect())
            .collect()
    }

    #[test]
    fn groups_hold_an_eighth_of_the_elements_in_order() {
        // 64 elements: groups of at most 8.
        assert_eq!(groups(&[4; 16]), vec![vec![4, 4]; 8]);
        assert_eq!(groups(&[3; 16]), vec![vec![3, 3]; 8]);
        // 123 elements, groups of at most 16: a member larger than that
        // stands alone; order is kept.
        assert_eq!(
            groups(&[1, 100, 1, 1, 5, 6, 9]),
            [vec![1], vec![100], vec![1, 1, 5, 6], vec![9]]
        );
        assert_eq!(groups(&[7]), [vec![7]]);
        assert!(groups(&[]).is_empty());
    }
}
