//! Batched matrix products `out (+)= a @ b`, accumulating in f32, in one of
//! two kernel families chosen per product:
//!
//! - [`tiled`]: register-blocked f32 arithmetic for every float dtype (f16
//!   and bf16 converted to f32 as they load, through `codegen::input`).
//! - [`coop`]: f16 operands on cooperative matrices (tensor cores),
//!   16 x 16 x 16 f16 x f16 -> f32 fragments, for f16 products where the
//!   adapter has them ([`super::device::coopmat_usable`]; the tuning's
//!   [`GpuTuning::coopmat`]). bf16 has no cooperative-matrix
//!   configuration on the H100's Vulkan driver (only f16 operands), so bf16
//!   products stay on the f32-compute kernel; so does everything on a device
//!   without the feature, the configuration, subgroups of 32 or
//!   `shader-f16`, and the accumulating form (f32 output added into).
//!
//! Operands are read through their views (any row, column and batch
//! strides, broadcast batches included), so transposes and broadcasts cost
//! no copy; the staging loads follow whichever of an operand's strides is 1
//! so neighbouring invocations read neighbouring addresses. Both families
//! take 128 x 128 tiles when the product has at least [`BIG_TILES_FROM`]
//! of them (two per SM of an H100), else 64 x 64 tiles, so that smaller
//! products still spread over the 132 SMs. Every edge is bounds-checked
//! (zeros staged beyond `m`, `n`, `k`; stores skipped beyond `m`, `n`).
//!
//! Design figures for an H100 (132 SMs, 64K 32-bit registers and at most
//! 2048 invocations per SM, 48 KiB of workgroup memory through wgpu):
//!
//! | kernel | invocations | tile | per invocation | workgroup memory | registers (est.) | workgroups per SM |
//! |---|---|---|---|---|---|---|
//! | f32, 128 | 256 | 128 x 128, depth slices of 16, double buffered | 8 x 8 outputs | 33,792 B | ~110-128 | 2 (registers) |
//! | f32, 64 | 256 | 64 x 64, slices of 16, double buffered | 4 x 4 outputs | 17,408 B | ~48 | 4-8 |
//! | coop, large (default) | 128 (4 subgroups, 2 x 2) | 128 x 128, slices of 32, double buffered | a subgroup: 4 x 4 fragments (64 x 64) | 46,080 B (2 staging fragments a subgroup) | ~210 | 2 (registers) |
//! | coop, large, `MLX_GPU_TUNING=coop_subgroups=8` | 256 (8 subgroups, 4 x 2) | 128 x 128, slices of 32, double buffered | a subgroup: 2 x 4 fragments (32 x 64) | 46,080 B (1 staging fragment) | ~100-130 | 2 |
//! | coop, `MLX_GPU_TUNING=coop_tile=256x128` | 256 (8 subgroups, 4 x 2) | 256 x 128, slices of 32, one buffer | a subgroup: 4 x 4 fragments (64 x 64) | 45,568 B (2 staging fragments) | ~210 | 1 (registers) |
//! | coop, small | 128 (4 subgroups, 2 x 2) | 64 x 64, slices of 32, double buffered | a subgroup: 2 x 2 fragments (32 x 32) | 35,840 B (4 staging fragments) | ~70 | 4-6 |
//!
//! **Double buffering of the tensor-core kernel** (`coop::Staging`,
//! the tuning's `coop_double_buffer`; designed, not measured). With one buffer
//! per operand, every 32-deep slice costs two barriers: the stores of the
//! next slice wait until every subgroup has finished multiplying the
//! present one, and the products wait for the stores. With two, each
//! slice's registers go to the other buffer right after the products, and
//! one barrier per slice remains: at 8192^3, 256 barriers a tile instead
//! of 512, and no warp of a workgroup idles between its products and its
//! stores while the slowest finishes. The price is workgroup memory: the
//! 128 x 128 tilings keep room for only 2 (4 subgroups) or 1 (8) staging
//! fragments a round in 48 KiB, so their epilogue takes 16 barriers
//! instead of 8; a 256-deep product (the reference model's) then costs 24
//! barriers either way, and every deeper one fewer with two buffers. An
//! SM's 228 KiB hold 4 such workgroups; registers allow 2. On lavapipe
//! (32 KiB) only the 64 x 64 tiling fits two buffers (27,648 B, 2 staging
//! fragments), so CI runs both main loops.
//!
//! Measured on an H200 (2026-11-27, `bench/gpu_ab.sh`, wall clock over 10
//! products): the f32 128-tile kernel 28.4 and 29.1 TFLOP/s at 4096^3 and
//! 8192^3 (57% of the H100's cuBLAS with TF32 off, 51.5; the design figure
//! was 30-40), the same with and without wgpu's runtime checks. The
//! tensor-core kernel 89 and 101 TFLOP/s with the checks, 126 and 144
//! without them: it is compiled without them by default
//! (`settings::GpuChecks`). It issues 16 fragment multiply-adds per
//! subgroup per 32-deep slice against 12 fragment loads from workgroup
//! memory at the 8-subgroup tiling; what it still lacks against cuBLAS
//! (695): asynchronous global-to-workgroup copies (WGSL has none), so the
//! loads are staged through registers, and two barriers per slice. What
//! the f32 kernel loses to cuBLAS: 32-bit index arithmetic per staged
//! vector (per element on operands not aligned for vector loads, see
//! `loads`) and the same register staging.
//!
//! **Subgroup tiles of the tensor-core kernel.** The 8-subgroup tiling
//! (measured on the H100, 2026-11-26: 82-90 TFLOP/s, 12-13% of cuBLAS)
//! has each subgroup load 12 fragments from workgroup memory per 16
//! fragment products (per 32-deep slice: 2 of `a` and 4 of `b` at each of
//! two 16-deep steps). The default now gives each of 4 subgroups a 64 x 64
//! block, the warp tile of llama.cpp's large cooperative-matrix tile: 16
//! loads per 32 products, so a third fewer fragment loads per product
//! (per SM and slice, with 2 workgroups resident: 128 loads of 512 B, 64
//! KiB, against 96 KiB), and half the loop and address instructions per
//! product in each warp. The cost: 16 accumulator fragments (128 f32
//! registers per invocation, about 210 in all, under the 255 limit: no
//! spills expected), each invocation staging twice the halves per slice,
//! and 8 warps per SM instead of 16 to hide latency, each with twice the
//! independent products per slice. Measured on an H200 (checked kernels):
//! 101 TFLOP/s at 8192^3 against the 8-subgroup tiling's 66.
//! `MLX_GPU_TUNING=coop_subgroups=8` keeps the older tiling, to compare both.
//!
//! **Split-K.** A product with fewer 128 x 128 tiles than two per SM and
//! a long depth (the fused loss's gradient products, `dX` over the
//! vocabulary, a small `dW`) would leave most of the 132 SMs idle or
//! holding one workgroup of 8 warps, with nothing to hide its load latency
//! behind. [`split_k`] cuts its depth into slices (8 for the one-pass
//! loss's `dh` per block of rows, as many as one wave holds): either kernel runs with the slices as
//! one more, outer batch dimension (each workgroup's depth clamped to its
//! slice, see
//! [`PROLOGUE`]), writing f32 partial products to a scratch buffer, and one
//! elementwise pass sums the slices in order (deterministic, no atomics)
//! into the output (converting to its dtype, or adding into it with
//! `accumulate`). The cooperative kernel splits the same way (slices a
//! multiple of its 32-deep staged slice), so f16 weight gradients, whose
//! outputs are small, no longer run on one workgroup per SM (on the H100,
//! f16 `dX` 2044 x 50257 x 256 ran at 5.9 TFLOP/s and `dW` 256 x 2044 x
//! 512 at 1.3 unsplit, a fifth and a third of their f32 rates). The tuning's
//! `split_wave=1` ([`GpuTuning::split_wave`]) turns it off, to measure the gain.
//!
//! | split-K, `[m, k] @ [k, n]` | tiles (side) | slices x depth | workgroups | partial sums |
//! |---|---|---|---|---|
//! | loss, one pass: `dh[block] = g @ w`, 1022 x 50257 x 256 | 16 (128) | 15 x 3360 | 240 | 15.7 MB |
//! | loss `dh += g @ w[chunk]`, 2044 x 2052 x 256 | 128 (64) | 4 x 528 | 512 | 8.4 MB |
//! | loss `dw[chunk] = g^T @ h`, 2052 x 2044 x 256 | 132 (64) | 4 x 512 | 528 | 8.4 MB |
//! | `dX` 2044 x 50257 x 256 (gpu_bench) | 32 (128) | 8 x 6288 | 256 | 16.7 MB |
//! | `dW` 256 x 2044 x 512 (gpu_bench) | 32 (64) | 7 x 304 | 224 | 3.7 MB |
//! | large model `dW`, 768 x 8192 x 2048 | 96 (128) | 5 x 1648 | 480 | 31.5 MB |
//! | large model `dW`, 768 x 8192 x 768 | 36 (128) | 7 x 1184 | 252 | 16.5 MB |
//!
//! Products deep enough for slices of 1,024 that fill 90% of their waves
//! of 128 x 128 workgroups split on those ([`split_big`]); the others on
//! 64 x 64 tiles ([`split_k`]).
//!
//! With 4 workgroups per SM (32 warps) instead of one (8), the loss's
//! gradient products should run near the 64-tile kernel's rate on large
//! products (~20 TFLOP/s) rather than at the 3.4-13.6 TFLOP/s measured
//! for `dX`; the partial sums cost one write and one read of `slices x m x
//! n` floats (8.4 MB: ~6 us at 3 TB/s against ~100 us of products).
//!
//! The fused linear cross-entropy (`loss/linear.rs`) records its logits
//! and gradient products through [`record`] (chunked over the vocabulary,
//! or in blocks of rows over all of it), so it runs on these kernels too (its f32 `accumulate` form on the f32
//! kernel, split over the depth as above).
//!
//! **Mixed precision.** With f16 operands it records through
//! [`record_f16_f32`] instead: f16 operands on the cooperative kernel
//! (any transpose case, through the views), an f32 result written or
//! added into (`accumulate`), and split-K as above with the cooperative
//! kernel writing the f32 partial sums (slices a multiple of its 32-deep
//! staged slice);
//! [`coop_product_count`] counts the products on the cooperative template.

