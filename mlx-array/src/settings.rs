//! Every environment variable mlx-array reads, in one place. Each has a
//! setter that wins over the environment, for programs that configure
//! themselves. A value that is not understood is an error naming the
//! variable: [`check`] reports it, and so does the first [`eval`](fn@crate::eval)
//! of the process, instead of silently using a default.
//!
//! | variable | values | default | setter |
//! |---|---|---|---|
//! | `MLX_OVERLAP` | `1`/`0` (`on`/`off`, `true`/`false`) | on | [`set_overlap`] |
//! | `MLX_PROFILE` | `1`/`0` | off; on: every primitive timed ([`crate::profile`]), GPU ones by timestamp queries around their compute passes where the adapter has `TIMESTAMP_QUERY` (set it before the GPU's first use; each eval then waits for its GPU work) | [`set_profile`] |
//! | `MLX_LCE` | `fused`, `blas` | `fused` where the CPU has AVX-512 | [`set_loss_path`] |
//! | `MLX_BLAS` | a CBLAS library's path, or `none` | OpenBLAS, or Accelerate on macOS | [`set_blas`] |
//! | `MLX_GEMM_BF16` | `1`/`0` | on: bfloat16 products (matmul, the one-pass output projection + loss) on AVX512_BF16 where the CPU has it (off: convert to f32 for the BLAS and the f32 kernels) | [`set_bf16_gemm`] |
//! | `MLX_AMX` | `1`/`0` | on: those bfloat16 products on AMX tiles where the CPU and OS offer them (off: AVX512_BF16 alone) | [`set_amx`] |
//! | `MLX_GPU_F16` | `1`/`0` | on: `f16` stored as WGSL `f16` where the GPU adapter has `shader-f16` (off: packed two to a 32-bit word) | [`set_gpu_f16`] |
//! | `MLX_GPU_COOPMAT` | `1`/`0`/`plain` | `1`: f16 matrix products and f16 attention (forward and gradient) on cooperative matrices (tensor cores) where the GPU adapter has them; `0`: the f32-compute kernels always; `plain`: the cooperative kernels' templates with plain-WGSL fragments on any adapter (for tests) | [`set_gpu_coopmat`] |
//! | `MLX_GPU_CHUNKS` | `1`/`0` | on: an eval's GPU work is submitted in chunks as it is recorded, so the GPU runs while the host records (off: one submission at the eval's end) | [`set_gpu_chunks`] |
//! | `MLX_GPU_SPLIT_K` | `1`/`0` | on: GPU matrix products with few output tiles and a long depth are split over the depth (off: one workgroup per output tile) | [`set_gpu_split_k`] |
//! | `MLX_GPU_SPLIT_WAVE` | a count of workgroups | 528 (4 per SM of an H100's 132): how many 64 x 64 output tiles one wave of the GPU holds; split-K takes the most depth slices that fit in it (for measuring the best figure on a device) | [`set_gpu_split_wave`] |
//! | `MLX_GPU_COOP_SUBGROUPS` | `4`, `8` | `4`: the tensor-core matrix product's 128 x 128 tiles run 4 subgroups of 64 x 64 (4 x 4 fragments each); `8`: 8 subgroups of 32 x 64 (2 x 4), the kernel measured on the H100 on 2026-11-26 (for measuring the better on a device) | [`set_gpu_coop_subgroups`] |
//! | `MLX_GPU_COOP_DOUBLE_BUFFER` | `1`/`0` | on: the tensor-core matrix product stages its operands' depth slices in two buffers where they fit the workgroup memory (one barrier a slice; off: one buffer, two barriers a slice, and more room for the output's staging fragments; for measuring the better on a device) | [`set_gpu_coop_double_buffer`] |
//! | `MLX_GPU_COOP_TILE` | `128x128`, `256x128` | `128x128`: the tensor-core matrix product's large tile (its subgroups as `MLX_GPU_COOP_SUBGROUPS` says); `256x128`: 8 subgroups of 64 x 64, one staged buffer (a quarter fewer staging loads and stores per product; for measuring the better on a device) | [`set_gpu_coop_tile`] |
//! | `MLX_GPU_F32_TILE` | `128x128`, `128x64`, `128x128/128`, `256x128` | `128x128`: the f32-compute matrix product's large tile runs 16 x 16 invocations of 8 x 8 outputs; `128x64`: 8 x 4 outputs each (fewer registers, more workgroups per SM); `128x128/128`: 128 invocations of 16 x 8 (more products per workgroup-memory read); `256x128`: 256 of 16 x 8, one staged buffer (for measuring the best on a device) | [`set_gpu_f32_tile`] |
//! | `MLX_GPU_ATTENTION_TILES` | `auto`, or `BQxBK` of `64x32`, `32x32`, `32x16`, `16x16` | `auto`: the largest tiles that fit the workgroup memory; a pair: the f32-compute attention kernels (forward and both gradient passes) take these tiles where they fit (for measuring the best on a device) | [`set_gpu_attention_tiles`] |
//! | `MLX_GPU_CHECKED` | `auto`/`1`/`0` | `auto` (default): GPU kernels compiled with wgpu's runtime checks (each dynamic index clamped into its array, each loop given a guard counter), except the tensor-core matrix products (1.42x faster without them on an H200); `1`: every kernel with them; `0`: none (to measure their cost on a device; on lavapipe the f16 fragment kernels then take minutes to compile) | [`set_gpu_checks`] |
//! | `MLX_GPU_VEC_LOADS` | `1`/`0` | on: the GPU matrix products' and attention kernels' staging loads read whole vectors (4 or 8 elements) along an operand's contiguous dimension where its offset and strides allow (off: one element per load) | [`set_gpu_vec_loads`] |
//! | `MLX_GPU_META_ARENA` | `1`/`0` | on: the small parameter words (`meta`) of a submission's GPU dispatches are packed into shared buffers written once per submission (off: a new buffer per dispatch) | [`set_gpu_meta_arena`] |
//! | `MLX_GPU_SHARED_PASSES` | `1`/`0` | on: consecutive GPU dispatches share one compute pass (off: a pass per dispatch); a pass per dispatch always while timing them for the profile | [`set_gpu_shared_passes`] |
//! | `MLX_GPU_LAYOUT_CACHE` | `1`/`0` | on: each GPU pipeline's bind group layout is kept with the pipeline (off: asked of wgpu at every dispatch) | [`set_gpu_layout_cache`] |
//! | `MLX_DEVICE` | `cpu`, `gpu` | `cpu` | [`crate::device::set_default_device`] |
//!
//! ```
//! mlx_array::settings::set_overlap(false); // plain graph order
//! assert!(!mlx_array::settings::overlap()?);
//! mlx_array::settings::set_overlap(true);
//! # Ok::<(), mlx_array::Error>(())
//! ```

