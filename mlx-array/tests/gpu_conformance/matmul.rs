//! The GPU matrix products against the CPU's: every kernel (the f32 one at
//! both tiles, the cooperative-matrix template with plain fragments), every
//! transpose case, shapes that are not multiples of any tile, broadcast
//! batches, f32 and the half dtypes, and the accumulating form the fused
//! linear cross-entropy uses (through its own specs).

use mlx_array::backend::gpu::vector_operand_count;
use mlx_array::settings::{GPU_COOP_SUBGROUPS, GpuCoopmat, GpuTuning, tune_gpu};
use mlx_array::{Array, Dtype, Result};

use crate::harness::{compare, gpu, native_f16_or_skip, spirv, tol};

/// Values in [-1, 1) of `n` elements, varied by `seed`, not all integers.
fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104729) % 211) as f32 / 105.5 - 1.0)
        .collect()
}

/// An `[.., rows, cols]` operand of `dtype`, stored transposed (a
/// column-major view) when `transposed`.
fn operand(
    batch: &[usize],
    rows: usize,
    cols: usize,
    transposed: bool,
    seed: usize,
    dtype: Dtype,
) -> Array {
    let count = batch.iter().product::<usize>() * rows * cols;
    let mut shape = batch.to_vec();
    if transposed {
        shape.extend([cols, rows]);
    } else {
        shape.extend([rows, cols]);
    }
    let x = Array::from_slice(&values(count, seed), &shape)
        .unwrap()
        .astype(dtype)
        .unwrap();
    if transposed {
        let nd = shape.len() as i32;
        let mut axes: Vec<i32> = (0..nd).collect();
        axes.swap(nd as usize - 2, nd as usize - 1);
        x.transpose(&axes).unwrap()
    } else {
        x
    }
}

/// `a @ b` in every transpose case against the CPU.
fn check(
    what: &str,
    dtype: Dtype,
    a_batch: &[usize],
    b_batch: &[usize],
    m: usize,
    k: usize,
    n: usize,
) {
    for (ta, tb) in [(false, false), (false, true), (true, false), (true, true)] {
        let a = operand(a_batch, m, k, ta, 1, dtype);
        let b = operand(b_batch, k, n, tb, 2, dtype);
        // Sums of k products of values below 1: the f32 tolerance grows
        // with the depth.
        let rel = tol(dtype).max(1e-6 * k as f64);
        compare(
            &format!(
                "{what} {dtype} [{a_batch:?} {m}x{k}] @ [{b_batch:?} {k}x{n}] transposed {ta}/{tb}"
            ),
            &[a, b],
            |v: &[Array]| -> Result<Array> { v[0].matmul(&v[1]) },
            rel,
        );
    }
}

/// Shapes small enough for lavapipe that still cross every tile edge.
fn shapes(what: &str, dtype: Dtype) {
    check(what, dtype, &[], &[], 1, 1, 1);
    check(what, dtype, &[], &[], 17, 33, 9);
    check(what, dtype, &[], &[], 70, 16, 65);
    check(what, dtype, &[], &[], 129, 47, 130);
    // Broadcast batches: `a` shared by three products, `b` by two.
    check(what, dtype, &[1, 2], &[3, 1], 19, 21, 35);
}

#[test]
fn f32_kernel_agrees_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        shapes("f32 kernel", dtype);
    }
    // Enough 128 x 128 tiles (264) for the large-tile kernel, with edges.
    check(
        "f32 kernel, 128 tiles",
        Dtype::F32,
        &[66],
        &[],
        129,
        20,
        130,
    );
    check("f32 kernel, 128 tiles", Dtype::F16, &[264], &[], 5, 3, 7);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// Every large tile of the f32 kernel (the tuning's `f32_tile`: 8 x 4 outputs
/// an invocation, 128 invocations of 16 x 8, 256 x 128 on one buffer)
/// agrees with the CPU across tile edges (rows past 128 and 256, columns
/// past 64 and 128, a depth of three staged slices, the last partial), in
/// every transpose case, with aligned operands (vector staging) and not.
#[test]
fn every_large_f32_tile_agrees_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    use mlx_array::settings::GpuF32Tile;
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    for (tile, name) in GpuF32Tile::ALL {
        tune_gpu(|t| t.f32_tile = tile);
        check(
            &format!("f32 tile {name}"),
            Dtype::F32,
            &[66],
            &[],
            260,
            40,
            132,
        );
        check(
            &format!("f32 tile {name}"),
            Dtype::F32,
            &[264],
            &[],
            9,
            35,
            7,
        );
        check(
            &format!("f32 tile {name}"),
            Dtype::BF16,
            &[264],
            &[],
            5,
            17,
            66,
        );
    }
    tune_gpu(|t| t.f32_tile = GpuF32Tile::Square);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// Kernel dispatches one GPU product of `[m, k] @ [k, n]` f32 records.
