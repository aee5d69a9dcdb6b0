//! Reductions over any set of axes, and argmax/argmin along one axis.

use half::{bf16, f16};
use rayon::prelude::*;

use super::copy::copy_cast;
use super::math::FloatLike;
use super::strided::{Layout, SyncPtr, base_ptr, fill_segments};
use crate::backend::common::reduce::ReduceOp;
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Bool8, Dtype, Element};

/// Where each output element's run of reduced values starts, and how to walk it.
struct Plan {
    kept_shape: Vec<usize>,
    kept_strides: Vec<isize>,
    offset: usize,
    len: usize,
    stride: isize,
    data: ArrayData,
}

/// Arranges `data` so that the values reduced into one output form a single
/// strided run, copying only when the reduced axes cannot be walked that way.
fn plan(data: &ArrayData, shape: &[usize], dtype: Dtype, axes: &[usize]) -> Plan {
    let kept: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let rshape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    let rstrides: Vec<isize> = axes.iter().map(|&a| data.strides()[a]).collect();
    let kept_shape: Vec<usize> = kept.iter().map(|&a| shape[a]).collect();
    let run = Layout::<1>::new(&rshape, [&rstrides], [0]);
    if run.rows() <= 1 {
        return Plan {
            kept_strides: kept.iter().map(|&a| data.strides()[a]).collect(),
            kept_shape,
            offset: data.offset(),
            len: size_of_shape(&rshape),
            stride: run.inner_strides[0],
            data: data.clone(),
        };
    }
    // Permute to kept-then-reduced and copy contiguous.
    let perm: Vec<usize> = kept.iter().chain(axes).copied().collect();
    let pshape: Vec<usize> = perm.iter().map(|&a| shape[a]).collect();
    let pview = data.view(
        perm.iter().map(|&a| data.strides()[a]).collect(),
        data.offset(),
    );
    let copy = copy_cast(&Operand::new(pview, &pshape, dtype), dtype);
    let len = size_of_shape(&rshape);
    Plan {
        kept_strides: crate::shape::contiguous_strides(&kept_shape)
            .iter()
            .map(|s| s * len as isize)
            .collect(),
        kept_shape,
        offset: 0,
        len,
        stride: 1,
        data: copy,
    }
}

/// How one reduction folds values of the storage type `T` into an accumulator.
trait Fold<T>: Sync {
    type Acc: Copy + Send + Sync;
    type Out: Element;
    fn init(&self) -> Self::Acc;
    fn step(&self, acc: Self::Acc, x: T) -> Self::Acc;
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
    fn finish(&self, acc: Self::Acc) -> Self::Out;
}

struct FloatFold(ReduceOp);
impl<T: FloatLike> Fold<T> for FloatFold {
    type Acc = f32;
    type Out = T;
    fn init(&self) -> f32 {
        match self.0 {
            ReduceOp::Sum => 0.0,
            ReduceOp::Prod => 1.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        }
    }
    #[inline(always)]
    fn step(&self, acc: f32, x: T) -> f32 {
        <Self as Fold<T>>::merge(self, acc, x.to_f32())
    }
    #[inline(always)]
    fn merge(&self, a: f32, x: f32) -> f32 {
        match self.0 {
            ReduceOp::Sum => a + x,
            ReduceOp::Prod => a * x,
            ReduceOp::Max => {
                if x > a || x.is_nan() {
                    x
                } else {
                    a
                }
            }
            ReduceOp::Min => {
                if x < a || x.is_nan() {
                    x
                } else {
                    a
                }
            }
        }
    }
    fn finish(&self, acc: f32) -> T {
        T::from_f32(acc)
    }
}

macro_rules! int_fold {
    ($name:ident, $t:ty) => {
        struct $name(ReduceOp);
        impl Fold<$t> for $name {
            type Acc = $t;
            type Out = $t;
            fn init(&self) -> $t {
                match self.0 {
                    ReduceOp::Sum => 0,
                    ReduceOp::Prod => 1,
                    ReduceOp::Max => <$t>::MIN,
                    ReduceOp::Min => <$t>::MAX,
                }
            }
            #[inline(always)]
            fn step(&self, acc: $t, x: $t) -> $t {
                self.merge(acc, x)
            }
            #[inline(always)]
            fn merge(&self, a: $t, x: $t) -> $t {
                match self.0 {
                    ReduceOp::Sum => a.wrapping_add(x),
                    ReduceOp::Prod => a.wrapping_mul(x),
                    ReduceOp::Max => a.max(x),
                    ReduceOp::Min => a.min(x),
                }
            }
            fn finish(&self, acc: $t) -> $t {
                acc
            }
        }
    };
}
int_fold!(I32Fold, i32);
int_fold!(I64Fold, i64);
int_fold!(U32Fold, u32);

/// Sum and product of bools count in int32; max and min are any and all.
struct BoolFold(ReduceOp);
impl Fold<Bool8> for BoolFold {
    type Acc = i32;
    type Out = i32;
    fn init(&self) -> i32 {
        I32Fold(self.0).init().clamp(0, 1)
    }
    #[inline(always)]
    fn step(&self, acc: i32, x: Bool8) -> i32 {
        self.merge(acc, x.0 as i32)
    }
    #[inline(always)]
    fn merge(&self, a: i32, b: i32) -> i32 {
        I32Fold(self.0).merge(a, b)
    }
    fn finish(&self, acc: i32) -> i32 {
        acc
    }
}

