//! The one-pass output projection + cross-entropy for bfloat16 `h` and `w`
//! on AVX512_BF16: the three products of [`super::avx512`]'s row block
//! with `vdpbf16ps` (bfloat16 pairs in, float32 sums out), everything else
//! (logits, softmax statistics, the gradient of the logits, `dw` and `dh`)
//! in float32, as PyTorch's autocast and MLX run a bfloat16 model's loss.
//!
//! `vdpbf16ps` adds `a[2j] * b[2j] + a[2j + 1] * b[2j + 1]` to float32 lane
//! `j`, so every product takes `A` as one 32-bit word per row and pair of
//! `k` (broadcast) and `B` as rows of such words, one per column:
//!
//! - logits `w @ h^T`: `k` runs along the features, so `A` is `w` read
//!   in place (two neighbouring features are one word) and `B` is `h`'s
//!   words transposed (small, once per block);
//! - `dw += g^T @ h`: `k` runs along the block's rows; `A` is the logits'
//!   gradient rounded to bfloat16 as it lies, `B` pairs `h`'s rows (once
//!   per block);
//! - `dh^T += w^T @ g^T`: `k` runs along the classes; `A` pairs the
//!   chunk's rows of `w` ([`pair_rows_into`], per chunk into cache-sized
//!   scratch: pairing all of `w` once per call took 26 MB more at the
//!   reference shape, a peak above f32's), `B` pairs the gradient's rows.
//!
//! The gradient is rounded to bfloat16 once per chunk, into both layouts.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::avx512::{
    Backward, ChunkGrad, Lanes, NR, Products, Strided, Tile, Tiles, VC, block_with, chunk_logits,
    round_block, tiles,
};
use crate::backend::cpu::matmul::{amx, gemm_bf16};
use crate::{ArrayData, Dtype};

/// Whether the bfloat16 path applies: AVX-512F and AVX512_BF16, a feature
/// axis of whole micro-tile columns, and bfloat16 products switched on
/// (the CPU tuning's `bf16`, [`crate::settings::CpuTuning`]) and the fused
/// loss not switched off (its `loss=blas`).
pub(super) fn enabled(dims: usize) -> bool {
    super::avx512::enabled(dims) && crate::settings::cpu_tuning().bf16 && gemm_bf16::available()
}

/// The bfloat16 tiles.
const BF16_TILES: Tiles<u32> = tiles!(tile);

/// The bfloat16 instructions: `vdpbf16ps` on AVX512_BF16, with `A` and
/// `B` as words of two bfloat16 (a pair of `k`), so that a tile's `k` steps
/// are pairs.
struct Bf16Lanes;

impl Lanes for Bf16Lanes {
    type Elem = u32;
    type Vector = __m512bh;

    #[inline(always)]
    unsafe fn load(p: *const u32) -> __m512bh {
        // SAFETY: the caller's promise; the two types are 64 bytes each.
        unsafe { std::mem::transmute(_mm512_loadu_si512(p as *const _)) }
    }

    #[inline(always)]
    unsafe fn broadcast(x: u32) -> __m512bh {
        // SAFETY: as `load`.
        unsafe { std::mem::transmute(_mm512_set1_epi32(x as i32)) }
    }

    #[inline(always)]
    unsafe fn multiply_add(sum: __m512, x: __m512bh, b: __m512bh) -> __m512 {
        // SAFETY: the caller's promise.
        unsafe { _mm512_dpbf16_ps(sum, x, b) }
    }
}

/// The bfloat16 micro-tile: [`Tile::run`] with [`Bf16Lanes`], `k` counting
/// pairs.
///
/// # Safety
/// AVX-512F and AVX512_BF16; every address of the tile is in bounds.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn tile<const M: usize, const UNIT_RS: bool>(t: Tile<u32>) {
    // SAFETY: the caller's promise, and this function has the features.
    unsafe { t.run::<Bf16Lanes, M, UNIT_RS>() }
}

/// Rows `2q` and `2q + 1` of the `rows x cols` bfloat16 matrix `x` as one
/// row of words each: word `(q, j)` holds `x[2q][j]` in its low half and
/// `x[2q + 1][j]` (zero past the last row) in its high half.
pub(super) fn pair_rows(x: &[u16], rows: usize, cols: usize) -> ArrayData {
    let pairs = rows.div_ceil(2);
    let mut out = ArrayData::alloc(&[pairs * cols], Dtype::U32);
    pair_rows_into(x, rows, cols, out.as_mut_slice::<u32>(pairs * cols));
    out
}

