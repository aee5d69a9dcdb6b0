//! Rotary positional encoding (RoPE).

use mlx_array::{Array, Result};

/// Rotates pairs of features by a position-dependent angle, as MLX's
/// `nn.RoPE`: `traditional` rotates consecutive pairs `(x[2i], x[2i+1])`,
/// otherwise the halves `(x[i], x[i + d/2])`. Positions run along axis -2,
/// starting at `offset` (for generation with a KV cache). Features beyond
/// `dims` pass through unchanged. No parameters.
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
        }
    }

    /// Applies the rotation to `x` of shape `[..., L, D]` with positions
    /// `offset..offset + L` (one fused primitive, [`mlx_array::rope`]).
    pub fn forward(&self, x: &Array, offset: usize) -> Result<Array> {
        mlx_array::rope(
            x,
            self.dims,
            self.traditional,
            self.base,
            self.scale,
            offset,
        )
    }
}
