//! One row block of the one-pass output projection + cross-entropy
//! (`Lce::value_and_grad`) on AVX-512, with no packing of the 50,257 x 256
//! output weight.
//!
//! Through the BLAS, each block of rows paid for OpenBLAS packing the whole
//! weight twice and the block's gradients once (a fifth of the time of the
//! loss on one core, `perf`). Here the logits are kept transposed, one
//! column per row of the block (`lt[v][t]`), so that all three products are
//! `C (+)= A @ B` with `B` and `C` read and written in place, row-major,
//! and `A` broadcast one element at a time from wherever it lies:
//!
//! - `lt = w @ h^T`: `A` is `w` itself, `B` the block's `h` transposed
//!   (small, made once per block);
//! - `dw (+)= g^T @ h`: `A` is the gradient `g^T` in `lt`, `B` is `h`;
//! - `dh^T = w^T @ g^T`: `A` is `w` read down its columns.
//!
//! The vocabulary is walked in chunks of [`VC`] classes so that a chunk's
//! logits and weights stay in the L2 cache between the products that use
//! them. Sums over chunks run in a fixed order, so the result does not
//! depend on the number of threads.

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::{IGNORED, vectorised};
use crate::backend::cpu::math;
use crate::{ArrayData, Dtype};

/// Columns of a micro-tile: two 16-lane vectors.
pub(super) const NR: usize = 32;
/// Rows of a micro-tile: 2 x 12 accumulators and 2 vectors of `B` in the
/// 32 vector registers.
pub(super) const MR: usize = 12;
/// Vocabulary classes per chunk: 256 x 256 f32 weights (256 KiB) and their
/// logits stay in L2 together.
pub(super) const VC: usize = 256;
/// Partial `dh^T` sums, one per contiguous group of chunks, added in order.
const GROUPS: usize = 16;

/// Whether the fast path applies: an AVX-512 CPU and a feature axis that
/// is a whole number of micro-tile columns.
pub(super) fn available(dims: usize) -> bool {
    dims > 0 && dims.is_multiple_of(NR) && is_x86_feature_detected!("avx512f")
}

/// Whether the one-pass loss takes this path: [`available`], unless
/// the tuning's `loss=blas` (`MLX_CPU_TUNING`) asks for the BLAS path (to
/// compare the two in one build).
pub(super) fn enabled(dims: usize) -> bool {
    use crate::settings::{LossPath, cpu_tuning};
    available(dims) && cpu_tuning().loss == LossPath::Fused
}

/// Rows per block rounded up to whole micro-tile columns of `lt`.
pub(super) fn round_block(rows: usize) -> usize {
    rows.div_ceil(NR) * NR
}

/// Where `A` of a product lies: element `(i, p)` at `ptr + i * rs + p * cs`.
pub(super) struct Strided<T> {
    pub ptr: *const T,
    pub rs: usize,
    pub cs: usize,
}

impl<T> Clone for Strided<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Strided<T> {}

/// One `m x NR` micro-tile of a product, `C (+)= A @ B` over `k` steps:
/// `A[i][p]` at `a.ptr + i * a.rs + p * a.cs`, `B[p][0..NR]` at `b + p *
/// ldb`, `C[i][0..NR]` at `c + i * ldc`; `add` adds to `C` rather than
/// overwriting it.
pub(super) struct Tile<T> {
    pub k: usize,
    pub a: Strided<T>,
    pub b: *const T,
    pub ldb: usize,
    pub c: *mut f32,
    pub ldc: usize,
    pub add: bool,
}

/// The instructions of one element type's micro-tile: load 16 lanes of a
/// row of `B`, broadcast an element of `A` to 16 lanes, and multiply-add
/// the two into 16 float32 sums.
///
/// The methods are `#[inline(always)]`, as is [`Tile::run`], so that they
/// end up in the kernel that calls `run`, which is compiled for the
/// instructions (`#[target_feature]`): code that is not inlined into it
/// would not get them.
pub(super) trait Lanes {
    /// An element of `A` and `B`.
    type Elem: Copy;
    /// 16 lanes of `B`, or an element of `A` broadcast to 16 lanes.
    type Vector: Copy;

    /// The 16 lanes at `p`.
    ///
    /// # Safety
    /// The CPU has the instructions; the 64 bytes at `p` are readable.
    unsafe fn load(p: *const Self::Elem) -> Self::Vector;

    /// `x` in every lane.
    ///
    /// # Safety
    /// The CPU has the instructions.
    unsafe fn broadcast(x: Self::Elem) -> Self::Vector;