/// [`pair_rows`] into `words` (`ceil(rows / 2) * cols` of them).
fn pair_rows_into(x: &[u16], rows: usize, cols: usize, words: &mut [u32]) {
    debug_assert!(x.len() == rows * cols && words.len() == rows.div_ceil(2) * cols);
    for (q, dst) in words.chunks_exact_mut(cols.max(1)).enumerate() {
        let lo = &x[2 * q * cols..(2 * q + 1) * cols];
        let hi = x.get((2 * q + 1) * cols..(2 * q + 2) * cols);
        match hi {
            Some(hi) => {
                for ((d, &l), &h) in dst.iter_mut().zip(lo).zip(hi) {
                    *d = l as u32 | (h as u32) << 16;
                }
            }
            None => {
                for (d, &l) in dst.iter_mut().zip(lo) {
                    *d = l as u32;
                }
            }
        }
    }
}

/// The bfloat16 products of one row block.
pub(super) struct Bf16Products<'a> {
    /// `w` (`vocab x dims`) as words: two neighbouring features each.
    w: &'a [u32],
    /// `w` itself (`vocab x dims` bfloat16).
    w16: &'a [u16],
    /// `h`'s words transposed: `dims / 2 x width`, zero past row `n` (in
    /// [`amx::gemm`]'s panels on AMX).
    h_words_t: ArrayData,
    /// [`pair_rows`] of `h` padded with zero rows to `width`: `width / 2 x
    /// dims` (in panels on AMX).
    h_pairs: ArrayData,
    dims: usize,
    n: usize,
    width: usize,
    /// The products run on AMX tiles ([`amx`]).
    amx: bool,
}

impl<'a> Bf16Products<'a> {
    /// The products of the block `h` (`n x dims` bfloat16) against `w`
    /// (4-byte aligned, read as words too).
    pub(super) fn new(h: &[u16], w16: &'a [u16], dims: usize) -> Self {
        Self::on(h, w16, dims, amx::available())
    }

    /// [`Self::new`] for AMX's tiles or AVX512_BF16's.
    fn on(h: &[u16], w16: &'a [u16], dims: usize, amx: bool) -> Self {
        let w = bytemuck::cast_slice(w16);
        let n = h.len() / dims;
        let width = round_block(n);
        let half = dims / 2;
        let mut h_words_t = ArrayData::alloc(&[half * width], Dtype::U32);
        let hwt = h_words_t.as_mut_slice::<u32>(half * width);
        hwt.fill(0);
        for (t, row) in h.chunks_exact(dims).enumerate() {
            for (p, pair) in row.chunks_exact(2).enumerate() {
                hwt[p * width + t] = pair[0] as u32 | (pair[1] as u32) << 16;
            }
        }
        let mut padded = vec![0u16; width * dims];
        padded[..h.len()].copy_from_slice(h);
        let mut h_pairs = pair_rows(&padded, width, dims);
        if amx {
            h_words_t = panels(&h_words_t, half, width);
            h_pairs = panels(&h_pairs, width / 2, dims);
        }
        Self {
            w,
            w16,
            h_words_t,
            h_pairs,
            dims,
            n,
            width,
            amx,
        }
    }
}

/// The row-major `kp x n` words of `x` in [`amx::gemm`]'s panels.
fn panels(x: &ArrayData, kp: usize, n: usize) -> ArrayData {
    let src = x.as_slice::<u32>(kp * n);
    let mut out = ArrayData::alloc(&[kp * n], Dtype::U32);
    let dst = out.as_mut_slice::<u32>(kp * n);
    for (p, row) in src.chunks_exact(n).enumerate() {
        for (j, seg) in row.chunks_exact(amx::COLS).enumerate() {
            let at = amx::panel_index(p, j * amx::COLS, kp);
            dst[at..at + seg.len()].copy_from_slice(seg);
        }
    }
    out
}

thread_local! {
    /// Per-thread scratch for one chunk's gradient in bfloat16 (both
    /// layouts) and its rows of `w` paired, kept between chunks.
    static GRADIENT: RefCell<Vec<u32>> = const { RefCell::new(Vec::new()) };
}

/// [`GRADIENT`]'s scratch cut into the rounded gradient as it is, the
/// gradient paired and the paired weights, of these lengths (grown when
/// short).
fn gradient_parts(
    scratch: &mut Vec<u32>,
    [n_as_is, n_paired, n_w]: [usize; 3],
) -> (&mut [u32], &mut [u32], &mut [u32]) {
    if scratch.len() < n_as_is + n_paired + n_w {
        scratch.resize(n_as_is + n_paired + n_w, 0);
    }
    let (as_is, rest) = scratch.split_at_mut(n_as_is);
    let (paired, rest) = rest.split_at_mut(n_paired);
    (as_is, paired, &mut rest[..n_w])
}

