//! Dropout with an explicit random key.

use mlx_array::{Array, Error, Result, random};

/// Zeroes each element with probability `p` and scales the rest by `1/(1-p)`
/// when given a key (training); the identity without one (evaluation).
#[derive(Clone, Copy, Debug)]
pub struct Dropout {
    /// Probability of dropping an element, in `[0, 1)`.
    pub p: f64,
}

crate::impl_module!(Dropout {});

impl Dropout {
    /// Fails unless `0 <= p < 1`.
    pub fn new(p: f64) -> Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(Error::Invalid {
                op: "Dropout",
                message: format!("p must be in [0, 1), got {p}"),
            });
        }
        Ok(Dropout { p })
    }

    /// Applies dropout with `key`, or returns `x` unchanged when `key` is `None`.
    pub fn forward(&self, x: &Array, key: Option<&Array>) -> Result<Array> {
        let Some(key) = key else { return Ok(x.clone()) };
        if self.p == 0.0 {
            return Ok(x.clone());
        }
        let keep = random::bernoulli(key, &Array::scalar(1.0 - self.p as f32), x.shape())?;
        keep.where_(&x.mul_scalar(1.0 / (1.0 - self.p))?, &x.scalar_like(0.0))
    }
}