use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use crate::error::{Error, Result};

/// `MLX_OVERLAP`: the evaluator runs what waits for no collective first.
pub const MLX_OVERLAP: &str = "MLX_OVERLAP";
/// `MLX_PROFILE`: time every primitive (on the GPU, by timestamp queries).
pub const MLX_PROFILE: &str = "MLX_PROFILE";
/// `MLX_LCE`: the CPU path of the one-pass output projection and loss.
pub const MLX_LCE: &str = "MLX_LCE";
/// `MLX_BLAS`: the CBLAS library for the matrix multiply.
pub const MLX_BLAS: &str = "MLX_BLAS";
/// `MLX_GEMM_BF16`: bfloat16 products on the CPU's AVX512_BF16 instructions.
pub const MLX_GEMM_BF16: &str = "MLX_GEMM_BF16";
/// `MLX_AMX`: bfloat16 products on the CPU's AMX tiles.
pub const MLX_AMX: &str = "MLX_AMX";
/// `MLX_GPU_F16`: `f16` stored natively on the GPU.
pub const MLX_GPU_F16: &str = "MLX_GPU_F16";
/// `MLX_GPU_COOPMAT`: f16 matrix products and attention on cooperative
/// matrices.
pub const MLX_GPU_COOPMAT: &str = "MLX_GPU_COOPMAT";
/// `MLX_GPU_CHUNKS`: submit an eval's GPU work in chunks as it is recorded.
pub const MLX_GPU_CHUNKS: &str = "MLX_GPU_CHUNKS";
/// `MLX_GPU_SPLIT_K`: split GPU matrix products over their depth.
pub const MLX_GPU_SPLIT_K: &str = "MLX_GPU_SPLIT_K";
/// `MLX_GPU_SPLIT_WAVE`: the 64 x 64 output tiles one wave of the GPU holds.
pub const MLX_GPU_SPLIT_WAVE: &str = "MLX_GPU_SPLIT_WAVE";
/// `MLX_GPU_COOP_SUBGROUPS`: subgroups per 128 x 128 tensor-core tile.
pub const MLX_GPU_COOP_SUBGROUPS: &str = "MLX_GPU_COOP_SUBGROUPS";
/// `MLX_GPU_COOP_TILE`: the tensor-core matrix product's large tile.
pub const MLX_GPU_COOP_TILE: &str = "MLX_GPU_COOP_TILE";
/// `MLX_GPU_F32_TILE`: the f32-compute matrix product's large tile.
pub const MLX_GPU_F32_TILE: &str = "MLX_GPU_F32_TILE";
/// `MLX_GPU_COOP_DOUBLE_BUFFER`: the tensor-core product's staged slices
/// in two buffers.
pub const MLX_GPU_COOP_DOUBLE_BUFFER: &str = "MLX_GPU_COOP_DOUBLE_BUFFER";
/// `MLX_GPU_ATTENTION_TILES`: the f32-compute attention kernels' tiles.
pub const MLX_GPU_ATTENTION_TILES: &str = "MLX_GPU_ATTENTION_TILES";
/// `MLX_GPU_CHECKED`: which GPU kernels are compiled with wgpu's runtime checks.
pub const MLX_GPU_CHECKED: &str = "MLX_GPU_CHECKED";
/// `MLX_GPU_VEC_LOADS`: GPU matrix products stage operands with vector loads.
pub const MLX_GPU_VEC_LOADS: &str = "MLX_GPU_VEC_LOADS";
/// `MLX_GPU_META_ARENA`: pack GPU dispatches' parameter words into shared buffers.
pub const MLX_GPU_META_ARENA: &str = "MLX_GPU_META_ARENA";
/// `MLX_GPU_SHARED_PASSES`: consecutive GPU dispatches share one compute pass.
pub const MLX_GPU_SHARED_PASSES: &str = "MLX_GPU_SHARED_PASSES";
/// `MLX_GPU_LAYOUT_CACHE`: keep each GPU pipeline's bind group layout.
pub const MLX_GPU_LAYOUT_CACHE: &str = "MLX_GPU_LAYOUT_CACHE";
/// `MLX_DEVICE`: the default device.
pub const MLX_DEVICE: &str = "MLX_DEVICE";

/// A boolean read from `name` (`default` when unset or empty).
fn parse_bool(name: &'static str, value: Option<&str>, default: bool) -> Result<bool> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("") => Ok(default),
        Some("1" | "on" | "true" | "yes") => Ok(true),
        Some("0" | "off" | "false" | "no") => Ok(false),
        Some(v) => Err(Error::invalid(
            name,
            format!("`{v}` is not understood: use 1 or 0"),
        )),
    }
}

/// A boolean setting: the setter's value, else the environment's (read once).
struct Flag {
    name: &'static str,
    default: bool,
    /// 0: not set in code; 1: off; 2: on.
    set: AtomicU8,
    env: OnceLock<std::result::Result<bool, String>>,
}

impl Flag {
    const fn new(name: &'static str, default: bool) -> Flag {
        Flag {
            name,
            default,
            set: AtomicU8::new(0),
            env: OnceLock::new(),
        }
    }

    fn get(&self) -> Result<bool> {
        match self.set.load(Ordering::Relaxed) {
            1 => return Ok(false),
            2 => return Ok(true),
            _ => {}
        }
        self.env
            .get_or_init(|| {
                let v = std::env::var(self.name).ok();
                parse_bool(self.name, v.as_deref(), self.default).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|message| Error::invalid(self.name, message))
    }

    fn set(&self, on: bool) {
        self.set.store(if on { 2 } else { 1 }, Ordering::Relaxed);
    }
}

/// A setting of a few named values: the setter's value, else the
/// environment's, read and `parse`d once.
struct Choice<T: 'static> {
    name: &'static str,
    /// Every value, in the order `set` numbers them.
    values: &'static [T],
    parse: fn(Option<&str>) -> Result<T>,
    /// 0: not set in code; else 1 + the value's index in `values`.
    set: AtomicU8,
    env: OnceLock<std::result::Result<T, String>>,
}

