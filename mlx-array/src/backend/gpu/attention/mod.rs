//! Fused scaled dot-product attention and its gradient on the GPU as flash
//! attention, in the packed layouts of the CPU kernels (see
//! `backend::cpu::attention`): the output stored `[B, Lq, H, dv]` then the
//! rows' logsumexps `[B, H, Lq]`, in f32 (and for f16 or bf16 inputs the
//! output once more in their dtype, in a buffer of its own, rounded from
//! the f32 value as it is stored: the model's activation, so that no cast
//! kernel follows; the gradient reads the f32 one); the gradients `dq [B, Lq, H, d]`,
//! `dk [B, Lk, H_kv, d]`, `dv [B, Lk, H_kv, dv]` one after another, in the
//! inputs' dtype (rounded once as they are stored, so a half-precision
//! model casts none of them). `q`, `k` and `v` are read in their own dtype
//! (f32, f16 or bf16) and computed in f32, except f16 on 16 x 16
//! fragments (below). They and the cotangent are read in place through
//! their heads' batch, head and row strides wherever each row's elements
//! are adjacent (a projection's `[B, L, H, d]` viewed as `[B, H, L, d]`:
//! no copy of the heads before the kernels), and copied dense otherwise.
//!
//! Grouped-query attention (`k`, `v` of `H_kv` heads, `H / H_kv` query
//! heads to each: the `group()` meta word): every kernel reads `k` and `v`
//! at the query head's key/value head (`row_of`), in place; a dK/dV pass
//! workgroup (or per-row thread) owns a key/value head's keys and walks
//! the query blocks of each query head of its group in turn, so `dk` and
//! `dv` are summed over the group in its registers (no expanded `dk`, `dv`
//! and no reduction after the kernels; the same dispatches as multi-head
//! attention, the dK/dV pass over `B H_kv` heads' blocks).
//!
//! # f16 on fragments (tensor cores)
//!
//! For f16 `q`, `k`, `v` where the fragment mode is chosen
//! (`fragment::chosen`: cooperative matrices on an adapter that has them,
//! or `MLX_GPU_TUNING=coopmat=plain` on any adapter with `shader-f16`),
//! [`fragments`] runs instead: a workgroup of `BQ / 16` subgroups of 32
//! per (batch, head, block of `BQ` query rows), each subgroup owning 16
//! rows; per block of `BK` keys, `S = Q K^T` and `O += P V` are 16 x 16 x
//! 16 fragment products (f16 x f16 -> f32), the online softmax between
//! them in f32 (S through workgroup memory, P back as f16), the output in
//! the packed f32 layout above. Head widths are zero-padded to multiples
//! of 16. Tiles: the first of 64 x 64, 64 x 32, 32 x 64, 32 x 32, 16 x 32,
//! 16 x 16 that fits (lavapipe's 32 KiB takes 32 x 64 at `d = 64`).
//!
//! Design figures (not measurements: no H100 measured this kernel yet),
//! at `d = dv = 64`, tiles 64 x 64, 128 invocations:
//! - workgroup memory 46,848 B: Q, K/V (one buffer), P as f16 with rows
//!   padded by 8 halves (9,216 B each), S and each block's `P V` as f32
//!   (17,408 B), row max/sum/rescale and the halves' maxima and sums
//!   (1,792 B);
//! - per 64-key block a subgroup issues 16 fragment products for S and
//!   16 for `P V` (1 MFLOP per workgroup), 6 barriers, and the online
//!   softmax on all 32 lanes: each lane takes half of one row's keys (32
//!   `exp`s, unrolled, so its workgroup-memory reads are all in flight
//!   together; before, 16 lanes ran a row's 64 in a loop, a chain of
//!   dependent reads), the halves' maxima and sums meeting in workgroup
//!   memory; the output (16 x 64 per subgroup) stays in registers, 32 f32
//!   per invocation;
//! - staging: where the head widths are multiples of 4 and the inputs
//!   start on a multiple of 4 (`staging::Loads`), each invocation loads
//!   `vec4<f16>` quads (the cotangent `vec4<f32>`), all of its 8 loads of
//!   a 64 x 64 tile issued before its stores, instead of 32 single halves
//!   in a loop, each load's latency (hundreds of cycles from L2) waited
//!   for before the next; the backward stages the same way;
//! - occupancy on an H100: shared memory allows 4 workgroups per SM (a
//!   fifth does not fit 228 KiB with the per-block reserve), 16 of 64 warps
//!   (25%); registers (~120 per invocation) allow the same 4;
//! - grid: [4, 4, 512, 64] has 128 workgroups (one per SM, one wave:
//!   latency bound), [16, 12, 512, 64] 1,536 (2.9 waves of 4 per SM).
//!
//! The gradient ([`fragments_backward`], with the f32 kernels' `delta`
//! pre-pass) runs on fragments too, in the same two passes as the f32
//! kernels below; each subgroup holds its 16 rows of `dK` and `dV` (or
//! `dQ`) in f32 fragments over the whole walk, `P` and `dS` go through
//! workgroup memory as f16 (`dO` is staged as f16). At `d = dv = 64`:
//! - dK/dV pass, 64 keys owned (4 subgroups) x 32 queries walked: K, V,
//!   Q, dO tiles (f16, 9,216 + 9,216 + 4,608 + 4,608 B), S/dP (f32,
//!   9,216 B), P/dS (f16, 5,120 B), lse and delta: 42,240 B; per walked
//!   block a subgroup issues 32 fragment products (S^T, `dV`, dP^T, `dK`,
//!   8 each) and 6 barriers;
//! - dQ pass, 64 queries owned x 32 keys walked: 42,496 B, 24 products
//!   (S, dP, `dQ`) per walked block;
//! - 5 workgroups per SM by shared memory, about 4 by registers (~8
//!   accumulator fragments of 8 f32 plus 4 fresh ones per invocation):
//!   16-20 warps (25-31%); grids of 128 and 1,536 workgroups per pass at
//!   the two shapes, as the forward.
//!
//! Lavapipe (32 KiB) runs these kernels with plain fragments at the
//! H100's backward tiles for `d = 32` and smaller ones for wider heads;
//! the forward's 64 x 64 tile runs only where 48 KiB is available.
//!
//! The fragment products (the forward's 0.54 and 6.4 GFLOP causal at
//! those shapes, the backward's 3.5 times that) are no longer the bound;
//! the f32 elementwise steps between them and the barriers are. Design
//! estimate, not a measurement: forward tens of microseconds at the small
//! shape and 0.1-0.3 ms at the large one, forward + backward 0.5-1 ms
//! there (f32 kernels measured: 1.78 and 8.32 ms; SDPA f32 1.097 ms).
//!
//! # Work per workgroup
//!
//! Every kernel runs 256 invocations as a 16 x 16 grid (`tx`, `ty`) over
//! tiles staged in workgroup memory. Q, K, V and dO tiles hold `vec4<f32>`
//! quads (head widths padded with zeros to multiples of 4), rows an odd
//! number of quads apart, so that 16-byte reads of 8 rows at one column
//! fall in 8 different groups of 4 banks; S, P and dS hold words, rows
//! `BK + 1` apart. An invocation owns the score entries `(ty + 16 i,
//! tx + 16 j)` and the output quads (4 adjacent columns) `tx + 16 j`:
//! - products over the head width (`S = Q K^T`, `dP = dO V^T`) read one
//!   quad of each operand per step, 4 FMAs per pair of rows;
//! - products over keys or queries (`O += P V`, `dV += P^T dO`,
//!   `dK += dS^T Q`, `dQ += dS K`) read one word of P or dS per row and
//!   one quad of V, dO, Q or K per owned quad.
//!
//! The code generator unrolls the micro-kernels' register blocks and
//! their loops (over the head width's quads and the block's keys or
//! queries, and the forward's softmax walks; [`unrolled`]), so every
//! step's addresses are constants from a base and the driver can issue
//! loads ahead (checked kernels' loops carry guard counters that hide
//! trip counts). Cost: lavapipe compiles the larger kernels more slowly
//! (the attention specs' first, uncached run 98 s instead of 59).
//! Tiles are staged from global memory by `vec4` quads where the head
//! widths and the inputs' first elements and strides are multiples of 4
//! (a settled choice: vectors always where they fit), each invocation's loads all
//! issued before its stores, and element by element otherwise.
//!
//! - Forward ([`forward`]): a workgroup per (batch, head, block of `BQ`
//!   query rows). The query block stays in workgroup memory; it walks the
//!   key blocks of `BK` rows the block sees (a causal block stops at its
//!   last row's last key): K tile -> `S = scale Q K^T` (each invocation a
//!   `BQ/16 x BK/16` block) -> S to workgroup memory -> every invocation
//!   stages its share of the V tile in the K tile's memory, then the
//!   `256 / BQ` invocations of each row (4 at `BQ` = 64) each take `BK`
//!   divided by that many adjacent keys (8): partial maxima, the row's max
//!   from them, the exponentials and their partial sums, merged in order
//!   by the row's first invocation into its running max, sum and rescale
//!   factor (two barriers more a block than one invocation per row, which
//!   walked all 32 keys twice while the other 192 waited: a chain of 64
//!   dependent steps, now 16) -> each invocation rescales and accumulates
//!   its `BQ/16` rows of owned quads of `O += P V` in registers.
//! - Backward in FlashAttention-2 order ([`backward`]): a pre-pass, a
//!   thread per query row, computes `delta = rowsum(dO o O)`; a dK/dV pass
//!   with a workgroup per (batch, head, block of `BK` keys) holds K and V
//!   and walks the query blocks that see them, recomputing
//!   `P = exp(scale Q K^T - lse)` and `dS = P o (dO V^T - delta)` and
//!   accumulating `dV += P^T dO`, `dK += dS^T Q` in registers; a dQ pass
//!   with a workgroup per (batch, head, block of `BQ` queries) walks the
//!   key blocks and accumulates `dQ += dS K`. No atomics: each pass owns
//!   its outputs.
//!
//! # Tiles and workgroup memory
//!
//! [`Tiles::plan`] takes the largest of `BQ x BK` in 64x32, 32x32, 32x16,
//! 16x16 whose workgroup memory fits the adapter's limit, capped at the
//! H100's 48 KiB; heads too wide for even 16x16 (`d = dv = 128` needs
//! 36.3 KiB in the backward, lavapipe has 32) take the per-row kernels of
//! `rows` instead. Lavapipe runs the H100's tiles (64x32 forward, 32x32
//! backward) at the specs' `d = 40, dv = 24` problems, and smaller ones
//! at `d = 64` and wider. At `d = dv = 64` (16 quads, rows 17 apart, one
//! margin of 16 quads after each quad tile for the invocations whose
//! owned quads run past the row):
//! - forward 64 x 32: Q 17,408 B, K/V 8,960 B, S 64x33 words, three row
//!   vectors, the softmax's 256 partials: 35.8 KiB; registers per invocation: S 4x2, O 4 quads,
//!   operands 6 quads, about 70 with addresses;
//! - backward 32 x 32: Q, dO, K, V 8,960 B each with margins, P and dS
//!   32x33 words each, lse and delta: 43.5 KiB (both passes); registers:
//!   S and dP 2x2 each, dK and dV 2 quads each (dQ 2 quads), operands 4
//!   quads.
//!
//! At `d = dv = 128` the tiles halve (forward 32 x 32, backward 16 x 16).
//!
//! # Expected occupancy and time on an H100
//!
//! 132 SMs with 228 KiB of shared memory and 64K registers each. The
//! forward's 35.8 KiB allows 6 workgroups per SM, the backward's 43.5
//! KiB 5 (40 warps), if registers allow (64 per invocation for 4 of 256,
//! about 50% occupancy). Work: [4, 4, 512, 64] has 128 forward workgroups
//! (one wave, under one per SM: latency bound) and 256 per backward pass;
//! [16, 12, 512, 64] has 1,536 forward workgroups and 3,072 per backward
//! pass.
//!
//! Roofline, causal (half of the `L x L` products, plus the diagonal
//! blocks): the forward is `B H L^2 (d + dv)` FLOP (0.54 GFLOP at
//! [4, 4, 512, 64], 6.4 at [16, 12, 512, 64]); the backward recomputes S
//! in both passes and does five more products: 3.5 times the forward, so
//! forward + backward is 4.5 times it (2.4 and 29 GFLOP). The FMAs read
//! their operands from workgroup memory, whose issue (one 128-byte
//! wavefront per SM per cycle against 128 FMAs) bounds the micro-kernels.
//! Counted in a warp's wavefronts (a broadcast word or quad is one, 16
//! rows' quads two):
//! - forward `S`: 8 per quad step for 32 FMAs (24 when the tiles held
//!   words and each step read single words); `P V`: 6 per key for 16 (8);
//! - backward `S` and `dP`: 6 per quad step for 16 FMAs each (16); `dV`
//!   and `dK`: 8 per query for 16 (12); `dQ`: 4 per key for 8 (6);
//! - per walked block of 32 queries a dK/dV warp issues 448 wavefronts
//!   (896 with word tiles), a dQ warp 320 (704).
//!
//! Measured with word tiles on an H100 (2026-11-26): forward + backward
//! 1.78 and 8.32 ms at the two shapes (backward 6.4 ms at the large
//! one), 5-7x PyTorch's SDPA in f32 (0.259 and 1.097 ms); the goal is 3x.
//! Design estimate for quad tiles, not a measurement: the backward about
//! half (3-3.5 ms at the large shape) where workgroup memory bounds it,
//! the forward's products a third of their issue, its one-invocation-
//! per-row softmax unchanged.

