//! Planning a product: which kernel family runs it (the cooperative one
//! where the device and dtype allow, [`super::super::device::coopmat_usable`]), which tiles, and
//! how its depth is split over workgroups (split-K: [`split_k`] on 64 x 64
//! tiles, [`split_big`] on 128 x 128 ones). See the module docs of
//! [`super`] for the figures behind these choices.

use super::super::device::context;
use super::coop;
use crate::settings::GpuTuning;
use crate::{Dtype, Result};

/// Workgroups that keep every SM of an H100 (132) busy twice over: below
/// this many 128 x 128 tiles, the 64 x 64 kernel runs instead.
pub(super) const BIG_TILES_FROM: usize = 264;

/// The fragment implementation of the cooperative kernel for products of
/// `dtype`, or `None` for the f32-compute kernel: f16 stored natively, not
/// accumulating, and [`coop_mode`] offering the kernel.
pub(super) fn coop_fragments(
    dtype: Dtype,
    accumulate: bool,
    tuning: &GpuTuning,
) -> Result<Option<coop::Fragments>> {
    if dtype != Dtype::F16 || accumulate {
        return Ok(None);
    }
    coop_mode(tuning)
}

/// The fragment implementation the cooperative kernel runs with, or `None`
/// where it cannot run: [`super::super::fragment::chosen`] offers one (f16 stored
/// natively, and the tuning's [`GpuTuning::coopmat`] either `Plain` or `Auto` on a
/// device with cooperative matrices, [`super::super::device::coopmat_usable`]), and the workgroup
/// memory fits the device's limit.
pub(super) fn coop_mode(tuning: &GpuTuning) -> Result<Option<coop::Fragments>> {
    let Some(fragments) = super::super::fragment::chosen(Dtype::F16, tuning)? else {
        return Ok(None);
    };
    let c = context()?;
    let fits = coop::Tiling::ALL.iter().all(|t| {
        t.shared_bytes() <= c.limits.max_compute_workgroup_storage_size as usize
            && t.invocations() <= c.limits.max_compute_invocations_per_workgroup as usize
    });
    Ok(fits.then_some(fragments))
}

/// Whether [`record_f16_f32`] can run here: the cooperative kernel is
/// available (on tensor cores, or with plain fragments when forced).
pub(crate) fn f16_f32_products(tuning: &GpuTuning) -> Result<bool> {
    Ok(coop_mode(tuning)?.is_some())
}

/// How a product's depth is cut: `count` slices of `depth` (the last one
/// shorter), each computed by its own workgroups into its own partial sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slices {
    pub(super) count: usize,
    pub(super) depth: usize,
}

/// The shortest depth slice worth its own workgroups: a 64 x 64 tile over
/// 256 depths is 2.1 MFLOP against 32 KiB of partial sums written and read
/// back (64 FLOP a byte, well above the H100's f32 balance of ~17), and 16
/// of the kernel's 16-deep staged slices amortise its prologue and stores.
pub(super) const MIN_SLICE_DEPTH: usize = 256;

/// The most slices: beyond 16, partial sums outweigh what more
/// workgroups could gain (a product with fewer than 33 tiles is tiny).
pub(super) const MAX_SLICES: usize = 16;