#[inline(always)]
unsafe fn fold_run<T: Element, F: Fold<T>>(
    f: &F,
    p: *const T,
    len: usize,
    stride: isize,
) -> F::Acc {
    let mut acc = f.init();
    if stride == 1 {
        // SAFETY: caller guarantees `len` contiguous elements at `p`.
        let s = unsafe { std::slice::from_raw_parts(p, len) };
        // Eight independent accumulators: vectorisable and more accurate.
        let mut lanes = [f.init(); 8];
        let chunks = s.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for k in 0..8 {
                lanes[k] = f.step(lanes[k], c[k]);
            }
        }
        for l in lanes {
            acc = f.merge(acc, l);
        }
        for &x in rest {
            acc = f.step(acc, x);
        }
    } else {
        for i in 0..len {
            // SAFETY: caller guarantees the run lies in the view.
            acc = f.step(acc, unsafe { *p.offset(i as isize * stride) });
        }
    }
    acc
}

fn run_fold<T: Element, F: Fold<T>>(f: F, p: Plan) -> ArrayData {
    let n_out = size_of_shape(&p.kept_shape);
    let mut out = ArrayData::alloc(&p.kept_shape, F::Out::DTYPE);
    let base = base_ptr::<T>(&p.data);
    let (len, stride) = (p.len, p.stride);
    let o = out.as_mut_slice::<F::Out>(n_out);
    let threads = rayon::current_num_threads();
    if n_out < threads && len >= 1 << 16 {
        // Few long runs: split each run across threads and merge the partials.
        let layout = Layout::<1>::new(&p.kept_shape, [&p.kept_strides], [p.offset]);
        for (r, slot) in o.iter_mut().enumerate() {
            let start = layout.row_offsets(r)[0];
            let chunk = len.div_ceil(threads * 4);
            let acc = (0..len.div_ceil(chunk))
                .into_par_iter()
                .map(|c| {
                    let lo = c * chunk;
                    let n = chunk.min(len - lo);
                    // SAFETY: sub-run of a run inside the view.
                    unsafe { fold_run(&f, base.at(start + lo as isize * stride), n, stride) }
                })
                .reduce(|| f.init(), |a, b| f.merge(a, b));
            *slot = f.finish(acc);
        }
        return out;
    }
    let layout = Layout::<1>::new(&p.kept_shape, [&p.kept_strides], [p.offset]);
    fill_segments(o, &layout, |seg, [off], [s]| {
        for (i, slot) in seg.iter_mut().enumerate() {
            // SAFETY: each output's run lies inside the view.
            let acc = unsafe { fold_run(&f, base.at(off + i as isize * s), len, stride) };
            *slot = f.finish(acc);
        }
    });
    out
}

/// Reduces `data` (of `shape`, `dtype`) over `axes` (sorted, distinct). The
/// result is contiguous with the kept dimensions only.
pub fn reduce(op: ReduceOp, x: &Operand<'_>, axes: &[usize]) -> ArrayData {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    let p = plan(data, shape, dtype, axes);
    match dtype {
        Dtype::F32 => run_fold::<f32, _>(FloatFold(op), p),
        Dtype::F16 => run_fold::<f16, _>(FloatFold(op), p),
        Dtype::BF16 => run_fold::<bf16, _>(FloatFold(op), p),
        Dtype::I32 => run_fold::<i32, _>(I32Fold(op), p),
        Dtype::I64 => run_fold::<i64, _>(I64Fold(op), p),
        Dtype::U32 => run_fold::<u32, _>(U32Fold(op), p),
        Dtype::Bool => {
            let counts = run_fold::<Bool8, _>(BoolFold(op), p);
            match op {
                ReduceOp::Max | ReduceOp::Min => {
                    let shape: Vec<usize> = (0..shape.len())
                        .filter(|a| !axes.contains(a))
                        .map(|a| shape[a])
                        .collect();
                    copy_cast(&Operand::new(counts, &shape, Dtype::I32), Dtype::Bool)
                }
                _ => counts,
            }
        }
    }
}

/// Index of the first maximum (or minimum) along `axis`, as uint32, kept
/// dimensions only.
pub fn arg_reduce(is_max: bool, x: &Operand<'_>, axis: usize) -> ArrayData {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    let p = plan(data, shape, dtype, &[axis]);
    super::dispatch!(dtype, T => arg_run::<T>(is_max, p))
}

fn arg_run<T: Element + PartialOrd>(is_max: bool, p: Plan) -> ArrayData {
    let n_out = size_of_shape(&p.kept_shape);
    let mut out = ArrayData::alloc(&p.kept_shape, Dtype::U32);
    let base: SyncPtr<T> = base_ptr::<T>(&p.data);
    let (len, stride) = (p.len, p.stride);
    let layout = Layout::<1>::new(&p.kept_shape, [&p.kept_strides], [p.offset]);
    fill_segments(
        out.as_mut_slice::<u32>(n_out),
        &layout,
        |seg, [off], [s]| {
            for (i, slot) in seg.iter_mut().enumerate() {
                // SAFETY: each run lies inside the view.
                unsafe {
                    let ptr = base.at(off + i as isize * s);
                    let mut best = *ptr;
                    let mut at = 0u32;
                    #[allow(clippy::eq_op)]
                    for j in 1..len {
                        let x = *ptr.offset(j as isize * stride);
                        let nan_x = x != x;
                        let nan_best = best != best;
                        let better = if is_max { x > best } else { x < best };
                        if !nan_best && (better || nan_x) {
                            best = x;
                            at = j as u32;
                        }
                    }
                    *slot = at;
                }
            }
        },
    );
    out
}