use super::codegen;
use super::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::settings::{self, GpuTuning};
use crate::shape::size_of_shape;
use crate::{Dtype, Error, Result};

mod coop;
mod loads;
mod plan;
mod product;
mod sources;
mod telemetry;
mod tiled;

pub use loads::vector_operand_count;
pub(crate) use plan::f16_f32_products;
#[doc(hidden)]
pub use sources::kernel_sources;
pub use telemetry::{
    coop_product_count, last_coop_buffers, last_coop_staged, last_coop_subgroups, last_product_tile,
};

#[cfg(doc)]
use plan::{BIG_TILES_FROM, split_big, split_k};
use plan::{coop_fragments, coop_mode};
use product::Product;

/// Which operands are read by columns (their row stride is the unit one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct View {
    /// `a` is stored column-major (a transposed view).
    a_cols: bool,
    /// `b` is stored column-major.
    b_cols: bool,
}

/// What a product's kernel does with the result `v` of output element `i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Epilogue {
    /// Stores it.
    Store,
    /// Adds it to the f32 output element already there.
    Accumulate,
    /// Stores it, rounded to the product's dtype, added to the matching
    /// element of a separate input `addend` of this dtype (the product's,
    /// or f32), as that dtype: a sum whose other term is the
    /// product (or its widening cast), computed by the product's kernel
    /// instead of a kernel of its own.
    Addend(Dtype),
}