fn dispatches_of(m: usize, k: usize, n: usize) -> usize {
    dispatches_in(Dtype::F32, m, k, n)
}

/// Kernel dispatches one GPU product of `[m, k] @ [k, n]` in `dtype`
/// records.
fn dispatches_in(dtype: Dtype, m: usize, k: usize, n: usize) -> usize {
    let a = operand(&[], m, k, false, 3, dtype).to_device(mlx_array::Device::Gpu);
    let b = operand(&[], k, n, true, 4, dtype).to_device(mlx_array::Device::Gpu);
    mlx_array::eval((&a, &b)).unwrap();
    let before = mlx_array::backend::gpu::dispatch_count();
    mlx_array::device::with_device(mlx_array::Device::Gpu, || a.matmul(&b))
        .unwrap()
        .eval()
        .unwrap();
    mlx_array::backend::gpu::dispatch_count() - before
}

/// Products with few output tiles and a long depth are split over the
/// depth (partial products, then a pass that sums them): every transpose
/// case, shapes off every tile and slice boundary (the last slice short),
/// broadcast batches, half dtypes, against the CPU.
#[test]
fn split_k_products_agree_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    // One 64 x 64 tile, depth 3001: 11 slices of 288, the last of 121.
    assert_eq!(dispatches_of(37, 3001, 45), 2, "split: product and sum");
    // Too shallow to split (one slice of at least 256 each would be 1).
    assert_eq!(dispatches_of(37, 511, 45), 1, "not split");
    // A wave of one workgroup leaves nothing to split; of two, two slices.
    tune_gpu(|t| t.split_wave = 1);
    assert_eq!(dispatches_of(37, 3001, 45), 1, "split_wave=1");
    tune_gpu(|t| t.split_wave = 2);
    assert_eq!(dispatches_of(37, 3001, 45), 2, "split_wave=2");
    check("split-K, two slices", Dtype::F32, &[], &[], 37, 3001, 45);
    tune_gpu(|t| t.split_wave = GpuTuning::default().split_wave);
    check("split-K", Dtype::F32, &[], &[], 37, 3001, 45);
    check("split-K", Dtype::F32, &[], &[], 1, 700, 3);
    // Six tiles a product over the batch: 4 slices of 288, the last of 236.
    check(
        "split-K, batched",
        Dtype::F32,
        &[1, 2],
        &[3, 1],
        19,
        1100,
        35,
    );
    for dtype in [Dtype::F16, Dtype::BF16] {
        check("split-K", dtype, &[], &[], 33, 1500, 20);
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// A product with few 128 x 128 tiles and a deep reduction is split on
/// those tiles when its slices fill the waves (`split_big`; a wave of 16
/// 64 x 64 workgroups here is 8 of 128 x 128, so 4 tiles in 2 slices fill
/// it): two dispatches, 128 tiles, the CPU's values on the f32 kernel
/// (f32, bf16) and the cooperative template (f16, plain fragments), in
/// every transpose case, the last slice short.
#[test]
fn deep_products_with_few_big_tiles_split_on_them() {
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.split_wave = 16);
    for (dtype, coopmat) in [
        (Dtype::F32, GpuCoopmat::Off),
        (Dtype::BF16, GpuCoopmat::Off),
        (Dtype::F16, GpuCoopmat::Plain),
    ] {
        if dtype == Dtype::F16 && !native_f16_or_skip() {
            continue;
        }
        tune_gpu(|t| t.coopmat = coopmat);
        assert_eq!(dispatches_in(dtype, 250, 2100, 256), 2, "{dtype}: split");
        assert_eq!(mlx_array::backend::gpu::last_product_tile(), Some(128));
        check("split on 128 tiles", dtype, &[], &[], 250, 2100, 256);
        assert_eq!(mlx_array::backend::gpu::last_product_tile(), Some(128));
        // One slice of 1,024 is too few: the 64 x 64 tiles, whole (16
        // of them fill the wave).
        assert_eq!(dispatches_in(dtype, 250, 2000, 256), 1, "{dtype}: whole");
        assert_eq!(mlx_array::backend::gpu::last_product_tile(), Some(64));
    }
    tune_gpu(|t| t.split_wave = GpuTuning::default().split_wave);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

#[test]
fn cooperative_template_with_plain_fragments_agrees_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    shapes("plain fragments", Dtype::F16);
    check("plain fragments, deep", Dtype::F16, &[], &[], 40, 200, 33);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// f16 products on the cooperative template (plain fragments here) split
/// over the depth as the f32 kernel's do: its f32 partial sums (stored
/// straight from the fragments on tiles wholly inside the product,
/// through the staging fragment on the others), then one pass summing
/// them into the f16 output, in every transpose case, with slices a
/// multiple of its 32-deep staged slice and a short last one.
#[test]
fn cooperative_split_k_products_agree_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    let before = mlx_array::backend::gpu::coop_product_count();
    // One 64 x 64 tile, depth 1500: 5 slices of 320, the last of 220.
    assert_eq!(dispatches_in(Dtype::F16, 33, 1500, 20), 2, "split");
    assert_eq!(
        mlx_array::backend::gpu::coop_product_count() - before,
        1,
        "on the cooperative template"
    );
    assert_eq!(dispatches_in(Dtype::F16, 33, 500, 20), 1, "too shallow");
    check("cooperative split-K", Dtype::F16, &[], &[], 33, 1500, 20);
    // f32 partial sums from whole tiles (stored straight from the
    // fragments), and from whole and edge tiles in one product.
    check(
        "cooperative split-K, whole tiles",
        Dtype::F16,
        &[],
        &[],
        128,
        1500,
        64,
    );
    check(
        "cooperative split-K, whole and edge tiles",
        Dtype::F16,
        &[],
        &[],
        130,
        1100,
        64,
    );
    check(
        "cooperative split-K, batched",
        Dtype::F16,
        &[1, 2],
        &[3, 1],
        19,
        1100,
        35,
    );
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

#[test]
fn default_path_agrees_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
    for dtype in [Dtype::F32, Dtype::F16] {
        check("default", dtype, &[], &[], 33, 40, 17);
    }
}