    /// `sum` plus the products of `x` and `b`, lane by lane.
    ///
    /// # Safety
    /// The CPU has the instructions.
    unsafe fn multiply_add(sum: __m512, x: Self::Vector, b: Self::Vector) -> __m512;
}

impl<T: Copy> Tile<T> {
    /// The tile with `L`'s instructions, for `M` rows (`m`), `A`'s row
    /// stride taken as 1 when `UNIT_RS` (its offsets then constants).
    ///
    /// `A`'s addresses come from four row pointers (rows `3j`, `3j + 1`,
    /// `3j + 2` at `base[j] + {0, 1, 2} * rs`), each stepped by `cs` per
    /// `p`. With a single pointer walked down the rows and back, every
    /// step's addresses hung on a chain of twelve adds through all the
    /// steps before it, and the tile ran at half speed.
    ///
    /// # Safety
    /// The CPU has AVX-512F and `L`'s instructions, and the caller is
    /// compiled for them; every address named in [`Tile`] is in bounds.
    #[inline(always)]
    pub(super) unsafe fn run<L: Lanes<Elem = T>, const M: usize, const UNIT_RS: bool>(self) {
        let Tile {
            k,
            a,
            b,
            ldb,
            c,
            ldc,
            add,
        } = self;
        // SAFETY: the caller's promise covers every pointer below.
        unsafe {
            let mut acc = [[_mm512_setzero_ps(); 2]; M];
            if add {
                for (i, row) in acc.iter_mut().enumerate() {
                    row[0] = _mm512_loadu_ps(c.add(i * ldc));
                    row[1] = _mm512_loadu_ps(c.add(i * ldc + 16));
                }
            }
            let rs = if UNIT_RS { 1 } else { a.rs };
            let mut base = [a.ptr; 4];
            for (j, p) in base.iter_mut().enumerate() {
                *p = a.ptr.wrapping_add(3 * j * rs);
            }
            let mut bp = b;
            for _ in 0..k {
                let b0 = L::load(bp);
                let b1 = L::load(bp.add(16));
                for (i, row) in acc.iter_mut().enumerate() {
                    let x = L::broadcast(if UNIT_RS {
                        *base[0].add(i)
                    } else {
                        *base[i / 3].add((i % 3) * rs)
                    });
                    row[0] = L::multiply_add(row[0], x, b0);
                    row[1] = L::multiply_add(row[1], x, b1);
                }
                for p in base.iter_mut() {
                    *p = p.wrapping_add(a.cs);
                }
                bp = bp.add(ldb);
            }
            for (i, row) in acc.iter().enumerate() {
                _mm512_storeu_ps(c.add(i * ldc), row[0]);
                _mm512_storeu_ps(c.add(i * ldc + 16), row[1]);
            }
        }
    }
}

/// The f32 instructions: `vfmadd231ps` on AVX-512F.
struct F32Lanes;

impl Lanes for F32Lanes {
    type Elem = f32;
    type Vector = __m512;

    #[inline(always)]
    unsafe fn load(p: *const f32) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_loadu_ps(p) }
    }

    #[inline(always)]
    unsafe fn broadcast(x: f32) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_set1_ps(x) }
    }

    #[inline(always)]
    unsafe fn multiply_add(sum: __m512, x: __m512, b: __m512) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_fmadd_ps(x, b, sum) }
    }
}

/// The f32 micro-tile: [`Tile::run`] with [`F32Lanes`].
///
/// # Safety
/// AVX-512F; every address of the tile is in bounds.
#[target_feature(enable = "avx512f")]
unsafe fn tile<const M: usize, const UNIT_RS: bool>(t: Tile<f32>) {
    // SAFETY: the caller's promise, and this function has the features.
    unsafe { t.run::<F32Lanes, M, UNIT_RS>() }
}

/// A micro-tile kernel: `C (+)= A @ B` for one [`Tile`].
pub(super) type TileFn<T> = unsafe fn(Tile<T>);

/// A kernel's tiles of 1 to [`MR`] rows, for `A` with any row stride and
/// with unit row stride.
pub(super) type Tiles<T> = [[TileFn<T>; 2]; MR];

