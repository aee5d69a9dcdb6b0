//! Batched matrix products `out (+)= a @ b`, accumulating in f32, in one of
//! two kernel families chosen per product:
//!
//! - [`tiled`]: register-blocked f32 arithmetic for every float dtype (f16
//!   and bf16 converted to f32 as they load, through `codegen::input`).
//! - [`coop`]: f16 operands on cooperative matrices (tensor cores),
//!   16 x 16 x 16 f16 x f16 -> f32 fragments, for f16 products where the
//!   adapter has them ([`coopmat_usable`]; `MLX_GPU_COOPMAT`,
//!   [`settings::gpu_coopmat`]). bf16 has no cooperative-matrix
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
//! | coop, large, `MLX_GPU_COOP_SUBGROUPS=8` | 256 (8 subgroups, 4 x 2) | 128 x 128, slices of 32, double buffered | a subgroup: 2 x 4 fragments (32 x 64) | 46,080 B (1 staging fragment) | ~100-130 | 2 |
//! | coop, `MLX_GPU_COOP_TILE=256x128` | 256 (8 subgroups, 4 x 2) | 256 x 128, slices of 32, one buffer | a subgroup: 4 x 4 fragments (64 x 64) | 45,568 B (2 staging fragments) | ~210 | 1 (registers) |
//! | coop, small | 128 (4 subgroups, 2 x 2) | 64 x 64, slices of 32, double buffered | a subgroup: 2 x 2 fragments (32 x 32) | 35,840 B (4 staging fragments) | ~70 | 4-6 |
//!
//! **Double buffering of the tensor-core kernel** (`coop::Staging`,
//! `MLX_GPU_COOP_DOUBLE_BUFFER`; designed, not measured). With one buffer
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
//! `MLX_GPU_COOP_SUBGROUPS=8` keeps the older tiling, to compare both.
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
//! 512 at 1.3 unsplit, a fifth and a third of their f32 rates). `MLX_GPU_SPLIT_K=0`
//! ([`settings::set_gpu_split_k`]) turns it off, to measure the gain.
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
use super::device::context;
use super::dispatch::dispatch_groups;
use super::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::settings;
use crate::shape::size_of_shape;
use crate::{Dtype, Error, Result};

mod coop;
mod loads;
mod tiled;

pub use loads::vector_operand_count;

/// Workgroups that keep every SM of an H100 (132) busy twice over: below
/// this many 128 x 128 tiles, the 64 x 64 kernel runs instead.
const BIG_TILES_FROM: usize = 264;

/// The fragment implementation of the cooperative kernel for products of
/// `dtype`, or `None` for the f32-compute kernel: f16 stored natively, not
/// accumulating, and [`coop_mode`] offering the kernel.
fn coop_fragments(dtype: Dtype, accumulate: bool) -> Result<Option<coop::Fragments>> {
    if dtype != Dtype::F16 || accumulate {
        return Ok(None);
    }
    coop_mode()
}

