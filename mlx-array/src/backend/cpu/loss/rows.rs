//! Row helpers the loss kernels share (and attention and the norms use):
//! class targets read from an integer array, and f32 row reductions in
//! lanes the compiler vectorises, run under [`vectorised`] for AVX-512.

use crate::backend::cpu::copy::copy_cast;
use crate::backend::cpu::math;
use crate::{Dtype, Error, Operand, Result};

/// A target that contributes nothing (its row equals the ignore index).
pub(in crate::backend::cpu) const IGNORED: usize = usize::MAX;

/// Targets as class indices, with rows equal to `ignore` marked
/// [`IGNORED`]; an index outside `0..vocab` is an error of `op`.
pub(super) fn targets(
    op: &str,
    t: &Operand<'_>,
    vocab: usize,
    ignore: Option<i64>,
) -> Result<Vec<usize>> {
    let c = copy_cast(t, Dtype::I64);
    c.as_slice::<i64>(t.size())
        .iter()
        .map(|&i| {
            if Some(i) == ignore {
                Ok(IGNORED)
            } else if i < 0 || i as usize >= vocab {
                Err(Error::eval(
                    op,
                    format!("target {i} is out of range for {vocab} classes"),
                ))
            } else {
                Ok(i as usize)
            }
        })
        .collect()
}

/// Independent accumulators per reduction, so that the compiler vectorises
/// the loops below (f32 sums are not reassociated on their own).
const LANES: usize = 16;

/// `max(init, max(row))`.
#[inline]
pub(in crate::backend::cpu) fn max_of(row: &[f32], init: f32) -> f32 {
    let mut acc = [init; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(c[i]);
        }
    }
    rest.iter().chain(&acc).fold(init, |m, &x| m.max(x))
}

/// `sum(exp(row - m))`.
#[inline]
pub(super) fn sum_exp(row: &[f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += math::exp(c[i] - m);
        }
    }
    acc.iter().sum::<f32>() + rest.iter().map(|&x| math::exp(x - m)).sum::<f32>()
}

/// `sum(row)`.
#[inline]
pub(super) fn sum_of(row: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = row.chunks_exact(LANES);
    let rest = chunks.remainder();
    for c in chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// Replaces every `x` of `row` by `exp(x - m)` and returns their sum, in
/// lanes (inlined so that it vectorises inside [`vectorised`]).
#[inline(always)]
pub(in crate::backend::cpu) fn exp_shifted_in_place(row: &mut [f32], m: f32) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = row.chunks_exact_mut(LANES);
    for ch in &mut chunks {
        for i in 0..LANES {
            ch[i] = math::exp(ch[i] - m);
            acc[i] += ch[i];
        }
    }
    let mut sum = acc.iter().sum::<f32>();
    for x in chunks.into_remainder() {
        *x = math::exp(*x - m);
        sum += *x;
    }
    sum
}

/// Runs `f` compiled for AVX-512 (else AVX2 and FMA) when the CPU has it, so
/// that the `exp` loops inlined into it use 16- (else 8-) wide vectors.
///
/// Only code inlined into `f` gets the wider instructions, and LLVM does not
/// inline a large closure on its own: pass `#[inline(always)] || ...`, or
/// the body runs as plain SSE2 (the one-pass loss's row pass then took 2.6
/// times as long as with AVX-512). Every path does the same operations in
/// the same order, so the results do not depend on the path taken.
#[inline(always)]
pub(in crate::backend::cpu) fn vectorised<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        if std::is_x86_feature_detected!("avx512f") {
            #[target_feature(enable = "avx512f,avx2,fma")]
            unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { avx512(f) };
        }
        if std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma") {
            #[target_feature(enable = "avx2,fma")]
            unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
                f()
            }
            // SAFETY: the CPU supports the features the function is compiled for.
            return unsafe { avx2(f) };
        }
    }
    f()
}
