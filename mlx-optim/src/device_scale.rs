//! The dynamic loss scale on the device (PyTorch's `GradScaler` with
//! `_amp_update_scale_`): the float16 step's overflow decision, the
//! scale's growth and backoff, all lazy, so that a step never waits for
//! the device in its middle.
//!
//! [`crate::LossScaler`] decides on the host, which needs the overflow flag
//! read back before the optimizer step can be built. [`DeviceLossScaler`]
//! keeps the scale and its count of good steps as 0-d float32 arrays and
//! updates them on the device from the flag (one kernel,
//! `crate::scale_update`); the flag gates the optimizer
//! step ([`crate::Optimizer::apply_gradients_gated`]). The host learns each
//! step's outcome later, when it reads the flag (with the step's loss), and
//! [`DeviceLossScaler::settle`]s it: the settled [`crate::LossScaler`] then
//! holds exactly what the host scaler would (its scale, skipped steps and
//! good steps), for metrics and checkpoints.
//!
//! ```
//! use mlx_array::{eval, Array, Tree};
//! use mlx_optim::{DeviceLossScaler, LossScaler};
//! let mut s = DeviceLossScaler::new(LossScaler::with(8.0, 2)).unwrap();
//! let grads = |v: f32| Tree::unflatten([("w".to_string(), Array::from_slice(&[v], &[1]).unwrap())]).unwrap();
//! let (unscaled, finite) = s.check(&grads(16.0), Ok).unwrap();
//! eval((&unscaled, &finite, &s)).unwrap();
//! assert_eq!(unscaled.get_array("w").unwrap().to_vec::<f32>().unwrap(), [2.0]);
//! assert_eq!(finite.item::<f32>().unwrap(), 1.0);
//! let (_, finite) = s.check(&grads(f32::INFINITY), Ok).unwrap();
//! assert_eq!(finite.item::<f32>().unwrap(), 0.0);
//! assert_eq!(s.scale().item::<f32>().unwrap(), 4.0); // halved on the device
//! assert!(s.settle(true) && !s.settle(false));
//! assert_eq!((s.settled().scale(), s.settled().skipped()), (4.0, 1));
//! ```

use mlx_array::{Array, Dtype, Evaluable, Tree};

use crate::loss_scale::LossScaler;
use crate::{Error, Result};

/// The largest growth interval a float32 count of good steps reaches
/// exactly (2^24).
const MAX_GROWTH_INTERVAL: u64 = 1 << 24;

/// A loss scale decided on the device; see the module's documentation.
///
/// The device keeps the scale in float32: it equals the host scaler's
/// while that is a normal float32 (2^-126 to 2^127; a run needing more
/// than a hundred halvings in a row has diverged anyway).
#[derive(Clone, Debug)]
pub struct DeviceLossScaler {
    /// The state after the last settled step (the host's knowledge).
    settled: LossScaler,
    /// The scale the next step multiplies its loss by (0-d float32).
    scale: Array,
    /// Finite steps in a row since the last change of the scale (0-d float32).
    good_steps: Array,
    /// `1 / scale` (0-d float32), computed with the scale.
    inverse: Array,
    /// 0-d float32 zero, placed on the device once (a host constant would
    /// travel to the GPU in every step).
    zero: Array,
}

impl DeviceLossScaler {
    /// Continues from `settled` (a fresh [`LossScaler`], or one resumed
    /// from a checkpoint). Fails when its growth interval is 0 or exceeds
    /// 2^24 (the device counts good steps in float32), or its scale is not
    /// a positive float32 (a checkpoint's `loss_scale.json` may hold
    /// anything: a scale of 0 would zero every gradient, a negative one
    /// turn training uphill).
    pub fn new(settled: LossScaler) -> Result<DeviceLossScaler> {
        let scale = settled.scale();
        if !(scale > 0.0 && (scale as f32).is_finite() && (scale as f32) > 0.0) {
            return Err(Error::Config(format!(
                "a loss scale must be a positive, finite float32, not {scale}"
            )));
        }
        if settled.growth_interval() == 0 {
            return Err(Error::Config(
                "a loss scale's growth interval must be at least 1 step".into(),
            ));
        }
        if settled.growth_interval() > MAX_GROWTH_INTERVAL {
            return Err(Error::Config(format!(
                "a device-side loss scale grows after at most {MAX_GROWTH_INTERVAL} good steps, not {}",
                settled.growth_interval()
            )));
        }
        let device = mlx_array::default_device();
        let put = |v: f64| Array::full(&[], v, Dtype::F32).to_device(device);
        let scale = put(settled.scale());
        Ok(DeviceLossScaler {
            inverse: put(1.0).div(&scale)?,
            scale,
            good_steps: put(settled.good_steps() as f64),
            zero: put(0.0),
            settled,
        })
    }