/// The [`Tiles`] of a kernel generic over `<const M: usize, const
/// UNIT_RS: bool>`.
macro_rules! tiles {
    ($tile:ident) => {
        [
            [$tile::<1, false>, $tile::<1, true>],
            [$tile::<2, false>, $tile::<2, true>],
            [$tile::<3, false>, $tile::<3, true>],
            [$tile::<4, false>, $tile::<4, true>],
            [$tile::<5, false>, $tile::<5, true>],
            [$tile::<6, false>, $tile::<6, true>],
            [$tile::<7, false>, $tile::<7, true>],
            [$tile::<8, false>, $tile::<8, true>],
            [$tile::<9, false>, $tile::<9, true>],
            [$tile::<10, false>, $tile::<10, true>],
            [$tile::<11, false>, $tile::<11, true>],
            [$tile::<12, false>, $tile::<12, true>],
        ]
    };
}
pub(super) use tiles;

/// The f32 tiles.
const F32_TILES: Tiles<f32> = tiles!(tile);

/// `C (+)= A @ B` for `m x n` `C` (row stride `ldc`, `n` a multiple of
/// [`NR`]) and `k x n` `B` (row stride `ldb`), a tile at a time with
/// `tiles`.
///
/// # Safety
/// The CPU has the tiles' features; `A`, `B` and `C` are in bounds for
/// these shapes and `C` overlaps neither input.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm<T>(
    tiles: &Tiles<T>,
    m: usize,
    n: usize,
    k: usize,
    a: Strided<T>,
    b: *const T,
    ldb: usize,
    c: *mut f32,
    ldc: usize,
    add: bool,
    prefetch_c: bool,
) {
    debug_assert!(n.is_multiple_of(NR));
    for i0 in (0..m).step_by(MR) {
        let ai = a.ptr.wrapping_add(i0 * a.rs);
        let ci = c.wrapping_add(i0 * ldc);
        let tile = tiles[(m - i0).min(MR) - 1][usize::from(a.rs == 1)];
        for j0 in (0..n).step_by(NR) {
            let (bj, cj) = (b.wrapping_add(j0), ci.wrapping_add(j0));
            if prefetch_c {
                // The next tile's C, which this one's k steps hide.
                let (ni, nj) = if j0 + NR < n {
                    (i0, j0 + NR)
                } else {
                    (i0 + MR, 0)
                };
                if ni < m {
                    for r in ni..(ni + MR).min(m) {
                        let p = c.wrapping_add(r * ldc + nj) as *const i8;
                        // SAFETY: SSE is part of x86_64; prefetching never faults.
                        unsafe {
                            _mm_prefetch::<_MM_HINT_T0>(p);
                            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64));
                        }
                    }
                }
            }
            // SAFETY: the tile lies inside the caller's shapes.
            unsafe {
                tile(Tile {
                    k,
                    a: Strided { ptr: ai, ..a },
                    b: bj,
                    ldb,
                    c: cj,
                    ldc,
                    add,
                })
            };
        }
    }
}

/// Per-column statistics of one chunk of logits: max, sum of `exp(x -
/// max)`, sum of `x` (for label smoothing), and the logits of the targets
/// that fall in the chunk, as `(column, logit)`.
struct ChunkStats {
    max: Vec<f32>,
    sum: Vec<f32>,
    total: Vec<f32>,
    targets: Vec<(usize, f32)>,
}

/// The statistics of one chunk of logits (classes `v0..`, `width` columns
/// per class) whose columns have targets `tg`; leaves `exp(x - max)` in
/// place of each logit, so that the gradient pass scales instead of
/// computing each exponential again.
fn chunk_stats(
    chunk: &mut [f32],
    v0: usize,
    tg: &[usize],
    width: usize,
    smoothing: bool,
) -> ChunkStats {
    let rows = chunk.len() / width;
    let targets = tg
        .iter()
        .enumerate()
        .filter(|&(_, &y)| y != IGNORED && (v0..v0 + rows).contains(&y))
        .map(|(t, &y)| (t, chunk[(y - v0) * width + t]))
        .collect();
    vectorised(
        #[inline(always)]
        || {
            let mut max = vec![f32::NEG_INFINITY; width];
            let mut sum = vec![0f32; width];
            let mut total = vec![0f32; width];
            for row in chunk.chunks_exact(width) {
                max.iter_mut().zip(row).for_each(|(m, &x)| *m = m.max(x));
            }
            for row in chunk.chunks_exact_mut(width) {
                if smoothing {
                    total.iter_mut().zip(row.iter()).for_each(|(t, &x)| *t += x);
                }
                sum.iter_mut()
                    .zip(row.iter_mut().zip(&max))
                    .for_each(|(s, (x, &m))| {
                        *x = math::exp(*x - m);
                        *s += *x;
                    });
            }
            ChunkStats {
                max,
                sum,
                total,
                targets,
            }
        },
    )
}

