//! Low-rank adapters on a frozen [`Linear`]: LoRA (Hu et al. 2021) and DoRA
//! (Liu et al. 2024), computed as PEFT computes them.
//!
//! Both wrap the layer they adapt, freeze its weight and bias (so
//! [`value_and_grad`](crate::value_and_grad) builds no gradient for them),
//! and start as the identity change: `B` is zero, so step 0 gives the base
//! layer's output. Parameter names and how they map to the two formats
//! people exchange adapters in:
//!
//! | here | shape | PEFT | mlx-lm |
//! |------|-------|------|--------|
//! | `base.weight`, `base.bias` | `[out, in]`, `[out]` | `base_layer.weight`, `base_layer.bias` | `linear.weight`, `linear.bias` |
//! | `lora_a` | `[r, in]` | `lora_A.weight` `[r, in]` | `lora_a` `[in, r]` (transposed) |
//! | `lora_b` | `[out, r]` | `lora_B.weight` `[out, r]` | `lora_b` `[r, out]` (transposed) |
//! | `magnitude` (DoRA) | `[out]` | `lora_magnitude_vector` | `m` |
//!
//! The scale is PEFT's `lora_alpha / r`; mlx-lm's `scale` is that quotient
//! given directly (mlx-lm's `scale: 20` at rank 8 is `alpha = 160` here).
//!
//! ```
//! use mlx_array::{random, Array, Dtype};
//! use mlx_nn::{LoRAConfig, LoRALinear, Linear, ModuleExt};
//! let base = Linear::new(4, 3, true, &random::key(0)).unwrap();
//! let lora = LoRALinear::from_linear(base.clone(), &LoRAConfig::default().rank(2), &random::key(1)).unwrap();
//! let x = Array::ones(&[2, 4], Dtype::F32);
//! // B starts at zero: the base layer's output, bit for bit.
//! assert_eq!(lora.forward(&x).unwrap().to_vec::<f32>().unwrap(), base.forward(&x).unwrap().to_vec::<f32>().unwrap());
//! // Only the adapter trains.
//! let names: Vec<String> = lora.trainable_parameters().flatten().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["lora_a", "lora_b"]);
//! ```

use mlx_array::{Array, Dtype, Error, Result};

use crate::{Dropout, Linear, ModuleExt, Param, impl_module, init};

/// Rank, `alpha` and dropout of a LoRA or DoRA adapter, with PEFT's defaults
/// (`r = 8`, `lora_alpha = 8`, no dropout).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoRAConfig {
    /// The rank `r` of `B A`.
    pub rank: usize,
    /// `alpha`: the update is scaled by `alpha / rank`.
    pub alpha: f64,
    /// Dropout probability on the adapter's input, in `[0, 1)`.
    pub dropout: f64,
}

impl Default for LoRAConfig {
    fn default() -> Self {
        LoRAConfig {
            rank: 8,
            alpha: 8.0,
            dropout: 0.0,
        }
    }
}

impl LoRAConfig {
    /// Sets the rank.
    pub fn rank(mut self, rank: usize) -> Self {
        self.rank = rank;
        self
    }
    /// Sets `alpha`.
    pub fn alpha(mut self, alpha: f64) -> Self {
        self.alpha = alpha;
        self
    }
    /// Sets the dropout probability.
    pub fn dropout(mut self, p: f64) -> Self {
        self.dropout = p;
        self
    }
    /// `alpha / rank`.
    pub fn scale(&self) -> f64 {
        self.alpha / self.rank as f64
    }
}

/// The adapter's `A`, `B`, scale and dropout for a base of `[out, in]`,
/// checked against the configuration.
fn adapter(
    base: &Linear,
    config: &LoRAConfig,
    key: &Array,
) -> Result<(Param, Param, f64, Dropout)> {
    let shape = base.weight.value().shape();
    let (out, inp) = (shape[0], shape[1]);
    if config.rank == 0 || !config.alpha.is_finite() {
        return Err(Error::Invalid {
            op: "LoRALinear",
            message: format!(
                "rank must be positive and alpha finite, got rank {} alpha {}",
                config.rank, config.alpha
            ),
        });
    }
    let dropout = Dropout::new(config.dropout)?;
    // PEFT: kaiming_uniform_(A, a = sqrt(5)); gain sqrt(2 / (1 + 5)), bound
    // gain * sqrt(3 / fan_in) = 1 / sqrt(in), which is also mlx-lm's bound.
    let a = init::uniform(key, 1.0 / (inp as f64).sqrt(), &[config.rank, inp])?;
    let b = Array::zeros(&[out, config.rank], Dtype::F32);
    Ok((Param::new(a), Param::new(b), config.scale(), dropout))
}