/// Rounds the `rows x width` f32 gradient `g` to bfloat16 into `as_is`
/// (the same layout, two columns per word: `rows x width / 2` words) and
/// `paired` ([`pair_rows`]: `ceil(rows / 2) x width` words, or with
/// `panels = Some(kp)` the first `ceil(rows / 2)` rows of a `kp x width` `B`
/// in [`amx::gemm`]'s panels).
///
/// # Safety
/// AVX-512F and AVX512_BF16; `width` is a multiple of 32 and the buffers
/// have the sizes above.
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn round_gradient(
    g: &[f32],
    rows: usize,
    width: usize,
    as_is: &mut [u32],
    paired: &mut [u32],
    panels: Option<usize>,
) {
    let pairs = rows.div_ceil(2);
    debug_assert!(g.len() == rows * width && width.is_multiple_of(32));
    debug_assert!(
        as_is.len() == rows * width / 2 && paired.len() == panels.unwrap_or(pairs) * width
    );
    let at = |q: usize, t: usize| match panels {
        Some(kp) => amx::panel_index(q, t, kp),
        None => q * width + t,
    };
    let as_is = as_is.as_mut_ptr() as *mut u16;
    for q in 0..rows.div_ceil(2) {
        let (r0, r1) = (2 * q, 2 * q + 1);
        for t in (0..width).step_by(16) {
            // SAFETY: rows r0 (and r1 when it exists) of every buffer are in
            // bounds (the caller's promise).
            unsafe {
                let lo = _mm512_cvtneps_pbh(_mm512_loadu_ps(g.as_ptr().add(r0 * width + t)));
                let lo: __m256i = std::mem::transmute(lo);
                _mm256_storeu_si256(as_is.add(r0 * width + t) as *mut __m256i, lo);
                let mut words = _mm512_cvtepu16_epi32(lo);
                if r1 < rows {
                    let hi = _mm512_cvtneps_pbh(_mm512_loadu_ps(g.as_ptr().add(r1 * width + t)));
                    let hi: __m256i = std::mem::transmute(hi);
                    _mm256_storeu_si256(as_is.add(r1 * width + t) as *mut __m256i, hi);
                    words =
                        _mm512_or_si512(words, _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(hi)));
                }
                _mm512_storeu_si512(paired.as_mut_ptr().add(at(q, t)) as *mut _, words);
            }
        }
    }
}

impl Products for Bf16Products<'_> {
    fn rows_and_width(&self) -> (usize, usize) {
        (self.n, self.width)
    }

    fn logits(&self, ci: usize, rows: usize, chunk: &mut [f32]) {
        let (half, width) = (self.dims / 2, self.width);
        let w = &self.w[ci * VC * half..];
        let hwt = self.h_words_t.as_slice::<u32>(half * width);
        if self.amx {
            // SAFETY: AMX is available; `hwt` is in panels, `half` a multiple of 16 (dims of
            // 32) and `width` of 32; the shapes are as below.
            unsafe {
                amx::gemm(
                    rows,
                    width,
                    half,
                    w.as_ptr(),
                    half,
                    hwt.as_ptr(),
                    chunk.as_mut_ptr(),
                    width,
                    false,
                )
            };
            return;
        }
        // SAFETY: the CPU was checked ([`enabled`]).
        unsafe { chunk_logits(&BF16_TILES, [rows, width, half], w, hwt, chunk) };
    }

    fn backward(&self, chunk: ChunkGrad<'_>) {
        if self.amx {
            // SAFETY: AMX is available.
            unsafe { self.backward_amx(chunk) };
            return;
        }
        let (dims, width, v0, rows) = (self.dims, self.width, chunk.ci * VC, chunk.rows);
        let pairs = rows.div_ceil(2);
        GRADIENT.with_borrow_mut(|scratch| {
            let (as_is, paired, w_pairs) =
                gradient_parts(scratch, [rows * width / 2, pairs * width, pairs * dims]);
            pair_rows_into(
                &self.w16[v0 * dims..(v0 + rows) * dims],
                rows,
                dims,
                w_pairs,
            );
            // SAFETY: the CPU was checked; width is a multiple of 32 and the
            // buffers have the sizes `round_gradient` asks for.
            unsafe { round_gradient(chunk.g, rows, width, as_is, paired, None) };
            // `g` is the rounded gradient, rows x width / 2 words, `hp` width
            // / 2 x dims; `wt` the paired rows of `w` read down their
            // columns, dims x pairs words, and `paired` pairs x width.
            let operands = Backward {
                g: Strided {
                    ptr: as_is.as_ptr(),
                    rs: width / 2,
                    cs: 1,
                },
                h: self.h_pairs.as_slice::<u32>(width / 2 * dims),
                wt: Strided {
                    ptr: w_pairs.as_ptr(),
                    rs: 1,
                    cs: dims,
                },
                gt: paired,
            };
            // SAFETY: the CPU was checked; `g` and `wt` lie in the buffers
            // they come from.
            unsafe {
                operands.run(
                    &BF16_TILES,
                    [rows, dims, width],
                    chunk.dw,
                    chunk.dht,
                    chunk.add,
                )
            };
        });
    }
}