mod backward;
mod forward;
mod fragments;
mod fragments_backward;
mod grad;
mod rows;
mod sources;
mod staging;
mod telemetry;
mod text;

use std::sync::atomic::Ordering;

use super::codegen;
use super::device::context;
use super::dispatch::dispatch_groups_with_half;
use super::elementwise::dense;
use super::fragment::{self, Fragments};
use super::pool::alloc;
use crate::backend::common::attention::AttentionDims;
use crate::data::{ArrayData, Operand};
use crate::settings::{self, GpuTuning};
use crate::{Dtype, Result};
use staging::Loads;

pub use grad::attention_grad;
#[doc(hidden)]
pub use sources::kernel_sources;
use telemetry::{FRAGMENT_FORWARDS, LAST_SCALAR_TILES, QUAD_STAGED, SCALAR_QUAD_STAGED};
pub use telemetry::{fragment_runs, last_scalar_tiles, quad_staged_runs, scalar_quad_staged_runs};
use text::{
    QUERY_BLOCK, SIZES, header, output_store, quad_cols, quad_stride, stage, store_quad, unroll,
    unrolled,
};

/// Invocations per workgroup side: kernels run `SIDE x SIDE` invocations.
const SIDE: usize = 16;

/// The H100's workgroup memory (the cap on every plan, so that every
/// adapter runs the same tiles where it can).
const WORKGROUP_BYTES: usize = 48 * 1024;