/// The three products of one row block, for one element type of `h` and
/// `w`: the driver, [`value_and_grad_block`], does everything else in f32.
pub(super) trait Products: Sync {
    /// Rows of the block (`n`) and their width rounded up to whole tiles.
    fn rows_and_width(&self) -> (usize, usize);

    /// The logits of classes `ci * VC ..` (`rows` of them) into `chunk`
    /// (`rows x width`, column `t` for row `t` of the block).
    fn logits(&self, ci: usize, rows: usize, chunk: &mut [f32]);

    /// Given the gradient of a chunk's logits, its share of `dw` and its
    /// term of `dh^T`.
    fn backward(&self, chunk: ChunkGrad<'_>);
}

/// One chunk of classes in the backward pass ([`Products::backward`]).
pub(super) struct ChunkGrad<'a> {
    /// The chunk's first class is `ci * VC`.
    pub ci: usize,
    /// Its classes.
    pub rows: usize,
    /// The gradient of its logits: `rows x width`, zero in the padding
    /// columns (and free to be overwritten).
    pub g: &'a mut [f32],
    /// Its `rows x dims` of `dw`: written, or added to with `add`.
    pub dw: &'a mut [f32],
    /// `dims x width` sums of `dh^T`, added to.
    pub dht: &'a mut [f32],
    pub add: bool,
}

/// The logits of `rows` classes into `chunk` (`rows x width`) with `tiles`:
/// `w`'s first `rows` rows of `k` elements times `ht` (`k x width`, the
/// block's rows transposed).
///
/// # Safety
/// The CPU has the tiles' features.
pub(super) unsafe fn chunk_logits<T>(
    tiles: &Tiles<T>,
    [rows, width, k]: [usize; 3],
    w: &[T],
    ht: &[T],
    chunk: &mut [f32],
) {
    assert!(w.len() >= rows * k && ht.len() == k * width && chunk.len() == rows * width);
    let a = Strided {
        ptr: w.as_ptr(),
        rs: k,
        cs: 1,
    };
    // SAFETY: the CPU has the features (the caller's promise); the shapes
    // were checked, and `chunk` overlaps no input.
    unsafe {
        gemm(
            tiles,
            rows,
            width,
            k,
            a,
            ht.as_ptr(),
            width,
            chunk.as_mut_ptr(),
            width,
            false,
            false,
        )
    };
}

/// The operands of a chunk's two backward products, `dw (+)= g @ h` and
/// `dht += wt @ gt` (see [`ChunkGrad`]), in one element type: `g` is `rows
/// x k`, `h` `k x dims` (row-major, so `k = h.len() / dims`), `wt` `dims x
/// kt` and `gt` `kt x width` (row-major).
pub(super) struct Backward<'a, T> {
    pub g: Strided<T>,
    pub h: &'a [T],
    pub wt: Strided<T>,
    pub gt: &'a [T],
}

impl<T> Backward<'_, T> {
    /// Both products with `tiles`: `dw` (`rows x dims`) written, or added
    /// to with `add`, and `dht` (`dims x width`) added to.
    ///
    /// # Safety
    /// The CPU has the tiles' features; `g` and `wt` name `rows x k` and
    /// `dims x kt` elements that lie in bounds and overlap neither output.
    pub(super) unsafe fn run(
        self,
        tiles: &Tiles<T>,
        [rows, dims, width]: [usize; 3],
        dw: &mut [f32],
        dht: &mut [f32],
        add: bool,
    ) {
        let (k, kt) = (self.h.len() / dims, self.gt.len() / width);
        assert!(dw.len() == rows * dims && dht.len() == dims * width);
        assert!(self.h.len() == k * dims && self.gt.len() == kt * width);
        // SAFETY: the caller's promise and the checked shapes; the outputs
        // overlap no input.
        unsafe {
            gemm(
                tiles,
                rows,
                dims,
                k,
                self.g,
                self.h.as_ptr(),
                dims,
                dw.as_mut_ptr(),
                dims,
                add,
                add,
            );
            gemm(
                tiles,
                dims,
                width,
                kt,
                self.wt,
                self.gt.as_ptr(),
                width,
                dht.as_mut_ptr(),
                width,
                true,
                false,
            );
        }
    }
}

/// The f32 products: `h` and `w` as they are, `h^T` made once per block.
struct F32Products<'a> {
    h: &'a [f32],
    ht: ArrayData,
    w: &'a [f32],
    dims: usize,
    n: usize,
    width: usize,
}