impl Epilogue {
    /// The dtype the kernel stores for a product of `dtype`.
    fn stored(self, dtype: Dtype) -> Dtype {
        match self {
            Epilogue::Addend(d) => d,
            Epilogue::Store | Epilogue::Accumulate => dtype,
        }
    }
}

/// The WGSL `i32` distance from output element `i` to its addend's element
/// in the product kernels ([`Epilogue::Addend`]): the meta word after the
/// batch strides (`16 + 3 * params[3]`).
const PRODUCT_ADDEND_SHIFT: &str = "bitcast<i32>(params[16u + 3u * params[3]])";

/// The output at `binding` of a product of `dtype`: `store_out(i, v)`
/// writes output element `i`, adds `v` to it ([`Epilogue::Accumulate`]),
/// or writes `v` rounded to `dtype` plus `addend[i + shift]`
/// ([`Epilogue::Addend`]: `addend` bound at `binding` and the output
/// after it; `shift` is WGSL of an `i32`). The sum is the one an add
/// kernel computes from the stored product (and its widening cast): both
/// terms in f32, rounded once to the addend's dtype.
fn output_decl(binding: u32, dtype: Dtype, epilogue: Epilogue, shift: &str) -> String {
    match epilogue {
        Epilogue::Store => codegen::output(binding, dtype),
        Epilogue::Accumulate => format!(
            "@group(0) @binding({binding}) var<storage, read_write> out: array<f32>;\n\
             fn store_out(i: u32, v: f32) {{ out[i] = out[i] + v; }}\n"
        ),
        Epilogue::Addend(sum) => {
            let product = match dtype {
                Dtype::F16 => "round_f16(v)",
                Dtype::BF16 => "round_bf16(v)",
                _ => "v",
            };
            format!(
                "{}{}fn store_out(i: u32, v: f32) {{ \
                 store_summed(i, load_addend(u32(i32(i) + {shift})) + {product}); }}\n",
                codegen::input("addend", binding, sum),
                codegen::output_named("summed", binding + 1, sum),
            )
        }
    }
}