/// Block sizes of one kernel: `bq` query rows by `bk` key rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Tiles {
    /// Query rows per block (a multiple of 16).
    pub bq: usize,
    /// Key rows per block (a multiple of 16).
    pub bk: usize,
}

impl Tiles {
    /// The largest tiles whose workgroup memory (`bytes(tiles)`) fits the
    /// adapter's limit, at most [`WORKGROUP_BYTES`]; `None` when even the
    /// smallest do not (heads too wide for the adapter). The tiles the
    /// tuning names ([`GpuTuning::attention_tiles`]) come first where they
    /// fit, to measure each on a device.
    fn plan(tuning: &GpuTuning, bytes: impl Fn(Tiles) -> usize) -> Result<Option<Tiles>> {
        let all = settings::GPU_ATTENTION_TILES;
        match tuning.attention_tiles {
            Some(asked) => {
                let mut order = vec![asked];
                order.extend(all.iter().filter(|&&t| t != asked));
                Self::plan_among(&order, bytes)
            }
            None => Self::plan_among(&all, bytes),
        }
    }

    /// The first of `candidates` (`(bq, bk)`, best first) that fits, as
    /// [`Tiles::plan`].
    fn plan_among(
        candidates: &[(usize, usize)],
        bytes: impl Fn(Tiles) -> usize,
    ) -> Result<Option<Tiles>> {
        let limit = context()?
            .limits
            .max_compute_workgroup_storage_size
            .min(WORKGROUP_BYTES as u32) as usize;
        Ok(candidates
            .iter()
            .map(|&(bq, bk)| Tiles { bq, bk })
            .find(|&t| bytes(t) <= limit))
    }
}

