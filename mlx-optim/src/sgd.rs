//! Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

use mlx_array::Array;

use crate::optimizer::{Optimizer, StepContext};
use crate::schedule::Schedule;
use crate::state::OptimizerState;
use crate::{Error, Result};

/// SGD as in MLX (`mlx.optimizers.SGD`):
///
/// ```text
/// g = g + weight_decay * w                     (if weight_decay != 0)
/// w = w - lr * g                               (if momentum == 0)
/// v = momentum * v + (1 - dampening) * g       (v starts at zero)
/// w = w - lr * (nesterov ? g + momentum * v : v)
/// ```
///
/// Defaults: momentum 0, weight decay 0, dampening 0, no Nesterov. Without
/// momentum it keeps no per-parameter state (MLX keeps an unused zero `v`).
///
/// ```
/// use mlx_optim::{Optimizer, Sgd};
/// let opt = Sgd::new(0.1).momentum(0.9).nesterov(true);
/// assert_eq!(opt.slot_names(), &["v"]);
/// ```
#[derive(Clone, Debug)]
pub struct Sgd {
    schedule: Schedule,
    momentum: f64,
    weight_decay: f64,
    dampening: f64,
    nesterov: bool,
    state: OptimizerState,
}

impl Sgd {
    /// SGD with the given learning rate (a number or a [`Schedule`]) and MLX's defaults.
    pub fn new(learning_rate: impl Into<Schedule>) -> Self {
        Sgd {
            schedule: learning_rate.into(),
            momentum: 0.0,
            weight_decay: 0.0,
            dampening: 0.0,
            nesterov: false,
            state: OptimizerState::new(),
        }
    }

    /// Sets the momentum strength (default 0).
    pub fn momentum(mut self, momentum: f64) -> Self {
        self.momentum = momentum;
        self
    }

    /// Sets the L2 weight decay added to the gradient (default 0).
    pub fn weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }

    /// Sets the dampening of the momentum (default 0).
    pub fn dampening(mut self, dampening: f64) -> Self {
        self.dampening = dampening;
        self
    }

    /// Enables Nesterov momentum (needs momentum > 0 and no dampening).
    pub fn nesterov(mut self, nesterov: bool) -> Self {
        self.nesterov = nesterov;
        self
    }
}

impl Optimizer for Sgd {
    fn slot_names(&self) -> &[&'static str] {
        if self.momentum > 0.0 { &["v"] } else { &[] }
    }

    fn validate(&self) -> Result<()> {
        if self.nesterov && (self.momentum <= 0.0 || self.dampening != 0.0) {
            return Err(Error::Config(
                "SGD: Nesterov momentum requires a momentum and zero dampening".into(),
            ));
        }
        Ok(())
    }

    fn apply_single(
        &self,
        grad: &Array,
        param: &Array,
        slots: &[Array],
        ctx: &StepContext,
    ) -> Result<(Array, Vec<Array>)> {
        let lr = ctx.learning_rate;
        let g = if self.weight_decay != 0.0 {
            grad.add(&param.mul_scalar(self.weight_decay)?)?
        } else {
            grad.clone()
        };
        if self.momentum <= 0.0 {
            return Ok((param.sub(&g.mul_scalar(lr)?)?, vec![]));
        }
        let v = slots[0].mul_scalar(self.momentum)?;
        let v = if self.dampening > 0.0 {
            v.add(&g.mul_scalar(1.0 - self.dampening)?)?
        } else {
            v.add(&g)?
        };
        let update = if self.nesterov {
            g.add(&v.mul_scalar(self.momentum)?)?
        } else {
            v.clone()
        };
        Ok((param.sub(&update.mul_scalar(lr)?)?, vec![v]))
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
}
