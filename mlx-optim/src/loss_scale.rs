//! Dynamic loss scaling for float16 training (PyTorch's `GradScaler`).
//!
//! float16 keeps 5 exponent bits: gradients below about 6e-8 vanish and
//! above 65,504 overflow. The loss is multiplied by a scale before the
//! backward pass, so that small gradients stay representable, and the
//! gradients divided by it afterwards, in float32. When a step's gradients
//! are not all finite the step is skipped and the scale halved; after
//! `growth_interval` good steps in a row it doubles.
//!
//! This scaler decides on the host, so its step must read the overflow
//! flag back first; [`crate::DeviceLossScaler`] makes the same decisions
//! on the device, with no read inside the step, and keeps one of these as
//! the host's settled view.
//!
//! ```
//! use mlx_optim::LossScaler;
//! let mut s = LossScaler::new();
//! assert_eq!(s.scale(), 65536.0);
//! assert!(!s.update(false)); // overflow: skip the step, halve the scale
//! assert_eq!((s.scale(), s.skipped()), (32768.0, 1));
//! assert!(s.update(true));
//! ```

use mlx_array::{Array, Dtype, Tree};
use serde::{Deserialize, Serialize};

use crate::Result;

/// The loss scale and its history (saved with checkpoints to resume exactly).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LossScaler {
    scale: f64,
    growth_interval: u64,
    good_steps: u64,
    skipped: u64,
}

impl Default for LossScaler {
    fn default() -> Self {
        Self::new()
    }
}

impl LossScaler {
    /// PyTorch's defaults: a scale of 2^16, doubled after 2,000 good steps.
    pub fn new() -> Self {
        LossScaler {
            scale: 65536.0,
            growth_interval: 2000,
            good_steps: 0,
            skipped: 0,
        }
    }

    /// The same with another first scale and growth interval.
    pub fn with(scale: f64, growth_interval: u64) -> Self {
        LossScaler {
            scale,
            growth_interval: growth_interval.max(1),
            ..Self::new()
        }
    }

    /// What the loss is multiplied by.
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Good steps in a row after which the scale doubles.
    pub fn growth_interval(&self) -> u64 {
        self.growth_interval
    }

    /// Finite steps in a row since the scale last changed.
    pub fn good_steps(&self) -> u64 {
        self.good_steps
    }

    /// Steps skipped so far because their gradients were not finite.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Records a step whose gradients were (`finite`) or were not all
    /// finite, and returns whether to apply it: a finite step counts toward
    /// doubling the scale; another is skipped and halves it.
    pub fn update(&mut self, finite: bool) -> bool {
        // Saturating: a scaler read from a checkpoint may hold any counts
        // (`u64::MAX` overflowed here, a panic).
        if finite {
            self.good_steps = self.good_steps.saturating_add(1);
            if self.good_steps >= self.growth_interval {
                self.scale *= 2.0;
                self.good_steps = 0;
            }
        } else {
            self.scale = (self.scale * 0.5).max(f64::MIN_POSITIVE);
            self.good_steps = 0;
            self.skipped = self.skipped.saturating_add(1);
        }
        finite
    }

    /// `grads` divided by the scale, in their own dtypes. Lazy.
    pub fn unscale(&self, grads: &Tree) -> Result<Tree> {
        let mut inverse = Scalars::new(1.0 / self.scale);
        Ok(grads.map(|_, g| g.mul(&inverse.like(g)))?)
    }
}

/// One weak scalar per dtype (as `Array::scalar_like` makes it), placed on
/// the default device once: multiplying every gradient by it then moves one
/// scalar to the GPU, not one per gradient.
struct Scalars {
    value: f64,
    made: Vec<(Dtype, Array)>,
}

impl Scalars {
    fn new(value: f64) -> Scalars {
        Scalars {
            value,
            made: Vec::new(),
        }
    }

    /// The scalar for `x`'s dtype.
    fn like(&mut self, x: &Array) -> Array {
        if let Some((_, s)) = self.made.iter().find(|(d, _)| *d == x.dtype()) {
            return s.clone();
        }
        let s = x
            .scalar_like(self.value)
            .to_device(mlx_array::default_device());
        self.made.push((x.dtype(), s.clone()));
        s
    }
}

