//! Rotary positional encoding (RoPE).

use mlx_array::{Array, Result};
use serde::{Deserialize, Serialize};

/// How RoPE's frequencies are scaled for longer contexts, as transformers'
/// `rope_type` (its `modeling_rope_utils.py`): none, linear position
/// interpolation, dynamic NTK scaling of the base, or Llama 3's
/// wavelength-band smoothing. [`RoPE::inv_freqs`] computes each.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub enum RopeScaling {
    /// `base^(-2i / dims)`, unscaled.
    #[default]
    Default,
    /// Every frequency divided by `factor`.
    Linear {
        /// How many times longer the context is.
        factor: f64,
    },
    /// The base grown for sequences longer than the original context.
    Dynamic {
        /// How many times longer the context is.
        factor: f64,
        /// The context the model was trained on.
        original_max_position_embeddings: usize,
    },
    /// Low frequencies divided by `factor`, high ones kept, a smooth band
    /// between.
    Llama3 {
        /// How many times longer the context is.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context the model was trained on.
        original_max_position_embeddings: usize,
    },
}

/// Rotates pairs of features by a position-dependent angle, as MLX's
/// `nn.RoPE`: `traditional` rotates consecutive pairs `(x[2i], x[2i+1])`,
/// otherwise the halves `(x[i], x[i + d/2])`. Positions run along axis -2,
/// starting at `offset` (for generation with a KV cache). Features beyond
/// `dims` pass through unchanged. No parameters. `scaling` rescales the
/// frequencies as transformers' `rope_type`s do ([`RopeScaling`]).
#[derive(Clone, Debug)]
pub struct RoPE {
    /// Number of features rotated (even).
    pub dims: usize,
    /// Consecutive pairs (true) or halves (false).
    pub traditional: bool,
    /// Base of the frequencies (10000 by default).
    pub base: f64,
    /// Scale applied to positions.
    pub scale: f64,
    /// Frequency scaling ([`RopeScaling::Default`]: none; any other
    /// rotates by [`RoPE::inv_freqs`]).
    pub scaling: RopeScaling,
}

crate::impl_module!(RoPE {});

impl RoPE {
    /// MLX's defaults: base 10000, scale 1.
    pub fn new(dims: usize, traditional: bool) -> RoPE {
        RoPE {
            dims,
            traditional,
            base: 10_000.0,
            scale: 1.0,
            scaling: RopeScaling::Default,
        }
    }

    /// Applies the rotation to `x` of shape `[..., L, D]` with positions
    /// `offset..offset + L` (one fused primitive): unscaled,
    /// [`mlx_array::rope`] with `base` and `scale`; otherwise
    /// [`mlx_array::rope_with_freqs`] with [`RoPE::inv_freqs`] of the
    /// length `offset + L` (what transformers' dynamic update takes: the
    /// largest position plus one), each multiplied by `scale` unless it is 1.
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        if self.scaling == RopeScaling::Default {
            return mlx_array::rope(
                x,
                self.dims,
                self.traditional,
                self.base,
                self.scale,
                offset,
            );
        }
        if !self.dims.is_multiple_of(2) {
            return Err(mlx_array::Error::Shape {
                op: "RoPE",
                message: format!("cannot rotate {} features: not an even number", self.dims),
            });
        }
        let len = x.shape().iter().rev().nth(1).copied().unwrap_or(0);
        let mut freqs = self.inv_freqs(offset + len);
        if self.scale != 1.0 {
            let scale = self.scale as f32;
            freqs.iter_mut().for_each(|f| *f *= scale);
        }
        mlx_array::rope_with_freqs(x, &freqs, self.traditional, offset)
    }

    /// The `dims / 2` inverse frequencies of the pairs for a sequence of
    /// `seq_len` positions, as transformers computes them
    /// (`modeling_rope_utils.py`, `base` as `rope_theta`, `dims` as the
    /// head width), in its precision: `1 / base^(2i / dims)` in f32, then
    /// per [`RopeScaling`]:
    ///
    /// - `Linear`: divided by `factor`.
    /// - `Dynamic`: the base grown to `base * (factor * n / original -
    ///   (factor - 1))^(dims / (dims - 2))` for `n = max(seq_len,
    ///   original)` (in f32 past the original length, as from a tensor of
    ///   positions; unchanged up to it). Transformers keeps the frequencies
    ///   of the longest sequence it has seen until one shorter than the
    ///   original comes; these are always `seq_len`'s (the same while
    ///   generation only grows).
    /// - `Llama3`: wavelengths `2 pi / f` above `original /
    ///   low_freq_factor` divided by `factor`, those below `original /
    ///   high_freq_factor` kept, and between them `(1 - s) f / factor + s
    ///   f` with `s = (original / wavelength - low) / (high - low)`.
    ///
    /// `seq_len` matters only to `Dynamic`; `scale` is not applied.
    ///
    /// ```
    /// use mlx_nn::{RoPE, RopeScaling};
    /// let mut rope = RoPE::new(8, false);
    /// rope.scaling = RopeScaling::Linear { factor: 4.0 };
    /// assert_eq!(rope.inv_freqs(16), [0.25, 0.025, 0.0025, 0.00025]);
    /// ```
    pub fn inv_freqs(&self, seq_len: usize) -> Vec<f32> {
        let dims = self.dims;
        // A Python float raised to an f32 tensor is rounded to f32 first.
        let base: f32 = match self.scaling {
            RopeScaling::Dynamic {
                factor,
                original_max_position_embeddings: original,
            } => {
                let exponent = dims as f64 / (dims as f64 - 2.0);
                if seq_len > original {
                    // As `dynamic_rope_update` computes it from a tensor of
                    // positions: `factor * seq_len / original - (factor - 1)`
                    // in f32, then its power and the product with the base.
                    let n = factor as f32 * seq_len as f32 / original as f32;
                    let grown = (n - (factor - 1.0) as f32).powf(exponent as f32);
                    self.base as f32 * grown
                } else {
                    // The initial frequencies, from Python floats.
                    let n = factor * original as f64 / original as f64;
                    (self.base * (n - (factor - 1.0)).powf(exponent)) as f32
                }
            }
            _ => self.base as f32,
        };
        let default = (0..dims / 2).map(|i| {
            let exponent = (2 * i) as f32 / dims as f32;
            1.0 / base.powf(exponent)
        });
        match self.scaling {
            RopeScaling::Default | RopeScaling::Dynamic { .. } => default.collect(),
            RopeScaling::Linear { factor } => default.map(|f| f / factor as f32).collect(),
            RopeScaling::Llama3 {
                factor,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            } => {
                let original = original as f64;
                let (low_wavelen, high_wavelen) = (original / low, original / high);
                let factor = factor as f32;
                let two_pi = (2.0 * std::f64::consts::PI) as f32;
                default
                    .map(|f| {
                        let wavelen = two_pi / f;
                        if wavelen > low_wavelen as f32 {
                            f / factor
                        } else if wavelen < high_wavelen as f32 {
                            f
                        } else {
                            let smooth =
                                (original as f32 / wavelen - low as f32) / (high - low) as f32;
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
        }
    }
}