/// Where an operand of a view test lies in its buffer: from element
/// `shift` of a flat buffer, its batches and rows (or columns, stored
/// transposed) dense after it.
#[derive(Clone, Copy)]
struct Placed {
    shift: usize,
    transposed: bool,
}

/// An `[.., rows, cols]` operand placed as `at`, built (on the device
/// running it) as views of `flat`: a slice from `at.shift`, a reshape, and
/// a transpose when `at.transposed`.
fn placed(flat: &Array, batch: &[usize], rows: usize, cols: usize, at: Placed) -> Result<Array> {
    let count: usize = batch.iter().product::<usize>() * rows * cols;
    let mut shape: Vec<i64> = batch.iter().map(|&d| d as i64).collect();
    let (r, c) = if at.transposed {
        (cols, rows)
    } else {
        (rows, cols)
    };
    shape.extend([r as i64, c as i64]);
    let x = flat
        .slice_axis(0, at.shift as i64, (at.shift + count) as i64)?
        .reshape(&shape)?;
    if !at.transposed {
        return Ok(x);
    }
    let nd = shape.len() as i32;
    let mut axes: Vec<i32> = (0..nd).collect();
    axes.swap(nd as usize - 2, nd as usize - 1);
    x.transpose(&axes)
}

/// Whether an operand placed as `at` (dense after its shift, `rows x
/// cols` per batch) can be staged `width` elements at a time, worked out
/// from its placement: it is not empty, and its contiguous extent
/// (columns, or rows when stored transposed) and its first element are
/// multiples of `width`.
fn vectorisable(at: Placed, rows: usize, cols: usize, width: usize) -> bool {
    let contiguous = if at.transposed { rows } else { cols };
    rows * cols > 0 && at.shift.is_multiple_of(width) && contiguous.is_multiple_of(width)
}

/// Every transpose case: whether `a`, `b` are stored transposed.
const TRANSPOSES: [(bool, bool); 4] = [(false, false), (false, true), (true, false), (true, true)];