/// The fragment implementation the cooperative kernel runs with, or `None`
/// where it cannot run: [`super::fragment::chosen`] offers one (f16 stored
/// natively, and [`settings::gpu_coopmat`] either `Plain` or `Auto` on a
/// device with cooperative matrices, [`coopmat_usable`]), and the workgroup
/// memory fits the device's limit.
fn coop_mode() -> Result<Option<coop::Fragments>> {
    let Some(fragments) = super::fragment::chosen(Dtype::F16)? else {
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
pub(crate) fn f16_f32_products() -> Result<bool> {
    Ok(coop_mode()?.is_some())
}

/// Products recorded on the cooperative kernel's template (either
/// fragment implementation) since the process started.
static COOP_PRODUCTS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Products recorded on the cooperative-matrix (tensor-core) template
/// since the process started, with either fragment implementation (for
/// tests that check which kernel a product took).
pub fn coop_product_count() -> usize {
    COOP_PRODUCTS.load(std::sync::atomic::Ordering::Relaxed)
}

/// The last value of a choice made while recording products (tilings,
/// stagings), kept for tests that check which kernel ran.
struct Last(std::sync::atomic::AtomicUsize);

impl Last {
    /// None recorded yet.
    const fn new() -> Last {
        Last(std::sync::atomic::AtomicUsize::new(0))
    }

    /// Records `n` (non-zero) as the latest.
    fn set(&self, n: usize) {
        self.0.store(n, std::sync::atomic::Ordering::Relaxed);
    }

    /// The latest, `None` before the first.
    fn get(&self) -> Option<usize> {
        match self.0.load(std::sync::atomic::Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

static LAST_COOP_SUBGROUPS: Last = Last::new();
static LAST_COOP_STAGED: Last = Last::new();
static LAST_COOP_BUFFERS: Last = Last::new();
static LAST_PRODUCT_TILE: Last = Last::new();

/// The subgroups per workgroup of the last product recorded on the
/// cooperative template, `None` before the first (for tests that check
/// which tiling ran).
pub fn last_coop_subgroups() -> Option<usize> {
    LAST_COOP_SUBGROUPS.get()
}

/// How many output fragments per subgroup the last product recorded on
/// the cooperative template staged at a time (`coop::staged_per_round`),
/// `None` before the first (for tests that check which epilogue ran).
pub fn last_coop_staged() -> Option<usize> {
    LAST_COOP_STAGED.get()
}

/// How many buffers of staged depth slices per operand (1 or 2) the last
/// product recorded on the cooperative template used
/// (`coop::Staging::choose`), `None` before the first (for tests that
/// check which main loop ran).
pub fn last_coop_buffers() -> Option<usize> {
    LAST_COOP_BUFFERS.get()
}

/// The output tile side (64 or 128) of the last product recorded on
/// either kernel, `None` before the first (for tests that check which
/// tiles, and so which split, a product took).
pub fn last_product_tile() -> Option<usize> {
    LAST_PRODUCT_TILE.get()
}

/// Whether `adapter` can run the tensor-core kernel: it offers
/// `EXPERIMENTAL_COOPERATIVE_MATRIX` and `SHADER_F16`, a 16 x 16 x 16
/// configuration with f16 operands and an f32 accumulator, and subgroups
/// of exactly 32 invocations (the kernel's subgroups are 32 consecutive
/// invocations of a workgroup).
pub(crate) fn coopmat_usable(adapter: &wgpu::Adapter) -> bool {
    use wgpu::wgt::CooperativeScalarType as S;
    let needed = wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX | wgpu::Features::SHADER_F16;
    let info = adapter.get_info();
    adapter.features().contains(needed)
        && info.subgroup_min_size == 32
        && info.subgroup_max_size == 32
        && adapter.cooperative_matrix_properties().iter().any(|p| {
            (p.m_size, p.n_size, p.k_size) == (16, 16, 16)
                && p.ab_type == S::F16
                && p.cr_type == S::F32
        })
}

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
const PROLOGUE: &str = r#"    let m = params[0];
    let n = params[1];
    let nb = params[3];
    let per = params[4] * params[5];
    let bi = g / per;
    let k = min(params[14], params[2] - (bi / params[15]) * params[14]);
    let tm = (g % per) / params[4];
    let tn = (g % per) % params[4];
    var ao = bitcast<i32>(params[7]);
    var bo = bitcast<i32>(params[10]);
    var rem = bi;
    for (var d = i32(nb) - 1; d >= 0; d = d - 1) {
        let s = params[16u + u32(d)];
        let c = i32(rem % s);
        ao = ao + c * bitcast<i32>(params[16u + nb + u32(d)]);
        bo = bo + c * bitcast<i32>(params[16u + 2u * nb + u32(d)]);
        rem = rem / s;
    }
    let ars = bitcast<i32>(params[8]);
    let acs = bitcast<i32>(params[9]);
    let brs = bitcast<i32>(params[11]);
    let bcs = bitcast<i32>(params[12]);
"#;

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
    record(a, b, &to)?;
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
pub(crate) fn record(a: &Operand<'_>, b: &Operand<'_>, to: &Destination<'_>) -> Result<()> {
    let dtype = a.dtype;
    // Packed outputs are cleared and OR-ed into from their first word.
    debug_assert!(!codegen::packed(dtype) || (to.offset == 0 && !to.accumulate));
    debug_assert!(!to.accumulate || dtype == Dtype::F32);
    debug_assert!(to.addend.is_none() || adds_in_kernel(dtype));
    debug_assert!(!(to.accumulate && to.addend.is_some()));
    let product = Product::new(&a.data, &b.data, dtype, a.shape, to.shape);
    let coop = coop_fragments(dtype, to.accumulate)?;
    product.record(coop, dtype, to)
}

/// Records `out[out_offset..] (+)= a @ b` for f16 operands into the dense
/// f32 block `out` (with `accumulate`, added to what is there) on the
/// cooperative kernel, f16 x f16 products accumulated in f32, as the fused
/// linear cross-entropy's products in f16 run (mixed precision, as
/// PyTorch's autocast does). Split over the depth as [`record`] splits.
/// Fails where [`f16_f32_products`] is false.
pub(crate) fn record_f16_f32(a: &Operand<'_>, b: &Operand<'_>, to: &Destination<'_>) -> Result<()> {
    debug_assert!(a.dtype == Dtype::F16 && b.dtype == Dtype::F16);
    let Some(fragments) = coop_mode()? else {
        return Err(Error::gpu(
            "matmul: f16 operands with an f32 result need the cooperative-matrix kernel, \
             which this device (or MLX_GPU_COOPMAT) does not offer",
        ));
    };
    let product = Product::new(&a.data, &b.data, Dtype::F16, a.shape, to.shape);
    product.record(Some(fragments), Dtype::F32, to)
}

/// The f32 buffer of a split product's partial sums (`shape`: flat, every
/// slice's block one after the other), written from its start.
fn partial<'a>(parts: &'a ArrayData, shape: &'a [usize]) -> Destination<'a> {
    Destination {
        data: parts,
        shape,
        offset: 0,
        accumulate: false,
        addend: None,
    }
}

/// The operands and sizes of one (batched) product.
struct Product<'a> {
    a: &'a ArrayData,
    b: &'a ArrayData,
    dtype: Dtype,
    m: usize,
    n: usize,
    k: usize,
    /// The output's batch dimensions (the operands' broadcast to them).
    batch_shape: &'a [usize],
}

impl<'a> Product<'a> {
    /// `a @ b` in `dtype`, `a` of `a_shape`, into an output of `out_shape`
    /// (its batch dimensions the operands' broadcast).
    fn new(
        a: &'a ArrayData,
        b: &'a ArrayData,
        dtype: Dtype,
        a_shape: &[usize],
        out_shape: &'a [usize],
    ) -> Product<'a> {
        let nd = out_shape.len();
        Product {
            a,
            b,
            dtype,
            m: out_shape[nd - 2],
            n: out_shape[nd - 1],
            k: a_shape[nd - 1],
            batch_shape: &out_shape[..nd - 2],
        }
    }

    fn batch(&self) -> usize {
        self.batch_shape.iter().product()
    }

    /// The output's elements.
    fn total(&self) -> usize {
        self.batch() * self.m * self.n
    }

    /// Whether there are enough 128 x 128 output tiles for the big kernel.
    fn big(&self) -> bool {
        self.batch() * self.m.div_ceil(128) * self.n.div_ceil(128) >= BIG_TILES_FROM
    }

    /// Records the product into `to` as `out_dtype` on the cooperative
    /// kernel with `coop`, else on the f32 kernel: split over the depth
    /// when it has too few output tiles ([`Product::depth_split`]: f32
    /// partial sums written by the same kernel, then summed in order into
    /// `to`), else whole, on 128 x 128 tiles when there are enough of them.
    fn record(
        &self,
        coop: Option<coop::Fragments>,
        out_dtype: Dtype,
        to: &Destination<'_>,
    ) -> Result<()> {
        let total = self.total();
        if total == 0 {
            return Ok(());
        }
        let big = self.big();
        if !big && settings::gpu_split_k() {
            let split = match self.depth_split(coop.is_some(), 128)? {
                Some(slices) => Some((128, slices)),
                None => self.depth_split(coop.is_some(), 64)?.map(|s| (64, s)),
            };
            if let Some((t, slices)) = split {
                let parts = alloc(&[slices.count * total], Dtype::F32)?;
                self.dispatch(
                    coop,
                    t,
                    Dtype::F32,
                    slices,
                    &partial(&parts, &[slices.count * total]),
                )?;
                return sum_slices(&parts, slices.count, total, out_dtype, to);
            }
        }
        let whole = Slices {
            count: 1,
            depth: self.k,
        };
        self.dispatch(coop, if big { 128 } else { 64 }, out_dtype, whole, to)
    }

    /// How to split the depth over the `t x t` workgroups (64:
    /// [`split_k`], 128: [`split_big`]) of the cooperative kernel (`coop`:
    /// slices a multiple of its 32-deep staged slice) or of the f32 kernel
    /// (16-deep); `None` when one slice is best or the f32 partial sums
    /// would not fit a buffer.
    fn depth_split(&self, coop: bool, t: usize) -> Result<Option<Slices>> {
        let c = context()?;
        let max_bytes = c
            .limits
            .max_storage_buffer_binding_size
            .min(c.limits.max_buffer_size) as usize;
        let unit = if coop { coop::DEPTH } else { tiled::DEPTH };
        let tiles = self.batch() * self.m.div_ceil(t) * self.n.div_ceil(t);
        let wave = settings::gpu_split_wave();
        let slices = if t == 128 {
            match split_big(tiles, self.k, unit, wave / 2) {
                Some(slices) => slices,
                None => return Ok(None),
            }
        } else {
            split_k(tiles, self.k, unit, wave)
        };
        let fits = slices.count * self.total() * 4 <= max_bytes.min(i32::MAX as usize);
        Ok((slices.count > 1 && fits).then_some(slices))
    }
}

/// How a product's depth is cut: `count` slices of `depth` (the last one
/// shorter), each computed by its own workgroups into its own partial sum.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Slices {
    count: usize,
    depth: usize,
}

/// The shortest depth slice worth its own workgroups: a 64 x 64 tile over
/// 256 depths is 2.1 MFLOP against 32 KiB of partial sums written and read
/// back (64 FLOP a byte, well above the H100's f32 balance of ~17), and 16
/// of the kernel's 16-deep staged slices amortise its prologue and stores.
const MIN_SLICE_DEPTH: usize = 256;

/// The most slices: beyond 16, partial sums outweigh what more
/// workgroups could gain (a product with fewer than 33 tiles is tiny).
const MAX_SLICES: usize = 16;

/// Split-K for a product of `tiles` 64 x 64 output tiles and depth `k`,
/// on a kernel staging `unit`-deep slices (16 for the f32 kernel, 32 for
/// the cooperative one), on a GPU whose one wave holds `wave` such
/// workgroups ([`settings::gpu_split_wave`]).
///
/// The wave's default, 528, is 132 SMs x 4 resident workgroups. The f32
/// kernel's (256 invocations, ~48 registers, 17 KiB of workgroup memory)
/// fit 4 to an SM, 32 of its 64 warps; the cooperative kernel's small
/// tiling (128 invocations, ~100 registers with its staged loads, 14 KiB)
/// fits 4-5, and 4 is the safe figure: a product launched as slightly
/// more than one wave runs its leftovers as a second wave as long as the
/// first. wgpu reports no SM count, so the H100's is the design figure
/// (the same as [`BIG_TILES_FROM`]'s); `MLX_GPU_SPLIT_WAVE` measures
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
fn split_k(tiles: usize, k: usize, unit: usize, wave: usize) -> Slices {
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
const MIN_BIG_SLICE_DEPTH: usize = 1024;

/// The share of its last wave's slots a split on 128 x 128 tiles must
/// fill to be taken.
const BIG_SPLIT_FILL: f64 = 0.9;

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
fn split_big(tiles: usize, k: usize, unit: usize, wave: usize) -> Option<Slices> {
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

impl Product<'_> {
    /// Records the product (or, with several `slices`, each slice's partial
    /// product as an outer batch of the destination) into `to` as
    /// `out_dtype`: on the cooperative kernel with `coop`, else on the f32
    /// kernel with `t x t` tiles.
    fn dispatch(
        &self,
        coop: Option<coop::Fragments>,
        t: usize,
        out_dtype: Dtype,
        slices: Slices,
        to: &Destination<'_>,
    ) -> Result<()> {
        let (out, out_offset, epilogue) = (to.data, to.offset, to.epilogue());
        let (a, b, dtype, m, n) = (self.a, self.b, self.dtype, self.m, self.n);
        let nd = self.batch_shape.len() + 2;
        let (sa, sb) = (a.strides(), b.strides());
        // Column-major staging when the row stride is the unit one.
        let view = View {
            a_cols: sa[nd - 2] == 1 && sa[nd - 1] != 1,
            b_cols: sb[nd - 2] == 1 && sb[nd - 1] != 1,
        };
        // The depth slices as the outermost batch dimension: slice `s`
        // starts `s * depth` along `a`'s columns and `b`'s rows.
        let mut dims = Vec::with_capacity(nd - 1);
        let (mut a_strides, mut b_strides) = (Vec::new(), Vec::new());
        if slices.count > 1 {
            dims.push(slices.count);
            a_strides.push(slices.depth as isize * sa[nd - 1]);
            b_strides.push(slices.depth as isize * sb[nd - 2]);
        }
        dims.extend_from_slice(self.batch_shape);
        a_strides.extend_from_slice(&sa[..nd - 2]);
        b_strides.extend_from_slice(&sb[..nd - 2]);
        let width = if coop.is_some() {
            coop::VEC
        } else {
            tiled::VEC
        };
        let loads = loads::choose(
            width,
            view,
            [a, b],
            [m, n, self.k],
            &dims,
            [&a_strides, &b_strides],
        );
        let limit = super::workgroup_memory_limit()?;
        let (pipeline, tm, tn) = match coop {
            Some(fragments) => {
                let subgroups = settings::gpu_coop_subgroups();
                let tiling = if t == 128 {
                    // The tall tiling where it fits, else the default.
                    let large = coop::Tiling::large(settings::gpu_coop_tile(), subgroups);
                    if large.shared_bytes() <= limit {
                        large
                    } else {
                        coop::Tiling::large(settings::GpuCoopTile::Square, subgroups)
                    }
                } else {
                    coop::Tiling::SMALL
                };
                let staging =
                    coop::Staging::choose(tiling, limit, settings::gpu_coop_double_buffer());
                let key = format!(
                    "matmul-coop:{tiling:?}:{staging:?}:{fragments:?}:{view:?}:{loads:?}:{out_dtype}:{epilogue:?}"
                );
                let p = context()?.product_pipeline(&key, fragments, || {
                    coop::source(tiling, staging, fragments, view, out_dtype, epilogue, loads)
                })?;
                COOP_PRODUCTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                LAST_COOP_STAGED.set(staging.staged);
                LAST_COOP_BUFFERS.set(staging.buffers);
                LAST_COOP_SUBGROUPS.set(tiling.invocations() / 32);
                (p, m.div_ceil(tiling.bm()), n.div_ceil(tiling.bn()))
            }
            None => {
                let tile = if t == 128 {
                    tiled::large_tile(settings::gpu_f32_tile())
                } else {
                    tiled::Tile::T64
                };
                let buffers = if tiled::shared_bytes(tile, 2) <= limit {
                    2
                } else {
                    1
                };
                let key = format!(
                    "matmul:{tile:?}:{buffers}:{dtype}:{out_dtype}:{view:?}:{loads:?}:{epilogue:?}"
                );
                let p = context()?.pipeline(&key, || {
                    tiled::source(tile, buffers, dtype, out_dtype, view, epilogue, loads)
                })?;
                (p, m.div_ceil(tile.bm), n.div_ceil(tile.bn))
            }
        };
        LAST_PRODUCT_TILE.set(t);
        let batch: usize = self.batch_shape.iter().product();
        let tiles = slices.count * batch * tm * tn;
        let mut meta = vec![
            m as u32,
            n as u32,
            self.k as u32,
            0, // batch dimensions, below
            tn as u32,
            tm as u32,
            tiles as u32,
            a.offset() as u32,
            sa[nd - 2] as i32 as u32,
            sa[nd - 1] as i32 as u32,
            b.offset() as u32,
            sb[nd - 2] as i32 as u32,
            sb[nd - 1] as i32 as u32,
            out_offset as u32,
            slices.depth as u32,
            batch as u32,
        ];
        meta[3] = dims.len() as u32;
        meta.extend(dims.iter().map(|&d| d as u32));
        meta.extend(a_strides.iter().map(|&s| s as i32 as u32));
        meta.extend(b_strides.iter().map(|&s| s as i32 as u32));
        meta.push(to.addend_shift());
        let elements = slices.count * batch * m * n;
        let inputs: Vec<&ArrayData> = [a, b]
            .into_iter()
            .chain(to.addend.map(|(x, _)| x))
            .collect();
        let stored = epilogue.stored(out_dtype);
        dispatch_groups(
            &pipeline,
            &meta,
            &inputs,
            out,
            elements * stored.size_of(),
            codegen::packed(stored),
            tiles,
        )
    }
}

/// Records `out[out_offset + i] (+)= sum over s of parts[s * total + i]`,
/// the slices summed in order (so the result does not depend on timing),
/// stored as `dtype`.
fn sum_slices(
    parts: &ArrayData,
    count: usize,
    total: usize,
    dtype: Dtype,
    to: &Destination<'_>,
) -> Result<()> {
    let (out, out_offset, epilogue) = (to.data, to.offset, to.epilogue());
    let key = format!("matmul_split_sum:{dtype}:{epilogue:?}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str("@group(0) @binding(1) var<storage, read> parts: array<f32>;\n");
        s.push_str(&output_decl(2, dtype, epilogue, "bitcast<i32>(params[3])"));
        s.push_str(codegen::ENTRY);
        s.push_str(&format!(
            r#" {{
    {index}
    let total = params[0];
    if (i >= total) {{ return; }}
    var acc = 0.0;
    for (var s = 0u; s < params[1]; s = s + 1u) {{ acc = acc + parts[s * total + i]; }}
    store_out(params[2] + i, acc);
}}
"#,
            index = codegen::THREAD_INDEX,
        ));
        s
    })?;
    let meta = [
        total as u32,
        count as u32,
        out_offset as u32,
        to.addend_shift(),
    ];
    let inputs: Vec<&ArrayData> = [parts]
        .into_iter()
        .chain(to.addend.map(|(x, _)| x))
        .collect();
    let stored = epilogue.stored(dtype);
    super::dispatch::dispatch(
        &pipeline,
        &meta,
        &inputs,
        out,
        total * stored.size_of(),
        codegen::packed(stored),
        total,
    )
}