/// `(x A^T) B^T`: the low-rank path, never forming `B A`.
fn low_rank(x: &Array, a: &Param, b: &Param) -> Result<Array> {
    x.matmul(&a.value().t()?)?.matmul(&b.value().t()?)
}

/// `W + scale B A`, `[out, in]`, in float32 whatever the base's dtype (a
/// base held in half precision is widened, not the update rounded).
fn merged(base: &Linear, a: &Param, b: &Param, scale: f64) -> Result<Array> {
    let delta = b.value().matmul(a.value())?.mul_scalar(scale)?;
    base.weight.value().astype(Dtype::F32)?.add(&delta)
}

/// The L2 norm of each row of `w` `[out, in]` over the input axis, `[out]`.
fn row_norms(w: &Array) -> Result<Array> {
    w.square()?.sum(&[1], false)?.sqrt()
}

/// A trainable [`Linear`] in the shape of `w`, bias copied.
fn linear_with(weight: Array, base: &Linear) -> Linear {
    Linear {
        weight: Param::new(weight),
        bias: base.bias.as_ref().map(|b| Param::new(b.value().clone())),
    }
}

/// LoRA: a frozen [`Linear`] plus a trainable low-rank update,
/// `base(x) + scale * (dropout(x) A^T) B^T` with `A` `[r, in]`, `B`
/// `[out, r]` and `scale = alpha / r` (PEFT's `LoraLayer`).
///
/// `A` is initialised as PEFT does (Kaiming-uniform with `a = sqrt(5)`,
/// i.e. uniform in `±1/sqrt(in)`), `B` to zeros. See the [module
/// documentation](self) for the names in PEFT and mlx-lm.
#[derive(Clone, Debug)]
pub struct LoRALinear {
    /// The adapted layer, frozen.
    pub base: Linear,
    /// `A`, `[r, in]`.
    pub lora_a: Param,
    /// `B`, `[out, r]`.
    pub lora_b: Param,
    /// `alpha / r`.
    pub scale: f64,
    /// Dropout on the adapter's input (training only).
    pub dropout: Dropout,
    /// The key the current training step draws the dropout from (the
    /// layer's own, e.g. one of [`mlx_array::random::split_keys`]); `None`
    /// (evaluation): no dropout. Read by [`AnyLinear`](crate::AnyLinear)'s
    /// forward pass.
    pub train_key: Option<Array>,
}

impl_module!(LoRALinear {
    base,
    lora_a,
    lora_b
});

impl LoRALinear {
    /// Wraps `base`, freezing it, with `A` drawn from `key` and `B` zero.
    pub fn from_linear(mut base: Linear, config: &LoRAConfig, key: &Array) -> Result<LoRALinear> {
        let (lora_a, lora_b, scale, dropout) = adapter(&base, config, key)?;
        base.freeze();
        Ok(LoRALinear {
            base,
            lora_a,
            lora_b,
            scale,
            dropout,
            train_key: None,
        })
    }

    /// The output without dropout (evaluation).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.forward_train(x, None)
    }

    /// The output with dropout on the adapter's input drawn from `key`, as
    /// [`Dropout::forward`] does (`None`: evaluation).
    pub fn forward_train(&self, x: &Array, key: Option<&Array>) -> Result<Array> {
        let y = self.base.forward(x)?;
        let xd = self.dropout.forward(x, key)?;
        // The adapter computes in its own float32; its update joins the
        // base's output in the base's dtype (a half-precision base keeps
        // the block in half precision).
        let update = low_rank(&xd, &self.lora_a, &self.lora_b)?.mul_scalar(self.scale)?;
        y.add(&update.astype(y.dtype())?)
    }

    /// The merged layer `W + scale B A` (bias unchanged), trainable.
    pub fn fuse(&self) -> Result<Linear> {
        let w = merged(&self.base, &self.lora_a, &self.lora_b, self.scale)?;
        Ok(linear_with(w, &self.base))
    }
}

