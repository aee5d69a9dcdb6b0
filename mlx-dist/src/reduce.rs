//! Elementwise reductions on raw little-endian byte buffers, in the buffer's dtype.
//!
//! Integers wrap on overflow; `Bool` sums and maxima are logical OR and minima
//! logical AND; `f16`/`bf16` are computed in `f32` and rounded once per
//! pair, or (`reduce_all`, when every rank's buffer is at hand) summed in
//! `f32` over all ranks and rounded once.

use half::{bf16, f16};
use mlx_array::Dtype;

/// The elementwise reduction of a collective.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// Sum.
    Sum,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
}

trait Elem: bytemuck::Pod {
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self;
}

macro_rules! int_elem {
    ($t:ty) => {
        impl Elem for $t {
            #[inline(always)]
            fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
                match op {
                    ReduceOp::Sum => a.wrapping_add(b),
                    ReduceOp::Max => a.max(b),
                    ReduceOp::Min => a.min(b),
                }
            }
        }
    };
}
int_elem!(u32);
int_elem!(i32);
int_elem!(i64);

impl Elem for f32 {
    #[inline(always)]
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
        match op {
            ReduceOp::Sum => a + b,
            ReduceOp::Max => a.max(b),
            ReduceOp::Min => a.min(b),
        }
    }
}

impl Elem for f16 {
    #[inline(always)]
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
        f16::from_f32(f32::combine(a.to_f32(), b.to_f32(), op))
    }
}

impl Elem for bf16 {
    #[inline(always)]
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
        bf16::from_f32(f32::combine(a.to_f32(), b.to_f32(), op))
    }
}

impl Elem for u8 {
    #[inline(always)]
    fn combine(a: Self, b: Self, op: ReduceOp) -> Self {
        let (a, b) = (a != 0, b != 0);
        (match op {
            ReduceOp::Sum | ReduceOp::Max => a || b,
            ReduceOp::Min => a && b,
        }) as u8
    }
}

#[inline(always)]
fn apply<T: Elem>(dst: &mut [u8], src: &[u8], op: ReduceOp) {
    match (
        bytemuck::try_cast_slice_mut::<u8, T>(dst),
        bytemuck::try_cast_slice::<u8, T>(src),
    ) {
        (Ok(d), Ok(s)) => {
            // Monomorphised per op so the loop vectorises.
            match op {
                ReduceOp::Sum => d
                    .iter_mut()
                    .zip(s)
                    .for_each(|(d, s)| *d = T::combine(*d, *s, ReduceOp::Sum)),
                ReduceOp::Max => d
                    .iter_mut()
                    .zip(s)
                    .for_each(|(d, s)| *d = T::combine(*d, *s, ReduceOp::Max)),
                ReduceOp::Min => d
                    .iter_mut()
                    .zip(s)
                    .for_each(|(d, s)| *d = T::combine(*d, *s, ReduceOp::Min)),
            }
        }
        _ => {
            // Unaligned buffers: element by element.
            let n = size_of::<T>();
            for (d, s) in dst.chunks_exact_mut(n).zip(src.chunks_exact(n)) {
                let a: T = bytemuck::pod_read_unaligned(d);
                let b: T = bytemuck::pod_read_unaligned(s);
                d.copy_from_slice(bytemuck::bytes_of(&T::combine(a, b, op)));
            }
        }
    }
}

/// `dst[i] = op(dst[i], src[i])` for every element; `dst` and `src` must have
/// the same length, a multiple of the dtype's size (checked by callers).
pub fn reduce_into(dst: &mut [u8], src: &[u8], dtype: Dtype, op: ReduceOp) {
    debug_assert_eq!(dst.len(), src.len());
    match dtype {
        Dtype::Bool => apply::<u8>(dst, src, op),
        Dtype::U32 => apply::<u32>(dst, src, op),
        Dtype::I32 => apply::<i32>(dst, src, op),
        Dtype::I64 => apply::<i64>(dst, src, op),
        Dtype::F16 => apply::<f16>(dst, src, op),
        Dtype::BF16 => apply::<bf16>(dst, src, op),
        Dtype::F32 => apply::<f32>(dst, src, op),
    }
}

/// The reduction of `parts` (each rank's buffer, in rank order) into
/// `out`. A sum of `f16`/`bf16` buffers is accumulated in `f32` over every
/// part and rounded once (pairwise, each partial sum would be rounded: at
/// four ranks `1 + 3 * 2^-8` in bfloat16 would come out as 1); everything
/// else is reduced pairwise in order, which for these ops is exact.
pub fn reduce_all(out: &mut [u8], parts: &[&[u8]], dtype: Dtype, op: ReduceOp) {
    let Some((first, rest)) = parts.split_first() else {
        return;
    };
    match (dtype, op) {
        (Dtype::F16 | Dtype::BF16, ReduceOp::Sum) => {
            let mut acc = vec![0f32; out.len() / 2];
            for part in parts {
                add_half(&mut acc, part, dtype);
            }
            round_half(&acc, out, dtype);
        }
        _ => {
            out.copy_from_slice(first);
            for part in rest {
                reduce_into(out, part, dtype, op);
            }
        }
    }
}

