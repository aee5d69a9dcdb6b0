//! A deliberately simple reference: dense row-major n-d arrays of f64 with
//! index arithmetic, against which every primitive is checked.

use half::{bf16, f16};

use crate::Dtype;

/// A dense row-major f64 array.
#[derive(Clone, Debug, PartialEq)]
pub struct Nd {
    /// The dimensions.
    pub shape: Vec<usize>,
    /// The values, row-major.
    pub v: Vec<f64>,
}

/// The number of elements of `shape`.
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
    /// An array of `shape` holding `v` (whose length must match).
    pub fn new(shape: &[usize], v: Vec<f64>) -> Nd {
        assert_eq!(
            size(shape),
            v.len(),
            "Nd::new: {shape:?} holds {} values",
            v.len()
        );
        Nd {
            shape: shape.to_vec(),
            v,
        }
    }
    /// An array whose element at each multi-index is `f(index)`.
    pub fn from_fn(shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Nd {
        let mut v = Vec::with_capacity(size(shape));
        for_each_index(shape, |i| v.push(f(i)));
        Nd::new(shape, v)
    }
    /// The row-major position of a multi-index.
    pub fn flat_index(&self, idx: &[usize]) -> usize {
        idx.iter()
            .zip(&self.shape)
            .fold(0, |acc, (&i, &d)| acc * d + i)
    }
    /// The element at a multi-index.
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
    /// `f` applied to every element.
    pub fn map(&self, f: impl Fn(f64) -> f64) -> Nd {
        Nd::new(&self.shape, self.v.iter().map(|&x| f(x)).collect())
    }
}

/// NumPy broadcast of two shapes (the reference's own version).
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        if i + s.len() >= n {
            s[i + s.len() - n]
        } else {
            1
        }
    };
    (0..n)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (da, db) if da == db || db == 1 => Some(da),
            (1, db) => Some(db),
            _ => None,
        })
        .collect()
}

/// `f` of two arrays, broadcast together.
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