impl<T: Copy + PartialEq> Choice<T> {
    const fn new(
        name: &'static str,
        values: &'static [T],
        parse: fn(Option<&str>) -> Result<T>,
    ) -> Choice<T> {
        Choice {
            name,
            values,
            parse,
            set: AtomicU8::new(0),
            env: OnceLock::new(),
        }
    }

    fn get(&self) -> Result<T> {
        match self.set.load(Ordering::Relaxed) {
            0 => self
                .env
                .get_or_init(|| {
                    (self.parse)(std::env::var(self.name).ok().as_deref())
                        .map_err(|e| e.to_string())
                })
                .clone()
                .map_err(|message| Error::invalid(self.name, message)),
            n => Ok(self.values[n as usize - 1]),
        }
    }

    fn set(&self, value: T) {
        let i = self.values.iter().position(|v| *v == value);
        let i = i.expect("every value of a choice is listed");
        self.set.store(i as u8 + 1, Ordering::Relaxed);
    }

    /// `Some`: as [`Choice::set`]; `None`: back to the environment's value.
    fn set_or_unset(&self, value: Option<T>) {
        match value {
            Some(v) => self.set(v),
            None => self.set.store(0, Ordering::Relaxed),
        }
    }
}

static OVERLAP: Flag = Flag::new(MLX_OVERLAP, true);
static PROFILE: Flag = Flag::new(MLX_PROFILE, false);
static BF16_GEMM: Flag = Flag::new(MLX_GEMM_BF16, true);

/// Whether bfloat16 matrix products use AVX512_BF16's instructions where the
/// CPU has them (default), or convert to f32 for the BLAS. An unreadable
/// `MLX_GEMM_BF16` counts as the default here; [`check`] reports it.
pub fn bf16_gemm() -> bool {
    BF16_GEMM.get().unwrap_or(true)
}

/// Chooses the bfloat16 product path (wins over `MLX_GEMM_BF16`).
pub fn set_bf16_gemm(on: bool) {
    BF16_GEMM.set(on);
}

static AMX: Flag = Flag::new(MLX_AMX, true);

/// Whether bfloat16 matrix products use AMX tiles where the CPU and the
/// operating system offer them (default), or AVX512_BF16 alone. Read once,
/// at the first bfloat16 product: set it before. An unreadable `MLX_AMX`
/// counts as the default here; [`check`] reports it.
pub fn amx() -> bool {
    AMX.get().unwrap_or(true)
}

/// Chooses whether bfloat16 products may use AMX (wins over `MLX_AMX`;
/// takes effect only before the first bfloat16 product).
pub fn set_amx(on: bool) {
    AMX.set(on);
}

static GPU_F16: Flag = Flag::new(MLX_GPU_F16, true);

/// Whether `f16` arrays are stored as WGSL `f16` on a GPU adapter with
/// `shader-f16` (default), or packed two to a 32-bit word as `bf16` is.
/// Read when the GPU is first used: set it before. An unreadable
/// `MLX_GPU_F16` counts as the default here; [`check`] reports it.
pub fn gpu_f16() -> bool {
    GPU_F16.get().unwrap_or(true)
}

/// Chooses how the GPU stores `f16` (wins over `MLX_GPU_F16`; takes effect
/// only before the GPU is first used).
pub fn set_gpu_f16(on: bool) {
    GPU_F16.set(on);
}

static GPU_CHUNKS: Flag = Flag::new(MLX_GPU_CHUNKS, true);

/// Whether an eval submits its GPU work in chunks while it records (default),
/// or all at its end (to measure what the overlap gains). An unreadable
/// `MLX_GPU_CHUNKS` counts as the default here; [`check`] reports it.
pub fn gpu_chunks() -> bool {
    GPU_CHUNKS.get().unwrap_or(true)
}

/// Chooses chunked GPU submission (wins over `MLX_GPU_CHUNKS`).
pub fn set_gpu_chunks(on: bool) {
    GPU_CHUNKS.set(on);
}

static GPU_SPLIT_K: Flag = Flag::new(MLX_GPU_SPLIT_K, true);

/// Whether GPU matrix products with few output tiles and a long depth are
/// split over the depth (default), or run one workgroup per output tile
/// (to measure what the split gains). An unreadable `MLX_GPU_SPLIT_K`
/// counts as the default here; [`check`] reports it.
pub fn gpu_split_k() -> bool {
    GPU_SPLIT_K.get().unwrap_or(true)
}

/// Chooses split-K GPU products (wins over `MLX_GPU_SPLIT_K`).
pub fn set_gpu_split_k(on: bool) {
    GPU_SPLIT_K.set(on);
}

/// The large tiles the tensor-core matrix product may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuCoopTile {
    /// `128x128`: 4 subgroups of 64 x 64, or 8 of 32 x 64 (the default;
    /// `MLX_GPU_COOP_SUBGROUPS`).
    Square,
    /// `256x128`: 8 subgroups of 64 x 64.
    Tall,
}

fn parse_coop_tile(value: Option<&str>) -> Result<GpuCoopTile> {
    match value.map(str::trim) {
        None | Some("" | "auto" | "128x128") => Ok(GpuCoopTile::Square),
        Some("256x128") => Ok(GpuCoopTile::Tall),
        Some(v) => Err(Error::invalid(
            MLX_GPU_COOP_TILE,
            format!("`{v}` is not understood: use 128x128 or 256x128"),
        )),
    }
}

static GPU_COOP_TILE: Choice<GpuCoopTile> = Choice::new(
    MLX_GPU_COOP_TILE,
    &[GpuCoopTile::Square, GpuCoopTile::Tall],
    parse_coop_tile,
);

/// The tensor-core matrix product's large tile (see [`GpuCoopTile`]). An
/// unreadable `MLX_GPU_COOP_TILE` counts as the default here; [`check`]
/// reports it.
pub fn gpu_coop_tile() -> GpuCoopTile {
    GPU_COOP_TILE.get().unwrap_or(GpuCoopTile::Square)
}