/// Sizes, flags, the inputs' offsets and `extra` words, then from
/// [`HEAD_STRIDES`] on the heads' strides of q, k, v and the cotangent
/// (`strides`), as every kernel here reads them (`row_of`, `row_step`),
/// then at [`GROUP`] the query heads per key/value head (`group()`).
fn meta(dims: &AttentionDims, inputs: &[&ArrayData], extra: &[u32], strides: &Strides) -> Vec<u32> {
    let mut m = vec![
        dims.b as u32,
        dims.h as u32,
        dims.lq as u32,
        dims.lk as u32,
        dims.causal as u32,
        dims.scale.to_bits(),
    ];
    m.extend(inputs.iter().map(|d| d.offset() as u32));
    m.extend_from_slice(extra);
    debug_assert!(
        m.len() <= HEAD_STRIDES,
        "attention meta words overlap the strides"
    );
    m.resize(HEAD_STRIDES, 0);
    m.extend(strides.iter().flatten());
    debug_assert_eq!(m.len(), GROUP);
    m.push(dims.group() as u32);
    m
}

/// The meta word of the query heads per key/value head, after the heads'
/// strides (1 for multi-head attention).
const GROUP: usize = HEAD_STRIDES + 12;
// `group()` in SIZES reads this word.
const _: () = assert!(GROUP == 28);

