//! bfloat16 GEMM with float32 accumulation on AVX512_BF16 (`vdpbf16ps`),
//! for CPUs that have it (AMD Zen 4 on, Intel Cooper Lake and Sapphire
//! Rapids on); the caller falls back to converting to f32 and `sgemm`
//! elsewhere. Where the CPU also has AMX, [`gemm`] hands the products to
//! the tiles of [`super::amx`] instead (`gemm_amx`, same packing of `B`).
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

pub(in crate::backend::cpu) use super::bf16_instructions::available;

/// A matrix of bfloat16 bit patterns: element `(r, c)` at `ptr + r * rs +
/// c * cs`.
#[derive(Clone, Copy)]
pub(in crate::backend::cpu) struct Matrix {
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

/// The output, written by tasks in disjoint tiles (each task its own rows
/// and columns of `C`).
type Out = crate::backend::cpu::Shared<u16>;

/// Products whose operands together have at most this many elements pack
/// each operand once, whole, before any tile runs; larger ones pack per
/// task (a block of `A` and a strip of `B` per panel), so that packing
/// never holds a copy of a huge operand.
const PACK_WHOLE: usize = 8 << 20;

/// `C = A @ B` for `m x k` `A` and `k x n` `B`: float32 sums rounded to
/// bfloat16 (nearest, ties to even), `C` row-major with row stride `ldc`.
///
/// # Safety
/// [`available`] is true; `A`, `B` and `C` are in bounds for these shapes
/// and `C` overlaps neither.
#[allow(clippy::too_many_arguments)]
pub(in crate::backend::cpu) unsafe fn gemm(
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
    let out = crate::backend::cpu::Shared(c);
    if k == 0 {
        for i in 0..m {
            // SAFETY: row `i` of `C` is in bounds (bfloat16 zero is 0u16).
            unsafe { std::ptr::write_bytes(c.add(i * ldc), 0, n) };
        }
        return;
    }
    if super::amx::available() {
        // SAFETY: the caller's promise, and AMX is available.
        unsafe { gemm_amx(m, n, k, a, b, out, ldc) };
        return;
    }
    // Tasks: row blocks x column blocks, enough for every thread.
    let row_blocks = m.div_ceil(MC);
    let col_blocks = n.div_ceil(NC);
    let tasks: Vec<(usize, usize)> = (0..row_blocks)
        .flat_map(|r| (0..col_blocks).map(move |c| (r, c)))
        .collect();
    let pairs = k.div_ceil(2);
    if (m + n) * k <= PACK_WHOLE {
        // Every strip of both operands, packed once over the whole of `k`
        // (a tile starts at its panel's pair).
        let mut apack = vec![0u32; m.div_ceil(MR) * MR * pairs];
        let mut bpack = vec![0u16; n.div_ceil(NR) * NR * 2 * pairs];
        apack
            .par_chunks_mut(MR * pairs)
            .enumerate()
            // SAFETY: strip `t` of `A` is inside `A` (the caller's promise).
            .for_each(|(t, strip)| unsafe {
                pack_a_strip(&a, t * MR, MR.min(m - t * MR), 0, k, strip)
            });
        bpack
            .par_chunks_mut(NR * 2 * pairs)
            .enumerate()
            // SAFETY: strip `s` of `B` is inside `B` (the caller's promise).
            .for_each(|(s, strip)| unsafe {
                pack_b_strip(&b, 0, k, s * NR, NR.min(n - s * NR), strip)
            });
        tasks.par_iter().for_each(|&(rb, cb)| {
            let (i0, j0) = (rb * MC, cb * NC);
            let (mc, nc) = (MC.min(m - i0), NC.min(n - j0));
            let (a0, b0) = (i0 / MR, j0 / NR);
            // SAFETY: the packs hold every strip; the block is inside `C`.
            unsafe {
                block(mc, nc, k, out, (i0, j0), ldc, |p0| Panel {
                    a: apack.as_ptr().add(a0 * MR * pairs + p0 / 2 * MR),
                    a_step: MR * pairs,
                    b: bpack.as_ptr().add(b0 * NR * 2 * pairs + p0 / 2 * 2 * NR),
                    b_step: NR * 2 * pairs,
                })
            };
        });
        return;
    }
    tasks.par_iter().for_each(|&(rb, cb)| {
        let (i0, j0) = (rb * MC, cb * NC);
        let (mc, nc) = (MC.min(m - i0), NC.min(n - j0));
        let mut apack = vec![0u32; mc.div_ceil(MR) * MR * KC / 2];
        let mut bpack = vec![0u16; nc.div_ceil(NR) * NR * KC];
        // SAFETY: the block is inside `A`, `B` and `C`; each panel is packed
        // into this task's own buffers before its tiles read them.
        unsafe {
            block(mc, nc, k, out, (i0, j0), ldc, |p0| {
                let kc = KC.min(k - p0);
                let pairs = kc.div_ceil(2);
                for (t, strip) in apack
                    .chunks_mut(MR * pairs)
                    .take(mc.div_ceil(MR))
                    .enumerate()
                {
                    pack_a_strip(&a, i0 + t * MR, MR.min(mc - t * MR), p0, kc, strip);
                }
                for (s, strip) in bpack
                    .chunks_mut(NR * 2 * pairs)
                    .take(nc.div_ceil(NR))
                    .enumerate()
                {
                    pack_b_strip(&b, p0, kc, j0 + s * NR, NR.min(nc - s * NR), strip);
                }
                Panel {
                    a: apack.as_ptr(),
                    a_step: MR * pairs,
                    b: bpack.as_ptr(),
                    b_step: NR * 2 * pairs,
                }
            })
        };
    });
}

/// [`gemm`] on AMX tiles ([`super::amx`]): `A` packed whole as rows of
/// pairs of `k` (zero past `k`, to whole steps of the tiles), `B` as the
/// strips of [`pack_b_strip`] (which are the tiles' layout of `B`), both in
/// parallel; then tasks of row blocks and column blocks sum each block
/// over all of `k` in float32 scratch and round it to bfloat16 into `C`.
///
/// # Safety
/// As [`gemm`]'s, and [`super::amx::available`].
unsafe fn gemm_amx(m: usize, n: usize, k: usize, a: Matrix, b: Matrix, out: Out, ldc: usize) {
    use super::amx::STEP;
    let kp = k.div_ceil(2).div_ceil(STEP) * STEP;
    // `A` in place when its rows already are rows of whole steps of pairs
    // (dense along `k`, `k` a multiple of 32, every row 4-byte aligned).
    let in_place = a.cs == 1
        && k.is_multiple_of(2 * STEP)
        && a.rs.is_multiple_of(2)
        && (a.ptr as usize).is_multiple_of(4);
    let mut apack: Vec<u32>;
    let (a_words, lda) = if in_place {
        (a.ptr as *const u32, a.rs / 2)
    } else {
        apack = vec![0u32; m * kp];
        apack
            .par_chunks_mut(MR * kp)
            .enumerate()
            // SAFETY: rows t * MR.. of `A` are inside `A` (the caller's promise).
            .for_each(|(t, rows)| unsafe { pack_a_rows(&a, t * MR, k, kp, rows) });
        (apack.as_ptr(), kp)
    };
    // Only read, by the tasks below.
    let a_words = crate::backend::cpu::Shared(a_words as *mut u32);
    let mut bpack = vec![0u16; n.div_ceil(NR) * NR * 2 * kp];
    bpack
        .par_chunks_mut(NR * 2 * kp)
        .enumerate()
        // SAFETY: strip `s` of `B` is inside `B` (the caller's promise).
        .for_each(|(s, strip)| unsafe {
            pack_b_strip(&b, 0, k, s * NR, NR.min(n - s * NR), strip)
        });
    let tasks: Vec<(usize, usize)> = (0..m.div_ceil(MC))
        .flat_map(|r| (0..n.div_ceil(NC)).map(move |c| (r, c)))
        .collect();
    tasks.par_iter().for_each(|&(rb, cb)| {
        let (i0, j0) = (rb * MC, cb * NC);
        let (mc, nc) = (MC.min(m - i0), NC.min(n - j0));
        let mut sums = SUMS.take();
        sums.resize(mc * NC, 0.0);
        // The strips of `B` are the tiles' panels.
        const _: () = assert!(NR == super::amx::COLS);
        let strips = bpack[j0 / NR * NR * 2 * kp..].as_ptr() as *const u32;
        // SAFETY: AMX is available; rows i0.. of `A` (in place or packed)
        // have kp words, the strips kp rows of NR words each (zero past n),
        // `sums` mc rows of NC.
        unsafe {
            super::amx::gemm(
                mc,
                nc.div_ceil(NR) * NR,
                kp,
                a_words.ptr().add(i0 * lda),
                lda,
                strips,
                sums.as_mut_ptr(),
                NC,
                false,
            )
        };
        for (i, row) in sums.chunks(NC).enumerate() {
            // SAFETY: row `i0 + i`, columns `j0 .. j0 + nc` of `C` are this
            // task's and in bounds.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(out.ptr().add((i0 + i) * ldc + j0), nc) };
            // SAFETY: AMX implies AVX512_BF16 ([`super::amx::available`]).
            unsafe { round_row(&row[..nc], dst) };
        }
        SUMS.set(sums);
    });
}

thread_local! {
    /// A task's float32 sums, kept between tasks and products.
    static SUMS: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// The whole of `A` (`m x k`) as [`super::amx::gemm`] reads it: `m` rows of
/// `kp` words, one per pair of `k` (zero past `k`), into `out`.
///
/// # Safety
/// `A` is in bounds for these shapes; `kp >= ceil(k / 2)`.
pub(in crate::backend::cpu) unsafe fn pack_a(
    a: &Matrix,
    m: usize,
    k: usize,
    kp: usize,
    out: &mut Vec<u32>,
) {
    out.clear();
    out.resize(m * kp, 0);
    for (t, rows) in out.chunks_mut(MR * kp).enumerate() {
        // SAFETY: rows t * MR.. of `A` (the caller's promise).
        unsafe { pack_a_rows(a, t * MR, k, kp, rows) };
    }
}

/// The whole of `B` (`k x n`) in [`super::amx::gemm`]'s panels of 32
/// columns, `kp` rows of words each (pairs of `k`, zero past `k` and `n`),
/// into `out`: the strips of [`pack_b_strip`] over all of `k`.
///
/// # Safety
/// `B` is in bounds for these shapes; `kp >= ceil(k / 2)`.
pub(in crate::backend::cpu) unsafe fn pack_b(
    b: &Matrix,
    k: usize,
    n: usize,
    kp: usize,
    out: &mut Vec<u32>,
) {
    const _: () = assert!(NR == super::amx::COLS);
    out.clear();
    out.resize(n.div_ceil(NR) * NR * kp, 0);
    let halves: &mut [u16] = bytemuck::cast_slice_mut(out);
    for (s, strip) in halves.chunks_mut(NR * 2 * kp).enumerate() {
        // SAFETY: columns s * NR.. of `B` (the caller's promise).
        unsafe { pack_b_strip(b, 0, k, s * NR, NR.min(n - s * NR), strip) };
    }
}

/// Rows `r0 ..` (up to [`MR`] of them, as many as `rows` holds) of `A` as
/// rows of `kp` words, one per pair of `k` (zero past `k`).
///
/// # Safety
/// The rows are inside `A`; `rows` holds whole rows of `kp` words.
unsafe fn pack_a_rows(a: &Matrix, r0: usize, k: usize, kp: usize, rows: &mut [u32]) {
    let full = k / 2;
    let n = rows.len() / kp;
    // SAFETY (all reads below): inside `A` (the caller's promise).
    unsafe {
        if a.cs == 1 {
            for (i, dst) in rows.chunks_exact_mut(kp).enumerate() {
                let src = a.ptr.add((r0 + i) * a.rs) as *const u32;
                for (p, d) in dst[..full].iter_mut().enumerate() {
                    *d = src.add(p).read_unaligned();
                }
            }
        } else if a.rs == 1 {
            // Columns dense along the rows: two neighbouring columns at a time.
            for p in 0..full {
                let lo = std::slice::from_raw_parts(a.ptr.add(2 * p * a.cs + r0), n);
                let hi = std::slice::from_raw_parts(a.ptr.add((2 * p + 1) * a.cs + r0), n);
                for (i, (&l, &h)) in lo.iter().zip(hi).enumerate() {
                    rows[i * kp + p] = l as u32 | (h as u32) << 16;
                }
            }
        } else {
            for (i, dst) in rows.chunks_exact_mut(kp).enumerate() {
                for (p, d) in dst[..full].iter_mut().enumerate() {
                    *d = a.at(r0 + i, 2 * p) as u32 | (a.at(r0 + i, 2 * p + 1) as u32) << 16;
                }
            }
        }
        if k % 2 == 1 {
            for (i, dst) in rows.chunks_exact_mut(kp).enumerate() {
                dst[full] = a.at(r0 + i, k - 1) as u32;
            }
        }
    }
}

/// Where one panel's packed strips of a task's block lie: strip `t` of its
/// rows at `a + t * a_step`, strip `s` of its columns at `b + s * b_step`.
struct Panel {
    a: *const u32,
    a_step: usize,
    b: *const u16,
    b_step: usize,
}

/// One task: the `mc x nc` block of `C` at `(i0, j0)` summed over the
/// panels of `k` in a float32 scratch and rounded to bfloat16 once.
/// `panel(p0)` readies the panel starting at `k = p0` (packing it, if it
/// must) and says where its strips lie.
///
/// # Safety
/// [`available`] is true; the strips hold the panel's pairs until the next
/// call of `panel`; the block is inside `C`.
unsafe fn block(
    mc: usize,
    nc: usize,
    k: usize,
    out: Out,
    (i0, j0): (usize, usize),
    ldc: usize,
    mut panel: impl FnMut(usize) -> Panel,
) {
    // The block's sums, NC columns per row.
    let mut sums = vec![0f32; mc * NC];
    for p0 in (0..k).step_by(KC) {
        let pairs = KC.min(k - p0).div_ceil(2);
        let strips = panel(p0);
        for s in 0..nc.div_ceil(NR) {
            let bs = strips.b.wrapping_add(s * strips.b_step);
            for t in 0..mc.div_ceil(MR) {
                let at = strips.a.wrapping_add(t * strips.a_step);
                let rows = MR.min(mc - t * MR);
                let cols = NR.min(nc - s * NR);
                // SAFETY: the caller's promise; the scratch holds the block.
                unsafe {
                    tile(
                        pairs,
                        at,
                        bs,
                        sums.as_mut_ptr().add(t * MR * NC + s * NR),
                        NC,
                        rows,
                        cols,
                        p0 > 0,
                    )
                };
            }
        }
    }
    for (i, row) in sums.chunks(NC).enumerate() {
        // SAFETY: row `i0 + i`, columns `j0 .. j0 + nc` of `C` are this
        // task's and in bounds.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr().add((i0 + i) * ldc + j0), nc) };
        // SAFETY: the caller's promise ([`available`]).
        unsafe { round_row(&row[..nc], dst) };
    }
}

/// `dst = src` rounded to bfloat16, nearest with ties to even, 16 at a
/// time with `vcvtneps2bf16` (which, like every AVX512_BF16 instruction,
/// reads and writes subnormals as zero).
///
/// # Safety
/// [`available`].
#[target_feature(enable = "avx512f,avx512bf16,avx512bw,avx512vl")]
pub(in crate::backend::cpu) unsafe fn round_row(src: &[f32], dst: &mut [u16]) {
    let (whole, rest) = (src.len() / 16 * 16, src.len() % 16);
    for (d, v) in dst[..whole].chunks_exact_mut(16).zip(src.chunks_exact(16)) {
        // SAFETY: 16 floats read, 16 bfloat16 written.
        unsafe {
            let b = _mm512_cvtneps_pbh(_mm512_loadu_ps(v.as_ptr()));
            _mm256_storeu_si256(
                d.as_mut_ptr() as *mut __m256i,
                std::mem::transmute::<__m256bh, __m256i>(b),
            );
        }
    }
    if rest > 0 {
        let mask = (1u16 << rest) - 1;
        // SAFETY: the masked load and store touch the last `rest` elements only.
        unsafe {
            let v = _mm512_maskz_loadu_ps(mask, src.as_ptr().add(whole));
            let b: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_mask_storeu_epi16(dst.as_mut_ptr().add(whole) as *mut i16, mask, b);
        }
    }
}

/// Packs rows `r0 .. r0 + rows` (at most [`MR`]) and columns `p0 .. p0 +
/// kc` of `A` into one strip: one word per pair of `k` and row, [`MR`]
/// words per pair (zero past the ends).
///
/// # Safety
/// The block is inside `A`; `strip` holds `MR * ceil(kc / 2)` words.
unsafe fn pack_a_strip(
    a: &Matrix,
    r0: usize,
    rows: usize,
    p0: usize,
    kc: usize,
    strip: &mut [u32],
) {
    let pairs = kc.div_ceil(2);
    let strip = &mut strip[..MR * pairs];
    if rows < MR || kc % 2 == 1 {
        strip.fill(0);
    }
    let full = kc / 2;
    // SAFETY (all reads below): inside the block (the caller's promise).
    unsafe {
        if a.cs == 1 {
            // Rows dense along k: a pair is two neighbours of one row.
            for i in 0..rows {
                let row = a.ptr.add((r0 + i) * a.rs + p0);
                for p in 0..full {
                    let word = (row.add(2 * p) as *const u32).read_unaligned();
                    strip[p * MR + i] = word;
                }
            }
        } else if a.rs == 1 {
            // Columns dense along the rows: a pair is two neighbouring
            // columns, read side by side.
            for p in 0..full {
                let lo = std::slice::from_raw_parts(a.ptr.add((p0 + 2 * p) * a.cs + r0), rows);
                let hi = std::slice::from_raw_parts(a.ptr.add((p0 + 2 * p + 1) * a.cs + r0), rows);
                for ((d, &l), &h) in strip[p * MR..p * MR + rows].iter_mut().zip(lo).zip(hi) {
                    *d = l as u32 | (h as u32) << 16;
                }
            }
        } else {
            for i in 0..rows {
                for p in 0..full {
                    let (l, h) = (a.at(r0 + i, p0 + 2 * p), a.at(r0 + i, p0 + 2 * p + 1));
                    strip[p * MR + i] = l as u32 | (h as u32) << 16;
                }
            }
        }
        if kc % 2 == 1 {
            for i in 0..rows {
                strip[full * MR + i] = a.at(r0 + i, p0 + kc - 1) as u32;
            }
        }
    }
}

/// Packs rows `p0 .. p0 + kc` and columns `c0 .. c0 + cols` (at most
/// [`NR`]) of `B` into one strip: for every pair of `k` the two values of
/// each column side by side, [`NR`] columns per pair (zero past the ends).
///
/// # Safety
/// The block is inside `B`; `strip` holds `NR * 2 * ceil(kc / 2)` values.
unsafe fn pack_b_strip(
    b: &Matrix,
    p0: usize,
    kc: usize,
    c0: usize,
    cols: usize,
    strip: &mut [u16],
) {
    let pairs = kc.div_ceil(2);
    let strip = &mut strip[..NR * 2 * pairs];
    if cols < NR || kc % 2 == 1 {
        strip.fill(0);
    }
    let full = kc / 2;
    // SAFETY (all reads below): inside the block (the caller's promise).
    unsafe {
        if b.cs == 1 {
            // Rows dense along the columns: interleave two rows.
            for p in 0..full {
                let lo = std::slice::from_raw_parts(b.ptr.add((p0 + 2 * p) * b.rs + c0), cols);
                let hi = std::slice::from_raw_parts(b.ptr.add((p0 + 2 * p + 1) * b.rs + c0), cols);
                let dst = &mut strip[p * 2 * NR..p * 2 * NR + 2 * cols];
                for ((d, &l), &h) in dst.chunks_exact_mut(2).zip(lo).zip(hi) {
                    d[0] = l;
                    d[1] = h;
                }
            }
        } else if b.rs == 1 {
            // Columns dense along k: a pair is one word of a column.
            for j in 0..cols {
                let col = b.ptr.add((c0 + j) * b.cs + p0);
                for p in 0..full {
                    let word = (col.add(2 * p) as *const u32).read_unaligned();
                    strip[p * 2 * NR + 2 * j] = word as u16;
                    strip[p * 2 * NR + 2 * j + 1] = (word >> 16) as u16;
                }
            }
        } else {
            for p in 0..full {
                for j in 0..cols {
                    strip[p * 2 * NR + 2 * j] = b.at(p0 + 2 * p, c0 + j);
                    strip[p * 2 * NR + 2 * j + 1] = b.at(p0 + 2 * p + 1, c0 + j);
                }
            }
        }
        if kc % 2 == 1 {
            for j in 0..cols {
                strip[full * 2 * NR + 2 * j] = b.at(p0 + kc - 1, c0 + j);
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