/// Chooses the tensor-core matrix product's large tile (wins over
/// `MLX_GPU_COOP_TILE`; `None`: back to the environment's or the default;
/// takes effect at the next product).
pub fn set_gpu_coop_tile(tile: Option<GpuCoopTile>) {
    GPU_COOP_TILE.set_or_unset(tile);
}

/// The large tiles the f32-compute matrix product may take (products with
/// enough of them; smaller ones take 64 x 64 tiles of 16 x 16
/// invocations).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuF32Tile {
    /// `128x128`: 16 x 16 invocations of 8 x 8 outputs (the default).
    Square,
    /// `128x64`: 16 x 16 invocations of 8 x 4 outputs.
    Half,
    /// `128x128/128`: 8 x 16 invocations of 16 x 8 outputs.
    Narrow,
    /// `256x128`: 16 x 16 invocations of 16 x 8 outputs, one staged buffer
    /// (two would need 50,176 bytes of workgroup memory).
    Tall,
}

impl GpuF32Tile {
    /// Every value, with the name `MLX_GPU_F32_TILE` spells it.
    pub const ALL: [(GpuF32Tile, &'static str); 4] = [
        (GpuF32Tile::Square, "128x128"),
        (GpuF32Tile::Half, "128x64"),
        (GpuF32Tile::Narrow, "128x128/128"),
        (GpuF32Tile::Tall, "256x128"),
    ];
}

fn parse_f32_tile(value: Option<&str>) -> Result<GpuF32Tile> {
    match value.map(str::trim) {
        None | Some("" | "auto") => Ok(GpuF32Tile::Square),
        Some(v) => GpuF32Tile::ALL
            .iter()
            .find(|(_, name)| *name == v)
            .map(|(t, _)| *t)
            .ok_or_else(|| {
                Error::invalid(
                    MLX_GPU_F32_TILE,
                    format!("`{v}` is not understood: use 128x128, 128x64, 128x128/128 or 256x128"),
                )
            }),
    }
}

static GPU_F32_TILE: Choice<GpuF32Tile> = Choice::new(
    MLX_GPU_F32_TILE,
    &[
        GpuF32Tile::Square,
        GpuF32Tile::Half,
        GpuF32Tile::Narrow,
        GpuF32Tile::Tall,
    ],
    parse_f32_tile,
);

/// The f32-compute matrix product's large tile (see [`GpuF32Tile`]). An
/// unreadable `MLX_GPU_F32_TILE` counts as the default here; [`check`]
/// reports it.
pub fn gpu_f32_tile() -> GpuF32Tile {
    GPU_F32_TILE.get().unwrap_or(GpuF32Tile::Square)
}

/// Chooses the f32-compute matrix product's large tile (wins over
/// `MLX_GPU_F32_TILE`; `None`: back to the environment's or the default;
/// takes effect at the next product).
pub fn set_gpu_f32_tile(tile: Option<GpuF32Tile>) {
    GPU_F32_TILE.set_or_unset(tile);
}

static GPU_COOP_DOUBLE_BUFFER: Flag = Flag::new(MLX_GPU_COOP_DOUBLE_BUFFER, true);

/// Whether the tensor-core matrix product stages its operands' depth
/// slices in two buffers where they fit the workgroup memory (default: one
/// barrier a slice), or in one (two barriers a slice, more room for the
/// output's staging fragments). An unreadable `MLX_GPU_COOP_DOUBLE_BUFFER`
/// counts as the default here; [`check`] reports it.
pub fn gpu_coop_double_buffer() -> bool {
    GPU_COOP_DOUBLE_BUFFER.get().unwrap_or(true)
}

/// Chooses the tensor-core product's buffers (wins over
/// `MLX_GPU_COOP_DOUBLE_BUFFER`; takes effect at the next product).
pub fn set_gpu_coop_double_buffer(on: bool) {
    GPU_COOP_DOUBLE_BUFFER.set(on);
}

/// The split-K wave's default: 4 workgroups of 64 x 64 tiles on each of
/// an H100's 132 SMs.
const DEFAULT_SPLIT_WAVE: usize = 4 * 132;

/// 0: not set in code; else the count.
static GPU_SPLIT_WAVE_SET: AtomicUsize = AtomicUsize::new(0);
static GPU_SPLIT_WAVE_ENV: OnceLock<std::result::Result<usize, String>> = OnceLock::new();

/// A positive count from `name` (`default` when unset or empty).
fn parse_count(name: &'static str, value: Option<&str>, default: usize) -> Result<usize> {
    match value.map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(Error::invalid(
                name,
                format!("`{v}` is not understood: use a positive whole number"),
            )),
        },
    }
}

/// A count setting: the value `set` in code (0: none), else variable
/// `name` of the environment, read and `parse`d once into `env`.
fn count_setting(
    set: &AtomicUsize,
    env: &OnceLock<std::result::Result<usize, String>>,
    name: &'static str,
    parse: impl FnOnce(Option<&str>) -> Result<usize>,
) -> Result<usize> {
    match set.load(Ordering::Relaxed) {
        0 => env
            .get_or_init(|| parse(std::env::var(name).ok().as_deref()).map_err(|e| e.to_string()))
            .clone()
            .map_err(|message| Error::invalid(name, message)),
        n => Ok(n),
    }
}

fn gpu_split_wave_checked() -> Result<usize> {
    count_setting(
        &GPU_SPLIT_WAVE_SET,
        &GPU_SPLIT_WAVE_ENV,
        MLX_GPU_SPLIT_WAVE,
        |v| parse_count(MLX_GPU_SPLIT_WAVE, v, DEFAULT_SPLIT_WAVE),
    )
}

/// How many workgroups of 64 x 64 output tiles one wave of the GPU holds
/// (default 528, the H100's 132 SMs with 4 each): split-K cuts a product's
/// depth into as many slices as fit in one wave. An unreadable
/// `MLX_GPU_SPLIT_WAVE` counts as the default here; [`check`] reports it.
pub fn gpu_split_wave() -> usize {
    gpu_split_wave_checked().unwrap_or(DEFAULT_SPLIT_WAVE)
}

/// Sets the split-K wave (wins over `MLX_GPU_SPLIT_WAVE`; `None`: back to
/// the environment's or the default). Takes effect at the next product.
pub fn set_gpu_split_wave(workgroups: Option<usize>) {
    GPU_SPLIT_WAVE_SET.store(workgroups.unwrap_or(0), Ordering::Relaxed);
}

