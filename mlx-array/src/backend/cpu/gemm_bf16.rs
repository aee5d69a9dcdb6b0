//! bfloat16 GEMM with float32 accumulation on AVX512_BF16 (`vdpbf16ps`),
//! for CPUs that have it (AMD Zen 4 on, Intel Cooper Lake and Sapphire
//! Rapids on); the caller falls back to converting to f32 and `sgemm`
//! elsewhere.
//!
//! Why by hand: OpenBLAS has `sbgemm` only when built with
//! `BUILD_BFLOAT16`, which Debian's and Homebrew's packages are not, and no
//! Rust GEMM crate has a bfloat16 kernel.
//!
//! `vdpbf16ps` multiplies pairs of bfloat16 values and adds both products
//! to a float32 lane: lane `j` of `acc` gains `a[2j] * b[2j] + a[2j + 1] *
//! b[2j + 1]`. So `A` is packed as pairs along `k` (one 32-bit word per row
//! and pair, broadcast to all lanes) and `B` as the same pairs interleaved
//! for 32 columns (two vectors per pair of `k`). The micro-tile is 12 rows x
//! 32 columns: 24 accumulators, 2 vectors of `B` and the broadcast in the
//! 32 vector registers, as the f32 tile of the fused loss. Panels of `KC`
//! values of `k` keep a strip of `B` (32 KiB) and of `A` in the L1 and L2
//! caches; tasks of row blocks and column strips run on rayon's threads,
//! each summing its block over the panels in a float32 scratch of its own
//! (cache-sized) and rounding it to bfloat16 into `C` once. Every element
//! of `C` sums its panels in the same order whatever the number of threads.

use std::arch::x86_64::*;

use rayon::prelude::*;

/// Rows of a micro-tile.
const MR: usize = 12;
/// Columns of a micro-tile: two vectors of 16 float32 lanes.
const NR: usize = 32;
/// Values of `k` per panel (even: whole pairs).
const KC: usize = 512;
/// Rows per task.
const MC: usize = MR * 16;
/// Columns per task: whole strips.
const NC: usize = NR * 8;

/// Whether this CPU has the instructions (checked once, cheaply, by std).
pub(super) fn available() -> bool {
    is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
}

/// A matrix of bfloat16 bit patterns: element `(r, c)` at `ptr + r * rs +
/// c * cs`.
#[derive(Clone, Copy)]
pub(super) struct Matrix {
    /// The first element.
    pub ptr: *const u16,
    /// Elements between rows.
    pub rs: usize,
    /// Elements between columns.
    pub cs: usize,
}

// SAFETY: the matrices are only read, by tasks that the caller waits for.
unsafe impl Send for Matrix {}
unsafe impl Sync for Matrix {}

impl Matrix {
    /// Element `(r, c)`.
    ///
    /// # Safety
    /// `(r, c)` is inside the matrix.
    unsafe fn at(&self, r: usize, c: usize) -> u16 {
        // SAFETY: the caller's promise.
        unsafe { *self.ptr.add(r * self.rs + c * self.cs) }
    }
}

/// The output, written by tasks in disjoint tiles.
#[derive(Clone, Copy)]
struct Out(*mut u16);
// SAFETY: each task writes its own rows and columns of `C`.
unsafe impl Send for Out {}
unsafe impl Sync for Out {}

impl Out {
    /// The output's first element (a method, so that closures capture
    /// the `Sync` wrapper rather than the pointer).
    fn ptr(&self) -> *mut u16 {
        self.0
    }
}

/// `C = A @ B` for `m x k` `A` and `k x n` `B`: float32 sums rounded to
/// bfloat16 (nearest, ties to even), `C` row-major with row stride `ldc`.
///
/// # Safety
/// [`available`] is true; `A`, `B` and `C` are in bounds for these shapes
/// and `C` overlaps neither.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm(
    m: usize,
    n: usize,
    k: usize,
    a: Matrix,
    b: Matrix,
    c: *mut u16,
    ldc: usize,
) {
    if m == 0 || n == 0 {
        return;
    }
    let out = Out(c);
    if k == 0 {
        for i in 0..m {
            // SAFETY: row `i` of `C` is in bounds (bfloat16 zero is 0u16).
            unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
        }
        return;
    }
    // Tasks: row blocks x column blocks, enough for every thread.
    let row_blocks = m.div_ceil(MC);
    let col_blocks = n.div_ceil(NC);
    let tasks: Vec<(usize, usize)> = (0..row_blocks)
        .flat_map(|r| (0..col_blocks).map(move |c| (r, c)))
        .collect();
    tasks.par_iter().for_each(|&(rb, cb)| {
        let (i0, j0) = (rb * MC, cb * NC);
        let (mc, nc) = (MC.min(m - i0), NC.min(n - j0));
        let mut apack = vec![0u32; mc.div_ceil(MR) * MR * KC / 2];
        let mut bpack = vec![0u16; nc.div_ceil(NR) * NR * KC];
        // The block's sums, NC columns per row.
        let mut sums = vec![0f32; mc * NC];
        for p0 in (0..k).step_by(KC) {
            let kc = KC.min(k - p0);
            let pairs = kc.div_ceil(2);
            // SAFETY: the blocks are inside `A`, `B` and `C` (the caller's
            // promise and the bounds above); the buffers hold the packs.
            unsafe {
                pack_a(&a, i0, mc, p0, kc, &mut apack);
                pack_b(&b, p0, kc, j0, nc, &mut bpack);
                for s in 0..nc.div_ceil(NR) {
                    for t in 0..mc.div_ceil(MR) {
                        let rows = MR.min(mc - t * MR);
                        let cols = NR.min(nc - s * NR);
                        tile(
                            pairs,
                            apack.as_ptr().add(t * MR * pairs),
                            bpack.as_ptr().add(s * NR * 2 * pairs),
                            sums.as_mut_ptr().add(t * MR * NC + s * NR),
                            NC,
                            rows,
                            cols,
                            p0 > 0,
                        );
                    }
                }
            }
        }
        for (i, row) in sums.chunks(NC).enumerate() {
            // SAFETY: row `i0 + i`, columns `j0 .. j0 + nc` of `C` are this
            // task's and in bounds.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(out.ptr().add((i0 + i) * ldc + j0), nc) };
            for (d, v) in dst.iter_mut().zip(&row[..nc]) {
                *d = half::bf16::from_f32(*v).to_bits();
            }
        }
    });
}