    /// The scale the next step multiplies its loss by (0-d float32; lazy
    /// after [`DeviceLossScaler::check`]).
    pub fn scale(&self) -> &Array {
        &self.scale
    }

    /// The state as of the last settled step: the host's view of the
    /// scale, the skipped steps and the good steps in a row.
    pub fn settled(&self) -> &LossScaler {
        &self.settled
    }

    /// Checks a step's (scaled) `grads`: returns them divided by the scale
    /// and the step's flag, a 0-d float32 that is 1 when every gradient is
    /// finite on every rank and 0 otherwise; `sum_over_ranks` sums the
    /// ranks' non-finite flags (`Ok` on one rank, `mlx_dist::all_sum`
    /// on more). Float32 gradients are unscaled and checked a group at a
    /// time by one fused kernel; one that is a pending cast of a half-precision
    /// gradient is read in half precision (the same values, without the
    /// cast's own pass). Then updates the scale on the device: halved on an
    /// overflow, doubled after `growth_interval` finite steps in a row.
    /// Lazy: pass the flag to the optimizer's gated step, read it later,
    /// and [`DeviceLossScaler::settle`] it.
    pub fn check(
        &mut self,
        grads: &Tree,
        sum_over_ranks: impl FnOnce(Array) -> Result<Array>,
    ) -> Result<(Tree, Array)> {
        let inverse = self.inverse.clone();
        // Float32 gradients (a half-precision step's master-weight
        // gradients) are unscaled and checked a group at a time by one
        // kernel; gradients of other dtypes keep their dtype, op by op.
        let flat = grads.flatten();
        let (wide, narrow): (Vec<_>, Vec<_>) =
            flat.into_iter().partition(|(_, g)| g.dtype() == Dtype::F32);
        let wide_grads: Vec<Array> = wide.iter().map(|(_, g)| g.clone()).collect();
        let (products, mut flag) = crate::unscale::unscale_and_check(&wide_grads, &inverse)?;
        let mut unscaled: std::collections::HashMap<String, Array> = wide
            .into_iter()
            .map(|(name, _)| name)
            .zip(products)
            .collect();
        if !narrow.is_empty() {
            let mut per_dtype: Vec<(Dtype, Array)> = Vec::new();
            let mut rest = Vec::with_capacity(narrow.len());
            for (name, g) in narrow {
                let inv = match per_dtype.iter().find(|(d, _)| *d == g.dtype()) {
                    Some((_, s)) => s.clone(),
                    None => {
                        let s = inverse.astype(g.dtype())?;
                        per_dtype.push((g.dtype(), s.clone()));
                        s
                    }
                };
                rest.push((name, g.mul(&inv)?));
            }
            // 0, or NaN when a gradient is not finite.
            let part =
                crate::loss_scale::non_finite_flag_with(rest.iter().map(|(_, g)| g), &self.zero)?;
            flag = flag.add(&part)?;
            unscaled.extend(rest);
        }
        let unscaled = grads.map(|name, _| {
            Ok(unscaled
                .remove(name)
                .expect("every gradient is unscaled once"))
        })?;
        let flag = sum_over_ranks(flag)?;
        // PyTorch's `_amp_update_scale_`, as `LossScaler::update`.
        let u = crate::scale_update::update(
            &flag,
            &self.scale,
            &self.good_steps,
            self.settled.growth_interval(),
        )?;
        (self.scale, self.good_steps, self.inverse) = (u.scale, u.good_steps, u.inverse);
        Ok((unscaled, u.finite))
    }

    /// Records the outcome of the oldest step checked and not yet settled
    /// (its flag, read on the host: `finite` when it was 1), exactly as
    /// [`LossScaler::update`]; returns whether the step was applied.
    pub fn settle(&mut self, finite: bool) -> bool {
        self.settled.update(finite)
    }
}

impl Evaluable for DeviceLossScaler {
    /// The scale, the count of good steps and the inverse scale: evaluate
    /// them with the step, so that they do not grow into a chain over the
    /// steps.
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.scale.clone());
        out.push(self.good_steps.clone());
        out.push(self.inverse.clone());
    }
}