/// The subgroup counts the tensor-core kernel's 128 x 128 tiles may run.
pub const GPU_COOP_SUBGROUPS: [usize; 2] = [4, 8];

/// 0: not set in code; else the count.
static GPU_COOP_SUBGROUPS_SET: AtomicUsize = AtomicUsize::new(0);
static GPU_COOP_SUBGROUPS_ENV: OnceLock<std::result::Result<usize, String>> = OnceLock::new();

fn parse_coop_subgroups(value: Option<&str>) -> Result<usize> {
    match value.map(str::trim) {
        None | Some("") => Ok(GPU_COOP_SUBGROUPS[0]),
        Some(v) => GPU_COOP_SUBGROUPS
            .iter()
            .find(|n| n.to_string() == v)
            .copied()
            .ok_or_else(|| {
                Error::invalid(
                    MLX_GPU_COOP_SUBGROUPS,
                    format!("`{v}` is not understood: use 4 or 8"),
                )
            }),
    }
}

fn gpu_coop_subgroups_checked() -> Result<usize> {
    count_setting(
        &GPU_COOP_SUBGROUPS_SET,
        &GPU_COOP_SUBGROUPS_ENV,
        MLX_GPU_COOP_SUBGROUPS,
        parse_coop_subgroups,
    )
}

/// Subgroups of 32 per 128 x 128 tile of the tensor-core matrix product:
/// 4 (default), each owning 64 x 64 outputs, or 8, each owning 32 x 64.
/// An unreadable `MLX_GPU_COOP_SUBGROUPS` counts as the default here;
/// [`check`] reports it.
pub fn gpu_coop_subgroups() -> usize {
    gpu_coop_subgroups_checked().unwrap_or(GPU_COOP_SUBGROUPS[0])
}

/// Sets the tensor-core tiles' subgroups (wins over
/// `MLX_GPU_COOP_SUBGROUPS`; `None`: back to the environment's or the
/// default). An error for a count not in [`GPU_COOP_SUBGROUPS`].
pub fn set_gpu_coop_subgroups(subgroups: Option<usize>) -> Result<()> {
    if let Some(n) = subgroups
        && !GPU_COOP_SUBGROUPS.contains(&n)
    {
        return Err(Error::invalid(
            MLX_GPU_COOP_SUBGROUPS,
            format!("{n} is not one of 4, 8"),
        ));
    }
    GPU_COOP_SUBGROUPS_SET.store(subgroups.unwrap_or(0), Ordering::Relaxed);
    Ok(())
}

/// The tiles the f32-compute attention kernels may be told to take: query
/// rows by key rows, as `MLX_GPU_ATTENTION_TILES` spells them.
pub const GPU_ATTENTION_TILES: [(usize, usize); 4] = [(64, 32), (32, 32), (32, 16), (16, 16)];

/// 0: not set in code; 1: auto; else 2 + an index into [`GPU_ATTENTION_TILES`].
static GPU_ATTENTION_TILES_SET: AtomicU8 = AtomicU8::new(0);
static GPU_ATTENTION_TILES_ENV: OnceLock<std::result::Result<Option<(usize, usize)>, String>> =
    OnceLock::new();

fn parse_attention_tiles(value: Option<&str>) -> Result<Option<(usize, usize)>> {
    let v = value.map(|v| v.trim().to_ascii_lowercase());
    match v.as_deref() {
        None | Some("" | "auto") => Ok(None),
        Some(v) => GPU_ATTENTION_TILES
            .iter()
            .find(|(q, k)| format!("{q}x{k}") == v)
            .map(|&t| Some(t))
            .ok_or_else(|| {
                Error::invalid(
                    MLX_GPU_ATTENTION_TILES,
                    format!("`{v}` is not understood: use auto, 64x32, 32x32, 32x16 or 16x16"),
                )
            }),
    }
}

fn gpu_attention_tiles_checked() -> Result<Option<(usize, usize)>> {
    match GPU_ATTENTION_TILES_SET.load(Ordering::Relaxed) {
        0 => GPU_ATTENTION_TILES_ENV
            .get_or_init(|| {
                parse_attention_tiles(std::env::var(MLX_GPU_ATTENTION_TILES).ok().as_deref())
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|message| Error::invalid(MLX_GPU_ATTENTION_TILES, message)),
        1 => Ok(None),
        i => Ok(GPU_ATTENTION_TILES.get(i as usize - 2).copied()),
    }
}

/// The tiles (query rows, key rows) the f32-compute attention kernels
/// take where they fit the workgroup memory, or `None` for the largest
/// that fit (default). An unreadable `MLX_GPU_ATTENTION_TILES` counts as
/// the default here; [`check`] reports it.
pub fn gpu_attention_tiles() -> Option<(usize, usize)> {
    gpu_attention_tiles_checked().unwrap_or(None)
}

/// Chooses the f32-compute attention kernels' tiles (wins over
/// `MLX_GPU_ATTENTION_TILES`; `None`: the largest that fit). An error for
/// a pair not in [`GPU_ATTENTION_TILES`].
pub fn set_gpu_attention_tiles(tiles: Option<(usize, usize)>) -> Result<()> {
    let v = match tiles {
        None => 1,
        Some(t) => match GPU_ATTENTION_TILES.iter().position(|&c| c == t) {
            Some(i) => 2 + i as u8,
            None => {
                return Err(Error::invalid(
                    MLX_GPU_ATTENTION_TILES,
                    format!("{}x{} is not one of 64x32, 32x32, 32x16, 16x16", t.0, t.1),
                ));
            }
        },
    };
    GPU_ATTENTION_TILES_SET.store(v, Ordering::Relaxed);
    Ok(())
}

/// Which GPU kernels are compiled with wgpu's runtime checks
/// (`MLX_GPU_CHECKED`): each dynamic index into a workgroup or local array
/// clamped into it, each loop given a guard counter, and storage accesses
/// clamped where the driver does not bound them itself (robust buffer
/// access). Every kernel is generated by this crate, not taken from users,
/// and bounds its own indices (workgroup arrays indexed within tiles whose
/// sizes are constants of the text, storage reads and writes guarded by
/// the sizes in its meta words, every loop a finite count).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuChecks {
    /// Every kernel but the tensor-core matrix products (default,
    /// `auto`): the cooperative-matrix products (f16, on adapters that
    /// have them), whose every workgroup index is a constant of their
    /// tiling plus the invocation's, run without the checks. On an H200 the
    /// 8192^3 f16 product ran at 144 TFLOP/s without them and 101 with
    /// them (2026-11-27); the f32 kernels measured the same either way.
    /// Adapters without cooperative matrices (lavapipe) never compile one.
    Auto,
    /// Every kernel (`1`).
    All,
    /// None (`0`): to measure what the checks cost. On lavapipe, LLVM 15
    /// unrolls the unguarded loops of the f16 fragment kernels and then
    /// spends minutes compiling them.
    None,
}