/// Split-K for a product of `tiles` 64 x 64 output tiles and depth `k`,
/// on a kernel staging `unit`-deep slices (16 for the f32 kernel, 32 for
/// the cooperative one), on a GPU whose one wave holds `wave` such
/// workgroups ([`GpuTuning::split_wave`]).
///
/// The wave's default, 528, is 132 SMs x 4 resident workgroups. The f32
/// kernel's (256 invocations, ~48 registers, 17 KiB of workgroup memory)
/// fit 4 to an SM, 32 of its 64 warps; the cooperative kernel's small
/// tiling (128 invocations, ~100 registers with its staged loads, 14 KiB)
/// fits 4-5, and 4 is the safe figure: a product launched as slightly
/// more than one wave runs its leftovers as a second wave as long as the
/// first. wgpu reports no SM count, so the H100's is the design figure
/// (the same as [`BIG_TILES_FROM`]'s); the tuning's `split_wave` measures
/// others on a device.
///
/// A product with fewer tiles than two per SM of an H100 (below
/// [`BIG_TILES_FROM`]) leaves most SMs idle or alone with one workgroup,
/// however long its depth: the fused linear cross-entropy's `dh += g @
/// w[chunk]` (`[2044, 2052] @ [2052, 256]`: 128 tiles) and `dw[chunk] =
/// g^T @ h` (`[2052, 2044] @ [2044, 256]`: 132 tiles), a whole `dX`
/// over the vocabulary (`[2044, 50257] @ [50257, 256]`: 128 tiles), a
/// small `dW` (`[256, 2044] @ [2044, 512]`: 32 tiles), and in half
/// precision every weight gradient of the reference model. Cutting the
/// depth into `s` slices gives `s` times the workgroups, each writing a
/// partial `[m, n]` sum that one more pass adds up: `s` is the largest
/// count that still runs as one wave (`wave`: one
/// more slice past it would leave a second wave of leftovers, each as long
/// as the first wave's), at most [`MAX_SLICES`] and with slices at least
/// [`MIN_SLICE_DEPTH`] deep; slice depths are multiples of `unit`, so only
/// the last slice has a ragged end. The four shapes above get 4, 4, 4 and
/// 7 slices: 512, 528, 512 and 224 workgroups instead of 128, 132, 128 and
/// 32 (the smallest count reaching a wave, as split before, gave 5, 4, 5
/// and 7: 640 workgroups, 1.2 waves).
pub(super) fn split_k(tiles: usize, k: usize, unit: usize, wave: usize) -> Slices {
    let whole = Slices { count: 1, depth: k };
    if tiles == 0 || tiles >= BIG_TILES_FROM {
        return whole;
    }
    let count = (wave / tiles).min(k / MIN_SLICE_DEPTH).min(MAX_SLICES);
    if count < 2 {
        return whole;
    }
    let depth = k.div_ceil(count).next_multiple_of(unit);
    Slices {
        count: k.div_ceil(depth),
        depth,
    }
}

/// The shortest depth slice of a product split on 128 x 128 tiles: 1,024
/// deep, a tile is 33.5 MFLOP against 128 KiB of partial sums written and
/// read back (256 FLOP a byte), and the kernel's prologue and stores are
/// amortised over 64 staged slices of the f32 kernel (32 of the
/// cooperative one).
pub(super) const MIN_BIG_SLICE_DEPTH: usize = 1024;

/// The share of its last wave's slots a split on 128 x 128 tiles must
/// fill to be taken.
pub(super) const BIG_SPLIT_FILL: f64 = 0.9;

/// Split-K on 128 x 128 tiles for a product of `tiles` of them, fewer than
/// one wave (`wave`: two per SM, 264 on an H100), and depth `k`: the
/// fewest slices (at most [`MAX_SLICES`], each at least
/// [`MIN_BIG_SLICE_DEPTH`] deep, multiples of `unit`) whose workgroups
/// fill at least [`BIG_SPLIT_FILL`] of the waves they take; `None` when
/// no count does, and [`split_k`] splits the product on 64 x 64 tiles.
///
/// The weight gradients of the large model (12 x 768, MLP 2048, batch 16 x
/// 512) are this shape: `dW = x^T @ dy` over 8,192 rows, `[768, 8192] @
/// [8192, 2048]` (96 tiles) and `[768, 8192] @ [8192, 768]` (36). On
/// 64 x 64 tiles (384 of them unsplit, 144 x 3 slices) they ran at 20-21
/// TFLOP/s on an H200, where the 128 x 128 f32 kernel runs full products
/// at 26-29 (`MLX_PROFILE=1`, 2026-11-27): they took 68 of the step's
/// 311 ms of GPU time. Here they take 5 slices of 1,648 (480 workgroups,
/// 91% of two waves) and 7 of 1,184 (252, 95% of one), for 31 and 16 MB
/// of partial sums (a few microseconds against a millisecond of
/// products). Designed, not measured: at the 128 x 128 kernel's rate the
/// step's weight gradients would take about 50 ms instead of 68.
/// The reference model's products are too shallow for slices this deep,
/// except the fused loss's `dh` over the vocabulary (16 tiles per block
/// of 1,022 rows, 50,257 deep: 15 slices of 3,360, 240 workgroups).
pub(super) fn split_big(tiles: usize, k: usize, unit: usize, wave: usize) -> Option<Slices> {
    if tiles == 0 || tiles >= wave {
        return None;
    }
    (2..=MAX_SLICES.min(k / MIN_BIG_SLICE_DEPTH)).find_map(|count| {
        let depth = k.div_ceil(count).next_multiple_of(unit);
        let slices = Slices {
            count: k.div_ceil(depth),
            depth,
        };
        let groups = tiles * slices.count;
        let fill = groups as f64 / (groups.div_ceil(wave) * wave) as f64;
        (slices.count > 1 && fill >= BIG_SPLIT_FILL).then_some(slices)
    })
}

#[cfg(test)]
mod tests {
    use super::{Slices, split_big, split_k};