/// The meta word where the heads' strides start: after at most 16 words
/// of sizes, offsets and extras (the gradient's 14 at most).
const HEAD_STRIDES: usize = 16;

/// The batch, head and row strides of q, k, v and the cotangent, in
/// elements (zeros for an input a kernel does not read, and along axes of
/// one element).
type Strides = [[u32; 3]; 4];

/// An input's `[B, H, L, w]` heads as the kernels read them, with their
/// batch, head and row strides: in place where each row's `w` elements
/// are adjacent (a projection's `[B, L, H, w]` output viewed as heads, the
/// usual case), else copied dense first.
fn heads(x: &ArrayData, shape: [usize; 4], dtype: Dtype) -> Result<(ArrayData, [u32; 3])> {
    let st = x.strides();
    let in_place = st.len() == 4
        && (shape[3] <= 1 || st[3] == 1)
        && st[..3].iter().all(|&s| s >= 0 && s <= u32::MAX as isize);
    if in_place {
        let strides = [0, 1, 2].map(|a| if shape[a] <= 1 { 0 } else { st[a] as u32 });
        return Ok((x.clone(), strides));
    }
    let data = dense(&Operand::new(x.clone(), &shape, dtype))?;
    let [_, h, l, w] = shape;
    Ok((data, [h * l * w, l * w, w].map(|s| s as u32)))
}

