//! Iteration over strided views: the one place that turns n-d strides into
//! flat loops, collapsing dimensions and splitting work across threads.

use rayon::prelude::*;

/// Below this many output elements a kernel runs on the calling thread.
pub const PARALLEL_THRESHOLD: usize = 1 << 15;

/// The loop structure of an n-d iteration over `N` operands that share a
/// shape: outer dimensions (walked with an odometer) and one inner run.
#[derive(Debug, Clone)]
pub struct Layout<const N: usize> {
    outer: Vec<usize>,
    outer_strides: Vec<[isize; N]>,
    /// Length of the innermost run.
    pub inner: usize,
    /// Stride of each operand along the innermost run.
    pub inner_strides: [isize; N],
    base: [isize; N],
}

impl<const N: usize> Layout<N> {
    /// Builds the loop for `shape` and each operand's strides and element offset,
    /// merging dimensions that are contiguous for every operand.
    pub fn new(shape: &[usize], strides: [&[isize]; N], offsets: [usize; N]) -> Self {
        let mut dims: Vec<(usize, [isize; N])> = Vec::new();
        for (d, &n) in shape.iter().enumerate() {
            if n == 1 {
                continue;
            }
            let s: [isize; N] = std::array::from_fn(|k| strides[k][d]);
            if let Some(last) = dims.last_mut()
                && (0..N).all(|k| last.1[k] == s[k] * n as isize)
            {
                last.0 *= n;
                last.1 = s;
                continue;
            }
            dims.push((n, s));
        }
        let base = offsets.map(|o| o as isize);
        let (inner, inner_strides) = dims.pop().unwrap_or((1, [0; N]));
        let inner = if shape.contains(&0) { 0 } else { inner };
        Layout {
            outer: dims.iter().map(|d| d.0).collect(),
            outer_strides: dims.iter().map(|d| d.1).collect(),
            inner,
            inner_strides,
            base,
        }
    }

    /// Number of inner runs.
    pub fn rows(&self) -> usize {
        if self.inner == 0 {
            0
        } else {
            self.outer.iter().product()
        }
    }

    /// The element offset of each operand at the start of inner run `row`.
    pub fn row_offsets(&self, mut row: usize) -> [isize; N] {
        let mut off = self.base;
        for (d, &n) in self.outer.iter().enumerate().rev() {
            let i = (row % n) as isize;
            row /= n;
            for (k, o) in off.iter_mut().enumerate() {
                *o += i * self.outer_strides[d][k];
            }
        }
        off
    }
}

/// Fills the contiguous `out` (one element per position of `layout`'s shape)
/// segment by segment: `f(out_segment, start_offsets, inner_strides)` where each
/// segment is a part of one inner run. Large outputs are split across threads.
pub fn fill_segments<const N: usize, O: Send>(
    out: &mut [O],
    layout: &Layout<N>,
    f: impl Fn(&mut [O], [isize; N], [isize; N]) + Sync,
) {
    let inner = layout.inner;
    let rows = layout.rows();
    if rows == 0 {
        return;
    }
    let st = layout.inner_strides;
    if out.len() < PARALLEL_THRESHOLD {
        for (r, seg) in out.chunks_mut(inner).enumerate() {
            f(seg, layout.row_offsets(r), st);
        }
        return;
    }
    let tasks = rayon::current_num_threads() * 4;
    if rows >= tasks {
        let rows_per = rows.div_ceil(tasks);
        out.par_chunks_mut(rows_per * inner)
            .enumerate()
            .for_each(|(c, chunk)| {
                for (i, seg) in chunk.chunks_mut(inner).enumerate() {
                    f(seg, layout.row_offsets(c * rows_per + i), st);
                }
            });
    } else {
        let per = inner.div_ceil(tasks).max(PARALLEL_THRESHOLD / 4);
        for (r, row) in out.chunks_mut(inner).enumerate() {
            let base = layout.row_offsets(r);
            row.par_chunks_mut(per).enumerate().for_each(|(c, seg)| {
                let start = std::array::from_fn(|k| base[k] + (c * per) as isize * st[k]);
                f(seg, start, st);
            });
        }
    }
}

