//! bfloat16 products on Intel AMX tiles (`tdpbf16ps`, Sapphire Rapids on),
//! for the bfloat16 GEMM and the one-pass loss, where the CPU has AMX-BF16
//! and the operating system lends the process the tile state (Linux 5.16
//! on, once asked with `arch_prctl`). Elsewhere, or with `MLX_CPU_TUNING=amx=off`, the
//! callers keep their AVX512_BF16 kernels.
//!
//! A tile register holds 16 rows of 64 bytes. `tdpbf16ps C, A, B` adds to
//! each float32 `C[i][j]` (16 x 16) the sum over 16 pairs `p` of
//! `A[i][2p] * B[p][2j] + A[i][2p + 1] * B[p][2j + 1]`: `A` is 16 rows of
//! 16 pairs of `k` (one 32-bit word per pair, as the AVX512_BF16 kernels already
//! lay out their operands), `B` 16 pairs of 16 columns, a word per column
//! and pair. One instruction is 8,192 multiply-adds; a core runs one every
//! 16 cycles, about 20 times `vdpbf16ps`' rate.
//!
//! Here a block of `C` is 32 x 32 float32 (four tiles), stepped over `k`
//! 16 pairs at a time with two tiles of `A` and two of `B`: all eight tile
//! registers. Operands are read in place, row-major, through the tile
//! loads' row stride; only a block of fewer than 32 rows goes through
//! zero-padded scratch. The tiles sum each element's pairs in one fixed
//! order, so results do not depend on the number of threads. Like every
//! bfloat16 instruction, `tdpbf16ps` reads subnormal inputs as zero.
//!
//! Why by hand: no Rust crate has AMX kernels, and OpenBLAS's `sbgemm` is
//! not in the distributions' builds (see [`super::gemm_bf16`]). The
//! instructions are written with `asm!` because Rust's AMX intrinsics are
//! not stable.

use std::arch::asm;
use std::cell::RefCell;
use std::sync::OnceLock;

/// Rows of a block of `C`: two tiles.
pub(in crate::backend::cpu) const ROWS: usize = 32;
/// Columns of a block of `C`: two tiles of 16 float32 sums.
pub(in crate::backend::cpu) const COLS: usize = 32;
/// Pairs of `k` per step: a tile of `A` is 16 rows of 16 pairs.
pub(in crate::backend::cpu) const STEP: usize = 16;

/// Whether the AMX kernels run: the CPU has AMX-TILE and AMX-BF16 (and
/// AVX512_BF16, for rounding results), the operating system grants the
/// tile state, and the CPU tuning's `amx` is on. Decided once per process.
pub(in crate::backend::cpu) fn available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE
        .get_or_init(|| crate::settings::cpu_tuning().amx && cpu_has_amx() && os_grants_tiles())
}

/// CPUID leaf 7: AMX-BF16 is EDX bit 22, AMX-TILE bit 24.
fn cpu_has_amx() -> bool {
    if !super::bf16_instructions::available() {
        return false;
    }
    // CPUID is part of x86_64; leaf 7 exists on every CPU with AVX-512.
    #[allow(unused_unsafe)] // `__cpuid_count` is safe in newer Rust
    let leaf = unsafe { std::arch::x86_64::__cpuid_count(7, 0) };
    leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0
}

/// Linux gives a process the (8 KiB per thread) tile data state only on
/// request: `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`, for
/// every thread of the process.
#[cfg(target_os = "linux")]
fn os_grants_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a system call with two integer arguments and no memory.
    unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        ) == 0
    }
}

/// No other operating system we build for runs on CPUs with AMX (Intel
/// Macs predate it), so no other is asked.
#[cfg(not(target_os = "linux"))]
fn os_grants_tiles() -> bool {
    false
}

/// The tile configuration (palette 1): all eight tiles 16 rows x 64 bytes.
#[repr(C, align(64))]
struct Config([u8; 64]);

const CONFIG: Config = {
    let mut c = [0u8; 64];
    c[0] = 1;
    let mut t = 0;
    while t < 8 {
        c[16 + 2 * t] = 64; // bytes per row, little-endian u16
        c[48 + t] = 16; // rows
        t += 1;
    }
    Config(c)
};

/// The tiles of this thread, configured; released when dropped (so the
/// operating system need not save them at every switch).
struct Tiles;

impl Tiles {
    /// # Safety
    /// [`available`] is true.
    unsafe fn configure() -> Tiles {
        // SAFETY: AMX is available (the caller's promise); the config is
        // 64 aligned bytes.
        unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
        Tiles
    }
}