/// The forward's buffers: the packed f32 output and logsumexps, and the
/// output in a half-precision dtype (`[B, Lq, H, dv]`) where one is asked.
struct Forward {
    /// The output then the logsumexps, f32 (the CPU's packed layout).
    packed: ArrayData,
    /// The output in the half-precision dtype, with that dtype.
    half: Option<(ArrayData, Dtype)>,
}

impl Forward {
    /// The buffers for `dims`, the output's copy in `half` if given.
    fn alloc(dims: &AttentionDims, half: Option<Dtype>) -> Result<Forward> {
        let (n_out, n_lse) = dims.packed_len();
        Ok(Forward {
            packed: alloc(&[n_out + n_lse], Dtype::F32)?,
            half: half
                .map(|d| Ok::<_, crate::Error>((alloc(&[n_out], d)?, d)))
                .transpose()?,
        })
    }

    /// Records one forward kernel writing these buffers, `inputs` bound
    /// before them.
    fn dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        meta: &[u32],
        inputs: &[&ArrayData],
        dims: &AttentionDims,
        groups: usize,
    ) -> Result<()> {
        let (n_out, n_lse) = dims.packed_len();
        let half = self.half.as_ref().map(|(h, d)| (h, *d, n_out));
        dispatch_groups_with_half(
            pipeline,
            meta,
            inputs,
            &self.packed,
            (n_out + n_lse) * 4,
            half,
            groups,
        )
    }
}

/// `softmax(scale * q @ k^T [causal]) @ v`, packed as on the CPU: `q`, `k`,
/// `v` of `dtype` (f32, f16 or bf16), the result f32; with a `half` dtype
/// (the node's half-precision output) also the output alone in it, `[B,
/// Lq, H, dv]`, rounded once from the f32 one as a cast would (the model's
/// activations, while the gradient reads the f32 output and logsumexps).
pub fn attention(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
    dtype: Dtype,
    half: Option<Dtype>,
) -> Result<(ArrayData, Option<ArrayData>)> {
    let tuning = settings::gpu_tuning();
    let out = if let Some(f) = fragment::chosen(dtype, &tuning)?
        && let Some(tiles) =
            Tiles::plan_among(&fragments::CANDIDATES, |t| fragments::bytes(dims, t))?
    {
        fragment_attention(q, k, v, dims, half, tiles, f)?
    } else if let Some(tiles) = Tiles::plan(&tuning, |t| forward::bytes(dims, t))? {
        tiled_attention(q, k, v, dims, (dtype, half), tiles)?
    } else {
        LAST_SCALAR_TILES.store(0, Ordering::Relaxed);
        rows::attention(q, k, v, dims, dtype, half)?
    };
    Ok((out.packed, out.half.map(|(h, _)| h)))
}

/// [`attention`] on the f32-compute flash kernel with `tiles`.
fn tiled_attention(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
    (dtype, half): (Dtype, Option<Dtype>),
    tiles: Tiles,
) -> Result<Forward> {
    let (n_out, n_lse) = dims.packed_len();
    let ([q, k, v], strides) = heads_qkv(q, k, v, dims, dtype)?;
    codegen::check_size("attention", n_out + n_lse, &[&q, &k, &v])?;
    let out = Forward::alloc(dims, half)?;
    if n_lse == 0 {
        return Ok(out);
    }
    note_scalar_tiles(tiles);
    let loads = scalar_kernel_loads(dims, &[&q, &k, &v], &strides);
    let key = format!(
        "attention:{}:{}:{dtype}:{half:?}:{tiles:?}:{loads:?}",
        dims.d, dims.dv
    );
    let pipeline =
        context()?.pipeline(&key, || forward::source(dims, (dtype, half), tiles, loads))?;
    let groups = dims.b * dims.h * dims.lq.div_ceil(tiles.bq);
    out.dispatch(
        &pipeline,
        &meta(dims, &[&q, &k, &v], &[], &strides),
        &[&q, &k, &v],
        dims,
        groups,
    )?;
    Ok(out)
}