/// `a @ b` against the CPU in the transpose `cases`, with `a` and `b` read
/// from elements `shifts` of their buffers, asserting which operands the
/// kernel staged with vector loads of `width` elements.
fn check_staging(
    what: &str,
    dtype: Dtype,
    (a_batch, b_batch): (&[usize], &[usize]),
    (m, k, n): (usize, usize, usize),
    shifts: [usize; 2],
    width: usize,
    cases: &[(bool, bool)],
) {
    let count = |batch: &[usize], r: usize, c: usize| batch.iter().product::<usize>() * r * c;
    let flat = |len: usize, seed: usize| {
        Array::from_slice(&values(len, seed), &[len])
            .unwrap()
            .astype(dtype)
            .unwrap()
    };
    let fa = flat(shifts[0] + count(a_batch, m, k), 1);
    let fb = flat(shifts[1] + count(b_batch, k, n), 2);
    for &(ta, tb) in cases {
        let at = Placed {
            shift: shifts[0],
            transposed: ta,
        };
        let bt = Placed {
            shift: shifts[1],
            transposed: tb,
        };
        let name = format!(
            "{what} {dtype} [{a_batch:?} {m}x{k}] @ [{b_batch:?} {k}x{n}] shifts {shifts:?} transposed {ta}/{tb}"
        );
        let before = vector_operand_count();
        compare(
            &name,
            &[fa.clone(), fb.clone()],
            |v: &[Array]| -> Result<Array> {
                placed(&v[0], a_batch, m, k, at)?.matmul(&placed(&v[1], b_batch, k, n, bt)?)
            },
            tol(dtype).max(1e-6 * k as f64),
        );
        let want =
            usize::from(vectorisable(at, m, k, width)) + usize::from(vectorisable(bt, k, n, width));
        assert_eq!(
            vector_operand_count() - before,
            want,
            "{name}: operands staged with vector loads"
        );
    }
}

/// Views of every kind through both staging paths: aligned operands (in
/// every transpose case, batched and broadcast, depth below one staged
/// slice, at an aligned offset) take the vector loads, misaligned ones
/// (views from element 1, extents off the vector width) the scalar ones;
/// each product against the CPU.
fn staging_cases(what: &str, dtype: Dtype, width: usize) {
    let w = width;
    let none: &[usize] = &[];
    let check =
        |batches, mkn, shifts| check_staging(what, dtype, batches, mkn, shifts, w, &TRANSPOSES);
    check((none, none), (w, 3 * w, 2 * w), [0, 0]);
    check((none, none), (2 * w, 3 * w, w), [1, w]);
    // Depth below one slice; offsets of a whole vector and of 1.
    check((none, none), (3 * w, w, 2 * w), [w, 0]);
    check((none, none), (3 * w, w, 2 * w), [0, 1]);
    // No depth: zeros, and no vector bindings of empty buffers.
    check((none, none), (w, 0, w), [0, 0]);
    // Shapes off the width and the tiles.
    check((none, none), (1, 1, 1), [0, 0]);
    check((none, none), (5, 3, 7), [0, 0]);
    check((none, none), (67, 130, 5), [0, 0]);
    check((none, none), (w + 1, 2 * w, 3 * w), [0, 0]);
    // Batched and broadcast: `a` shared by three products, `b` by two.
    check((&[1, 2], &[3, 1]), (w, 2 * w, 3 * w), [0, 0]);
    check((&[1, 2], &[3, 1]), (w, 2 * w, 3 * w), [1, w]);
}

#[test]
fn f32_kernel_stages_aligned_operands_with_vector_loads() {
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        staging_cases("f32 kernel", dtype, 4);
    }
    let f16 = if mlx_array::backend::gpu::native_f16() {
        "native"
    } else {
        "packed"
    };
    eprintln!("f16 staged from {f16} storage");
    // The 128 x 128 tiles (264 of them), both operands vectors: one
    // transpose case (lavapipe takes a second for it), each operand along
    // the depth (the other way is the 64 x 64 tiles' text with other
    // extents).
    check_staging(
        "f32 kernel, 128 tiles",
        Dtype::F32,
        (&[264], &[264]),
        (4, 8, 12),
        [0, 0],
        4,
        &[(false, true)],
    );
    // Split over the depth (one tile, 4 slices of 256): `a` by vectors,
    // `b` (from element 1) by elements.
    check_staging(
        "f32 kernel, split-K",
        Dtype::F32,
        (&[], &[]),
        (8, 1024, 12),
        [0, 1],
        4,
        &TRANSPOSES,
    );
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// The f32 kernel's vector loads of f16 stored packed two to a word (as
/// on adapters without `shader-f16`), whatever this adapter has: the test
/// above again in a child process with `MLX_GPU_TUNING=f16=off`.
#[test]
fn f32_kernel_stages_packed_f16_with_vector_loads() {
    let Some(_gpu) = gpu() else { return };
    let stderr = mlx_array::conformance::rerun_with_env(
        "matmul::f32_kernel_stages_aligned_operands_with_vector_loads",
        &[("MLX_GPU_TUNING", "f16=off"), ("MLX_REQUIRE_GPU", "1")],
    );
    assert!(
        stderr.contains("f16 staged from packed storage"),
        "{stderr}"
    );
}

