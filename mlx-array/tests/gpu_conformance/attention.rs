//! The f16 flash attention on 16 x 16 fragments, forward and gradient:
//! with plain-WGSL fragments (`MLX_GPU_TUNING=coopmat=plain`, any adapter) they
//! run, not the f32 kernels, and agree with the CPU on shapes that are not
//! multiples of their tiles, causal and not, at head widths 64, 32 and ones
//! padded to 16; their cooperative-matrix variants, which no CI adapter
//! runs, compile to SPIR-V.

use mlx_array::backend::gpu::{attention_fragment_runs, attention_kernel_sources};
use mlx_array::device::with_device;
use mlx_array::settings::{GpuCoopmat, tune_gpu};
use mlx_array::{Array, Device, Dtype, Result};

use crate::harness::{bits, compare, gpu, native_f16_or_skip, spirv, tol};

/// An f16 `[b, h, l, d]` input of values in [-1, 1), varied by `seed`.
fn input(shape: [usize; 4], seed: usize) -> Array {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i * 7919 + seed * 104729) % 211) as f32 / 105.5 - 1.0)
        .collect();
    Array::from_slice(&v, &shape)
        .unwrap()
        .astype(Dtype::F16)
        .unwrap()
}

/// The gradients of `attend` at `x[..3]` for the cotangent `x[3]`: dq,
/// dk and dv flattened into one array.
fn gradients(
    attend: impl Fn(&[Array]) -> Result<Array> + Copy,
) -> impl Fn(&[Array]) -> Result<Array> {
    move |x: &[Array]| {
        let (_, g) = mlx_array::vjp(|y: &[Array]| Ok(vec![attend(y)?]), &x[..3], &[x[3].clone()])?;
        let flat: Vec<Array> = g.iter().map(|g| g.reshape(&[-1])).collect::<Result<_>>()?;
        mlx_array::concatenate(&flat, 0)
    }
}

/// `fused_attention` of f16 inputs `[b, h, lq, d]`, `[b, h, lk, d]`,
/// `[b, h, lk, dv]` and its gradients (for a fixed f16 cotangent) on the
/// GPU against the CPU; whether the fragment kernels ran (forward,
/// gradient).
fn check(dims: [usize; 6], causal: bool) -> (bool, bool) {
    let [b, h, lq, lk, d, dv] = dims;
    let inputs = [
        input([b, h, lq, d], 1),
        input([b, h, lk, d], 2),
        input([b, h, lk, dv], 3),
        input([b, h, lq, dv], 4),
    ];
    let attend = move |x: &[Array]| mlx_array::fused_attention(&x[0], &x[1], &x[2], 0.3, causal);
    let (forwards, grads) = attention_fragment_runs();
    let what = format!("f16 attention {dims:?} causal {causal}");
    // P and dS are rounded to f16 before their products.
    let rel = 2.0 * tol(Dtype::F16);
    compare(&what, &inputs, attend, rel);
    compare(
        &format!("{what}: dq, dk, dv"),
        &inputs,
        gradients(attend),
        2.0 * rel,
    );
    let (f, g) = attention_fragment_runs();
    (f > forwards, g > grads)
}

#[test]
fn f16_attention_on_plain_fragments_agrees_with_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    // Several query and key blocks with ragged ends, more keys than
    // queries (a cache) under the mask, more queries than keys without,
    // widths padded to 16 (40 x 24, 8), one row.
    let shapes = [
        ([1, 2, 70, 70, 64, 64], true),
        ([2, 1, 33, 50, 64, 64], false),
        ([1, 1, 100, 131, 32, 32], true),
        ([1, 2, 90, 37, 32, 32], false),
        ([1, 2, 17, 40, 40, 24], true),
        ([1, 1, 1, 3, 8, 8], false),
    ];
    for (dims, causal) in shapes {
        assert_eq!(
            check(dims, causal),
            (true, true),
            "{dims:?}: the fragment kernels did not both run"
        );
    }
    // The f32 kernel where the adapter has no cooperative matrices
    // (lavapipe) and the setting is the default.
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
    if !mlx_array::backend::gpu::adapter_name()
        .unwrap()
        .contains("llvmpipe")
    {
        return;
    }
    assert_eq!(
        check([1, 1, 20, 20, 32, 32], true),
        (false, false),
        "the fragment kernels ran without cooperative matrices"
    );
}