/// Notes `tiles` as the last f32-compute kernel's.
fn note_scalar_tiles(tiles: Tiles) {
    LAST_SCALAR_TILES.store(tiles.bq << 16 | tiles.bk, Ordering::Relaxed);
}

/// [`attention`] for f16 `q`, `k`, `v` on 16 x 16 fragments (`f`) with
/// tiles `tiles`: the same packed f32 result.
fn fragment_attention(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
    half: Option<Dtype>,
    tiles: Tiles,
    f: Fragments,
) -> Result<Forward> {
    let (n_out, n_lse) = dims.packed_len();
    let ([q, k, v], strides) = heads_qkv(q, k, v, dims, Dtype::F16)?;
    codegen::check_size("attention", n_out + n_lse, &[&q, &k, &v])?;
    let out = Forward::alloc(dims, half)?;
    if n_lse == 0 {
        return Ok(out);
    }
    let loads = fragment_loads(dims, &[&q, &k, &v], &strides);
    let key = format!(
        "attention-fragments:{}:{}:{f:?}:{half:?}:{tiles:?}:{loads:?}",
        dims.d, dims.dv
    );
    let pipeline = context()?.pipeline(&key, || fragments::source(dims, tiles, f, loads, half))?;
    out.dispatch(
        &pipeline,
        &meta(dims, &[&q, &k, &v], &[], &strides),
        &[&q, &k, &v],
        dims,
        dims.b * dims.h * dims.lq.div_ceil(tiles.bq),
    )?;
    FRAGMENT_FORWARDS.fetch_add(1, Ordering::Relaxed);
    Ok(out)
}

/// How the f32-compute kernels read `inputs` of the heads' `strides`
/// ([`staging_loads`]), counted when by quads.
fn scalar_kernel_loads(dims: &AttentionDims, inputs: &[&ArrayData], strides: &Strides) -> Loads {
    let loads = staging_loads(dims, inputs, strides);
    if loads == Loads::Quads {
        SCALAR_QUAD_STAGED.fetch_add(1, Ordering::Relaxed);
    }
    loads
}

/// How a kernel stages `inputs` (q, k, v, and the gradient's f32
/// cotangent) of the heads' `strides`: by quads where the head widths,
/// the inputs' first elements and their strides allow it.
fn staging_loads(dims: &AttentionDims, inputs: &[&ArrayData], strides: &Strides) -> Loads {
    let places: Vec<usize> = inputs
        .iter()
        .map(|d| d.offset())
        .chain(strides.iter().flatten().map(|&s| s as usize))
        .collect();
    Loads::for_inputs(dims.d, dims.dv, &places)
}

/// How the fragment kernels read `inputs` ([`staging_loads`]), counted
/// when by quads.
fn fragment_loads(dims: &AttentionDims, inputs: &[&ArrayData], strides: &Strides) -> Loads {
    let loads = staging_loads(dims, inputs, strides);
    if loads == Loads::Quads {
        QUAD_STAGED.fetch_add(1, Ordering::Relaxed);
    }
    loads
}

/// `q`, `k`, `v` (of `dtype`, shaped as `dims` says) as the kernels read
/// them ([`heads`]), with their strides (the cotangent's zero).
fn heads_qkv(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    dims: &AttentionDims,
    dtype: Dtype,
) -> Result<([ArrayData; 3], Strides)> {
    let [qs, ks, vs] = dims.shapes();
    let (q, sq) = heads(q, qs, dtype)?;
    let (k, sk) = heads(k, ks, dtype)?;
    let (v, sv) = heads(v, vs, dtype)?;
    Ok(([q, k, v], [sq, sk, sv, [0; 3]]))
}