impl Drop for Tiles {
    fn drop(&mut self) {
        // SAFETY: the tiles were configured by `configure`.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

/// One 32 x 32 block `C (+)= A @ B` over `steps` steps of [`STEP`] pairs:
/// `A`'s word `(i, p)` at `a + i * lda + p`, `B`'s word `(p, j)` at
/// `b + p * 32 + j` (a panel), `C[i][j]` at `c + i * ldc + j` (strides in
/// elements).
///
/// # Safety
/// The tiles are configured ([`Tiles`]); 32 rows of `A` with `steps *
/// STEP` words each, the panel's `steps * STEP` rows, and 32 x 32 floats
/// of `C` are in bounds.
#[inline]
unsafe fn block(
    steps: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    add: bool,
) {
    let (sa, sb, sc) = (lda * 4, COLS * 4, ldc * 4);
    let c1 = c.wrapping_add(16);
    let c2 = c.wrapping_add(16 * ldc);
    let c3 = c2.wrapping_add(16);
    // SAFETY (every asm! below): the caller's promise; the tile loads read
    // and the stores write 16 rows of 64 bytes at the given stride.
    unsafe {
        if add {
            asm!(
                "tileloadd tmm0, [{c0} + {s}]",
                "tileloadd tmm1, [{c1} + {s}]",
                "tileloadd tmm2, [{c2} + {s}]",
                "tileloadd tmm3, [{c3} + {s}]",
                c0 = in(reg) c, c1 = in(reg) c1, c2 = in(reg) c2, c3 = in(reg) c3,
                s = in(reg) sc,
                options(nostack, readonly),
            );
        } else {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nostack, nomem)
            );
        }
        let (mut ap, mut bp) = (a, b);
        for _ in 0..steps {
            // Each load right before the first product that reads it, so
            // that it waits only for the last product that read its tile.
            asm!(
                "tileloadd tmm4, [{a0} + {sa}]",
                "tileloadd tmm6, [{b0} + {sb}]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tileloadd tmm7, [{b1} + {sb}]",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tileloadd tmm5, [{a1} + {sa}]",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                a0 = in(reg) ap, a1 = in(reg) ap.add(16 * lda),
                b0 = in(reg) bp, b1 = in(reg) bp.add(16),
                sa = in(reg) sa, sb = in(reg) sb,
                options(nostack, readonly),
            );
            ap = ap.add(STEP);
            bp = bp.add(STEP * COLS);
        }
        asm!(
            "tilestored [{c0} + {s}], tmm0",
            "tilestored [{c1} + {s}], tmm1",
            "tilestored [{c2} + {s}], tmm2",
            "tilestored [{c3} + {s}], tmm3",
            c0 = in(reg) c, c1 = in(reg) c1, c2 = in(reg) c2, c3 = in(reg) c3,
            s = in(reg) sc,
            options(nostack),
        );
    }
}