#[test]
fn cooperative_template_stages_aligned_operands_with_vector_loads() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    staging_cases("plain fragments", Dtype::F16, 8);
    // A depth of four vectors but not of eight: `a` and `b` along it by
    // elements, along `m` and `n` by vectors.
    check_staging(
        "plain fragments",
        Dtype::F16,
        (&[], &[]),
        (16, 36, 24),
        [0, 0],
        8,
        &TRANSPOSES,
    );
    // The 128 x 128 tilings (264 tiles), both operands vectors, in one
    // transpose case (lavapipe takes three seconds for each): each operand
    // along the tile's places, with either count of subgroups.
    for subgroups in GPU_COOP_SUBGROUPS {
        tune_gpu(|t| t.coop_subgroups = subgroups);
        check_staging(
            &format!("plain fragments, 128 tiles, {subgroups} subgroups"),
            Dtype::F16,
            (&[264], &[264]),
            (8, 16, 8),
            [0, 0],
            8,
            &[(true, false)],
        );
        assert_eq!(
            mlx_array::backend::gpu::last_coop_subgroups(),
            Some(subgroups)
        );
        // Whole tiles, so that every subgroup's every fragment holds
        // outputs (`b` shared by the 264 products); f16 outputs leave
        // through the staging fragments, as many a round as the adapter's
        // workgroup memory allows: with 48 KiB 4 (4 subgroups) or 2 (8);
        // any adapter that runs the template has room for 2 and 1.
        check(
            &format!("plain fragments, whole 128 tiles, {subgroups} subgroups"),
            Dtype::F16,
            &[264],
            &[1],
            128,
            16,
            128,
        );
        assert_eq!(
            mlx_array::backend::gpu::last_coop_subgroups(),
            Some(subgroups)
        );
        let staged = mlx_array::backend::gpu::last_coop_staged();
        let most = if subgroups == 4 { 4 } else { 2 };
        assert!(
            staged.is_some_and(|s| s >= most / 2 && s <= most),
            "staging fragments a round: {staged:?}"
        );
    }
    tune_gpu(|t| t.coop_subgroups = GPU_COOP_SUBGROUPS[0]);
    // The 64 x 64 tiling with one buffer: its 4 fragments a subgroup leave
    // in one round (26,112 bytes, within what any adapter that runs the
    // template has).
    tune_gpu(|t| t.coop_double_buffer = false);
    check(
        "plain fragments, 64 tiles, one buffer",
        Dtype::F16,
        &[],
        &[],
        70,
        40,
        66,
    );
    assert_eq!(mlx_array::backend::gpu::last_coop_buffers(), Some(1));
    assert_eq!(mlx_array::backend::gpu::last_coop_staged(), Some(4));
    tune_gpu(|t| t.coop_double_buffer = true);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// The tall tensor-core tiling (`MLX_GPU_TUNING=coop_tile=256x128`: 8 subgroups
/// of 64 x 64) where the adapter's workgroup memory holds it (37,376 bytes
/// at least: on an H100, not on lavapipe's 32 KiB, where the default
/// 128 x 128 tiling of 4 subgroups runs instead): whole and ragged tiles,
/// f16 and accumulated f32 outputs, against the CPU either way.
#[test]
fn cooperative_template_runs_the_tall_tiling_where_it_fits() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    use mlx_array::settings::GpuCoopTile;
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    tune_gpu(|t| t.coop_tile = GpuCoopTile::Tall);
    let limit = mlx_array::backend::gpu::workgroup_memory_limit().unwrap();
    let subgroups = if limit >= 37_376 { 8 } else { 4 };
    // 264 products of 256 x 128 tiles wholly inside, then ragged ones.
    check("tall tiles", Dtype::F16, &[264], &[1], 256, 48, 128);
    assert_eq!(
        mlx_array::backend::gpu::last_coop_subgroups(),
        Some(subgroups),
        "{limit} bytes of workgroup memory"
    );
    check("tall tiles, ragged", Dtype::F16, &[66], &[], 300, 40, 130);
    assert_eq!(
        mlx_array::backend::gpu::last_coop_subgroups(),
        Some(subgroups)
    );
    tune_gpu(|t| t.coop_tile = GpuCoopTile::Square);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// The tensor-core template's double-buffered main loop (slice `s` staged
