//! Batched matrix products on top of [`blas::sgemm`],
//! and for bfloat16 on CPUs with AVX512_BF16 on the bfloat16 GEMM
//! (`gemm_bf16`, on AMX tiles where the CPU has them), whose float32 sums
//! are rounded to bfloat16 once.

#[cfg(target_arch = "x86_64")]
pub(super) mod amx;
#[cfg(target_arch = "x86_64")]
mod bf16_instructions;
pub mod blas;
#[cfg(target_arch = "x86_64")]
pub(super) mod gemm_bf16;

use super::copy::copy_cast;
use super::strided::{Layout, for_each_run};
use crate::Dtype;
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;

/// How one operand's matrices can be handed to GEMM without a copy.
fn gemm_view(strides: &[isize], rows: usize, cols: usize) -> Option<(bool, usize)> {
    let n = strides.len();
    let (rs, cs) = (strides[n - 2], strides[n - 1]);
    if (cs == 1 || cols == 1) && rs >= cols as isize && rs > 0 {
        Some((false, rs as usize))
    } else if (rs == 1 || rows == 1) && cs >= rows as isize && cs > 0 {
        Some((true, cs as usize))
    } else if rows == 1 && cols == 1 {
        Some((false, 1))
    } else {
        None
    }
}

/// Prepares an operand: f32 data whose matrices GEMM can read directly.
fn operand(x: &Operand<'_>) -> (ArrayData, bool, usize) {
    let (r, c) = (x.shape[x.ndim() - 2], x.shape[x.ndim() - 1]);
    if x.dtype == Dtype::F32
        && let Some((t, ld)) = gemm_view(x.data.strides(), r, c)
    {
        return (x.data.clone(), t, ld);
    }
    let copy = copy_cast(x, Dtype::F32);
    (copy, false, c.max(1))
}

/// `a @ b` for `a` of shape `[..., m, k]` and `b` of `[..., k, n]` whose batch
/// dimensions are already broadcast to `out_shape[..-2]`. Floats only; f16
/// and bf16 compute in f32 (bf16 with AMX's or AVX512_BF16's products where
/// the CPU has them, see [`bf16_gemm`]).
pub fn matmul(a: &Operand<'_>, b: &Operand<'_>, out_shape: &[usize]) -> ArrayData {
    let (a_shape, dtype) = (a.shape, a.dtype);
    #[cfg(target_arch = "x86_64")]
    if dtype == Dtype::BF16 && bf16_gemm() {
        return matmul_bf16(a, b, out_shape);
    }
    let nd = out_shape.len();
    let (m, n, k) = (
        out_shape[nd - 2],
        out_shape[nd - 1],
        a_shape[a_shape.len() - 1],
    );
    let (a32, ta, lda) = operand(a);
    let (b32, tb, ldb) = operand(b);
    let mut out = ArrayData::alloc(out_shape, Dtype::F32);
    let total = size_of_shape(out_shape);
    if total == 0 {
        return out;
    }
    let c = out.as_mut_slice::<f32>(total).as_mut_ptr();
    let batch = &out_shape[..nd - 2];
    let layout = Layout::<2>::new(
        batch,
        [&a32.strides()[..nd - 2], &b32.strides()[..nd - 2]],
        [a32.offset(), b32.offset()],
    );
    let (pa, pb) = (
        a32.storage().as_ptr() as *const f32,
        b32.storage().as_ptr() as *const f32,
    );
    let mut idx = 0usize;
    for_each_run(&layout, |[oa, ob], run, [sa, sb]| {
        for r in 0..run as isize {
            // SAFETY: offsets address matrices inside each operand; each batch
            // writes its own m x n block of the fresh output.
            unsafe {
                blas::sgemm(
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    1.0,
                    pa.offset(oa + r * sa),
                    lda,
                    pb.offset(ob + r * sb),
                    ldb,
                    0.0,
                    c.add(idx * m * n),
                    n,
                );
                if k == 0 {
                    std::ptr::write_bytes(c.add(idx * m * n), 0, m * n);
                }
            }
            idx += 1;
        }
    });
    if dtype == Dtype::F32 {
        out
    } else {
        copy_cast(&Operand::new(out, out_shape, Dtype::F32), dtype)
    }
}

/// Whether bfloat16 products take the bfloat16 GEMM (AVX512_BF16, and AMX
/// where present): the CPU has it and
/// the CPU tuning's `bf16` is not off (which converts to f32 for `sgemm`,
/// to compare the two in one build).
#[cfg(target_arch = "x86_64")]
fn bf16_gemm() -> bool {
    gemm_bf16::available() && crate::settings::cpu_tuning().bf16
}

/// [`matmul`] of bfloat16 operands on the bfloat16 GEMM: float32 sums,
/// rounded to bfloat16 once, written straight into the bfloat16 output.
#[cfg(target_arch = "x86_64")]
fn matmul_bf16(a: &Operand<'_>, b: &Operand<'_>, out_shape: &[usize]) -> ArrayData {
    use gemm_bf16::{Matrix, gemm};
    let nd = out_shape.len();
    let (m, n, k) = (out_shape[nd - 2], out_shape[nd - 1], a.shape[a.ndim() - 1]);
    let view = |x: &Operand<'_>| {
        let (r, c) = (x.shape[x.ndim() - 2], x.shape[x.ndim() - 1]);
        match gemm_view(x.data.strides(), r, c) {
            Some(v) => (x.data.clone(), v),
            None => (copy_cast(x, Dtype::BF16), (false, c.max(1))),
        }
    };
    let (a16, (ta, lda)) = view(a);
    let (b16, (tb, ldb)) = view(b);
    let mut out = ArrayData::alloc(out_shape, Dtype::BF16);
    let total = size_of_shape(out_shape);
    if total == 0 {
        return out;
    }
    let c = out.as_mut_slice::<half::bf16>(total).as_mut_ptr() as *mut u16;
    let layout = Layout::<2>::new(
        &out_shape[..nd - 2],
        [&a16.strides()[..nd - 2], &b16.strides()[..nd - 2]],
        [a16.offset(), b16.offset()],
    );
    let (pa, pb) = (
        a16.storage().as_ptr() as *const u16,
        b16.storage().as_ptr() as *const u16,
    );
    let matrix = |ptr: *const u16, t: bool, ld: usize| Matrix {
        ptr,
        rs: if t { 1 } else { ld },
        cs: if t { ld } else { 1 },
    };
    let mut idx = 0usize;
    for_each_run(&layout, |[oa, ob], run, [sa, sb]| {
        for r in 0..run as isize {
            // SAFETY: `bf16_gemm` checked the CPU; offsets address matrices
            // inside each operand; each batch writes its own m x n block
            // of the fresh output.
            unsafe {
                gemm(
                    m,
                    n,
                    k,
                    matrix(pa.offset(oa + r * sa), ta, lda),
                    matrix(pb.offset(ob + r * sb), tb, ldb),
                    c.add(idx * m * n),
                    n,
                );
            }
            idx += 1;
        }
    });
    out
}