/// Packs rows `i0 .. i0 + mc` and columns `p0 .. p0 + kc` of `A`: strips of
/// [`MR`] rows, in each one word per pair of `k` and row (zero past the
/// ends).
///
/// # Safety
/// The block is inside `A`; `pack` holds `ceil(mc / MR) * MR * ceil(kc / 2)`
/// words.
unsafe fn pack_a(a: &Matrix, i0: usize, mc: usize, p0: usize, kc: usize, pack: &mut [u32]) {
    let pairs = kc.div_ceil(2);
    for t in 0..mc.div_ceil(MR) {
        let strip = &mut pack[t * MR * pairs..(t + 1) * MR * pairs];
        for i in 0..MR {
            let row = t * MR + i;
            for p in 0..pairs {
                let word = if row < mc {
                    // SAFETY: inside the block (the caller's promise).
                    let lo = unsafe { a.at(i0 + row, p0 + 2 * p) } as u32;
                    let hi = if 2 * p + 1 < kc {
                        // SAFETY: as above.
                        unsafe { a.at(i0 + row, p0 + 2 * p + 1) as u32 }
                    } else {
                        0
                    };
                    lo | (hi << 16)
                } else {
                    0
                };
                strip[p * MR + i] = word;
            }
        }
    }
}

/// Packs rows `p0 .. p0 + kc` and columns `j0 .. j0 + nc` of `B`: strips of
/// [`NR`] columns, in each for every pair of `k` the two values of each
/// column side by side (zero past the ends).
///
/// # Safety
/// The block is inside `B`; `pack` holds `ceil(nc / NR) * NR * 2 *
/// ceil(kc / 2)` values.
unsafe fn pack_b(b: &Matrix, p0: usize, kc: usize, j0: usize, nc: usize, pack: &mut [u16]) {
    let pairs = kc.div_ceil(2);
    for s in 0..nc.div_ceil(NR) {
        let strip = &mut pack[s * NR * 2 * pairs..(s + 1) * NR * 2 * pairs];
        for p in 0..pairs {
            let dst = &mut strip[p * NR * 2..(p + 1) * NR * 2];
            for col in 0..NR {
                let j = s * NR + col;
                let (lo, hi) = if j < nc {
                    // SAFETY: inside the block (the caller's promise).
                    unsafe {
                        let lo = b.at(p0 + 2 * p, j0 + j);
                        let hi = if 2 * p + 1 < kc {
                            b.at(p0 + 2 * p + 1, j0 + j)
                        } else {
                            0
                        };
                        (lo, hi)
                    }
                } else {
                    (0, 0)
                };
                dst[2 * col] = lo;
                dst[2 * col + 1] = hi;
            }
        }
    }
}

/// One micro-tile: `C[0..rows][0..cols] (+)= A @ B` over `pairs` pairs of
/// `k`, from packed strips of `A` ([`MR`] words per pair) and `B` ([`NR`] x 2
/// values per pair).
///
/// # Safety
/// AVX-512F and AVX512_BF16; the strips hold `pairs` pairs; `C`'s `rows x
/// cols` block (row stride `ldc`) is in bounds.
#[target_feature(enable = "avx512f,avx512bf16")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    pairs: usize,
    a: *const u32,
    b: *const u16,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    add: bool,
) {
    // SAFETY: the caller's promise covers every pointer below.
    unsafe {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..pairs {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp as *const _));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(32) as *const _));
            for (i, row) in acc.iter_mut().enumerate() {
                let x: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(i) as i32));
                row[0] = _mm512_dpbf16_ps(row[0], x, b0);
                row[1] = _mm512_dpbf16_ps(row[1], x, b1);
            }
            ap = ap.add(MR);
            bp = bp.add(2 * NR);
        }
        if rows == MR && cols == NR {
            for (i, row) in acc.iter().enumerate() {
                let ci = c.add(i * ldc);
                let (mut v0, mut v1) = (row[0], row[1]);
                if add {
                    v0 = _mm512_add_ps(v0, _mm512_loadu_ps(ci));
                    v1 = _mm512_add_ps(v1, _mm512_loadu_ps(ci.add(16)));
                }
                _mm512_storeu_ps(ci, v0);
                _mm512_storeu_ps(ci.add(16), v1);
            }
            return;
        }
        let mut tmp = [[0f32; NR]; MR];
        for (i, row) in acc.iter().enumerate() {
            _mm512_storeu_ps(tmp[i].as_mut_ptr(), row[0]);
            _mm512_storeu_ps(tmp[i].as_mut_ptr().add(16), row[1]);
        }
        for (i, t) in tmp.iter().enumerate().take(rows) {
            let ci = c.add(i * ldc);
            for (j, v) in t.iter().enumerate().take(cols) {
                *ci.add(j) = if add { *ci.add(j) + v } else { *v };
            }
        }
    }
}