impl GpuChecks {
    /// Whether a kernel is compiled with the checks: a tensor-core
    /// (cooperative-matrix) matrix product with `tensor_cores`.
    pub fn checks(self, tensor_cores: bool) -> bool {
        match self {
            GpuChecks::Auto => !tensor_cores,
            GpuChecks::All => true,
            GpuChecks::None => false,
        }
    }
}

fn parse_gpu_checks(value: Option<&str>) -> Result<GpuChecks> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "auto") => Ok(GpuChecks::Auto),
        v => parse_bool(MLX_GPU_CHECKED, v, true)
            .map(|on| if on { GpuChecks::All } else { GpuChecks::None })
            .map_err(|_| {
                Error::invalid(
                    MLX_GPU_CHECKED,
                    format!(
                        "`{}` is not understood: use auto, 1 or 0",
                        v.unwrap_or_default()
                    ),
                )
            }),
    }
}

static GPU_CHECKS: Choice<GpuChecks> = Choice::new(
    MLX_GPU_CHECKED,
    &[GpuChecks::Auto, GpuChecks::All, GpuChecks::None],
    parse_gpu_checks,
);

/// Which GPU kernels are compiled with wgpu's runtime checks (see
/// [`GpuChecks`]). Read when a kernel is compiled. An unreadable
/// `MLX_GPU_CHECKED` counts as the default here; [`check`] reports it.
pub fn gpu_checks() -> GpuChecks {
    GPU_CHECKS.get().unwrap_or(GpuChecks::Auto)
}

/// Chooses which GPU kernels are compiled with wgpu's runtime checks
/// (wins over `MLX_GPU_CHECKED`; kernels compiled from then on).
pub fn set_gpu_checks(checks: GpuChecks) {
    GPU_CHECKS.set(checks);
}

static GPU_VEC_LOADS: Flag = Flag::new(MLX_GPU_VEC_LOADS, true);

/// Whether GPU matrix products and attention kernels stage an operand with vector loads along
/// its contiguous dimension where its offset and strides allow (default),
/// or one element per load always (to measure what the vectors gain). An
/// unreadable `MLX_GPU_VEC_LOADS` counts as the default here; [`check`]
/// reports it.
pub fn gpu_vec_loads() -> bool {
    GPU_VEC_LOADS.get().unwrap_or(true)
}

/// Chooses vector staging loads in GPU products (wins over
/// `MLX_GPU_VEC_LOADS`; takes effect at the next product).
pub fn set_gpu_vec_loads(on: bool) {
    GPU_VEC_LOADS.set(on);
}

static GPU_META_ARENA: Flag = Flag::new(MLX_GPU_META_ARENA, true);

/// Whether the parameter words (`meta`) of a submission's GPU dispatches
/// are packed into shared buffers written once per submission (default),
/// or each dispatch makes a buffer of its own (to measure what the arena
/// gains). An unreadable `MLX_GPU_META_ARENA` counts as the default here;
/// [`check`] reports it.
pub fn gpu_meta_arena() -> bool {
    GPU_META_ARENA.get().unwrap_or(true)
}

/// Chooses the meta arena (wins over `MLX_GPU_META_ARENA`; takes effect at
/// the next dispatch).
pub fn set_gpu_meta_arena(on: bool) {
    GPU_META_ARENA.set(on);
}

static GPU_SHARED_PASSES: Flag = Flag::new(MLX_GPU_SHARED_PASSES, true);

/// Whether consecutive GPU dispatches share one compute pass (default), or
/// every dispatch has a pass of its own (to measure what sharing gains). Dispatches timed for the profile always have their
/// own pass. An unreadable `MLX_GPU_SHARED_PASSES` counts as the default
/// here; [`check`] reports it.
pub fn gpu_shared_passes() -> bool {
    GPU_SHARED_PASSES.get().unwrap_or(true)
}

/// Chooses shared compute passes (wins over `MLX_GPU_SHARED_PASSES`; takes
/// effect at the next dispatch).
pub fn set_gpu_shared_passes(on: bool) {
    GPU_SHARED_PASSES.set(on);
}

static GPU_LAYOUT_CACHE: Flag = Flag::new(MLX_GPU_LAYOUT_CACHE, true);

/// Whether each GPU pipeline's bind group layout is kept with it (default),
/// or asked of wgpu at every dispatch (to measure what keeping it gains).
/// An unreadable `MLX_GPU_LAYOUT_CACHE` counts as the default here;
/// [`check`] reports it.
pub fn gpu_layout_cache() -> bool {
    GPU_LAYOUT_CACHE.get().unwrap_or(true)
}

/// Chooses whether bind group layouts are kept (wins over
/// `MLX_GPU_LAYOUT_CACHE`; takes effect at the next dispatch).
pub fn set_gpu_layout_cache(on: bool) {
    GPU_LAYOUT_CACHE.set(on);
}

/// How the GPU multiplies `f16` matrices, in products and attention
/// (`MLX_GPU_COOPMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuCoopmat {
    /// On cooperative matrices (tensor cores) where the adapter has them,
    /// else the f32-compute kernel (default, `1`).
    Auto,
    /// The f32-compute kernel always (`0`).
    Off,
    /// The cooperative kernel's template with plain-WGSL fragments, on any
    /// adapter (`plain`): the tiling, staging and edges that the tensor-core
    /// kernel runs, testable where no adapter has cooperative matrices.
    Plain,
}

fn parse_gpu_coopmat(value: Option<&str>) -> Result<GpuCoopmat> {
    if value.is_some_and(|v| v.trim().eq_ignore_ascii_case("plain")) {
        return Ok(GpuCoopmat::Plain);
    }
    parse_bool(MLX_GPU_COOPMAT, value, true).map(|on| {
        if on {
            GpuCoopmat::Auto
        } else {
            GpuCoopmat::Off
        }
    })
}