/// Finds workgroup `g`'s batch `bi`, tile row `tm` and column `tn`, the
/// operands' offsets `ao`, `bo` in that batch and their strides, and its
/// depth `k`: the whole depth `params[2]`, or under split-K (where the
/// outermost batch dimension numbers depth slices of `params[14]`, each
/// holding `params[15]` true batches) what is left of it from the slice's
/// start, at most one slice.
const PROLOGUE: &str = include_str!("prologue.wgsl");

/// `a @ b` for `a` of shape `[..., m, k]` and `b` of `[..., k, n]` (of one
/// dtype, batch dimensions already broadcast to `out_shape[..-2]`),
/// accumulating in f32. The output is contiguous, of the operands' dtype.
pub fn matmul(a: &Operand<'_>, b: &Operand<'_>, out_shape: &[usize]) -> Result<ArrayData> {
    let dtype = a.dtype;
    if !dtype.is_float() {
        supported(dtype)?;
        return Err(Error::eval("matmul", format!("no GPU kernel for {dtype}")));
    }
    new_product(a, b, out_shape, None)
}

/// Records `a @ b` (plus `addend`, as [`matmul_adding`] says) into a new
/// contiguous array of `out_shape`, of the addend's dtype or else the
/// operands'.
fn new_product(
    a: &Operand<'_>,
    b: &Operand<'_>,
    out_shape: &[usize],
    addend: Option<&Operand<'_>>,
) -> Result<ArrayData> {
    let dtype = addend.map_or(a.dtype, |x| x.dtype);
    supported(a.dtype)?;
    let mut read = vec![&a.data, &b.data];
    read.extend(addend.map(|x| &x.data));
    codegen::check_size("matmul", size_of_shape(out_shape), &read)?;
    codegen::check_size("matmul", a.size(), &[])?;
    codegen::check_size("matmul", b.size(), &[])?;
    let out = alloc(out_shape, dtype)?;
    let to = Destination {
        data: &out,
        shape: out_shape,
        offset: 0,
        accumulate: false,
        addend: addend.map(|x| (&x.data, x.dtype)),
    };
    record(a, b, &to, &settings::gpu_tuning())?;
    Ok(out)
}

/// Whether products of `dtype` can add an addend as they store
/// ([`matmul_adding`]): the float dtypes (f16 on the tensor-core kernel
/// where it runs).
pub fn adds_in_kernel(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16)
}

/// `addend + a @ b` for operands as [`matmul`] takes them, of a dtype that
/// [`adds_in_kernel`], and a dense `addend` of the output's size (any
/// shape with that many elements: it is read in the output's row-major
/// order) of the operands' dtype or f32 (the sum of the product's widening
/// cast), in the product's kernels: the sum is
/// stored, in the addend's dtype, where the product would be, without a
/// kernel of its own or the product's buffer. Equal bit for bit to the
/// product, cast, then added (each element is the product rounded to its
/// dtype plus the addend, in f32, rounded once to the addend's dtype).
/// The GPU evaluator calls it for an add whose other term is a product
/// that nothing else reads.
pub fn matmul_adding(
    a: &Operand<'_>,
    b: &Operand<'_>,
    out_shape: &[usize],
    addend: &Operand<'_>,
) -> Result<ArrayData> {
    let total = size_of_shape(out_shape);
    let dtype = a.dtype;
    let sums = b.dtype == dtype
        && adds_in_kernel(dtype)
        && (addend.dtype == dtype || addend.dtype == Dtype::F32);
    if !sums {
        return Err(Error::eval(
            "matmul",
            format!(
                "a product with an addend takes float operands of one dtype and an addend \
                 of that dtype or f32; got {}, {} and {}",
                a.dtype, b.dtype, addend.dtype
            ),
        ));
    }
    if addend.size() != total || !addend.is_contiguous() {
        return Err(Error::eval(
            "matmul",
            format!(
                "the addend of a product of {out_shape:?} must be dense with {total} elements, \
                 got {:?} with strides {:?}",
                addend.shape,
                addend.data.strides()
            ),
        ));
    }
    new_product(a, b, out_shape, Some(addend))
}

