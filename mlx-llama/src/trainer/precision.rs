//! Mixed precision: the dtype the model computes in, with float32 master
//! weights and optimizer state, and float16's dynamic loss scale.
//!
//! The loss scale is decided on the device ([`mlx_optim::DeviceLossScaler`]):
//! a float16 step multiplies its loss by a scale array, unscales its
//! gradients, computes their finite flag (summed over the ranks, a lazy
//! collective inside the step's graph) and gates the optimizer step with
//! it, and nothing comes back to the host in the middle of the step. The
//! host learns the outcome when it reads the step's loss: the flag travels
//! with it, and [`Precision::settle`] then updates the settled scale that
//! metrics and checkpoints read, as the host-side scaler did.

use std::path::Path;

use anyhow::{Context, Result, anyhow};
use mlx_array::{Array, Dtype, Evaluable, Tree};
use mlx_dist::Group;
use mlx_optim::{DeviceLossScaler, LossScaler};

use crate::checkpoint;
use crate::config::{FloatDtype, TrainConfig};

/// The loss scale's file in a checkpoint folder (float16 runs only).
const SCALE_FILE: &str = "loss_scale.json";

/// How a run computes: its compute dtype, and for float16 its loss scale.
pub(super) struct Precision {
    /// The dtype of the forward and backward passes (`None`: the
    /// parameters' own, float32).
    pub compute: Option<Dtype>,
    scaler: Option<DeviceLossScaler>,
}

impl Precision {
    /// The precision `cfg` asks for.
    pub(super) fn for_config(cfg: &TrainConfig) -> Result<Precision> {
        let (compute, scaler) = match cfg.dtype {
            FloatDtype::F32 => (None, None),
            FloatDtype::Bf16 => (Some(Dtype::BF16), None),
            FloatDtype::F16 => {
                let scaler = match cfg.loss_scale {
                    Some(s) => LossScaler::with(s, LossScaler::new().growth_interval()),
                    None => LossScaler::new(),
                };
                (Some(Dtype::F16), Some(on_device(scaler)?))
            }
        };
        Ok(Precision { compute, scaler })
    }

    /// What the step's loss is multiplied by before the backward pass (a
    /// 0-d float32 on the device), when there is a loss scale (float16).
    pub(super) fn loss_scale(&self) -> Option<&Array> {
        self.scaler.as_ref().map(DeviceLossScaler::scale)
    }

    /// The loss scale after the last settled step, when there is one.
    pub(super) fn scale_if_any(&self) -> Option<f64> {
        self.scaler.as_ref().map(|s| s.settled().scale())
    }

    /// Settled steps skipped because their float16 gradients overflowed.
    pub(super) fn skipped(&self) -> u64 {
        self.scaler.as_ref().map_or(0, |s| s.settled().skipped())
    }

    /// The averaged `grads` of a step, unscaled, and with a loss scale the
    /// flag that gates the step's update: 1 when every gradient is finite
    /// on every rank of `world` (one small collective), 0 otherwise; the
    /// scale then halves or grows on the device. Lazy: nothing waits.
    pub(super) fn check(&mut self, grads: Tree, world: &Group) -> Result<(Tree, Option<Array>)> {
        let Some(scaler) = self.scaler.as_mut() else {
            return Ok((grads, None));
        };
        let (grads, finite) = scaler
            .check(&grads, |flag| Ok(mlx_dist::all_sum(&flag, world)?))
            .map_err(|e| anyhow!("{e}"))?;
        Ok((grads, Some(finite)))
    }

    /// Records the outcome of the oldest unsettled step, its flag read on
    /// the host (`finite`: it was 1); returns whether it was applied.
    pub(super) fn settle(&mut self, finite: bool) -> bool {
        self.scaler.as_mut().is_none_or(|s| s.settle(finite))
    }