/// DoRA: LoRA with the weight split into a trainable magnitude `m` `[out]`
/// and a direction, `y = m / ||W + scale B A|| * (x W^T + scale (x A^T) B^T) + b`,
/// the norm taken per output row over the input axis.
///
/// As PEFT's `DoraLinearLayer` (and the paper's section 4.3), the norm
/// `||W + scale B A||` is detached from the gradient: it follows `A` and
/// `B` in the forward pass but no gradient flows through it, so `A` and `B`
/// get gradient only through the low-rank path and `m` through the quotient.
/// `m` starts at the row norms of `W` (PEFT's `lora_magnitude_vector`), `A`
/// and `B` as in [`LoRALinear`]. The output is computed as PEFT does,
/// `base(x) + (m/n - 1) x' W^T + m/n scale (x' A^T) B^T` with `x'` the
/// dropped-out input, so that at step 0 (`m/n = 1`, `B = 0`) it is the
/// base layer's output.
#[derive(Clone, Debug)]
pub struct DoRALinear {
    /// The adapted layer, frozen.
    pub base: Linear,
    /// `A`, `[r, in]`.
    pub lora_a: Param,
    /// `B`, `[out, r]`.
    pub lora_b: Param,
    /// `m`, `[out]`.
    pub magnitude: Param,
    /// `alpha / r`.
    pub scale: f64,
    /// Dropout on the adapter's input (training only).
    pub dropout: Dropout,
    /// The key the current training step draws the dropout from (the
    /// layer's own, e.g. one of [`mlx_array::random::split_keys`]); `None`
    /// (evaluation): no dropout. Read by [`AnyLinear`](crate::AnyLinear)'s
    /// forward pass.
    pub train_key: Option<Array>,
}

impl_module!(DoRALinear {
    base,
    lora_a,
    lora_b,
    magnitude
});

impl DoRALinear {
    /// Wraps `base`, freezing it, with `A` drawn from `key`, `B` zero and
    /// `m = ||W||` per output row.
    pub fn from_linear(mut base: Linear, config: &LoRAConfig, key: &Array) -> Result<DoRALinear> {
        let (lora_a, lora_b, scale, dropout) = adapter(&base, config, key)?;
        let magnitude = Param::new(row_norms(base.weight.value())?);
        base.freeze();
        Ok(DoRALinear {
            base,
            lora_a,
            lora_b,
            magnitude,
            scale,
            dropout,
            train_key: None,
        })
    }

    /// `m / ||W + scale B A||`, `[out]`, the norm detached.
    fn magnitude_scale(&self) -> Result<Array> {
        let w = merged(&self.base, &self.lora_a, &self.lora_b, self.scale)?;
        let norm = row_norms(&w)?.stop_gradient()?;
        self.magnitude.value().divide(&norm)
    }

    /// The output without dropout (evaluation).
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.forward_train(x, None)
    }

    /// The output with dropout on the adapter's input drawn from `key`
    /// (`None`: evaluation). As in PEFT, the dropped-out input also feeds
    /// the `(m/n - 1) x' W^T` term.
    pub fn forward_train(&self, x: &Array, key: Option<&Array>) -> Result<Array> {
        let ms = self.magnitude_scale()?;
        let w_t = self.base.weight.value().t()?;
        let xw = x.matmul(&w_t)?;
        let y = match &self.base.bias {
            Some(b) => xw.add(b.value())?,
            None => xw.clone(),
        };
        let (xd, xdw) = match key {
            Some(_) if self.dropout.p > 0.0 => {
                let xd = self.dropout.forward(x, key)?;
                let xdw = xd.matmul(&w_t)?;
                (xd, xdw)
            }
            _ => (x.clone(), xw),
        };
        let update = low_rank(&xd, &self.lora_a, &self.lora_b)?.mul_scalar(self.scale)?;
        let out = y
            .add(&ms.sub_scalar(1.0)?.multiply(&xdw)?)?
            .add(&ms.multiply(&update)?)?;
        out.astype(y.dtype())
    }

    /// The merged layer `m / ||W + scale B A|| * (W + scale B A)` row by row
    /// (bias unchanged), trainable.
    pub fn fuse(&self) -> Result<Linear> {
        let w = merged(&self.base, &self.lora_a, &self.lora_b, self.scale)?;
        let ms = self.magnitude.value().divide(&row_norms(&w)?)?;
        let w = w.multiply(&ms.expand_dims(&[1])?)?;
        Ok(linear_with(w, &self.base))
    }
}
