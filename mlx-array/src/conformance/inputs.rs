//! Test inputs: random values for a dtype, arrays in odd memory layouts, and
//! the proptest strategies the specifications draw shapes from.

use half::{bf16, f16};
use proptest::prelude::*;

use super::reference::Nd;
use crate::{Array, Bool8, Dtype, SliceArg};

/// The float dtypes.
pub const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

/// The dtypes with arithmetic.
pub const NUMERIC: [Dtype; 6] = [
    Dtype::F32,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::I64,
];

/// An axis length: sometimes 0, often 1, mostly 2 to 5.
pub fn dim() -> impl Strategy<Value = usize> {
    prop_oneof![1 => Just(0usize), 3 => Just(1usize), 6 => 2usize..6]
}

/// A shape of at most `max_nd` axes drawn from [`dim`].
pub fn shape(max_nd: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(dim(), 0..=max_nd)
}

/// A shape of `min_nd..=max_nd` axes of 1 to 4 elements.
pub fn nonempty_shape(min_nd: usize, max_nd: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..5, min_nd..=max_nd)
}

/// One of [`LAYOUTS`].
pub fn layout() -> impl Strategy<Value = Layout> {
    prop::sample::select(LAYOUTS.to_vec())
}

/// Values suitable for `dtype` in `[lo, hi]` (integers for integer dtypes),
/// from a small deterministic generator seeded by `seed`.
pub fn fill(shape: &[usize], dtype: Dtype, lo: f64, hi: f64, seed: u64) -> Nd {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Nd::from_fn(shape, |_| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (s >> 11) as f64 / (1u64 << 53) as f64;
        let v = lo + u * (hi - lo);
        let v = if dtype.is_float() { v } else { v.round() };
        let v = if dtype == Dtype::U32 { v.abs() } else { v };
        super::reference::quantize(v, dtype)
    })
}

/// An array of `dtype` holding `values` (converted as `as` does).
pub fn typed(values: &[f64], shape: &[usize], dtype: Dtype) -> Array {
    let v = values;
    match dtype {
        Dtype::F32 => Array::from_slice(&v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape),
        Dtype::F16 => Array::from_slice(
            &v.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>(),
            shape,
        ),
        Dtype::BF16 => Array::from_slice(
            &v.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>(),
            shape,
        ),
        Dtype::I32 => Array::from_slice(&v.iter().map(|&x| x as i32).collect::<Vec<_>>(), shape),
        Dtype::U32 => Array::from_slice(&v.iter().map(|&x| x as u32).collect::<Vec<_>>(), shape),
        Dtype::I64 => Array::from_slice(&v.iter().map(|&x| x as i64).collect::<Vec<_>>(), shape),
        Dtype::Bool => Array::from_slice(
            &v.iter()
                .map(|&x| Bool8((x != 0.0) as u8))
                .collect::<Vec<_>>(),
            shape,
        ),
    }
    .expect("sizes match")
}

/// How an input array is laid out in memory.
#[derive(Clone, Copy, Debug)]
pub enum Layout {
    /// Dense row-major.
    Dense,
    /// A transpose of a dense array (reversed strides).
    Transposed,
    /// Every other element of a larger array along the last axis.
    Strided,
    /// Reversed along the first axis (negative stride).
    Reversed,
}

/// Every [`Layout`].
pub const LAYOUTS: [Layout; 4] = [
    Layout::Dense,
    Layout::Transposed,
    Layout::Strided,
    Layout::Reversed,
];

/// A CPU array holding `nd`'s values (quantized to `dtype`) in the given
/// layout, already evaluated so that its data is really laid out that way.
pub fn make(nd: &Nd, dtype: Dtype, layout: Layout) -> Array {
    crate::device::with_device(crate::Device::Cpu, || make_here(nd, dtype, layout))
}

fn make_here(nd: &Nd, dtype: Dtype, layout: Layout) -> Array {
    let n = nd.shape.len();
    let a = match layout {
        _ if n == 0 => typed(&nd.v, &nd.shape, dtype),
        Layout::Dense => typed(&nd.v, &nd.shape, dtype),
        Layout::Transposed => {
            let rshape: Vec<usize> = nd.shape.iter().rev().copied().collect();
            let t = Nd::from_fn(&rshape, |i| {
                nd.at(&i.iter().rev().copied().collect::<Vec<_>>())
            });
            typed(&t.v, &rshape, dtype)
                .transpose(&[])
                .expect("transpose")
        }
        Layout::Strided => {
            let mut big = nd.shape.clone();
            big[n - 1] *= 2;
            let b = Nd::from_fn(&big, |i| {
                if i[n - 1] % 2 == 0 {
                    let mut j = i.to_vec();
                    j[n - 1] /= 2;
                    nd.at(&j)
                } else {
                    77.0
                }
            });
            let mut args = vec![SliceArg::FULL; n];
            args[n - 1] = SliceArg::FULL.step(2);
            typed(&b.v, &big, dtype).slice(&args).expect("slice")
        }
        Layout::Reversed => {
            let r = Nd::from_fn(&nd.shape, |i| {
                let mut j = i.to_vec();
                j[0] = nd.shape[0] - 1 - i[0];
                nd.at(&j)
            });
            let mut args = vec![SliceArg::FULL; n];
            args[0] = SliceArg::FULL.step(-1);
            typed(&r.v, &nd.shape, dtype).slice(&args).expect("slice")
        }
    };
    a.eval().expect("input evaluates");
    a
}

/// Reads an array's values as f64 (exact for every dtype we test with).
pub fn values(a: &Array) -> Vec<f64> {
    if a.dtype().is_integer() {
        a.to_vec::<i64>()
            .expect("values")
            .into_iter()
            .map(|x| x as f64)
            .collect()
    } else {
        a.to_vec::<f32>()
            .expect("values")
            .into_iter()
            .map(f64::from)
            .collect()
    }
}

/// Uniform f32 values in `[lo, hi)` from the array PRNG, on the CPU.
pub fn uniform(seed: u64, shape: &[usize], lo: f64, hi: f64) -> Array {
    crate::device::with_device(crate::Device::Cpu, || {
        let a = crate::random::uniform(&crate::random::key(seed), lo, hi, shape, Dtype::F32)
            .expect("uniform");
        a.eval().expect("uniform evaluates");
        a
    })
}

/// f32 values kept at least 0.37 apart from each other and away from
/// integers, so that max/min/abs/floor are smooth within a finite-difference
/// step.
pub fn spread(seed: u64, shape: &[usize]) -> Array {
    let n: usize = shape.iter().product();
    let mut v: Vec<f32> = (0..n)
        .map(|i| (i as f32) * 0.37 + 0.2 - n as f32 * 0.18)
        .collect();
    let mut s = seed;
    for i in (1..n).rev() {
        s = s.wrapping_mul(6364136223846793005).wrapping_add(1);
        v.swap(i, (s >> 33) as usize % (i + 1));
    }
    Array::from_slice(&v, shape).expect("sizes match")
}

/// An i32 array.
pub fn ints(v: &[i32], shape: &[usize]) -> Array {
    Array::from_slice(v, shape).expect("sizes match")
}