static GPU_COOPMAT: Choice<GpuCoopmat> = Choice::new(
    MLX_GPU_COOPMAT,
    &[GpuCoopmat::Auto, GpuCoopmat::Off, GpuCoopmat::Plain],
    parse_gpu_coopmat,
);

/// How the GPU multiplies `f16` matrices (see [`GpuCoopmat`]). An
/// unreadable `MLX_GPU_COOPMAT` counts as the default here; [`check`]
/// reports it.
pub fn gpu_coopmat() -> GpuCoopmat {
    GPU_COOPMAT.get().unwrap_or(GpuCoopmat::Auto)
}

/// Chooses how the GPU multiplies `f16` matrices (wins over
/// `MLX_GPU_COOPMAT`; takes effect at the next product).
pub fn set_gpu_coopmat(mode: GpuCoopmat) {
    GPU_COOPMAT.set(mode);
}

/// Whether the evaluator overlaps communication with computation (runs
/// what waits for no collective first). Default on.
pub fn overlap() -> Result<bool> {
    OVERLAP.get()
}

/// Turns the evaluator's overlap of communication on or off (wins over `MLX_OVERLAP`).
pub fn set_overlap(on: bool) {
    OVERLAP.set(on);
}

/// Whether every primitive is timed (see [`crate::profile`]). Default off.
pub fn profile() -> Result<bool> {
    PROFILE.get()
}

/// Turns the per-primitive profile on or off (wins over `MLX_PROFILE`). GPU
/// execution times need it on before the GPU is first used.
pub fn set_profile(on: bool) {
    PROFILE.set(on);
}

/// The CPU path of the one-pass output projection and loss.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LossPath {
    /// The fused AVX-512 kernel where the CPU has it, else BLAS.
    Fused,
    /// Always BLAS (to compare the two in one build).
    Blas,
}

static LOSS_PATH: Flag = Flag::new(MLX_LCE, false);

fn parse_loss_path(value: Option<&str>) -> Result<LossPath> {
    match value.map(|v| v.trim().to_ascii_lowercase()).as_deref() {
        None | Some("" | "fused") => Ok(LossPath::Fused),
        Some("blas") => Ok(LossPath::Blas),
        Some(v) => Err(Error::invalid(
            MLX_LCE,
            format!("`{v}` is not understood: use fused or blas"),
        )),
    }
}

/// The CPU path of the one-pass loss (`MLX_LCE`).
pub fn loss_path() -> Result<LossPath> {
    match LOSS_PATH.set.load(Ordering::Relaxed) {
        1 => return Ok(LossPath::Fused),
        2 => return Ok(LossPath::Blas),
        _ => {}
    }
    static ENV: OnceLock<std::result::Result<LossPath, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        parse_loss_path(std::env::var(MLX_LCE).ok().as_deref()).map_err(|e| e.to_string())
    })
    .clone()
    .map_err(|m| Error::invalid(MLX_LCE, m))
}

/// Chooses the CPU path of the one-pass loss (wins over `MLX_LCE`).
pub fn set_loss_path(path: LossPath) {
    LOSS_PATH.set(path == LossPath::Blas);
}

/// Which CBLAS library to load.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlasChoice {
    /// The system's (OpenBLAS and kin; Accelerate on macOS).
    System,
    /// None: the pure-Rust GEMM.
    None,
    /// This library (a path or a name the dynamic loader finds).
    Library(String),
}

static BLAS_SET: Mutex<Option<BlasChoice>> = Mutex::new(None);
static BLAS_READ: OnceLock<BlasChoice> = OnceLock::new();

/// The CBLAS library the matrix multiply loads (`MLX_BLAS`). Read once, at
/// the first matrix multiply; [`set_blas`] must come before it.
pub fn blas() -> BlasChoice {
    BLAS_READ
        .get_or_init(|| {
            if let Some(c) = BLAS_SET.lock().unwrap_or_else(|p| p.into_inner()).clone() {
                return c;
            }
            match std::env::var(MLX_BLAS) {
                Ok(v) if v.trim() == "none" => BlasChoice::None,
                Ok(v) if !v.trim().is_empty() => BlasChoice::Library(v.trim().to_string()),
                _ => BlasChoice::System,
            }
        })
        .clone()
}

/// Chooses the CBLAS library (wins over `MLX_BLAS`). An error once the
/// library was loaded: the process keeps the one it has.
pub fn set_blas(choice: BlasChoice) -> Result<()> {
    let mut s = BLAS_SET.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(current) = BLAS_READ.get() {
        if *current == choice {
            return Ok(());
        }
        return Err(Error::invalid(
            MLX_BLAS,
            format!(
                "the BLAS library was already chosen ({current:?}); set it before the first matrix multiply"
            ),
        ));
    }
    *s = Some(choice);
    Ok(())
}