    /// Rank 0 writes the loss scale into the checkpoint folder `dir` (as of
    /// the last settled step: checkpoints follow finished steps).
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        if let Some(s) = &self.scaler {
            let text = serde_json::to_string(s.settled())?;
            checkpoint::write_synced(&dir.join(SCALE_FILE), text.as_bytes())?;
        }
        Ok(())
    }

    /// Reads the loss scale of a float16 run from the checkpoint `dir`, if
    /// it has one (a checkpoint of another precision has none: the scale
    /// starts afresh).
    pub(super) fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join(SCALE_FILE);
        if let Some(s) = self.scaler.as_mut()
            && path.exists()
        {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("reading {}", path.display()))?;
            let settled: LossScaler = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a loss scale", path.display()))?;
            *s = on_device(settled).with_context(|| format!("resuming {}", path.display()))?;
        }
        Ok(())
    }
}

/// `settled` continued on the device.
fn on_device(settled: LossScaler) -> Result<DeviceLossScaler> {
    DeviceLossScaler::new(settled).map_err(|e| anyhow!("{e}"))
}

impl Evaluable for Precision {
    /// The loss scale's arrays, evaluated with each step.
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        if let Some(s) = &self.scaler {
            s.collect_arrays(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A float16 step's check builds its flag and the scale's update
    /// without evaluating anything (the host-side scaler read the flag
    /// here, waiting for the whole backward pass); its outcome is settled
    /// later, as read.
    #[test]
    fn a_float16_check_waits_for_nothing() {
        let cfg = TrainConfig {
            dtype: FloatDtype::F16,
            loss_scale: Some(4.0),
            ..TrainConfig::default()
        };
        let mut p = Precision::for_config(&cfg).unwrap();
        let lazy = |v: f32| {
            Array::from_slice(&[v, 2.0], &[2])
                .unwrap()
                .mul_scalar(2.0)
                .unwrap()
        };
        let grads = Tree::unflatten([("w".to_string(), lazy(f32::INFINITY))]).unwrap();
        let (unscaled, finite) = p.check(grads, &Group::single()).unwrap();
        let finite = finite.expect("float16 has a flag");
        let w = unscaled.get_array("w").unwrap();
        assert!(!finite.is_evaluated() && !w.is_evaluated());
        assert!(!p.loss_scale().unwrap().is_evaluated());
        // Read later: the step overflowed, and the scale halved.
        assert_eq!(finite.item::<f32>().unwrap(), 0.0);
        assert_eq!(p.loss_scale().unwrap().item::<f32>().unwrap(), 2.0);
        assert_eq!(p.scale_if_any(), Some(4.0), "not settled yet");
        assert!(!p.settle(false));
        assert_eq!((p.scale_if_any(), p.skipped()), (Some(2.0), 1));
    }

    /// The ranks hold different gradients (their own data, or their
    /// shards): one rank's overflow skips the step on every rank.
    #[test]
    fn one_ranks_overflow_skips_the_step_on_every_rank() {
        let flags = mlx_dist::run_local(2, |g| {
            let cfg = TrainConfig {
                dtype: FloatDtype::F16,
                ..TrainConfig::default()
            };
            let mut p = Precision::for_config(&cfg).unwrap();
            let mine = if g.rank() == 1 { f32::NAN } else { 1.0 };
            let grads =
                Tree::unflatten([("w".to_string(), Array::from_slice(&[mine], &[1]).unwrap())])
                    .unwrap();
            let (_, finite) = p.check(grads, &g).unwrap();
            finite.unwrap().item::<f32>().unwrap()
        })
        .unwrap();
        assert_eq!(flags, [0.0, 0.0]);
    }

    #[test]
    fn float32_and_bfloat16_have_no_scale_and_no_flag() {
        for dtype in [FloatDtype::F32, FloatDtype::Bf16] {
            let cfg = TrainConfig {
                dtype,
                ..TrainConfig::default()
            };
            let mut p = Precision::for_config(&cfg).unwrap();
            let grads =
                Tree::unflatten([("w".to_string(), Array::ones(&[2], Dtype::F32))]).unwrap();
            let (_, finite) = p.check(grads, &Group::single()).unwrap();
            assert!(finite.is_none() && p.loss_scale().is_none() && p.scale_if_any().is_none());
        }
    }
}