/// in buffer `s % 2`, one barrier a slice) on the 64 x 64 tiling, which
/// has room for two buffers on any adapter that runs the template (27,648
/// bytes with 2 staging fragments): depths of one, two, three and four
/// 32-deep slices and partial last slices, so that both buffers hold the
/// last slice in turn, in every transpose case; the same products with one
/// buffer agree with the CPU too.
#[test]
fn cooperative_template_double_buffers_its_slices() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    for double in [true, false] {
        tune_gpu(|t| t.coop_double_buffer = double);
        for k in [16, 32, 33, 64, 96, 100, 128] {
            check(
                &format!("plain fragments, double buffer {double}"),
                Dtype::F16,
                &[],
                &[],
                37,
                k,
                70,
            );
            assert_eq!(
                mlx_array::backend::gpu::last_coop_buffers(),
                Some(if double { 2 } else { 1 })
            );
        }
    }
    tune_gpu(|t| t.coop_double_buffer = true);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// Every matmul kernel variant (the cooperative-matrix ones included,
/// which no CI adapter runs) parses, validates with every capability and
/// compiles to SPIR-V through naga, the version wgpu uses: a shader that
/// cannot build fails here on any machine, GPU or not.
#[test]
fn every_matmul_kernel_compiles_to_spirv() {
    let sources = mlx_array::backend::gpu::matmul_kernel_sources();
    assert!(sources.len() >= 32 + 64, "{} variants", sources.len());
    for family in ["coop", "f32 kernel"] {
        for loads in ["a: true, b: true", "a: true, b: false", "a: false, b: true"] {
            assert!(
                sources
                    .iter()
                    .any(|(what, _)| what.starts_with(family) && what.contains(loads)),
                "no {family} variant with vector loads {loads}"
            );
        }
    }
    for (what, src) in &sources {
        let bytes: usize = what
            .rsplit('(')
            .next()
            .and_then(|s| s.trim_end_matches(" B)").parse().ok())
            .unwrap_or_else(|| panic!("{what}: no size"));
        assert!(
            bytes <= 48 * 1024,
            "{what}: over 48 KiB of workgroup memory"
        );
        spirv(what, src);
    }
}

/// The fused linear cross-entropy of `h`, `w`, targets `t` and row
/// weights `rw`, its value and both gradients, in both GPU paths (the
/// one-pass `linear_cross_entropy_sum`, and `linear_cross_entropy`
/// differentiated), against the CPU.
fn check_linear_cross_entropy(
    what: &str,
    [h, w, t, rw]: [&Array; 4],
    opts: &mlx_array::primitives::loss::LinearCrossEntropyOptions,
) {
    for one_pass in [false, true] {
        for (part, out) in [("loss", None), ("dh", Some(0)), ("dw", Some(1))] {
            compare(
                &format!("{what} {part}, one pass {one_pass}"),
                &[h.clone(), w.clone()],
                |v: &[Array]| -> Result<Array> {
                    let loss = |x: &[Array]| {
                        if one_pass {
                            mlx_array::linear_cross_entropy_sum(&x[0], &x[1], t, rw, opts)
                        } else {
                            mlx_array::linear_cross_entropy(&x[0], &x[1], t, opts)?
                                .multiply(rw)?
                                .sum_all()
                        }
                    };
                    let (value, grads) = mlx_array::value_and_grad(loss, &[0, 1])(v)?;
                    Ok(out.map_or(value, |i| grads[i].clone()))
                },
                1e-4,
            );
        }
    }
}

