//! Rotary position embedding in one pass over the rows.

use rayon::prelude::*;

use super::copy::contiguous;
use crate::Dtype;
use crate::backend::common::rope::RopeSpec;
use crate::data::{ArrayData, Operand};

/// `(cos, sin)` of every `(position, pair)`, `[len, dims / 2]`, in f32
/// as the graph of ops it replaces computed them; with a frequency table,
/// the angle is the f32 product of the position and the pair's frequency.
fn table(spec: &RopeSpec, len: usize) -> Vec<(f32, f32)> {
    let half = spec.dims / 2;
    let k = (-2.0 * (spec.base as f64).ln() / spec.dims as f64) as f32;
    let sign = if spec.inverse { -1.0 } else { 1.0 };
    let freqs = spec.freqs.as_deref();
    (0..len)
        .flat_map(|p| {
            let pos = (spec.offset + p) as f32 * spec.scale;
            (0..half).map(move |i| {
                let theta = match freqs {
                    Some(f) => pos * f[i],
                    None => pos * (i as f32 * k).exp(),
                };
                (theta.cos(), sign * theta.sin())
            })
        })
        .collect()
}

/// Rotates `x` (`[..., L, D]`, read as f32, any strides; rows are read
/// where they lie when their features are adjacent) as `spec` says; a new
/// contiguous buffer.
pub fn rope(x: &Operand<'_>, spec: &RopeSpec) -> ArrayData {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let nd = shape.len();
    let (len, width) = (shape[nd - 2], shape[nd - 1]);
    let mut out = ArrayData::alloc(shape, Dtype::F32);
    if n == 0 {
        return out;
    }
    let x = if x.data.strides()[nd - 1] == 1 || width == 1 {
        x.data.clone()
    } else {
        contiguous(x)
    };
    let (outer, strides) = (&shape[..nd - 1], &x.strides()[..nd - 1]);
    let base = x.ptr::<f32>() as usize;
    let table = table(spec, len);
    let half = spec.dims / 2;
    out.as_mut_slice::<f32>(n)
        .par_chunks_mut(width)
        .enumerate()
        .with_min_len(64)
        .for_each(|(row, o)| {
            let (mut rest, mut at) = (row, 0isize);
            for (&size, &stride) in outer.iter().zip(strides).rev() {
                at += (rest % size) as isize * stride;
                rest /= size;
            }
            // SAFETY: `at` addresses row `row` of the view, whose `width`
            // features are adjacent (checked or copied above).
            let x = unsafe { std::slice::from_raw_parts((base as *const f32).offset(at), width) };
            let angles = &table[(row % len) * half..][..half];
            if spec.traditional {
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (x1, x2) = (x[2 * i], x[2 * i + 1]);
                    o[2 * i] = x1 * c - x2 * s;
                    o[2 * i + 1] = x1 * s + x2 * c;
                }
            } else {
                let (o1, o2) = o[..spec.dims].split_at_mut(half);
                for (i, &(c, s)) in angles.iter().enumerate() {
                    let (x1, x2) = (x[i], x[i + half]);
                    o1[i] = x1 * c - x2 * s;
                    o2[i] = x1 * s + x2 * c;
                }
            }
            o[spec.dims..].copy_from_slice(&x[spec.dims..]);
        });
    out
}