/// Elements converted at a time by [`add_half`] and [`round_half`].
const CHUNK: usize = 1024;

/// `acc[i] += part[i]` for a buffer of `f16` or `bf16` values
/// (little-endian bytes, any alignment) and float32 sums: the conversions
/// run a chunk at a time, so that they vectorise (`f16` through the F16C or
/// NEON conversions where the CPU has them).
pub(crate) fn add_half(acc: &mut [f32], part: &[u8], dtype: Dtype) {
    use half::slice::HalfFloatSliceExt;
    let (mut halves, mut wide) = ([0u16; CHUNK], [0f32; CHUNK]);
    for (acc, bytes) in acc.chunks_mut(CHUNK).zip(part.chunks(2 * CHUNK)) {
        let (h, w) = (&mut halves[..acc.len()], &mut wide[..acc.len()]);
        bytemuck::cast_slice_mut::<u16, u8>(h).copy_from_slice(bytes);
        if dtype == Dtype::BF16 {
            // A bfloat16 is the top half of the float32 of its value.
            for (w, &x) in w.iter_mut().zip(h.iter()) {
                *w = f32::from_bits(u32::from(x) << 16);
            }
        } else {
            bytemuck::cast_slice::<u16, f16>(h).convert_to_f32_slice(w);
        }
        for (a, x) in acc.iter_mut().zip(w.iter()) {
            *a += x;
        }
    }
}

/// Float32 sums rounded to `f16` or `bf16` (nearest, ties to even), into
/// `out`'s little-endian bytes.
pub(crate) fn round_half(acc: &[f32], out: &mut [u8], dtype: Dtype) {
    use half::slice::HalfFloatSliceExt;
    let mut halves = [0u16; CHUNK];
    for (acc, bytes) in acc.chunks(CHUNK).zip(out.chunks_mut(2 * CHUNK)) {
        let h = &mut halves[..acc.len()];
        if dtype == Dtype::BF16 {
            bytemuck::cast_slice_mut::<u16, bf16>(h).convert_from_f32_slice(acc);
        } else {
            bytemuck::cast_slice_mut::<u16, f16>(h).convert_from_f32_slice(acc);
        }
        bytes.copy_from_slice(bytemuck::cast_slice(h));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f32_sum_max_min_aligned_and_not() {
        let a: Vec<f32> = vec![1.0, -2.0, 3.5];
        let b: Vec<f32> = vec![0.5, 4.0, -1.0];
        for off in [0usize, 1] {
            let mut d = vec![0u8; off];
            d.extend_from_slice(bytemuck::cast_slice(&a));
            let mut s = vec![0u8; off];
            s.extend_from_slice(bytemuck::cast_slice(&b));
            reduce_into(&mut d[off..], &s[off..], Dtype::F32, ReduceOp::Sum);
            let got: Vec<f32> = d[off..]
                .chunks(4)
                .map(bytemuck::pod_read_unaligned)
                .collect();
            assert_eq!(got, vec![1.5, 2.0, 2.5]);
        }
        let mut d: Vec<u8> = bytemuck::cast_slice(&a).to_vec();
        reduce_into(&mut d, bytemuck::cast_slice(&b), Dtype::F32, ReduceOp::Max);
        assert_eq!(bytemuck::cast_slice::<u8, f32>(&d), &[1.0, 4.0, 3.5]);
    }

    #[test]
    fn halves_ints_and_bools() {
        let mut d: Vec<u8> = bytemuck::cast_slice(&[bf16::from_f32(1.5)]).to_vec();
        reduce_into(
            &mut d,
            bytemuck::cast_slice(&[bf16::from_f32(2.0)]),
            Dtype::BF16,
            ReduceOp::Sum,
        );
        assert_eq!(bytemuck::cast_slice::<u8, bf16>(&d)[0].to_f32(), 3.5);
        let mut d: Vec<u8> = bytemuck::cast_slice(&[i32::MAX]).to_vec();
        reduce_into(
            &mut d,
            bytemuck::cast_slice(&[1i32]),
            Dtype::I32,
            ReduceOp::Sum,
        );
        assert_eq!(bytemuck::cast_slice::<u8, i32>(&d)[0], i32::MIN);
        let mut d = vec![0u8, 1, 1];
        reduce_into(&mut d, &[1, 0, 1], Dtype::Bool, ReduceOp::Min);
        assert_eq!(d, vec![0, 0, 1]);
    }
}