impl Bf16Products<'_> {
    /// [`Products::backward`] on AMX tiles. `dw (+)= g @ h` takes the
    /// rounded gradient and `h`'s paired rows as they are; `dh^T (+)= w^T @
    /// g` needs `w^T` as rows of pairs of classes, made per chunk (the
    /// tiles cannot read down columns), with both operands padded with zero
    /// pairs to whole steps of the tiles.
    ///
    /// # Safety
    /// [`amx::available`]; the buffers as [`Products::backward`]'s.
    unsafe fn backward_amx(&self, chunk: ChunkGrad<'_>) {
        use amx::STEP;
        let ChunkGrad {
            ci,
            rows,
            g: chunk,
            dw: dw_c,
            dht,
            add,
        } = chunk;
        let (dims, width, v0) = (self.dims, self.width, ci * VC);
        let pairs = rows.div_ceil(2);
        let padded = pairs.div_ceil(STEP) * STEP;
        GRADIENT.with_borrow_mut(|scratch| {
            let (as_is, paired, w_t) =
                gradient_parts(scratch, [rows * width / 2, padded * width, dims * padded]);
            // SAFETY: AVX512_BF16 comes with AMX; the sizes are as asked.
            unsafe { round_gradient(chunk, rows, width, as_is, paired, Some(padded)) };
            // The padding pairs of every panel.
            for panel in paired.chunks_exact_mut(padded * amx::COLS) {
                panel[pairs * amx::COLS..].fill(0);
            }
            transpose_pairs(
                &self.w16[v0 * dims..(v0 + rows) * dims],
                rows,
                dims,
                padded,
                w_t,
            );
            let hp = self.h_pairs.as_slice::<u32>(width / 2 * dims);
            // SAFETY: AMX is available (the caller's promise). `as_is` is
            // rows x width / 2 words, `hp` width / 2 x dims (panels), `dw_c` rows x
            // dims; `w_t` is dims x padded words, `paired` padded x width (panels),
            // `dht` dims x width. width / 2 and padded are multiples of 16,
            // dims and width of 32. Outputs overlap no input.
            unsafe {
                amx::gemm(
                    rows,
                    dims,
                    width / 2,
                    as_is.as_ptr(),
                    width / 2,
                    hp.as_ptr(),
                    dw_c.as_mut_ptr(),
                    dims,
                    add,
                );
                amx::gemm(
                    dims,
                    width,
                    padded,
                    w_t.as_ptr(),
                    padded,
                    paired.as_ptr(),
                    dht.as_mut_ptr(),
                    width,
                    true,
                );
            }
        });
    }
}

/// The `rows x cols` bfloat16 matrix `x` transposed, as rows of pairs:
/// word `(j, q)` of `out` (`cols` rows of `padded` words) holds `x[2q][j]`
/// in its low half and `x[2q + 1][j]` in its high half, zero past the last
/// row of `x`.
fn transpose_pairs(x: &[u16], rows: usize, cols: usize, padded: usize, out: &mut [u32]) {
    debug_assert!(x.len() == rows * cols && out.len() == cols * padded);
    let pairs = rows.div_ceil(2);
    debug_assert!(padded >= pairs);
    for row in out.chunks_exact_mut(padded) {
        row[pairs..].fill(0);
    }
    for q in 0..pairs {
        let lo = &x[2 * q * cols..(2 * q + 1) * cols];
        match x.get((2 * q + 1) * cols..(2 * q + 2) * cols) {
            Some(hi) => {
                for (j, (&l, &h)) in lo.iter().zip(hi).enumerate() {
                    out[j * padded + q] = l as u32 | (h as u32) << 16;
                }
            }
            None => {
                for (j, &l) in lo.iter().enumerate() {
                    out[j * padded + q] = l as u32;
                }
            }
        }
    }
}