    /// The large model's weight gradients and the reference loss's `dh`
    /// take the fewest slices (of at least 1,024) that fill 90% of the
    /// waves of two 128 x 128 workgroups per SM they take (module docs);
    /// products that fill a wave already, or are too shallow, are not
    /// split on these tiles.
    #[test]
    fn big_splits_fill_their_waves() {
        let tiles = |m: usize, n: usize| m.div_ceil(128) * n.div_ceil(128);
        let wave = WAVE / 2;
        let cases = [
            // (tiles, k, unit) -> (count, depth)
            ((tiles(768, 2048), 8192, 16), Some((5, 1648))),
            ((tiles(2048, 768), 8192, 16), Some((5, 1648))),
            ((tiles(768, 768), 8192, 16), Some((7, 1184))),
            ((tiles(768, 768), 8192, 32), Some((7, 1184))),
            ((tiles(1022, 256), 50257, 32), Some((15, 3360))),
            // Too shallow for two slices of 1,024 (the reference model's
            // weight gradients), or a wave already (the large model's
            // activation gradients).
            ((tiles(256, 256), 2044, 32), None),
            ((tiles(8192, 768), 2048, 16), None),
            // No count up to 8 fills 90%: 6 tiles x 8 is 48 of 264.
            ((tiles(256, 384), 8192, 16), None),
        ];
        for ((t, k, unit), want) in cases {
            let got = split_big(t, k, unit, wave);
            assert_eq!(
                got,
                want.map(|(count, depth)| Slices { count, depth }),
                "{t} tiles, depth {k}"
            );
            if let Some(s) = got {
                let groups = t * s.count;
                assert!(groups as f64 >= 0.9 * (groups.div_ceil(wave) * wave) as f64);
                assert!(s.depth >= 1024 && s.depth % unit == 0);
                assert!(s.depth * (s.count - 1) < k && s.depth * s.count >= k);
            }
        }
        assert_eq!(split_big(0, 8192, 16, wave), None);
        assert_eq!(split_big(4, 8192, 16, 0), None);
    }

    /// The default wave: 4 workgroups on each of an H100's 132 SMs.
    const WAVE: usize = 528;

    /// The design table's shapes (module docs) get the largest slice count
    /// that one wave of 528 workgroups holds, limited by slices of at
    /// least 256 and at most 16 of them; depths a multiple of the kernel's
    /// staged slice.
    #[test]
    fn split_k_fills_one_wave_and_no_more() {
        let tiles = |m: usize, n: usize| m.div_ceil(64) * n.div_ceil(64);
        let cases = [
            // (tiles, k, unit) -> (count, depth)
            ((tiles(1022, 256), 50257, 16), (8, 6288)),
            ((tiles(2044, 256), 2052, 16), (4, 528)),
            ((tiles(2052, 256), 2044, 16), (4, 512)),
            ((tiles(2044, 256), 50257, 16), (4, 12576)),
            ((tiles(256, 512), 2044, 16), (7, 304)),
            // The cooperative kernel's 32-deep slices.
            ((tiles(2044, 256), 50257, 32), (4, 12576)),
            ((tiles(256, 256), 2044, 32), (7, 320)),
        ];
        for ((t, k, unit), (count, depth)) in cases {
            let s = split_k(t, k, unit, WAVE);
            assert_eq!(s, Slices { count, depth }, "{t} tiles, depth {k}");
            assert!(t * s.count <= WAVE);
            assert_eq!(s.depth % unit, 0);
            assert!(s.depth * (s.count - 1) < k && s.depth * s.count >= k);
        }
    }

    /// Products that fill a wave alone, or are too shallow for two
    /// slices of 256, stay whole.
    #[test]
    fn split_k_leaves_full_or_shallow_products_whole() {
        for (t, k) in [
            (0, 5000),
            (264, 5000),
            (265, 5000),
            (300, 100_000),
            (1, 511),
            (10, 300),
        ] {
            assert_eq!(
                split_k(t, k, 16, WAVE),
                Slices { count: 1, depth: k },
                "{t} tiles, depth {k}"
            );
        }
        // 176 tiles: three slices would be 528 workgroups, one wave.
        assert_eq!(split_k(176, 5000, 16, WAVE).count, 3);
        assert_eq!(split_k(177, 5000, 16, WAVE).count, 2);
        // A wave twice as large: twice the slices (at most 16).
        assert_eq!(split_k(64, 50257, 16, 2 * WAVE).count, 16);
        assert_eq!(split_k(128, 50257, 16, 2 * WAVE).count, 8);
    }
}
