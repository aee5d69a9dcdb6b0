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
    check_input("rope", x, dims)?;
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
        freqs: None,
    };
    Ok(rotation(x, spec))
}

/// Rotates the first `2 * inv_freqs.len()` features of every row of `x`
/// (`[..., L, D]`) by its position with explicit inverse frequencies:
/// pair `i` of the row at position `p` turns by `(offset + p) *
/// inv_freqs[i]` (computed in f32, the product as transformers forms it),
/// paired as [`rope`] pairs them. MLX's `mx.fast.rope(..., freqs=...)`,
/// given inverse frequencies (`1 / freqs`): the scaled RoPE variants
/// (linear, dynamic NTK, Llama 3) are tables of them. Same primitive,
/// dtypes and gradient as [`rope`].
///
/// ```
/// use mlx_array::{Array, rope_with_freqs};
/// let x = Array::from_slice(&[1.0f32, 0.0, 1.0, 0.0], &[2, 2]).unwrap();
/// // Position 1 turns by half a radian.
/// let r = rope_with_freqs(&x, &[0.5], true, 0).unwrap().to_vec::<f32>().unwrap();
/// assert_eq!(r[..2], [1.0, 0.0]);
/// assert!((r[2] - 0.5f32.cos()).abs() < 1e-6 && (r[3] - 0.5f32.sin()).abs() < 1e-6);
/// ```
pub fn rope_with_freqs(
    x: &Array,
    inv_freqs: &[f32],
    traditional: bool,
    offset: usize,
) -> Result<Array> {
    let dims = 2 * inv_freqs.len();
    check_input("rope_with_freqs", x, dims)?;
    if let Some(bad) = inv_freqs.iter().find(|f| !f.is_finite()) {
        return Err(crate::Error::invalid(
            "rope_with_freqs",
            format!("inverse frequencies must be finite; got {bad}"),
        ));
    }
    let spec = RopeSpec {
        dims,
        traditional,
        base: 1.0,
        scale: 1.0,
        offset,
        inverse: false,
        freqs: Some(inv_freqs.into()),
    };
    Ok(rotation(x, spec))
}

/// Refuses what no rotation takes: fewer than two axes, `dims` not a
/// positive even number within the last axis, an input not of floats.
fn check_input(op: &'static str, x: &Array, dims: usize) -> Result<()> {
    let width = x.shape().last().copied().unwrap_or(0);
    if x.ndim() < 2 || dims == 0 || !dims.is_multiple_of(2) || dims > width {
        return Err(crate::Error::shape(
            op,
            format!(
                "cannot rotate {dims} features (a positive even number, at most the last axis) of an input of shape {:?} ([..., L, D])",
                x.shape()
            ),
        ));
    }
    if !x.dtype().is_float() {
        return Err(crate::Error::dtype(
            op,
            x.dtype(),
            "the input must be floating point",
        ));
    }
    Ok(())
}

/// The rotation of `x` as `spec` says, one lazy node of `x`'s shape and dtype.
fn rotation(x: &Array, spec: RopeSpec) -> Array {
    Array::from_primitive(
        Rope {
            spec,
            keep_order: false,
        },
        vec![x.clone()],
        x.shape().to_vec(),
        x.dtype(),
    )
}