/// Where [`record`] writes a product: the dense `[..., m, n]` block of
/// `shape` starting at element `offset` of `data`, overwritten, with
/// `accumulate` added to (which needs an unpacked dtype), or with `addend`
/// overwritten by the sum of the product and the addend.
pub(crate) struct Destination<'a> {
    /// The output buffer.
    pub(crate) data: &'a ArrayData,
    /// The block's shape (its batch dimensions the operands' broadcast).
    pub(crate) shape: &'a [usize],
    /// The block's first element in `data`.
    pub(crate) offset: usize,
    /// Add to what is there instead of overwriting it.
    pub(crate) accumulate: bool,
    /// An array added to the product (and its dtype, the stored one), read
    /// densely from its offset in the block's order (see
    /// [`Epilogue::Addend`]; not with `accumulate`).
    pub(crate) addend: Option<(&'a ArrayData, Dtype)>,
}

impl Destination<'_> {
    /// What the kernels do with each result.
    fn epilogue(&self) -> Epilogue {
        match (self.accumulate, self.addend) {
            (true, _) => Epilogue::Accumulate,
            (false, Some((_, dtype))) => Epilogue::Addend(dtype),
            (false, None) => Epilogue::Store,
        }
    }

    /// The `i32` distance from an output element to its addend's (0
    /// without one), for the kernels' meta words.
    fn addend_shift(&self) -> u32 {
        self.addend.map_or(0, |(x, _)| {
            (x.offset() as i64 - self.offset as i64) as i32 as u32
        })
    }
}

/// Records `out (+)= a @ b` for operands of one dtype (the output's),
/// reading `a` and `b` through their views: f16 on the cooperative kernel
/// where it runs ([`coop_fragments`]), everything else on the f32 kernel.
/// Products with too few output tiles to fill the GPU and a long depth are
/// split over the depth ([`split_k`]) on either kernel.
pub(crate) fn record(
    a: &Operand<'_>,
    b: &Operand<'_>,
    to: &Destination<'_>,
    tuning: &GpuTuning,
) -> Result<()> {
    let dtype = a.dtype;
    // Packed outputs are cleared and OR-ed into from their first word.
    debug_assert!(!codegen::packed(dtype) || (to.offset == 0 && !to.accumulate));
    debug_assert!(!to.accumulate || dtype == Dtype::F32);
    debug_assert!(to.addend.is_none() || adds_in_kernel(dtype));
    debug_assert!(!(to.accumulate && to.addend.is_some()));
    let product = Product::new(&a.data, &b.data, dtype, a.shape, to.shape, tuning);
    let coop = coop_fragments(dtype, to.accumulate, tuning)?;
    product.record(coop, dtype, to)
}

/// Records `out[out_offset..] (+)= a @ b` for f16 operands into the dense
/// f32 block `out` (with `accumulate`, added to what is there) on the
/// cooperative kernel, f16 x f16 products accumulated in f32, as the fused
/// linear cross-entropy's products in f16 run (mixed precision, as
/// PyTorch's autocast does). Split over the depth as [`record`] splits.
/// Fails where [`f16_f32_products`] is false.
pub(crate) fn record_f16_f32(
    a: &Operand<'_>,
    b: &Operand<'_>,
    to: &Destination<'_>,
    tuning: &GpuTuning,
) -> Result<()> {
    debug_assert!(a.dtype == Dtype::F16 && b.dtype == Dtype::F16);
    let Some(fragments) = coop_mode(tuning)? else {
        return Err(Error::gpu(
            "matmul: f16 operands with an f32 result need the cooperative-matrix kernel, \
             which this device (or the tuning's coopmat) does not offer",
        ));
    };
    let product = Product::new(&a.data, &b.data, Dtype::F16, a.shape, to.shape, tuning);
    product.record(Some(fragments), Dtype::F32, to)
}