impl<'a> F32Products<'a> {
    /// The products of the block `h` (`n x dims`) against `w`.
    fn new(h: &'a [f32], w: &'a [f32], dims: usize) -> Self {
        let n = h.len() / dims;
        let width = round_block(n);
        // h^T, zero in the padding columns. Scratch is `ArrayData`: 64-byte
        // aligned (vectors split across cache lines cost a fifth of the speed)
        // and counted by the memory statistics.
        let mut ht = ArrayData::alloc(&[dims * width], Dtype::F32);
        let hts = ht.as_mut_slice::<f32>(dims * width);
        hts.fill(0.0);
        for (t, row) in h.chunks_exact(dims).enumerate() {
            for (d, &x) in row.iter().enumerate() {
                hts[d * width + t] = x;
            }
        }
        Self {
            h,
            ht,
            w,
            dims,
            n,
            width,
        }
    }
}

impl Products for F32Products<'_> {
    fn rows_and_width(&self) -> (usize, usize) {
        (self.n, self.width)
    }

    fn logits(&self, ci: usize, rows: usize, chunk: &mut [f32]) {
        let (dims, width) = (self.dims, self.width);
        let ht = self.ht.as_slice::<f32>(dims * width);
        // SAFETY: avx512f was checked.
        unsafe {
            chunk_logits(
                &F32_TILES,
                [rows, width, dims],
                &self.w[ci * VC * dims..],
                ht,
                chunk,
            )
        };
    }

    fn backward(&self, chunk: ChunkGrad<'_>) {
        let (dims, width, v0, rows) = (self.dims, self.width, chunk.ci * VC, chunk.rows);
        // This chunk's weights into L2 while `dw` is computed: `dh^T` reads
        // them down their columns, a line per step.
        for line in self.w[v0 * dims..(v0 + rows) * dims].chunks(16) {
            // SAFETY: SSE is part of x86_64; prefetching never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr() as *const i8) };
        }
        // `g` is rows x n of the chunk (row stride width) and `gt` the
        // chunk itself; `wt` is dims x rows of `w` read down its columns.
        let operands = Backward {
            g: Strided {
                ptr: chunk.g.as_ptr(),
                rs: width,
                cs: 1,
            },
            h: &self.h[..self.n * dims],
            wt: Strided {
                ptr: self.w[v0 * dims..(v0 + rows) * dims].as_ptr(),
                rs: 1,
                cs: dims,
            },
            gt: &*chunk.g,
        };
        // SAFETY: avx512f was checked; `g` and `wt` lie in the slices they
        // come from.
        unsafe {
            operands.run(
                &F32_TILES,
                [rows, dims, width],
                chunk.dw,
                chunk.dht,
                chunk.add,
            )
        };
    }
}

/// One row block of the one-pass loss: `n` rows `h` (`n x dims`) with
/// targets `tg` ([`IGNORED`] = no loss) and weights `rw`, against `w` (`vocab x
/// dims`). Writes `dh` (`n x dims`) and writes (`first`) or adds to `dw`
/// (`vocab x dims`); returns `sum_r rw[r] * loss_r`. `lt` is scratch of at
/// least `vocab * round_block(n)` elements.
///
/// The caller has checked [`available`]`(dims)`.
#[allow(clippy::too_many_arguments)]
pub(super) fn value_and_grad_block(
    h: &[f32],
    w: &[f32],
    tg: &[usize],
    rw: &[f32],
    smoothing: f32,
    dims: usize,
    lt: &mut [f32],
    dh: &mut [f32],
    dw: &mut [f32],
    first: bool,
) -> f64 {
    assert!(
        available(dims),
        "the AVX-512 loss needs avx512f and dims % 32 == 0"
    );
    assert!(h.len() == tg.len() * dims);
    let products = F32Products::new(h, w, dims);
    block_with(&products, tg, rw, smoothing, dims, Some(lt), dh, dw, first)
}