/// Every kernel variant's WGSL, named: both tilings of the cooperative
/// template with both fragment implementations, and the f32 kernel at both
/// tiles and buffer counts, in every transpose case, with scalar and
/// vector staging loads (both operands one way for every dtype, and one
/// of each for the first dtype; the f32 kernel with one buffer, whose
/// staging text is the two-buffer one's, vectors for the first dtype
/// only) (f16 declared as the running device stores it,
/// packed before the GPU is first used). The cooperative sources start
/// with `enable f16;` here. For the test that compiles them all through
/// naga to SPIR-V.
#[doc(hidden)]
pub fn kernel_sources() -> Vec<(String, String)> {
    use loads::VecLoads;
    let mut out = Vec::new();
    let mut views = Vec::new();
    for a_cols in [false, true] {
        for b_cols in [false, true] {
            views.push(View { a_cols, b_cols });
        }
    }
    let uniform = [VecLoads::default(), VecLoads { a: true, b: true }];
    let mixed = [
        VecLoads { a: true, b: false },
        VecLoads { a: false, b: true },
    ];
    // Scalar loads always; vectors for both operands with `vectors`, and
    // for one of them with `first` too.
    let choices = |vectors: bool, first: bool| {
        let mut c = vec![uniform[0]];
        if vectors {
            c.push(uniform[1]);
            if first {
                c.extend(mixed);
            }
        }
        c
    };
    for tiling in coop::Tiling::ALL.into_iter().chain([coop::Tiling::TALL]) {
        // One buffer and one staging fragment at a time, and what 48 KiB
        // allow with one buffer and with two.
        let mut stagings = vec![coop::Staging::LEAST];
        for double in [false, true] {
            let s = coop::Staging::choose(tiling, 48 << 10, double);
            if !stagings.contains(&s) {
                stagings.push(s);
            }
        }
        for staging in stagings {
            for fragments in [coop::Fragments::Cooperative, coop::Fragments::Plain] {
                for &view in &views {
                    for (i, (dtype, epilogue)) in [
                        (Dtype::F16, Epilogue::Store),
                        (Dtype::F32, Epilogue::Store),
                        (Dtype::F32, Epilogue::Accumulate),
                        (Dtype::F16, Epilogue::Addend(Dtype::F16)),
                        (Dtype::F16, Epilogue::Addend(Dtype::F32)),
                    ]
                    .into_iter()
                    .enumerate()
                    {
                        for loads in choices(true, i == 0) {
                            out.push((
                                format!(
                                    "coop {tiling:?} {staging:?} {fragments:?} {view:?} {loads:?} {dtype} {epilogue:?} ({} B)",
                                    tiling.shared_bytes_for(staging)
                                ),
                                format!(
                                    "enable f16;\n{}",
                                    coop::source(
                                        tiling, staging, fragments, view, dtype, epilogue, loads
                                    )
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    for tile in [tiled::Tile::T64, tiled::Tile::T128] {
        for buffers in [1, 2] {
            for &view in &views {
                // The last two: split-K partial sums of half operands.
                for (i, (dtype, out_dtype, epilogue)) in [
                    (Dtype::F32, Dtype::F32, Epilogue::Store),
                    (Dtype::F32, Dtype::F32, Epilogue::Accumulate),
                    (Dtype::F32, Dtype::F32, Epilogue::Addend(Dtype::F32)),
                    (Dtype::F16, Dtype::F16, Epilogue::Store),
                    (Dtype::BF16, Dtype::BF16, Epilogue::Store),
                    (Dtype::F16, Dtype::F16, Epilogue::Addend(Dtype::F16)),
                    (Dtype::BF16, Dtype::BF16, Epilogue::Addend(Dtype::BF16)),
                    (Dtype::BF16, Dtype::BF16, Epilogue::Addend(Dtype::F32)),
                    (Dtype::F16, Dtype::F32, Epilogue::Store),
                    (Dtype::BF16, Dtype::F32, Epilogue::Store),
                ]
                .into_iter()
                .enumerate()
                {
                    for loads in choices(buffers == 2 || i == 0, i == 0) {
                        let mut src =
                            tiled::source(tile, buffers, dtype, out_dtype, view, epilogue, loads);
                        if dtype == Dtype::F16 && !codegen::packed(dtype) {
                            src.insert_str(0, "enable f16;\n");
                        }
                        out.push((
                            format!(
                                "f32 kernel {tile:?} x {buffers} {view:?} {loads:?} {dtype} -> {out_dtype} {epilogue:?} ({} B)",
                                tiled::shared_bytes(tile, buffers)
                            ),
                            src,
                        ));
                    }
                }
            }
        }
    }
    // The other large tiles (`MLX_GPU_F32_TILE`), f32 only.
    for (choice, _) in &settings::GpuF32Tile::ALL[1..] {
        let tile = tiled::large_tile(*choice);
        // Two buffers only where they fit the H100's 48 KiB.
        for buffers in [1, 2]
            .into_iter()
            .filter(|&b| tiled::shared_bytes(tile, b) <= 48 << 10)
        {
            for &view in &views {
                for epilogue in [
                    Epilogue::Store,
                    Epilogue::Accumulate,
                    Epilogue::Addend(Dtype::F32),
                ] {
                    for loads in choices(true, false) {
                        out.push((
                            format!(
                                "f32 kernel {tile:?} x {buffers} {view:?} {loads:?} {epilogue:?} ({} B)",
                                tiled::shared_bytes(tile, buffers)
                            ),
                            tiled::source(
                                tile,
                                buffers,
                                Dtype::F32,
                                Dtype::F32,
                                view,
                                epilogue,
                                loads,
                            ),
                        ));
                    }
                }
            }
        }
    }
    out
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
