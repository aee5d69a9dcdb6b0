//! Rotary position embedding (MLX's `mx.fast.rope`).

use crate::primitives::rope::{Rope, RopeSpec};
use crate::{Array, Result};

/// Rotates the first `dims` features of every row of `x` (`[..., L, D]`)
/// by its position: pair `i` of the row at position `p` turns by
/// `(offset + p) * scale * base^(-2i / dims)`. Pairs are consecutive
/// features when `traditional`, else feature `i` and `i + dims / 2`.
/// Features after `dims` pass through. One primitive (a pass over the
/// rows, on the CPU or the GPU) computed in f32; the result has `x`'s
/// dtype (a half input is read and written as such, no conversions).
///
/// ```
/// use mlx_array::{Array, rope};
/// let x = Array::from_slice(&[1.0f32, 0.0, 1.0, 0.0], &[2, 2]).unwrap();
/// // Position 0 stays; position 1 turns by one radian (base^0 = 1).
/// let r = rope(&x, 2, true, 10_000.0, 1.0, 0).unwrap().to_vec::<f32>().unwrap();
/// assert_eq!(r[..2], [1.0, 0.0]);
/// assert!((r[2] - 1f32.cos()).abs() < 1e-6 && (r[3] - 1f32.sin()).abs() < 1e-6);
/// ```
pub fn rope(
    x: &Array,
    dims: usize,
    traditional: bool,
    base: f64,
    scale: f64,
    offset: usize,
) -> Result<Array> {
    let width = x.shape().last().copied().unwrap_or(0);
    if x.ndim() < 2 || dims == 0 || !dims.is_multiple_of(2) || dims > width {
        return Err(crate::Error::shape(
            "rope",
            format!(
                "cannot rotate {dims} features (a positive even number, at most the last axis) of an input of shape {:?} ([..., L, D])",
                x.shape()
            ),
        ));
    }
    if !x.dtype().is_float() {
        return Err(crate::Error::dtype(
            "rope",
            x.dtype(),
            "the input must be floating point",
        ));
    }
    if !(base.is_finite() && base > 0.0 && scale.is_finite()) {
        return Err(crate::Error::invalid(
            "rope",
            format!("base must be positive and finite and scale finite; got {base} and {scale}"),
        ));
    }
    let spec = RopeSpec {
        dims,
        traditional,
        base: base as f32,
        scale: scale as f32,
        offset,
        inverse: false,
    };
    Ok(Array::from_primitive(
        Rope {
            spec,
            keep_order: false,
        },
        vec![x.clone()],
        x.shape().to_vec(),
        x.dtype(),
    ))
}