thread_local! {
    /// One chunk's logits, per thread, for blocks whose logits are
    /// computed again rather than kept (see [`block_with`]).
    static CHUNK: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`value_and_grad_block`] with the products of `products` (whose block
/// has `tg.len()` rows). With `lt` (room for the block's logits of every
/// class) the logits are computed once and kept there between the two
/// passes; without it each chunk's logits are computed again in the second
/// pass, in a per-thread buffer that stays in the cache, and turned into
/// the gradient (one exponential each, against the row's logsumexp). That pays where
/// the products are cheap beside the traffic of the kept logits (AMX:
/// `vocab x block` floats written, read back and rewritten through
/// memory).
#[allow(clippy::too_many_arguments)]
pub(super) fn block_with(
    products: &impl Products,
    tg: &[usize],
    rw: &[f32],
    smoothing: f32,
    dims: usize,
    lt: Option<&mut [f32]>,
    dh: &mut [f32],
    dw: &mut [f32],
    first: bool,
) -> f64 {
    let (n, width) = products.rows_and_width();
    let vocab = dw.len() / dims;
    assert!(tg.len() == n && rw.len() == n && dh.len() == n * dims);
    assert!(dw.len() == vocab * dims);
    assert!(lt.as_ref().is_none_or(|lt| lt.len() >= vocab * width));
    let mut lt = lt.map(|lt| &mut lt[..vocab * width]);
    let s = smoothing;
    let v = vocab as f32;
    let chunks = vocab.div_ceil(VC);
    let rows_of = |ci: usize| VC.min(vocab - ci * VC);

    // Logits of one chunk of classes at a time, and their column statistics.
    let stats: Vec<ChunkStats> = match lt.as_deref_mut() {
        Some(lt) => lt
            .par_chunks_mut(VC * width)
            .enumerate()
            .map(|(ci, chunk)| {
                products.logits(ci, chunk.len() / width, chunk);
                chunk_stats(chunk, ci * VC, tg, width, s > 0.0)
            })
            .collect(),
        None => (0..chunks)
            .into_par_iter()
            .map(|ci| {
                CHUNK.with_borrow_mut(|buf| {
                    buf.resize(VC * width, 0.0);
                    let chunk = &mut buf[..rows_of(ci) * width];
                    products.logits(ci, rows_of(ci), chunk);
                    chunk_stats(chunk, ci * VC, tg, width, s > 0.0)
                })
            })
            .collect(),
    };

    // Each column's logsumexp, its loss, and the coefficients of its gradient.
    let mut lse = vec![0f32; width];
    let mut coef = vec![0f32; width];
    let mut target_logit = vec![0f32; width];
    for &(t, x) in stats.iter().flat_map(|st| &st.targets) {
        target_logit[t] = x;
    }
    let mut total_loss = 0f64;
    for t in 0..n {
        let (y, c) = (tg[t], rw[t]);
        if y == IGNORED || c == 0.0 {
            continue;
        }
        let m = stats
            .iter()
            .map(|st| st.max[t])
            .fold(f32::NEG_INFINITY, f32::max);
        let sum: f32 = stats
            .iter()
            .map(|st| st.sum[t] * math::exp(st.max[t] - m))
            .sum();
        let total: f32 = stats.iter().map(|st| st.total[t]).sum();
        lse[t] = m + sum.ln();
        coef[t] = c;
        let target = target_logit[t];
        total_loss += (c * (lse[t] - (1.0 - s) * target - s * total / v)) as f64;
    }
    let uniform: Vec<f32> = coef.iter().map(|&c| c * s / v).collect();

    // Per chunk: the gradient of the logits in place, its share of `dw`,
    // and its term of `dh^T`, summed per group of chunks.
    let per_group = chunks.div_ceil(GROUPS);
    let kept: Vec<Option<&mut [f32]>> = match lt {
        Some(lt) => lt.chunks_mut(per_group * VC * width).map(Some).collect(),
        None => (0..chunks.div_ceil(per_group)).map(|_| None).collect(),
    };
    let partials: Vec<ArrayData> = kept
        .into_par_iter()
        .zip(dw.par_chunks_mut(per_group * VC * dims))
        .enumerate()
        .map(|(gi, (lt_g, dw_g))| {
            let mut dht_data = ArrayData::alloc(&[dims * width], Dtype::F32);
            let dht = dht_data.as_mut_slice::<f32>(dims * width);
            dht.fill(0.0);
            let mut lt_g = lt_g.map(|l| l.chunks_mut(VC * width));
            for (k, dw_c) in dw_g.chunks_mut(VC * dims).enumerate() {
                let ci = gi * per_group + k;
                let (v0, rows) = (ci * VC, rows_of(ci));
                let st = &stats[ci];
                let mut buf = Vec::new();
                let chunk: &mut [f32] = match lt_g.as_mut() {
                    Some(it) => {
                        // The kept chunk holds `exp(x - max)`: the
                        // probability is that times `exp(max - lse)`, one
                        // factor per column.
                        let chunk = it.next().expect("a kept chunk per chunk of dw");
                        let scale: Vec<f32> = coef
                            .iter()
                            .zip(st.max.iter().zip(&lse))
                            .map(|(&c, (&m, &l))| if c == 0.0 { 0.0 } else { c * math::exp(m - l) })
                            .collect();
                        vectorised(
                            #[inline(always)]
                            || {
                                for row in chunk.chunks_exact_mut(width) {
                                    for (x, (&f, &u)) in
                                        row.iter_mut().zip(scale.iter().zip(&uniform))
                                    {
                                        // Rows without a loss get exactly
                                        // zero, whatever their logits were.
                                        *x = if f == 0.0 { 0.0 } else { *x * f - u };
                                    }
                                }
                            },
                        );
                        chunk
                    }
                    None => {
                        // The logits again, straight to `c * softmax - u`.
                        buf = CHUNK.take();
                        buf.resize(VC * width, 0.0);
                        let chunk = &mut buf[..rows * width];
                        products.logits(ci, rows, chunk);
                        vectorised(
                            #[inline(always)]
                            || {
                                for row in chunk.chunks_exact_mut(width) {
                                    for (x, ((&c, &l), &u)) in
                                        row.iter_mut().zip(coef.iter().zip(&lse).zip(&uniform))
                                    {
                                        *x = if c == 0.0 {
                                            0.0
                                        } else {
                                            c * math::exp(*x - l) - u
                                        };
                                    }
                                }
                            },
                        );
                        chunk
                    }
                };
                for &(t, _) in &st.targets {
                    if coef[t] != 0.0 {
                        chunk[(tg[t] - v0) * width + t] -= coef[t] * (1.0 - s);
                    }
                }
                products.backward(ChunkGrad {
                    ci,
                    rows,
                    g: chunk,
                    dw: dw_c,
                    dht,
                    add: !first,
                });
                if !buf.is_empty() {
                    CHUNK.set(buf);
                }
            }
            dht_data
        })
        .collect();

    // dh = (sum of the partial dh^T)^T, the groups added in order.
    let mut dht = vec![0f32; dims * width];
    for p in &partials {
        let p = p.as_slice::<f32>(dims * width);
        dht.iter_mut().zip(p).for_each(|(a, b)| *a += b);
    }
    for (t, row) in dh.chunks_exact_mut(dims).enumerate() {
        for (d, x) in row.iter_mut().enumerate() {
            *x = dht[d * width + t];
        }
    }
    total_loss
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A small deterministic pseudo-random sequence in [-1, 1).
    pub(in crate::backend::cpu) fn noise(n: usize, seed: u64) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 23) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// The loss and gradients of one block straight from the definition, in
    /// f64: `(sum_r rw[r] * loss_r, dh, dw)`.
    pub(in crate::backend::cpu) fn reference(
        h: &[f32],
        w: &[f32],
        tg: &[usize],
        rw: &[f32],
        s: f64,
        dims: usize,
    ) -> (f64, Vec<f64>, Vec<f64>) {
        let vocab = w.len() / dims;
        let (mut loss, mut dh, mut dw) = (0f64, vec![0f64; h.len()], vec![0f64; w.len()]);
        for (t, (&y, &c)) in tg.iter().zip(rw).enumerate() {
            if y == IGNORED || c == 0.0 {
                continue;
            }
            let (c, hr) = (c as f64, &h[t * dims..(t + 1) * dims]);
            let x: Vec<f64> = w
                .chunks(dims)
                .map(|wr| hr.iter().zip(wr).map(|(&a, &b)| a as f64 * b as f64).sum())
                .collect();
            let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
            let mean = x.iter().sum::<f64>() / vocab as f64;
            loss += c * (lse - (1.0 - s) * x[y] - s * mean);
            for (v, &xv) in x.iter().enumerate() {
                let target = if v == y { 1.0 - s } else { 0.0 } + s / vocab as f64;
                let g = c * ((xv - lse).exp() - target);
                for d in 0..dims {
                    dh[t * dims + d] += g * w[v * dims + d] as f64;
                    dw[v * dims + d] += g * hr[d] as f64;
                }
            }
        }
        (loss, dh, dw)
    }

    /// Every element of `got` within `tol` times the largest magnitude in `want` of its expectation.
    pub(in crate::backend::cpu) fn assert_close(what: &str, got: &[f32], want: &[f64], tol: f64) {
        let scale = want.iter().fold(0f64, |a, b| a.max(b.abs())).max(1e-3);
        for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g as f64 - w).abs() <= tol * scale,
                "{what}[{i}]: {g} against {w} (scale {scale})"
            );
        }
    }

    /// One block's arguments in [`check_two_blocks`].
    pub(in crate::backend::cpu) struct Case<'a> {
        pub h: &'a [f32],
        pub w: &'a [f32],
        pub tg: &'a [usize],
        pub rw: &'a [f32],
        pub smoothing: f32,
        pub dims: usize,
        pub lt: &'a mut [f32],
        pub dh: &'a mut [f32],
        pub dw: &'a mut [f32],
        pub first: bool,
    }

    /// Two blocks (the second adding to `dw`) of 45 and 13 rows, padded to
    /// whole tiles, over 613 classes (three chunks, the last an odd one,
    /// tiles with 1 to 12 rows), with ignored rows, a zero weight and label
    /// smoothing `s`, through `block` against the definition in f64 on the
    /// values `round` gives (those the kernel sees); `block` returns the
    /// block's loss. The loss is within 1e-4 of the definition, the
    /// gradients within `tol` of their largest magnitude.
    pub(in crate::backend::cpu) fn check_two_blocks(
        what: &str,
        s: f32,
        tol: f64,
        round: impl Fn(Vec<f32>) -> Vec<f32>,
        mut block: impl FnMut(Case<'_>) -> f64,
    ) {
        let (dims, vocab) = (64, 613);
        let w = round(noise(vocab * dims, 1).iter().map(|x| x * 0.5).collect());
        let mut lt = vec![0f32; vocab * round_block(45)];
        let mut dw = vec![f32::NAN; vocab * dims];
        let mut want_dw = vec![0f64; vocab * dims];
        for (b, rows) in [45usize, 13].into_iter().enumerate() {
            let h = round(noise(rows * dims, 2 + b as u64));
            let tg: Vec<usize> = (0..rows)
                .map(|r| {
                    if r % 7 == 3 {
                        IGNORED
                    } else {
                        (r * 97 + b) % vocab
                    }
                })
                .collect();
            let rw: Vec<f32> = (0..rows)
                .map(|r| if r == 5 { 0.0 } else { 0.5 + r as f32 / 64.0 })
                .collect();
            let mut dh = vec![f32::NAN; rows * dims];
            let loss = block(Case {
                h: &h,
                w: &w,
                tg: &tg,
                rw: &rw,
                smoothing: s,
                dims,
                lt: &mut lt,
                dh: &mut dh,
                dw: &mut dw,
                first: b == 0,
            });
            let (want_loss, want_dh, block_dw) = reference(&h, &w, &tg, &rw, s as f64, dims);
            want_dw.iter_mut().zip(&block_dw).for_each(|(a, b)| *a += b);
            assert!(
                (loss - want_loss).abs() <= 1e-4 * want_loss.abs(),
                "{what}: loss {loss} against {want_loss}"
            );
            assert_close("dh", &dh, &want_dh, tol);
        }
        assert_close("dw", &dw, &want_dw, tol);
    }

    /// [`check_two_blocks`] on f32 values.
    #[test]
    fn blocks_equal_the_definition() {
        if !available(64) {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        for s in [0.0f32, 0.1] {
            check_two_blocks(
                "f32",
                s,
                1e-4,
                |x| x,
                |c| {
                    value_and_grad_block(
                        c.h,
                        c.w,
                        c.tg,
                        c.rw,
                        c.smoothing,
                        c.dims,
                        c.lt,
                        c.dh,
                        c.dw,
                        c.first,
                    )
                },
            );
        }
    }

    /// The `dh^T` sums over groups of chunks run in a fixed order: the same
    /// inputs give the same bits on one thread and on several.
    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        if !available(32) {
            eprintln!("skipped: this CPU has no AVX-512");
            return;
        }
        let (dims, vocab, rows) = (32, 5000, 40);
        let (w, h) = (noise(vocab * dims, 3), noise(rows * dims, 4));
        let tg: Vec<usize> = (0..rows).map(|r| r * 123 % vocab).collect();
        let rw = vec![1.0f32; rows];
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                let (mut lt, mut dh, mut dw) = (
                    vec![0f32; vocab * round_block(rows)],
                    vec![0f32; rows * dims],
                    vec![0f32; vocab * dims],
                );
                let l = value_and_grad_block(
                    &h, &w, &tg, &rw, 0.0, dims, &mut lt, &mut dh, &mut dw, true,
                );
                (
                    l.to_bits(),
                    dh.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    dw.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                )
            })
        };
        assert!(run(1) == run(3), "one thread and three differ");
    }
}
