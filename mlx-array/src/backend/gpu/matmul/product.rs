//! One product's recording: its operands and sizes ([`Product`]), the
//! kernel variant its plan picks (cooperative or f32, tile, staging), how
//! its depth is split (the plan's [`split_k`] or [`split_big`], within the
//! device's buffer limit), its meta words and dispatch, and the sum of a
//! split product's slices.

use super::super::codegen;
use super::super::device::context;
use super::super::dispatch::dispatch_groups;
use super::super::pool::alloc;
use super::plan::{BIG_TILES_FROM, Slices, split_big, split_k};
use super::telemetry::{
    COOP_PRODUCTS, LAST_COOP_BUFFERS, LAST_COOP_STAGED, LAST_COOP_SUBGROUPS, LAST_PRODUCT_TILE,
};
use super::{Destination, View, coop, loads, output_decl, tiled};
use crate::data::ArrayData;
use crate::settings::{GpuCoopTile, GpuTuning};
use crate::{Dtype, Result};

/// The kernel that sums a split product's slices (a template).
const SPLIT_SUM: &str = include_str!("split_sum.wgsl");

/// The f32 buffer of a split product's partial sums (`shape`: flat, every
/// slice's block one after the other), written from its start.
pub(super) fn partial<'a>(parts: &'a ArrayData, shape: &'a [usize]) -> Destination<'a> {
    Destination {
        data: parts,
        shape,
        offset: 0,
        accumulate: false,
        addend: None,
    }
}

/// The operands and sizes of one (batched) product.
pub(super) struct Product<'a> {
    pub(super) a: &'a ArrayData,
    pub(super) b: &'a ArrayData,
    pub(super) dtype: Dtype,
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    /// The output's batch dimensions (the operands' broadcast to them).
    pub(super) batch_shape: &'a [usize],
    /// The tuning its entry point read: the planning's choices.
    pub(super) tuning: &'a GpuTuning,
}

impl<'a> Product<'a> {
    /// `a @ b` in `dtype`, `a` of `a_shape`, into an output of `out_shape`
    /// (its batch dimensions the operands' broadcast).
    pub(super) fn new(
        a: &'a ArrayData,
        b: &'a ArrayData,
        dtype: Dtype,
        a_shape: &[usize],
        out_shape: &'a [usize],
        tuning: &'a GpuTuning,
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
            tuning,
        }
    }

    pub(super) fn batch(&self) -> usize {
        self.batch_shape.iter().product()
    }

    /// The output's elements.
    pub(super) fn total(&self) -> usize {
        self.batch() * self.m * self.n
    }

    /// Whether there are enough 128 x 128 output tiles for the big kernel.
    pub(super) fn big(&self) -> bool {
        self.batch() * self.m.div_ceil(128) * self.n.div_ceil(128) >= BIG_TILES_FROM
    }

    /// Records the product into `to` as `out_dtype` on the cooperative
    /// kernel with `coop`, else on the f32 kernel: split over the depth
    /// when it has too few output tiles ([`Product::depth_split`]: f32
    /// partial sums written by the same kernel, then summed in order into
    /// `to`), else whole, on 128 x 128 tiles when there are enough of them.
    pub(super) fn record(
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
        if !big {
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
}

impl Product<'_> {
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
        let wave = self.tuning.split_wave;
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
        let limit = super::super::device::workgroup_memory_limit()?;
        let (pipeline, tm, tn) = match coop {
            Some(fragments) => {
                let subgroups = self.tuning.coop_subgroups;
                let tiling = if t == 128 {
                    // The tall tiling where it fits, else the default.
                    let large = coop::Tiling::large(self.tuning.coop_tile, subgroups);
                    if large.shared_bytes() <= limit {
                        large
                    } else {
                        coop::Tiling::large(GpuCoopTile::Square, subgroups)
                    }
                } else {
                    coop::Tiling::SMALL
                };
                let staging = coop::Staging::choose(tiling, limit, self.tuning.coop_double_buffer);
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
                    tiled::large_tile(self.tuning.f32_tile)
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
        s.push_str(&codegen::fill(
            SPLIT_SUM,
            &[
                (
                    "output",
                    &output_decl(2, dtype, epilogue, "bitcast<i32>(params[3])"),
                ),
                ("entry", codegen::ENTRY),
                ("index", codegen::THREAD_INDEX),
            ],
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
    super::super::dispatch::dispatch(
        &pipeline,
        &meta,
        &inputs,
        out,
        total * stored.size_of(),
        codegen::packed(stored),
        total,
    )
}