/// Every variant of the fragment kernels (forward and both gradient
/// passes), cooperative matrices included, builds to SPIR-V.
#[test]
fn every_fragment_attention_kernel_compiles_to_spirv() {
    let sources = attention_kernel_sources();
    assert!(
        sources
            .iter()
            .filter(|(w, _)| w.contains("Cooperative"))
            .count()
            >= 4,
        "{} variants",
        sources.len()
    );
    for (what, src) in &sources {
        assert!(src.contains("coopMultiplyAdd") == what.contains("Cooperative"));
        spirv(what, src);
    }
}

/// The tuning's `attention_tiles` makes the f32-compute
/// forward and both gradient passes take each of the tiles it allows, and
/// every one of them agrees with the CPU on lengths that are not
/// multiples of any tile, causal and not.
#[test]
fn f32_attention_takes_the_tiles_it_is_told_and_agrees_with_the_cpu() {
    use mlx_array::backend::gpu::attention_last_scalar_tiles;
    use mlx_array::settings::GPU_ATTENTION_TILES;
    let Some(_gpu) = gpu() else { return };
    let f32_input = |shape: [usize; 4], seed| input(shape, seed).astype(Dtype::F32).unwrap();
    let (b, h, lq, lk, d, dv) = (1, 2, 45, 70, 8, 8);
    let inputs = [
        f32_input([b, h, lq, d], 1),
        f32_input([b, h, lk, d], 2),
        f32_input([b, h, lk, dv], 3),
        f32_input([b, h, lq, dv], 4),
    ];
    for tiles in GPU_ATTENTION_TILES {
        tune_gpu(|t| t.attention_tiles = Some(tiles));
        for causal in [false, true] {
            let attend =
                move |x: &[Array]| mlx_array::fused_attention(&x[0], &x[1], &x[2], 0.3, causal);
            let what = format!("f32 attention, tiles {tiles:?}, causal {causal}");
            compare(&what, &inputs, attend, tol(Dtype::F32));
            assert_eq!(attention_last_scalar_tiles(), Some(tiles), "{what}");
            compare(
                &format!("{what}: dq, dk, dv"),
                &inputs,
                gradients(attend),
                2.0 * tol(Dtype::F32),
            );
            assert_eq!(
                attention_last_scalar_tiles(),
                Some(tiles),
                "{what}: gradient"
            );
        }
    }
    tune_gpu(|t| t.attention_tiles = None);
}

