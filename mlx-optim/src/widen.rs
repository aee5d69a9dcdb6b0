//! Gradients widened from half precision, read where they lie: a float32
//! gradient that is a pending cast of a float16 or bfloat16 one (the
//! gradient of float32 master weights through their half-precision copy)
//! is handed to the crate's kernels in half precision, which widen it
//! exactly as the cast would, so the cast runs no kernel of its own.

use std::borrow::Cow;

use half::{bf16, f16};
use mlx_array::{Array, ArrayData, Dtype};

/// What a kernel reads for gradient `g`: the half-precision array a
/// pending float32 cast widens, or `g` itself.
pub(crate) fn widened_from(g: &Array) -> Array {
    if g.dtype() == Dtype::F32
        && g.primitive_name() == Some("astype")
        && let [x] = g.pending_inputs().as_slice()
        && matches!(x.dtype(), Dtype::F16 | Dtype::BF16)
    {
        return x.clone();
    }
    g.clone()
}

/// The first `n` elements of the dense CPU `data` of `dtype` as float32:
/// the data itself when it is float32, else widened (exactly).
pub(crate) fn f32_values(data: &ArrayData, dtype: Dtype, n: usize) -> Cow<'_, [f32]> {
    match dtype {
        Dtype::F16 => Cow::Owned(data.as_slice::<f16>(n).iter().map(|v| v.to_f32()).collect()),
        Dtype::BF16 => Cow::Owned(
            data.as_slice::<bf16>(n)
                .iter()
                .map(|v| v.to_f32())
                .collect(),
        ),
        _ => Cow::Borrowed(data.as_slice::<f32>(n)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_widened_half_gradient_is_read_in_half_precision() {
        let h = Array::from_slice(&[1.0f32, 2.0], &[2])
            .unwrap()
            .astype(Dtype::F16)
            .unwrap();
        let w = h.astype(Dtype::F32).unwrap();
        assert_eq!(widened_from(&w).id(), h.id());
        // Not a widening: itself.
        let f = Array::from_slice(&[1.0f32], &[1]).unwrap();
        assert_eq!(widened_from(&f).id(), f.id());
        let narrowed = f.astype(Dtype::F16).unwrap();
        assert_eq!(widened_from(&narrowed).id(), narrowed.id());
    }

    #[test]
    fn half_values_widen_exactly() {
        let v = [1.5f32, -0.000_061_035_156, 65504.0, 3.0e-8];
        for d in [Dtype::F16, Dtype::BF16] {
            let h = Array::from_slice(&v, &[4]).unwrap().astype(d).unwrap();
            h.eval().unwrap();
            let want = h.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(&*f32_values(&h.data().unwrap(), d, 4), &want[..], "{d}");
        }
        let f = Array::from_slice(&v, &[4]).unwrap();
        f.eval().unwrap();
        assert!(matches!(
            f32_values(&f.data().unwrap(), Dtype::F32, 4),
            Cow::Borrowed(_)
        ));
    }
}