/// Checks every variable above that this module reads, returning the first
/// one that is not understood. The settings are a leaf: what needs more
/// than parsing is checked where it is used (`MLX_DEVICE` by
/// [`crate::device::default_device_from_env`], whether an `MLX_BLAS`
/// library loads by the CPU backend); the first [`eval`](fn@crate::eval)
/// checks all of them.
pub fn check() -> Result<()> {
    overlap()?;
    profile()?;
    BF16_GEMM.get()?;
    AMX.get()?;
    GPU_F16.get()?;
    GPU_CHUNKS.get()?;
    GPU_SPLIT_K.get()?;
    GPU_COOP_DOUBLE_BUFFER.get()?;
    GPU_F32_TILE.get()?;
    GPU_COOP_TILE.get()?;
    GPU_VEC_LOADS.get()?;
    GPU_META_ARENA.get()?;
    GPU_SHARED_PASSES.get()?;
    GPU_LAYOUT_CACHE.get()?;
    GPU_CHECKS.get()?;
    gpu_split_wave_checked()?;
    gpu_attention_tiles_checked()?;
    gpu_coop_subgroups_checked()?;
    GPU_COOPMAT.get()?;
    loss_path()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_take_the_usual_spellings_and_refuse_the_rest() {
        for (v, want) in [
            ("1", true),
            ("on", true),
            ("TRUE", true),
            ("0", false),
            ("off", false),
        ] {
            assert_eq!(parse_bool("X", Some(v), !want).unwrap(), want, "{v}");
        }
        assert!(parse_bool("X", None, true).unwrap());
        assert!(!parse_bool("X", Some(" "), false).unwrap());
        let e = parse_bool("MLX_OVERLAP", Some("maybe"), true).unwrap_err();
        assert!(e.to_string().contains("MLX_OVERLAP"), "{e}");
        assert!(e.to_string().contains("maybe"), "{e}");
    }

    #[test]
    fn the_loss_path_is_fused_or_blas() {
        assert_eq!(parse_loss_path(None).unwrap(), LossPath::Fused);
        assert_eq!(parse_loss_path(Some("BLAS")).unwrap(), LossPath::Blas);
        assert!(
            parse_loss_path(Some("gpu"))
                .unwrap_err()
                .to_string()
                .contains("MLX_LCE")
        );
    }

    #[test]
    fn a_setter_wins_over_the_environment() {
        let f = Flag::new("MLX_TEST_SETTINGS_FLAG_UNSET", true);
        assert!(f.get().unwrap());
        f.set(false);
        assert!(!f.get().unwrap());
    }

    #[test]
    fn a_choice_reads_its_variable_once_and_a_setter_wins() {
        let c = Choice::new(
            "MLX_TEST_SETTINGS_CHOICE_UNSET",
            &[GpuCoopmat::Auto, GpuCoopmat::Off, GpuCoopmat::Plain],
            parse_gpu_coopmat,
        );
        assert_eq!(c.get().unwrap(), GpuCoopmat::Auto);
        for v in [GpuCoopmat::Plain, GpuCoopmat::Off, GpuCoopmat::Auto] {
            c.set(v);
            assert_eq!(c.get().unwrap(), v);
        }
        assert_eq!(
            parse_gpu_coopmat(Some(" PLAIN ")).unwrap(),
            GpuCoopmat::Plain
        );
        assert_eq!(parse_gpu_coopmat(Some("0")).unwrap(), GpuCoopmat::Off);
        let e = parse_gpu_coopmat(Some("tensor")).unwrap_err();
        assert!(e.to_string().contains("MLX_GPU_COOPMAT"), "{e}");
    }

    #[test]
    fn counts_are_positive_whole_numbers() {
        assert_eq!(parse_count("X", None, 528).unwrap(), 528);
        assert_eq!(parse_count("X", Some(" 1056 "), 528).unwrap(), 1056);
        for bad in ["0", "-4", "1.5", "many"] {
            let e = parse_count("MLX_GPU_SPLIT_WAVE", Some(bad), 528).unwrap_err();
            assert!(e.to_string().contains("MLX_GPU_SPLIT_WAVE"), "{e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn coop_subgroups_are_four_or_eight() {
        assert_eq!(parse_coop_subgroups(None).unwrap(), 4);
        assert_eq!(parse_coop_subgroups(Some(" 8 ")).unwrap(), 8);
        for bad in ["2", "16", "four", "-4"] {
            let e = parse_coop_subgroups(Some(bad)).unwrap_err();
            assert!(e.to_string().contains("MLX_GPU_COOP_SUBGROUPS"), "{e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
        assert!(set_gpu_coop_subgroups(Some(6)).is_err());
    }

    #[test]
    fn coop_tiles_are_square_or_tall() {
        assert_eq!(parse_coop_tile(None).unwrap(), GpuCoopTile::Square);
        assert_eq!(
            parse_coop_tile(Some(" 256x128 ")).unwrap(),
            GpuCoopTile::Tall
        );
        let e = parse_coop_tile(Some("128x256")).unwrap_err();
        assert!(e.to_string().contains("MLX_GPU_COOP_TILE"), "{e}");
    }

    #[test]
    fn f32_tiles_are_named_by_their_outputs_and_invocations() {
        assert_eq!(parse_f32_tile(None).unwrap(), GpuF32Tile::Square);
        assert_eq!(parse_f32_tile(Some("auto")).unwrap(), GpuF32Tile::Square);
        for (tile, name) in GpuF32Tile::ALL {
            assert_eq!(parse_f32_tile(Some(&format!(" {name} "))).unwrap(), tile);
        }
        for bad in ["64x64", "128", "128x128/256", "square"] {
            let e = parse_f32_tile(Some(bad)).unwrap_err();
            assert!(e.to_string().contains("MLX_GPU_F32_TILE"), "{e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn runtime_checks_are_auto_all_or_none_and_auto_spares_only_the_tensor_cores() {
        assert_eq!(parse_gpu_checks(None).unwrap(), GpuChecks::Auto);
        assert_eq!(parse_gpu_checks(Some(" Auto ")).unwrap(), GpuChecks::Auto);
        assert_eq!(parse_gpu_checks(Some("1")).unwrap(), GpuChecks::All);
        assert_eq!(parse_gpu_checks(Some("off")).unwrap(), GpuChecks::None);
        let e = parse_gpu_checks(Some("some")).unwrap_err();
        assert!(e.to_string().contains("MLX_GPU_CHECKED"), "{e}");
        assert!(e.to_string().contains("some"), "{e}");
        let table = [
            (GpuChecks::Auto, [true, false]),
            (GpuChecks::All, [true, true]),
            (GpuChecks::None, [false, false]),
        ];
        for (checks, [plain, tensor]) in table {
            assert_eq!(checks.checks(false), plain, "{checks:?}, plain kernels");
            assert_eq!(
                checks.checks(true),
                tensor,
                "{checks:?}, tensor-core kernels"
            );
        }
    }

    #[test]
    fn attention_tiles_are_auto_or_one_of_the_kernels_pairs() {
        assert_eq!(parse_attention_tiles(None).unwrap(), None);
        assert_eq!(parse_attention_tiles(Some("AUTO")).unwrap(), None);
        assert_eq!(
            parse_attention_tiles(Some("32x16")).unwrap(),
            Some((32, 16))
        );
        for bad in ["48x16", "32", "x"] {
            let e = parse_attention_tiles(Some(bad)).unwrap_err();
            assert!(e.to_string().contains("MLX_GPU_ATTENTION_TILES"), "{e}");
        }
        assert!(set_gpu_attention_tiles(Some((48, 16))).is_err());
    }
}