/// The f16 fragment kernels stage their inputs by quads (`vec4` loads,
/// unrolled) where the head widths are multiples of 4, and element by
/// element where they are not; both agree with the CPU, the quads across
/// ragged blocks and widths padded to 16.
#[test]
fn f16_attention_stages_by_quads_where_widths_allow_and_agrees_either_way() {
    use mlx_array::backend::gpu::attention_quad_staged_runs;
    let Some(_gpu) = gpu() else { return };
    if !native_f16_or_skip() {
        return;
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    for (dims, causal, quads) in [
        ([1, 2, 37, 53, 40, 24], true, true),
        ([2, 1, 19, 33, 12, 20], false, true),
        ([1, 2, 37, 53, 6, 10], true, false),
        ([1, 1, 20, 20, 16, 13], false, false),
    ] {
        let before = attention_quad_staged_runs();
        assert_eq!(check(dims, causal), (true, true), "{dims:?}");
        // The forward (for the output, and again under the gradient) and
        // both gradient passes.
        let runs = attention_quad_staged_runs() - before;
        assert_eq!(
            runs,
            if quads { 4 } else { 0 },
            "{dims:?}: quad-staged kernels"
        );
    }
    // Queries that start one element into their buffer (a view the
    // kernels read in place): element by element, even at width 16.
    let (lq, lk, d) = (21, 30, 16);
    let inputs = [
        input([1, 1, 1, lq * d + 1], 1),
        input([1, 1, lk, d], 2),
        input([1, 1, lk, d], 3),
    ];
    let before = attention_quad_staged_runs();
    compare(
        "f16 attention, queries at an odd offset",
        &inputs,
        |x: &[Array]| {
            let q = x[0]
                .reshape(&[-1])?
                .slice(&[mlx_array::SliceArg::range(1, (lq * d + 1) as i64)])?
                .reshape(&[1, 1, lq as i64, d as i64])?;
            mlx_array::fused_attention(&q, &x[1], &x[2], 0.3, true)
        },
        2.0 * tol(Dtype::F16),
    );
    assert_eq!(
        attention_quad_staged_runs(),
        before,
        "odd offset: quads ran"
    );
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// The f32-compute kernels (f32 and bf16 inputs here) stage their inputs
/// by quads where the head widths are multiples of 4, element by element
/// otherwise; both agree with the CPU, forward and gradients, causal and
/// not.
#[test]
fn f32_attention_stages_by_quads_where_widths_allow_and_agrees_either_way() {
    use mlx_array::backend::gpu::attention_scalar_quad_staged_runs;
    let Some(_gpu) = gpu() else { return };
    tune_gpu(|t| t.coopmat = GpuCoopmat::Off);
    for (dtype, [b, h, lq, lk, d, dv], causal, quads) in [
        (Dtype::F32, [1, 2, 37, 53, 40, 24], true, true),
        (Dtype::BF16, [2, 1, 19, 33, 12, 20], false, true),
        (Dtype::F32, [1, 2, 37, 53, 6, 10], true, false),
        (Dtype::F32, [1, 2, 37, 53, 42, 24], false, false),
    ] {
        let cast = |x: Array| x.astype(dtype).unwrap();
        let inputs = [
            cast(input([b, h, lq, d], 1)),
            cast(input([b, h, lk, d], 2)),
            cast(input([b, h, lk, dv], 3)),
            input([b, h, lq, dv], 4).astype(Dtype::F32).unwrap(),
        ];
        let attend =
            move |x: &[Array]| mlx_array::fused_attention(&x[0], &x[1], &x[2], 0.3, causal);
        let what = format!(
            "{dtype} attention {:?} causal {causal}",
            [b, h, lq, lk, d, dv]
        );
        let before = attention_scalar_quad_staged_runs();
        compare(&what, &inputs, attend, tol(dtype));
        compare(
            &format!("{what}: dq, dk, dv"),
            &inputs,
            gradients(attend),
            2.0 * tol(dtype),
        );
        // The forward twice (alone, and under the gradient), both passes.
        let runs = attention_scalar_quad_staged_runs() - before;
        assert_eq!(
            runs,
            if quads { 4 } else { 0 },
            "{what}: quad-staged kernels"
        );
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// The f32-compute kernels hold their tiles as quads, and each invocation
/// owns output quads `tx + 16 j`: head widths of the model (64), of more
/// quads than one row of invocations (72, 68: some invocations own two,
/// others read past the row) and ending inside a quad (70, 66: staged
/// element by element, the quad's rest zeros) agree with the CPU, forward
/// and gradients, on the tiled kernels (not the per-row fallback).
#[test]
fn f32_attention_over_widths_of_several_quads_and_partial_quads_agrees() {
    use mlx_array::backend::gpu::attention_last_scalar_tiles;
    let Some(_gpu) = gpu() else { return };
    for ([b, h, lq, lk, d, dv], causal) in [
        ([1, 2, 33, 33, 64, 64], true),
        ([1, 2, 37, 53, 72, 68], true),
        ([1, 1, 20, 33, 70, 66], false),
    ] {
        let f32_input = |shape: [usize; 4], seed| input(shape, seed).astype(Dtype::F32).unwrap();
        let inputs = [
            f32_input([b, h, lq, d], 1),
            f32_input([b, h, lk, d], 2),
            f32_input([b, h, lk, dv], 3),
            f32_input([b, h, lq, dv], 4),
        ];
        let attend =
            move |x: &[Array]| mlx_array::fused_attention(&x[0], &x[1], &x[2], 0.3, causal);
        let what = format!("f32 attention {:?} causal {causal}", [b, h, lq, lk, d, dv]);
        compare(&what, &inputs, attend, tol(Dtype::F32));
        compare(
            &format!("{what}: dq, dk, dv"),
            &inputs,
            gradients(attend),
            2.0 * tol(Dtype::F32),
        );
        assert!(
            attention_last_scalar_tiles().is_some(),
            "{what}: ran the per-row fallback"
        );
    }
}

/// Heads viewed out of `[B, L, H, d]` projections (strided `[B, H, L, d]`
/// views) are read in place through their strides: evaluating the forward
/// pass and its gradient takes exactly the kernels it takes from dense
/// inputs (no copy of `q`, `k`, `v` or the cotangent), with the same values
/// bit for bit, staged by quads (`d = 8`: every stride a multiple of 4) or
/// element by element (`d = 6`). Views whose head width is not their
/// unit-stride axis are copied dense by the kernels, with the same values.
#[test]
fn strided_heads_are_read_in_place_by_the_forward_and_the_gradient() {
    let Some(_gpu) = gpu() else { return };
    for d in [8, 6] {
        let (b, l, h) = (2, 9, 3);
        let host = |seed: usize, shape: [usize; 4]| {
            let n = b * l * h * d;
            let v: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 + seed * 104729) % 211) as f32 / 105.5 - 1.0)
                .collect();
            Array::from_slice(&v, &shape).unwrap()
        };
        let on_gpu = |a: Array| {
            let g = a.to_device(Device::Gpu);
            g.eval().unwrap();
            g
        };
        // Heads of `[B, H, L, d]` as projections give them (`[B, L, H, d]`
        // swapped), and with the head width strided (`[B, H, d, L]` swapped).
        let projections: Vec<Array> = (1..=4).map(|s| on_gpu(host(s, [b, l, h, d]))).collect();
        let columns: Vec<Array> = (1..=4).map(|s| on_gpu(host(s, [b, h, d, l]))).collect();
        let run = |source: &[Array], axes: (i32, i32), dense: bool| {
            with_device(Device::Gpu, || {
                let heads: Vec<Array> = source
                    .iter()
                    .map(|p| {
                        let t = p.swapaxes(axes.0, axes.1).unwrap();
                        if !dense {
                            return t;
                        }
                        let dense = t.contiguous().unwrap();
                        dense.eval().unwrap();
                        dense
                    })
                    .collect();
                let attend = |x: &[Array]| {
                    Ok(vec![mlx_array::fused_attention(
                        &x[0], &x[1], &x[2], 0.35, true,
                    )?])
                };
                let (out, grads) =
                    mlx_array::vjp(attend, &heads[..3], &[heads[3].clone()]).unwrap();
                let before = mlx_array::backend::gpu::dispatch_count();
                mlx_array::eval((&out, &grads)).unwrap();
                let kernels = mlx_array::backend::gpu::dispatch_count() - before;
                let values: Vec<Vec<u32>> = out.iter().chain(&grads).map(bits).collect();
                (kernels, values)
            })
        };
        let (dense_kernels, dense_values) = run(&projections, (1, 2), true);
        let (view_kernels, view_values) = run(&projections, (1, 2), false);
        assert_eq!(
            view_values, dense_values,
            "d {d}: the same values from views"
        );
        assert_eq!(
            view_kernels, dense_kernels,
            "d {d}: views are read in place, not copied"
        );
        let (_, dense_values) = run(&columns, (2, 3), true);
        let (_, view_values) = run(&columns, (2, 3), false);
        assert_eq!(
            view_values, dense_values,
            "d {d}: the same values from views with a strided head width"
        );
    }
}

/// q, k, v and a cotangent of `shape` in `dtype`, evaluated on the GPU.
fn gpu_inputs(shape: [usize; 4], dtype: Dtype) -> Vec<Array> {
    (1..=4)
        .map(|s| {
            let x = with_device(Device::Gpu, || input(shape, s).astype(dtype)).unwrap();
            x.eval().unwrap();
            x
        })
        .collect()
}

/// Causal attention's output and the gradients of `inputs[..3]` for the
/// cotangent `ct`, evaluated on the GPU.
fn causal_vjp(inputs: &[Array], ct: &Array) -> (Vec<Array>, Vec<Array>) {
    let attend = |x: &[Array]| {
        Ok(vec![mlx_array::fused_attention(
            &x[0], &x[1], &x[2], 0.3, true,
        )?])
    };
    let (out, grads) = with_device(Device::Gpu, || {
        mlx_array::vjp(attend, &inputs[..3], std::slice::from_ref(ct))
    })
    .unwrap();
    mlx_array::eval((&out, &grads)).unwrap();
    (out, grads)
}

/// Asserts that `grads`, for the half-precision cotangent `inputs[3]`,
/// have the bits of the gradients for that cotangent widened to f32.
fn assert_cotangent_read_as_stored(inputs: &[Array], grads: &[Array], what: &str) {
    let widened = with_device(Device::Gpu, || inputs[3].astype(Dtype::F32)).unwrap();
    widened.eval().unwrap();
    let (_, want) = causal_vjp(inputs, &widened);
    for (g, w) in grads.iter().zip(&want) {
        assert_eq!(bits(g), bits(w), "{what}: the cotangent read as stored");
    }
}

/// The gradient kernels store `dq`, `dk`, `dv` in the inputs' dtype (f16
/// on the fragment kernels, bf16 packed two to a word on the f32-compute
/// ones) and read a cotangent of that dtype as it is: a half-precision vjp
/// runs the forward kernel (which writes the half output itself) and the
/// gradient's three kernels, no cast of its output, cotangent or
/// gradients, and its gradients have
/// the bits of the same cotangent widened to f32 first (the values are the
/// specs' to check).
#[test]
fn half_precision_gradients_leave_the_kernels_in_their_dtype() {
    let Some(_gpu) = gpu() else { return };
    let native = native_f16_or_skip();
    tune_gpu(|t| t.coopmat = GpuCoopmat::Plain);
    for dtype in [Dtype::F16, Dtype::BF16] {
        if dtype == Dtype::F16 && !native {
            continue;
        }
        let inputs = gpu_inputs([1, 2, 40, 32], dtype);
        let (before_runs, before) = (
            attention_fragment_runs(),
            mlx_array::backend::gpu::dispatch_count(),
        );
        let (_, grads) = causal_vjp(&inputs, &inputs[3]);
        let kernels = mlx_array::backend::gpu::dispatch_count() - before;
        assert_eq!(
            kernels, 4,
            "{dtype}: kernels of the forward pass and the gradient"
        );
        for g in &grads {
            assert_eq!(g.dtype(), dtype);
        }
        assert_eq!(
            attention_fragment_runs().1 > before_runs.1,
            dtype == Dtype::F16,
            "{dtype}: fragment gradient"
        );
        assert_cotangent_read_as_stored(&inputs, &grads, &dtype.to_string());
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// Heads too wide for the adapter's workgroup memory (`d = 128` on
/// lavapipe's 32 KiB) take the per-row kernels, which read a half-precision
/// cotangent as stored too: the same bits as the cotangent widened to f32
/// first, for f16 and bf16.
#[test]
fn wide_heads_read_a_half_precision_cotangent_as_stored() {
    let Some(_gpu) = gpu() else { return };
    let native = native_f16_or_skip();
    for dtype in [Dtype::F16, Dtype::BF16] {
        if dtype == Dtype::F16 && !native {
            continue;
        }
        let inputs = gpu_inputs([1, 1, 20, 128], dtype);
        let (_, grads) = causal_vjp(&inputs, &inputs[3]);
        assert_cotangent_read_as_stored(&inputs, &grads, &dtype.to_string());
    }
}

/// Every forward kernel family writes the half-precision output beside the
/// f32 one (the f16 fragments, the f32-compute tiles for f16 and for bf16
/// packed two to a word, the per-row kernel for heads too wide for the
/// tiles): its bits are the f32 output's rounded as `astype` rounds, and a
/// half-precision forward pass is one kernel, no cast after it.
#[test]
fn every_forward_kernel_writes_the_half_output_as_the_cast_would() {
    use mlx_array::backend::gpu::attention_last_scalar_tiles;
    use mlx_array::primitives::attention::Attention;
    let Some(_gpu) = gpu() else { return };
    let native = native_f16_or_skip();
    let node = Attention {
        scale: 0.3,
        causal: true,
    };
    // (coopmat setting, dtype, shape, which kernel: "fragments", "tiles", "rows")
    let cases = [
        (GpuCoopmat::Plain, Dtype::F16, [1, 2, 40, 32], "fragments"),
        (GpuCoopmat::Off, Dtype::F16, [1, 2, 40, 32], "tiles"),
        (GpuCoopmat::Off, Dtype::BF16, [1, 2, 37, 24], "tiles"),
        (GpuCoopmat::Off, Dtype::F16, [1, 1, 9, 256], "rows"),
        (GpuCoopmat::Off, Dtype::BF16, [1, 1, 9, 256], "rows"),
    ];
    for (mode, dtype, shape, kernel) in cases {
        if dtype == Dtype::F16 && !native {
            continue;
        }
        tune_gpu(|t| t.coopmat = mode);
        let what = format!("{dtype} {shape:?} on the {kernel}");
        let x = gpu_inputs(shape, dtype);
        let fragments = attention_fragment_runs().0;
        let before = mlx_array::backend::gpu::dispatch_count();
        let got = with_device(Device::Gpu, || node.build(&x[0], &x[1], &x[2]));
        mlx_array::eval(&got).unwrap();
        assert_eq!(
            mlx_array::backend::gpu::dispatch_count() - before,
            1,
            "{what}: one kernel"
        );
        let ran = if attention_fragment_runs().0 > fragments {
            "fragments"
        } else if attention_last_scalar_tiles().is_some() {
            "tiles"
        } else {
            "rows"
        };
        assert_eq!(ran, kernel, "{what}: the kernel that ran");
        assert_eq!(got.len(), 3, "{what}");
        let cast = with_device(Device::Gpu, || got[0].astype(dtype)).unwrap();
        assert_eq!(bits(&got[2]), bits(&cast), "{what}: the f32 output rounded");
        let out = with_device(Device::Gpu, || {
            mlx_array::fused_attention(&x[0], &x[1], &x[2], 0.3, true)
        })
        .unwrap();
        assert_eq!(bits(&out), bits(&cast), "{what}: fused_attention's output");
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}

/// Grouped-query (4 query heads on 2 key/value heads, causal) and
/// multi-query (2 on 1, plain) attention on each kernel family (the f16
/// fragments, the f32-compute tiles, the per-row kernels for heads too wide
/// for the tiles' workgroup memory) agrees with the CPU, forward and
/// gradient, with `dk` and `dv` of `k`'s and `v`'s shapes; and runs the
/// kernels multi-head attention of as many query heads runs, as many of
/// them: `k` and `v` read in place (no copy per query head), `dk` and `dv`
/// summed over each group inside the kernels (no reduction after them).
#[test]
fn grouped_query_attention_runs_on_every_kernel_family_and_agrees_with_the_cpu() {
    use mlx_array::backend::gpu::{attention_last_scalar_tiles, dispatch_count};
    let Some(_gpu) = gpu() else { return };
    let native = native_f16_or_skip();
    // (coopmat setting, dtype, d, dv, the kernel family expected)
    let families = [
        (GpuCoopmat::Plain, Dtype::F16, 32, 32, "fragments"),
        (GpuCoopmat::Off, Dtype::F32, 8, 12, "tiles"),
        (GpuCoopmat::Off, Dtype::F32, 256, 256, "rows"),
    ];
    for (mode, dtype, d, dv, family) in families {
        if dtype == Dtype::F16 && !native {
            continue;
        }
        tune_gpu(|t| t.coopmat = mode);
        for (h, hkv, causal) in [(4, 2, true), (2, 1, false)] {
            let (lq, lk) = if family == "rows" { (9, 12) } else { (20, 27) };
            let what = format!("{dtype} on the {family}: {h} heads on {hkv}, causal {causal}");
            let typed = |shape: [usize; 4], seed| input(shape, seed).astype(dtype).unwrap();
            let inputs = [
                typed([1, h, lq, d], 1),
                typed([1, hkv, lk, d], 2),
                typed([1, hkv, lk, dv], 3),
                typed([1, h, lq, dv], 4),
            ];
            let attend =
                move |x: &[Array]| mlx_array::fused_attention(&x[0], &x[1], &x[2], 0.3, causal);
            // Which family ran: (fragment forward, fragment gradient), f32 tiles.
            let ran = |before: (usize, usize), grad: bool| {
                let (f, g) = attention_fragment_runs();
                let fragments = if grad { g > before.1 } else { f > before.0 };
                if fragments {
                    "fragments"
                } else if attention_last_scalar_tiles().is_some() {
                    "tiles"
                } else {
                    "rows"
                }
            };
            let rel = if dtype == Dtype::F16 {
                2.0 * tol(dtype)
            } else {
                4.0 * tol(dtype)
            };
            let before = attention_fragment_runs();
            compare(&what, &inputs, attend, rel);
            assert_eq!(ran(before, false), family, "{what}: forward");
            let before = attention_fragment_runs();
            compare(
                &format!("{what}: dq, dk, dv"),
                &inputs,
                gradients(attend),
                2.0 * rel,
            );
            assert_eq!(ran(before, true), family, "{what}: gradient");
            // The kernels of the pass, against multi-head attention of k and
            // v repeated to every query head (copied before counting).
            let on_gpu = |x: &Array| {
                let g = x.to_device(Device::Gpu);
                g.eval().unwrap();
                g
            };
            let repeat = |x: &Array| {
                let s = x.shape().to_vec();
                let r = x
                    .reshape(&[1, hkv as i64, 1, lk as i64, s[3] as i64])
                    .and_then(|y| y.broadcast_to(&[1, hkv, h / hkv, lk, s[3]]))
                    .and_then(|y| y.reshape(&[1, h as i64, lk as i64, s[3] as i64]))
                    .unwrap();
                on_gpu(&r)
            };
            let grouped: Vec<Array> = inputs.iter().map(on_gpu).collect();
            let repeated = vec![
                grouped[0].clone(),
                repeat(&inputs[1]),
                repeat(&inputs[2]),
                grouped[3].clone(),
            ];
            let kernels = |x: &[Array]| {
                with_device(Device::Gpu, || {
                    let f = |y: &[Array]| Ok(vec![attend(y)?]);
                    let (out, grads) = mlx_array::vjp(f, &x[..3], &[x[3].clone()]).unwrap();
                    let before = dispatch_count();
                    mlx_array::eval((&out, &grads)).unwrap();
                    let shapes: Vec<Vec<usize>> =
                        grads.iter().map(|g| g.shape().to_vec()).collect();
                    (dispatch_count() - before, shapes)
                })
            };
            let (n_grouped, shapes) = kernels(&grouped);
            let (n_repeated, _) = kernels(&repeated);
            assert_eq!(n_grouped, n_repeated, "{what}: kernels of the pass");
            let want: Vec<Vec<usize>> = inputs[..3].iter().map(|x| x.shape().to_vec()).collect();
            assert_eq!(shapes, want, "{what}: the gradients' shapes");
        }
    }
    tune_gpu(|t| t.coopmat = GpuCoopmat::Auto);
}