/// Calls `f(start_offsets, len, inner_strides)` for every inner run, serially.
pub fn for_each_run<const N: usize>(
    layout: &Layout<N>,
    mut f: impl FnMut([isize; N], usize, [isize; N]),
) {
    for r in 0..layout.rows() {
        f(layout.row_offsets(r), layout.inner, layout.inner_strides);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn collapses_contiguous_dims() {
        let l = Layout::<1>::new(&[2, 3, 4], [&[12, 4, 1]], [0]);
        assert_eq!((l.rows(), l.inner, l.inner_strides), (1, 24, [1]));
        let t = Layout::<1>::new(&[3, 2], [&[1, 3]], [0]);
        assert_eq!((t.rows(), t.inner, t.inner_strides), (3, 2, [3]));
        assert_eq!(t.row_offsets(2), [2]);
    }

    #[test]
    fn zero_sized_shapes_have_no_rows() {
        let l = Layout::<1>::new(&[2, 0, 3], [&[0, 3, 1]], [0]);
        assert_eq!(l.rows(), 0);
    }
}

/// A raw pointer that kernels share across worker threads. Workers only read
/// through it, or write disjoint elements.
#[derive(Clone, Copy)]
pub struct SyncPtr<T>(pub *const T);
// SAFETY: see the type's doc: shared reads, disjoint writes.
unsafe impl<T> Send for SyncPtr<T> {}
unsafe impl<T> Sync for SyncPtr<T> {}

impl<T> SyncPtr<T> {
    /// The element at offset `i` (in elements) from the base.
    ///
    /// # Safety
    /// `i` must address an element inside the allocation.
    #[inline(always)]
    pub unsafe fn at(self, i: isize) -> *const T {
        unsafe { self.0.offset(i) }
    }
}

/// The base pointer of a view's storage, typed (offsets are added by [`Layout`]).
pub fn base_ptr<T>(data: &crate::ArrayData) -> SyncPtr<T> {
    SyncPtr(data.storage().as_ptr() as *const T)
}

/// `out[i] = f(a[i])` over a strided input into a new contiguous buffer.
pub fn map1<A: crate::Element, O: crate::Element>(
    shape: &[usize],
    a: &crate::ArrayData,
    f: impl Fn(A) -> O + Sync,
) -> crate::ArrayData {
    let n = crate::shape::size_of_shape(shape);
    let mut out = crate::ArrayData::alloc(shape, O::DTYPE);
    let layout = Layout::<1>::new(shape, [a.strides()], [a.offset()]);
    let pa = base_ptr::<A>(a);
    fill_segments(out.as_mut_slice::<O>(n), &layout, |seg, [oa], [sa]| {
        // SAFETY: the layout only produces offsets inside `a`'s view.
        unsafe {
            let p = pa.at(oa);
            if sa == 1 {
                run1(std::slice::from_raw_parts(p, seg.len()), seg, &f);
            } else {
                for (i, o) in seg.iter_mut().enumerate() {
                    *o = f(*p.offset(i as isize * sa));
                }
            }
        }
    });
    out
}

/// `out[i] = f(a[i], b[i])` over two strided inputs of the same shape.
pub fn map2<A: crate::Element, B: crate::Element, O: crate::Element>(
    shape: &[usize],
    a: &crate::ArrayData,
    b: &crate::ArrayData,
    f: impl Fn(A, B) -> O + Sync,
) -> crate::ArrayData {
    let n = crate::shape::size_of_shape(shape);
    let mut out = crate::ArrayData::alloc(shape, O::DTYPE);
    let layout = Layout::<2>::new(shape, [a.strides(), b.strides()], [a.offset(), b.offset()]);
    let (pa, pb) = (base_ptr::<A>(a), base_ptr::<B>(b));
    fill_segments(
        out.as_mut_slice::<O>(n),
        &layout,
        |seg, [oa, ob], [sa, sb]| {
            let len = seg.len();
            // SAFETY: the layout only produces offsets inside each view.
            unsafe {
                let (x, y) = (pa.at(oa), pb.at(ob));
                match (sa, sb) {
                    (1, 1) => run2(
                        std::slice::from_raw_parts(x, len),
                        std::slice::from_raw_parts(y, len),
                        seg,
                        &f,
                    ),
                    (1, 0) => {
                        let (x, v) = (std::slice::from_raw_parts(x, len), *y);
                        for (o, &u) in seg.iter_mut().zip(x) {
                            *o = f(u, v);
                        }
                    }
                    (0, 1) => {
                        let (u, y) = (*x, std::slice::from_raw_parts(y, len));
                        for (o, &v) in seg.iter_mut().zip(y) {
                            *o = f(u, v);
                        }
                    }
                    _ => {
                        for (i, o) in seg.iter_mut().enumerate() {
                            let i = i as isize;
                            *o = f(*x.offset(i * sa), *y.offset(i * sb));
                        }
                    }
                }
            }
        },
    );
    out
}

/// `a[i] = f(a[i], b[i])` written over `a`, a dense buffer the caller has
/// proven nobody else reads (a donated input), with `b` any strided view of
/// the same shape: the output of a binary op without a new allocation.
pub fn map2_in_place<A: crate::Element, B: crate::Element>(
    shape: &[usize],
    a: crate::ArrayData,
    b: &crate::ArrayData,
    f: impl Fn(A, B) -> A + Sync,
) -> crate::ArrayData {
    let n = crate::shape::size_of_shape(shape);
    // `a` is dense in `shape`'s order, so `b`'s layout alone walks both.
    let layout = Layout::<1>::new(shape, [b.strides()], [b.offset()]);
    let pb = base_ptr::<B>(b);
    // SAFETY: `a` was donated: no other handle reads or writes its buffer.
    let out = unsafe { a.as_mut_slice_unchecked::<A>(n) };
    fill_segments(out, &layout, |seg, [ob], [sb]| {
        // SAFETY: the layout only produces offsets inside `b`'s view.
        unsafe {
            let y = pb.at(ob);
            match sb {
                0 => {
                    let v = *y;
                    for o in seg.iter_mut() {
                        *o = f(*o, v);
                    }
                }
                1 => {
                    let ys = std::slice::from_raw_parts(y, seg.len());
                    for (o, &v) in seg.iter_mut().zip(ys) {
                        *o = f(*o, v);
                    }
                }
                _ => {
                    for (i, o) in seg.iter_mut().enumerate() {
                        *o = f(*o, *y.offset(i as isize * sb));
                    }
                }
            }
        }
    });
    a
}

/// `out[i] = f(a[i], b[i], c[i])` over three strided inputs of the same shape.
pub fn map3<A: crate::Element, B: crate::Element, C: crate::Element, O: crate::Element>(
    shape: &[usize],
    a: &crate::ArrayData,
    b: &crate::ArrayData,
    c: &crate::ArrayData,
    f: impl Fn(A, B, C) -> O + Sync,
) -> crate::ArrayData {
    let n = crate::shape::size_of_shape(shape);
    let mut out = crate::ArrayData::alloc(shape, O::DTYPE);
    let layout = Layout::<3>::new(
        shape,
        [a.strides(), b.strides(), c.strides()],
        [a.offset(), b.offset(), c.offset()],
    );
    let (pa, pb, pc) = (base_ptr::<A>(a), base_ptr::<B>(b), base_ptr::<C>(c));
    fill_segments(
        out.as_mut_slice::<O>(n),
        &layout,
        |seg, [oa, ob, oc], [sa, sb, sc]| {
            // SAFETY: the layout only produces offsets inside each view.
            unsafe {
                let (x, y, z) = (pa.at(oa), pb.at(ob), pc.at(oc));
                for (i, o) in seg.iter_mut().enumerate() {
                    let i = i as isize;
                    *o = f(*x.offset(i * sa), *y.offset(i * sb), *z.offset(i * sc));
                }
            }
        },
    );
    out
}

/// The contiguous inner loops, compiled twice: for the baseline target and,
/// on x86-64, for AVX2 + FMA (chosen at run time), so that math such as
/// `exp` vectorises 8 lanes wide on machines that have it.
#[inline(always)]
fn zip1<A: Copy, O>(src: &[A], dst: &mut [O], f: &impl Fn(A) -> O) {
    for (o, &x) in dst.iter_mut().zip(src) {
        *o = f(x);
    }
}

#[inline(always)]
fn zip2<A: Copy, B: Copy, O>(a: &[A], b: &[B], dst: &mut [O], f: &impl Fn(A, B) -> O) {
    for ((o, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip1_avx2<A: Copy, O>(src: &[A], dst: &mut [O], f: &impl Fn(A) -> O) {
    zip1(src, dst, f)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn zip2_avx2<A: Copy, B: Copy, O>(a: &[A], b: &[B], dst: &mut [O], f: &impl Fn(A, B) -> O) {
    zip2(a, b, dst, f)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[inline(always)]
fn run1<A: Copy, O>(src: &[A], dst: &mut [O], f: &impl Fn(A) -> O) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { zip1_avx2(src, dst, f) };
    }
    zip1(src, dst, f)
}

#[inline(always)]
fn run2<A: Copy, B: Copy, O>(a: &[A], b: &[B], dst: &mut [O], f: &impl Fn(A, B) -> O) {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports the features the function is compiled for.
        return unsafe { zip2_avx2(a, b, dst, f) };
    }
    zip2(a, b, dst, f)
}
