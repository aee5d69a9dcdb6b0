//! A deliberately simple reference: n-d arrays of f64 with index arithmetic,
//! used to check every primitive.
#![allow(dead_code)]

use half::{bf16, f16};
use mlx_array::{Array, Bool8, Dtype};

/// A dense row-major f64 array.
#[derive(Clone, Debug, PartialEq)]
pub struct Nd {
    pub shape: Vec<usize>,
    pub v: Vec<f64>,
}

pub fn size(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// Calls `f` with every multi-index of `shape` in row-major order.
pub fn for_each_index(shape: &[usize], mut f: impl FnMut(&[usize])) {
    if shape.contains(&0) {
        return;
    }
    let mut idx = vec![0; shape.len()];
    loop {
        f(&idx);
        let mut d = shape.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

impl Nd {
    pub fn new(shape: &[usize], v: Vec<f64>) -> Nd {
        assert_eq!(size(shape), v.len());
        Nd {
            shape: shape.to_vec(),
            v,
        }
    }
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Nd {
        let mut v = Vec::with_capacity(size(shape));
        for_each_index(shape, |i| v.push(f(i)));
        Nd::new(shape, v)
    }
    pub fn flat_index(&self, idx: &[usize]) -> usize {
        idx.iter()
            .zip(&self.shape)
            .fold(0, |acc, (&i, &d)| acc * d + i)
    }
    pub fn at(&self, idx: &[usize]) -> f64 {
        self.v[self.flat_index(idx)]
    }
    /// The value at `idx` of the broadcast of self to a shape of `idx.len()` dims.
    pub fn at_broadcast(&self, idx: &[usize]) -> f64 {
        let lead = idx.len() - self.shape.len();
        let own: Vec<usize> = self
            .shape
            .iter()
            .enumerate()
            .map(|(d, &n)| if n == 1 { 0 } else { idx[lead + d] })
            .collect();
        self.at(&own)
    }
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Nd {
        Nd::new(&self.shape, self.v.iter().map(|&x| f(x)).collect())
    }
}

/// NumPy broadcast of two shapes (the reference's own version).
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    (0..n)
        .map(|i| {
            let da = if i + a.len() >= n {
                a[i + a.len() - n]
            } else {
                1
            };
            let db = if i + b.len() >= n {
                b[i + b.len() - n]
            } else {
                1
            };
            if da == db || db == 1 {
                Some(da)
            } else if da == 1 {
                Some(db)
            } else {
                None
            }
        })
        .collect()
}

pub fn zip(a: &Nd, b: &Nd, f: impl Fn(f64, f64) -> f64) -> Nd {
    let shape = broadcast(&a.shape, &b.shape).expect("broadcastable");
    Nd::from_fn(&shape, |i| f(a.at_broadcast(i), b.at_broadcast(i)))
}

/// Rounds `v` to what `dtype` can hold, with Rust's `as` semantics for ints.
pub fn quantize(v: f64, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => v as f32 as f64,
        Dtype::F16 => f16::from_f64(v).to_f64(),
        Dtype::BF16 => bf16::from_f64(v).to_f64(),
        Dtype::I32 => v as i32 as f64,
        Dtype::U32 => v as u32 as f64,
        Dtype::I64 => v as i64 as f64,
        Dtype::Bool => (v != 0.0) as u8 as f64,
    }
}

/// Integer wrap-around as the integer dtypes do it.
pub fn wrap(v: f64, dtype: Dtype) -> f64 {
    match dtype {
        Dtype::I32 => (v as i64) as i32 as f64,
        Dtype::U32 => (v as i64) as u32 as f64,
        _ => v,
    }
}

fn typed(nd_values: &[f64], shape: &[usize], dtype: Dtype) -> Array {
    let v = nd_values;
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

pub const LAYOUTS: [Layout; 4] = [
    Layout::Dense,
    Layout::Transposed,
    Layout::Strided,
    Layout::Reversed,
];

/// An array holding `nd`'s values (quantized to `dtype`) in the given layout,
/// already evaluated so that its data is really laid out that way.
pub fn make(nd: &Nd, dtype: Dtype, layout: Layout) -> Array {
    let n = nd.shape.len();
    let a = match layout {
        _ if n == 0 => typed(&nd.v, &nd.shape, dtype),
        Layout::Dense => typed(&nd.v, &nd.shape, dtype),
        Layout::Transposed => {
            let rshape: Vec<usize> = nd.shape.iter().rev().copied().collect();
            let t = Nd::from_fn(&rshape, |i| {
                nd.at(&i.iter().rev().copied().collect::<Vec<_>>())
            });
            typed(&t.v, &rshape, dtype).transpose(&[]).unwrap()
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
            let mut args = vec![mlx_array::SliceArg::FULL; n];
            args[n - 1] = mlx_array::SliceArg::FULL.step(2);
            typed(&b.v, &big, dtype).slice(&args).unwrap()
        }
        Layout::Reversed => {
            let r = Nd::from_fn(&nd.shape, |i| {
                let mut j = i.to_vec();
                j[0] = nd.shape[0] - 1 - i[0];
                nd.at(&j)
            });
            let mut args = vec![mlx_array::SliceArg::FULL; n];
            args[0] = mlx_array::SliceArg::FULL.step(-1);
            typed(&r.v, &nd.shape, dtype).slice(&args).unwrap()
        }
    };
    a.eval().unwrap();
    a
}

/// Reads an array's values as f64 (exact for every dtype we test with).
pub fn values(a: &Array) -> Vec<f64> {
    if a.dtype().is_integer() {
        a.to_vec::<i64>()
            .unwrap()
            .into_iter()
            .map(|x| x as f64)
            .collect()
    } else {
        a.to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect()
    }
}

/// Relative tolerance for results computed in `dtype`.
pub fn tol(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F32 => 2e-5,
        Dtype::F16 => 2e-3,
        Dtype::BF16 => 1.6e-2,
        _ => 0.0,
    }
}

/// Asserts that `a` has `want`'s shape, the dtype `dtype`, and close values.
pub fn check(a: &Array, want: &Nd, dtype: Dtype, rel: f64, what: &str) {
    assert_eq!(a.shape(), &want.shape[..], "{what}: shape");
    assert_eq!(a.dtype(), dtype, "{what}: dtype");
    let got = values(a);
    for (i, (&g, &w)) in got.iter().zip(&want.v).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            (g - w).abs() <= rel * w.abs().max(1.0) + if rel > 0.0 { 1e-6 } else { 0.0 }
        };
        assert!(
            ok,
            "{what}: element {i} is {g}, expected {w} (got {got:?}, want {:?})",
            want.v
        );
    }
}