/// The fused linear cross-entropy's gradient products, split over the
/// depth where the classes are many and the rows few, in both of its GPU
/// paths: differentiating `linear_cross_entropy` (chunks of 700, 700 and
/// 100 classes: `dh += g @ w[chunk]` split, the second chunk adding its
/// split sum into `dh`) and `linear_cross_entropy_sum` (the one-pass value
/// and gradient, in blocks of 14, 14 and 12 rows: each block's `dh` split
/// over all 1500 classes into its own rows, `dw` added up over blocks),
/// with label smoothing, against the CPU.
#[test]
fn linear_cross_entropy_gradient_with_split_products_agrees_with_the_cpu() {
    use mlx_array::primitives::loss::LinearCrossEntropyOptions;
    let Some(_gpu) = gpu() else { return };
    let (rows, dims, vocab) = (40, 24, 1500);
    let h = operand(&[], rows, dims, false, 5, Dtype::F32);
    let w = operand(&[], vocab, dims, false, 6, Dtype::F32);
    let t = Array::from_slice(
        &(0..rows as i32)
            .map(|i| (i * 379) % vocab as i32)
            .collect::<Vec<i32>>(),
        &[rows],
    )
    .unwrap();
    let rw = Array::from_slice(
        &(0..rows)
            .map(|i| 0.25 + (i % 3) as f32)
            .collect::<Vec<f32>>(),
        &[rows],
    )
    .unwrap();
    let opts = LinearCrossEntropyOptions {
        label_smoothing: 0.1,
        chunk: 700,
        block_rows: 16,
        ..Default::default()
    };
    check_linear_cross_entropy("linear cross-entropy", [&h, &w, &t, &rw], &opts);
}

/// The loss's statistics kernel walks each row's classes in unrolled
/// rounds of 4,096 (256 invocations, 16 loads each): the one-pass value
/// and gradients over 9,000 classes (three rounds, the last partial) and
/// the separate passes' (chunks of 4,500 classes: two rounds each) agree
/// with the CPU.
#[test]
fn linear_cross_entropy_over_classes_of_several_rounds_agrees_with_the_cpu() {
    use mlx_array::primitives::loss::LinearCrossEntropyOptions;
    let Some(_gpu) = gpu() else { return };
    let (rows, dims, vocab) = (12, 16, 9000);
    let h = operand(&[], rows, dims, false, 7, Dtype::F32);
    let w = operand(&[], vocab, dims, false, 8, Dtype::F32);
    let t = Array::from_slice(
        &(0..rows as i32)
            .map(|i| (i * 2731) % vocab as i32)
            .collect::<Vec<i32>>(),
        &[rows],
    )
    .unwrap();
    let ones = Array::from_slice(&vec![1.0f32; rows], &[rows]).unwrap();
    let opts = LinearCrossEntropyOptions {
        chunk: 4500,
        ..Default::default()
    };
    check_linear_cross_entropy(
        &format!("linear cross-entropy over {vocab} classes"),
        [&h, &w, &t, &ones],
        &opts,
    );
}

/// Kernels compile with wgpu's runtime checks by default, the plain
/// fragments of the tensor-core template included, and without them under
/// `MLX_GPU_TUNING=checked=off` (here its setter), as variants of their own;
/// products agree with the CPU either way.
#[test]
fn checked_and_unchecked_kernels_agree_with_the_cpu() {
    use mlx_array::backend::gpu::{pipeline_count, unchecked_pipeline_count};
    use mlx_array::settings::GpuChecks;
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    let unchecked = unchecked_pipeline_count();
    check("checked", Dtype::F32, &[], &[], 17, 33, 9);
    let compiled = pipeline_count().unwrap();
    check("checked, again", Dtype::F32, &[], &[], 17, 33, 9);
    assert_eq!(
        pipeline_count().unwrap(),
        compiled,
        "the same kernels again"
    );
    // The tensor-core template on plain fragments: checked under `auto`.
    if native_f16_or_skip() {
        tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
        let before = mlx_array::backend::gpu::coop_product_count();
        check("plain fragments", Dtype::F16, &[], &[], 17, 40, 9);
        assert!(
            mlx_array::backend::gpu::coop_product_count() > before,
            "on the tensor-core template"
        );
    }
    assert_eq!(
        unchecked_pipeline_count(),
        unchecked,
        "plain fragment kernels keep the checks"
    );
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    tune_gpu(|t| t.checked = GpuChecks::None);
    let compiled = pipeline_count().unwrap();
    check("unchecked", Dtype::F32, &[], &[], 17, 33, 9);
    assert!(
        pipeline_count().unwrap() > compiled,
        "unchecked kernels compiled as their own variants"
    );
    assert!(
        unchecked_pipeline_count() > unchecked,
        "counted as unchecked"
    );
    tune_gpu(|t| t.checked = GpuChecks::Auto);
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}