/// A float32 scalar that is 0 when every element of `grads` is finite and
/// NaN otherwise: the sum of each gradient's part (its sum, or `sum(g *
/// 0)` for a half gradient), times zero (an infinity or NaN times zero is
/// NaN). Sum it over the ranks holding parts of the gradients to check
/// them all. Lazy.
pub fn non_finite_flag(grads: &Tree) -> Result<Array> {
    let zero = Array::zeros(&[], Dtype::F32).to_device(mlx_array::default_device());
    non_finite_flag_with(grads.flatten().iter().map(|(_, g)| g), &zero)
}

/// [`non_finite_flag`] of the arrays `grads`, with a float32 zero already
/// on the device. A
/// float32 gradient's part is its sum (one reduction: a sum of finite
/// float32 values overflows only beyond 3.4e38, which no gradient
/// approaches; an overflowing step is skipped either way); a half
/// gradient's is `sum(g * 0)` (its own sum may overflow its dtype where
/// its values do not), with the zero cast once per dtype.
pub(crate) fn non_finite_flag_with<'a>(
    grads: impl IntoIterator<Item = &'a Array>,
    zero: &Array,
) -> Result<Array> {
    let mut flag: Option<Array> = None;
    let mut zeros: Vec<(Dtype, Array)> = Vec::new();
    for g in grads {
        let part = if g.dtype() == Dtype::F32 {
            g.sum_all()?
        } else {
            let z = match zeros.iter().find(|(d, _)| *d == g.dtype()) {
                Some((_, z)) => z.clone(),
                None => {
                    let z = zero.astype(g.dtype())?;
                    zeros.push((g.dtype(), z.clone()));
                    z
                }
            };
            g.mul(&z)?.sum_all()?.astype(Dtype::F32)?
        };
        flag = Some(match flag {
            None => part,
            Some(f) => f.add(&part)?,
        });
    }
    match flag {
        Some(f) => Ok(f.mul(zero)?),
        None => Ok(zero.clone()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_halves_on_overflow_and_doubles_after_the_interval() {
        let mut s = LossScaler::with(8.0, 3);
        assert!(s.update(true) && s.update(true));
        assert!(!s.update(false), "an overflow skips the step");
        assert_eq!((s.scale(), s.skipped()), (4.0, 1));
        // The good steps before the overflow no longer count.
        assert!(s.update(true) && s.update(true));
        assert_eq!(s.scale(), 4.0);
        assert!(s.update(true));
        assert_eq!(s.scale(), 8.0, "doubled after 3 good steps in a row");
        let saved: LossScaler = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(saved, s);
    }

    #[test]
    fn the_flag_is_nan_exactly_when_a_gradient_is_not_finite() {
        let tree = |v: f32| {
            Tree::unflatten([
                (
                    "a".to_string(),
                    Array::from_slice(&[1.0f32, -2.0], &[2]).unwrap(),
                ),
                (
                    "b".to_string(),
                    Array::from_slice(&[3.0f32, v], &[2]).unwrap(),
                ),
            ])
            .unwrap()
        };
        assert_eq!(
            non_finite_flag(&tree(5.0)).unwrap().item::<f32>().unwrap(),
            0.0
        );
        for bad in [f32::INFINITY, f32::NEG_INFINITY, f32::NAN] {
            assert!(
                non_finite_flag(&tree(bad))
                    .unwrap()
                    .item::<f32>()
                    .unwrap()
                    .is_nan()
            );
        }
        // Half gradients whose sum passes f16's largest value are finite.
        let big = Tree::unflatten([(
            "h".to_string(),
            Array::from_slice(&[60000.0f32, 60000.0], &[2])
                .unwrap()
                .astype(Dtype::F16)
                .unwrap(),
        )])
        .unwrap();
        assert_eq!(non_finite_flag(&big).unwrap().item::<f32>().unwrap(), 0.0);
        let inf = Tree::unflatten([(
            "h".to_string(),
            Array::from_slice(&[1.0f32, f32::INFINITY], &[2])
                .unwrap()
                .astype(Dtype::F16)
                .unwrap(),
        )])
        .unwrap();
        assert!(
            non_finite_flag(&inf)
                .unwrap()
                .item::<f32>()
                .unwrap()
                .is_nan()
        );
        let halved = LossScaler::with(4.0, 1).unscale(&tree(8.0)).unwrap();
        assert_eq!(
            halved.get_array("b").unwrap().to_vec::<f32>().unwrap(),
            [0.75, 2.0]
        );
    }
}