/// Whether blocks keep their logits between the two passes: not on AMX,
/// whose products cost less than writing the logits to memory and reading
/// them back.
pub(super) fn keeps_logits() -> bool {
    !amx::available()
}

/// Rows per block when the logits are not kept: a chunk's logits (1 MiB at
/// most) stay in the L2 cache, and the partial sums of `dh^T` take at most
/// 32 MiB.
pub(super) fn recomputing_block(dims: usize) -> usize {
    (1024usize).min((32 << 20) / (4 * 16 * dims.max(1))).max(NR)
}

/// One row block of the one-pass loss for bfloat16 `h` (`n x dims`) and
/// `w` (`vocab x dims`, 4-byte aligned: it is also read as words),
/// as [`super::avx512::value_and_grad_block`]: f32 `dh`, `dw` and loss.
///
/// The caller has checked [`enabled`]`(dims)`. Without `lt` the logits are
/// computed again rather than kept ([`block_with`]): the caller passes none
/// where [`keeps_logits`] says no.
#[allow(clippy::too_many_arguments)]
pub(super) fn value_and_grad_block(
    h: &[u16],
    w16: &[u16],
    tg: &[usize],
    rw: &[f32],
    smoothing: f32,
    dims: usize,
    lt: Option<&mut [f32]>,
    dh: &mut [f32],
    dw: &mut [f32],
    first: bool,
) -> f64 {
    assert!(
        super::avx512::available(dims) && gemm_bf16::available(),
        "the bfloat16 loss needs avx512f, avx512bf16 and dims % 32 == 0"
    );
    let vocab = dw.len() / dims;
    assert!(h.len() == tg.len() * dims && w16.len() == vocab * dims);
    let products = Bf16Products::new(h, w16, dims);
    block_with(&products, tg, rw, smoothing, dims, lt, dh, dw, first)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cpu::loss::avx512::tests::check_two_blocks;
    use half::bf16;

    /// bfloat16 bit patterns of `x` and the values they stand for.
    fn rounded(x: &[f32]) -> (Vec<u16>, Vec<f32>) {
        let b: Vec<bf16> = x.iter().map(|&v| bf16::from_f32(v)).collect();
        (
            b.iter().map(|v| v.to_bits()).collect(),
            b.iter().map(|v| v.to_f32()).collect(),
        )
    }

    #[test]
    fn pair_rows_interleaves_neighbouring_rows() {
        let x: Vec<u16> = (1..=6).collect();
        let pairs = pair_rows(&x, 3, 2);
        let got = pairs.as_slice::<u32>(4);
        assert_eq!(got, [1 | 3 << 16, 2 | 4 << 16, 5, 6]);
    }

    /// [`check_two_blocks`] on bfloat16 values, on the AVX512_BF16 tiles
    /// and the AMX ones where the CPU has them. The loss and logits are
    /// exact products summed in f32; the gradients round the logits'
    /// gradient to bfloat16 (a relative error of 2^-9 per term), hence
    /// their wider tolerance.
    #[test]
    fn blocks_equal_the_definition_on_bfloat16_values() {
        if !(super::super::avx512::available(64) && gemm_bf16::available()) {
            eprintln!("skipped: this CPU has no AVX512_BF16");
            return;
        }
        let paths = if amx::available() {
            vec![false, true]
        } else {
            vec![false]
        };
        for (s, amx) in [0.0f32, 0.1]
            .into_iter()
            .flat_map(|s| paths.iter().map(move |&a| (s, a)))
        {
            let what = if amx { "amx" } else { "avx512_bf16" };
            check_two_blocks(
                what,
                s,
                5e-3,
                |x| rounded(&x).1,
                |c| {
                    // In an `ArrayData`, whose storage is aligned for reading words.
                    let bits = |x: &[f32]| x.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>();
                    let w16 = ArrayData::from_slice(&bits(c.w), &[c.w.len()]);
                    let h16 = rounded(c.h).0;
                    let products =
                        Bf16Products::on(&h16, w16.as_slice::<u16>(c.w.len()), c.dims, amx);
                    // Logits kept on the AVX512_BF16 path, computed again on AMX.
                    block_with(
                        &products,
                        c.tg,
                        c.rw,
                        c.smoothing,
                        c.dims,
                        (!amx).then_some(c.lt),
                        c.dh,
                        c.dw,
                        c.first,
                    )
                },
            );
        }
    }
}
