//! Mixed precision: the dtype the model computes in, with float32 master
//! weights and optimizer state, and float16's dynamic loss scale.

use std::path::Path;

use anyhow::{Context, Result};
use mlx_array::{Dtype, Tree};
use mlx_dist::Group;
use mlx_optim::{LossScaler, non_finite_flag};

use crate::checkpoint;
use crate::config::{FloatDtype, TrainConfig};

/// The loss scale's file in a checkpoint folder (float16 runs only).
const SCALE_FILE: &str = "loss_scale.json";

/// How a run computes: its compute dtype, and for float16 its loss scale.
pub(super) struct Precision {
    /// The dtype of the forward and backward passes (`None`: the
    /// parameters' own, float32).
    pub compute: Option<Dtype>,
    scaler: Option<LossScaler>,
}

/// What [`Precision::check`] decided about a step's gradients.
pub(super) enum Checked {
    /// Apply these (unscaled) gradients.
    Apply(Tree),
    /// The gradients overflowed: skip the step; the scale is now this.
    Skip(f64),
}

impl Precision {
    /// The precision `cfg` asks for.
    pub(super) fn for_config(cfg: &TrainConfig) -> Precision {
        let (compute, scaler) = match cfg.dtype {
            FloatDtype::F32 => (None, None),
            FloatDtype::Bf16 => (Some(Dtype::BF16), None),
            FloatDtype::F16 => {
                let scaler = match cfg.loss_scale {
                    Some(s) => LossScaler::with(s, LossScaler::new().growth_interval()),
                    None => LossScaler::new(),
                };
                (Some(Dtype::F16), Some(scaler))
            }
        };
        Precision { compute, scaler }
    }

    /// What the loss is multiplied by before the backward pass.
    pub(super) fn loss_scale(&self) -> f64 {
        self.scaler.as_ref().map_or(1.0, |s| s.scale())
    }

    /// The loss scale, when there is one (float16).
    pub(super) fn scale_if_any(&self) -> Option<f64> {
        self.scaler.as_ref().map(|s| s.scale())
    }

    /// Steps skipped because their float16 gradients overflowed.
    pub(super) fn skipped(&self) -> u64 {
        self.scaler.as_ref().map_or(0, |s| s.skipped())
    }

    /// The averaged `grads` of a step, unscaled, or the decision to skip it
    /// when any of them (on any rank: one small collective) is not finite.
    /// Without a loss scale, `grads` as they are, lazily; with one, this
    /// evaluates the step's gradients.
    pub(super) fn check(&mut self, grads: Tree, group: &Group) -> Result<Checked> {
        let Some(scaler) = self.scaler.as_mut() else {
            return Ok(Checked::Apply(grads));
        };
        let grads = scaler.unscale(&grads)?;
        let flag = mlx_dist::all_sum(&non_finite_flag(&grads)?, group)?;
        let finite = flag.item::<f32>()?.is_finite();
        Ok(if scaler.update(finite) {
            Checked::Apply(grads)
        } else {
            Checked::Skip(scaler.scale())
        })
    }

    /// Rank 0 writes the loss scale into the checkpoint folder `dir`.
    pub(super) fn save(&self, dir: &Path) -> Result<()> {
        if let Some(s) = &self.scaler {
            checkpoint::write_synced(&dir.join(SCALE_FILE), serde_json::to_string(s)?.as_bytes())?;
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
            *s = serde_json::from_str(&text)
                .with_context(|| format!("{} is not a loss scale", path.display()))?;
        }
        Ok(())
    }
}