thread_local! {
    /// Zero-padded rows of `A` and a block of `C` for a last group of
    /// fewer than 32 rows, kept between calls.
    static EDGE: RefCell<(Vec<u32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `C (+)= A @ B` for `m x n` float32 `C` (row stride `ldc`), `A` of `m`
/// rows of `kp` words (row stride `lda`: pairs of `k` side by side) and
/// `B` of `kp` rows of `n` words (a word per column and pair) in panels of
/// [`COLS`] columns ([`panel_index`]: panel `g` at `b + g * kp * COLS`,
/// its row `p` at `p * COLS` in it), on this thread.
///
/// `B` comes in panels because the tile loads read 16 rows of 64 bytes at
/// a stride: rows of a wide matrix lie 4 KiB or more apart, all in one set
/// of the L1 cache, and the loads waited on the L2.
///
/// # Safety
/// [`available`] is true; `kp` is a multiple of [`STEP`] and `n` of
/// [`COLS`]; the operands are in bounds for these shapes and `C` overlaps
/// neither.
#[allow(clippy::too_many_arguments)]
pub(in crate::backend::cpu) unsafe fn gemm(
    m: usize,
    n: usize,
    kp: usize,
    a: *const u32,
    lda: usize,
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    add: bool,
) {
    debug_assert!(kp.is_multiple_of(STEP) && n.is_multiple_of(COLS));
    if m == 0 || n == 0 {
        return;
    }
    let steps = kp / STEP;
    // SAFETY: the caller's promise.
    let _tiles = unsafe { Tiles::configure() };
    let whole = m / ROWS * ROWS;
    for i0 in (0..whole).step_by(ROWS) {
        for j0 in (0..n).step_by(COLS) {
            // SAFETY: rows i0..i0 + 32 and columns j0..j0 + 32 are in bounds.
            unsafe {
                block(
                    steps,
                    a.add(i0 * lda),
                    lda,
                    b.add(j0 * kp),
                    c.add(i0 * ldc + j0),
                    ldc,
                    add,
                )
            };
        }
    }
    let rest = m - whole;
    if rest == 0 {
        return;
    }
    EDGE.with_borrow_mut(|(ea, ec)| {
        ea.clear();
        ea.resize(ROWS * kp, 0);
        ec.resize(ROWS * COLS, 0.0);
        for i in 0..rest {
            // SAFETY: row whole + i of A has kp words.
            let row = unsafe { std::slice::from_raw_parts(a.add((whole + i) * lda), kp) };
            ea[i * kp..(i + 1) * kp].copy_from_slice(row);
        }
        for j0 in (0..n).step_by(COLS) {
            // SAFETY: C's rows whole.. (rest of them) are in bounds.
            let c_row = |i: usize| unsafe { c.add((whole + i) * ldc + j0) };
            if add {
                for i in 0..rest {
                    // SAFETY: 32 floats of row i of this block of C.
                    let src = unsafe { std::slice::from_raw_parts(c_row(i), COLS) };
                    ec[i * COLS..(i + 1) * COLS].copy_from_slice(src);
                }
            }
            // SAFETY: the scratch holds 32 rows of kp words and 32 x 32 floats.
            unsafe {
                block(
                    steps,
                    ea.as_ptr(),
                    kp,
                    b.add(j0 * kp),
                    ec.as_mut_ptr(),
                    COLS,
                    add,
                )
            };
            for i in 0..rest {
                // SAFETY: 32 floats of row i of this block of C.
                let dst = unsafe { std::slice::from_raw_parts_mut(c_row(i), COLS) };
                dst.copy_from_slice(&ec[i * COLS..(i + 1) * COLS]);
            }
        }
    });
}

/// Where word `(p, j)` of a `kp`-row `B` lies in [`gemm`]'s panels.
#[inline]
pub(in crate::backend::cpu) fn panel_index(p: usize, j: usize, kp: usize) -> usize {
    j / COLS * kp * COLS + p * COLS + j % COLS
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bf16(x: f32) -> u16 {
        half::bf16::from_f32(x).to_bits()
    }

    /// Products of every edge case of the block loop (whole and partial
    /// row groups, one and several steps, `add` on and off) against the
    /// f64 sums of the same bfloat16 values.
    #[test]
    fn products_equal_the_definition() {
        if !available() {
            eprintln!("skipping: no AMX on this CPU or OS (or MLX_CPU_TUNING=amx=off)");
            return;
        }
        for &(m, n, kp) in &[(32, 32, 16), (70, 64, 48), (5, 96, 16), (33, 32, 128)] {
            let (lda, ldb, ldc) = (kp + 3, n + 32, n + 5);
            let val = |s: usize| ((s * 7919) % 61) as f32 / 16.0 - 1.9;
            let a16: Vec<u16> = (0..m * lda * 2).map(|s| bf16(val(s))).collect();
            let b16: Vec<u16> = (0..kp * ldb * 2).map(|s| bf16(val(s + 5))).collect();
            let a: Vec<u32> = bytemuck::pod_collect_to_vec(&a16);
            let rows: Vec<u32> = bytemuck::pod_collect_to_vec(&b16);
            let mut b = vec![u32::MAX; kp * n];
            for p in 0..kp {
                for j in 0..n {
                    b[panel_index(p, j, kp)] = rows[p * ldb + j];
                }
            }
            let f = |h: u16| half::bf16::from_bits(h).to_f64();
            for add in [false, true] {
                let mut c: Vec<f32> = (0..m * ldc).map(|s| (s % 5) as f32).collect();
                let before = c.clone();
                // SAFETY: available; the buffers have the strides above.
                unsafe {
                    gemm(
                        m,
                        n,
                        kp,
                        a.as_ptr(),
                        lda,
                        b.as_ptr(),
                        c.as_mut_ptr(),
                        ldc,
                        add,
                    )
                };
                for i in 0..m {
                    for j in 0..ldc {
                        let got = c[i * ldc + j] as f64;
                        if j >= n {
                            assert_eq!(got, before[i * ldc + j] as f64, "outside C");
                            continue;
                        }
                        let mut want = if add { before[i * ldc + j] as f64 } else { 0.0 };
                        for p in 0..kp {
                            for h in 0..2 {
                                want +=
                                    f(a16[2 * (i * lda + p) + h]) * f(b16[2 * (p * ldb + j) + h]);
                            }
                        }
                        assert!(
                            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                            "{m}x{n}x{kp} add {add}: ({i}, {j}) {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
