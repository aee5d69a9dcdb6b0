//! Gathers, scatters and placements: `take`, `take_along_axis`,
//! `scatter_add`, `concatenate`, `pad` and `slice_update`.
//!
//! Every input is read through its view (offset, shape and strides in
//! `params`, found with `vloc`). Negative indices count from the end as on
//! the CPU; the CPU rejects out-of-range indices at eval, which a kernel
//! cannot do without a round trip, so here they read as zero (gathers) or
//! are skipped (scatters) and never touch memory outside the arrays.

use super::codegen::{self, compute_type};
use super::device::context;
use super::dispatch::dispatch;
use super::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::dtype::{Element, cast};
use crate::shape::{contiguous_strides, size_of_shape};
use crate::{Dtype, Error, Result};

/// WGSL of `take` (a template).
const INDEXING_TAKE_WGSL: &str = include_str!("take.wgsl");

/// WGSL of `scatter_add`.
const INDEXING_SCATTER_ADD_WGSL: &str = include_str!("scatter_add.wgsl");

/// WGSL of `take_along_axis` (a template).
const INDEXING_TAKE_ALONG_AXIS_WGSL: &str = include_str!("take_along_axis.wgsl");

/// WGSL of `pad` (a template).
const INDEXING_PAD_WGSL: &str = include_str!("pad.wgsl");

/// WGSL of `slice_update`.
const INDEXING_SLICE_UPDATE_WGSL: &str = include_str!("slice_update.wgsl");

/// Kernel parameters under construction: scalars first, then view
/// descriptors `[ndim, shape.., offset, strides..]` appended by [`Meta::view`].
pub(crate) struct Meta(pub(crate) Vec<u32>);

impl Meta {
    /// Appends a descriptor of `data` viewed as `shape`; returns its position.
    pub(crate) fn view(&mut self, data: &ArrayData, shape: &[usize]) -> u32 {
        self.raw(shape, data.offset(), data.strides())
    }

    /// Appends a descriptor from explicit parts; returns its position.
    pub(crate) fn raw(&mut self, shape: &[usize], offset: usize, strides: &[isize]) -> u32 {
        let at = self.0.len() as u32;
        self.0.push(shape.len() as u32);
        self.0.extend(shape.iter().map(|&s| s as u32));
        self.0.push(offset as u32);
        self.0.extend(strides.iter().map(|&s| s as i32 as u32));
        at
    }

    /// Appends plain values; returns the position of the first.
    pub(crate) fn list(&mut self, v: impl IntoIterator<Item = usize>) -> u32 {
        let at = self.0.len() as u32;
        self.0.extend(v.into_iter().map(|x| x as u32));
        at
    }
}

/// `vloc(i, base)`: the buffer element at row-major position `i` of the
/// view described at `params[base]`.
pub(crate) const VLOC: &str = include_str!("vloc.wgsl");

/// `idx_at(j) -> i32`: index `j` of the input `idx` (i32 or u32; u32 values
/// beyond `i32::MAX` become an out-of-range sentinel).
pub(crate) fn index_input(binding: u32, d: Dtype) -> Result<String> {
    let body = match d {
        Dtype::I32 => "return load_idx(j);",
        Dtype::U32 => {
            "let v = load_idx(j); return select(bitcast<i32>(0x80000000u), bitcast<i32>(v), v < 0x80000000u);"
        }
        _ => {
            supported(d)?;
            return Err(Error::gpu(format!("indices must be i32 or u32, got {d}")));
        }
    };
    Ok(format!(
        "{}fn idx_at(j: u32) -> i32 {{ {body} }}\n",
        codegen::input("idx", binding, d)
    ))
}

/// The zero of a compute type.
pub(crate) fn zero(d: Dtype) -> &'static str {
    match compute_type(d) {
        "f32" => "0.0",
        "i32" => "0",
        _ => "0u",
    }
}

/// Header every kernel here starts with.
pub(crate) fn header() -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    s.push_str(VLOC);
    s
}

/// The kernel body opening: `i` is the thread, `params[0]` the thread count.
pub(crate) fn entry() -> String {
    format!(
        "{} {{\n    {}\n    if (i >= params[0]) {{ return; }}\n",
        codegen::ENTRY,
        codegen::THREAD_INDEX
    )
}

/// `take` along `axis`: output `a[..axis] + idx + a[axis+1..]`.
pub fn take(
    a: &Operand<'_>,
    idx: &Operand<'_>,
    axis: usize,
    out_shape: &[usize],
) -> Result<ArrayData> {
    let (a_shape, dtype, idx_shape, idx_dtype) = (a.shape, a.dtype, idx.shape, idx.dtype);
    let (a, idx) = (&a.data, &idx.data);
    supported(dtype)?;
    let n = size_of_shape(out_shape);
    codegen::check_size("take", n.max(size_of_shape(a_shape)), &[a, idx])?;
    let post: usize = a_shape[axis + 1..].iter().product();
    let nidx = size_of_shape(idx_shape);
    let mut m = Meta(vec![
        n as u32,
        nidx as u32,
        post as u32,
        a_shape[axis] as u32,
        0,
        0,
    ]);
    m.0[4] = m.view(a, a_shape);
    m.0[5] = m.view(idx, idx_shape);
    let key = format!("take:{dtype}:{idx_dtype}");
    let idx_src = index_input(2, idx_dtype)?;
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::input("a", 1, dtype));
        s.push_str(&idx_src);
        s.push_str(&codegen::output(3, dtype));
        s.push_str(&entry());
        s.push_str(&crate::backend::gpu::codegen::fill(
            INDEXING_TAKE_WGSL,
            &[("zero", (zero(dtype)))],
        ));
        s
    })?;
    let out = alloc(out_shape, dtype)?;
    dispatch(
        &pipeline,
        &m.0,
        &[a, idx],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        n,
    )?;
    Ok(out)
}

/// `take_along_axis`: `a` and `idx` (of the output's shape) agree except
/// along `axis`.
pub fn take_along_axis(a: &Operand<'_>, idx: &Operand<'_>, axis: usize) -> Result<ArrayData> {
    let (a_shape, dtype, idx_dtype, out_shape) = (a.shape, a.dtype, idx.dtype, idx.shape);
    let (a, idx) = (&a.data, &idx.data);
    supported(dtype)?;
    let n = size_of_shape(out_shape);
    codegen::check_size("take_along_axis", n, &[a, idx])?;
    let mut m = Meta(vec![n as u32, axis as u32, 0, 0]);
    m.0[2] = m.view(a, a_shape);
    m.0[3] = m.view(idx, out_shape);
    let key = format!("take_along_axis:{dtype}:{idx_dtype}");
    let idx_src = index_input(2, idx_dtype)?;
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::input("a", 1, dtype));
        s.push_str(&idx_src);
        s.push_str(&codegen::output(3, dtype));
        s.push_str(&entry());
        s.push_str(&crate::backend::gpu::codegen::fill(
            INDEXING_TAKE_ALONG_AXIS_WGSL,
            &[("zero", (zero(dtype)))],
        ));
        s
    })?;
    let out = alloc(out_shape, dtype)?;
    dispatch(
        &pipeline,
        &m.0,
        &[a, idx],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        n,
    )?;
    Ok(out)
}

/// `atomic_add(k, v)`: adds `v` to f32 element `k` of the atomic output.
const ATOMIC_ADD_F32: &str = include_str!("atomic_add_f32.wgsl");

/// Adds `ct` into zeros of `out_shape` at the positions `idx` names along
/// `axis`: the gradient of `take` (`along_axis` false) or of
/// `take_along_axis` (true). Sums are accumulated in f32 (with atomic
/// compare-exchange loops, so colliding indices add up) and cast to `dtype`
/// at the end, as the CPU does.
pub fn scatter_add(
    ct: &Operand<'_>,
    idx: &Operand<'_>,
    axis: usize,
    along_axis: bool,
    out_shape: &[usize],
) -> Result<ArrayData> {
    let (ct_shape, dtype, idx_shape, idx_dtype) = (ct.shape, ct.dtype, idx.shape, idx.dtype);
    let (ct, idx) = (&ct.data, &idx.data);
    supported(dtype)?;
    let n = size_of_shape(ct_shape);
    codegen::check_size("scatter_add", n.max(size_of_shape(out_shape)), &[ct, idx])?;
    let len = out_shape[axis];
    let post: usize = out_shape[axis + 1..].iter().product();
    let nidx = size_of_shape(idx_shape);
    let mut m = Meta(vec![
        n as u32,
        nidx as u32,
        post as u32,
        len as u32,
        axis as u32,
        0,
        0,
        0,
    ]);
    m.0[5] = m.view(ct, ct_shape);
    m.0[6] = m.view(idx, idx_shape);
    m.0[7] = m.raw(out_shape, 0, &contiguous_strides(out_shape));
    let key = format!("scatter_add:{dtype}:{idx_dtype}:{along_axis}");
    let idx_src = index_input(2, idx_dtype)?;
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::input("ct", 1, dtype));
        s.push_str(&idx_src);
        s.push_str("@group(0) @binding(3) var<storage, read_write> out: array<atomic<u32>>;\n");
        s.push_str(ATOMIC_ADD_F32);
        s.push_str(&entry());
        s.push_str("    let nidx = params[1]; let post = params[2]; let len = params[3]; let axis = params[4];\n");
        s.push_str("    let v = f32(load_ct(vloc(i, params[5])));\n");
        if along_axis {
            s.push_str(
                INDEXING_SCATTER_ADD_WGSL,
            );
        } else {
            s.push_str(
                r#"    let q = i % post; let r = i / post; let k = r % nidx; let p = r / nidx;
    let j = resolve(idx_at(vloc(k, params[6])), len);
    if (j >= 0) { atomic_add((p * len + u32(j)) * post + q, v); }
}
"#,
            );
        }
        s
    })?;
    if n == 0 {
        // Nothing to add: the result is zeros.
        return super::elementwise::map("zeros", zero(dtype), out_shape, &[], dtype);
    }
    let out_n = size_of_shape(out_shape);
    let acc = alloc(out_shape, Dtype::F32)?;
    dispatch(&pipeline, &m.0, &[ct, idx], &acc, out_n * 4, true, n)?;
    if dtype == Dtype::F32 {
        Ok(acc)
    } else {
        super::astype(&Operand::new(acc, out_shape, Dtype::F32), dtype)
    }
}

/// Copies `src` into `out` at `dst_offset + sum(c_k * dst_strides[k])`.
/// `clear` clears a packed output before writing.
fn place(
    out: &ArrayData,
    out_elems: usize,
    dst_strides: &[isize],
    dst_offset: usize,
    src: &Operand<'_>,
    clear: bool,
) -> Result<()> {
    let (shape, dtype, src) = (src.shape, src.dtype, &src.data);
    let n = size_of_shape(shape);
    let mut m = Meta(vec![n as u32, 0, 0]);
    m.0[1] = m.view(src, shape);
    m.0[2] = m.raw(shape, dst_offset, dst_strides);
    let key = format!("place:{dtype}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::input("x", 1, dtype));
        s.push_str(&codegen::output(2, dtype));
        s.push_str(&entry());
        s.push_str("    store_out(vloc(i, params[2]), load_x(vloc(i, params[1])));\n}\n");
        s
    })?;
    dispatch(
        &pipeline,
        &m.0,
        &[src],
        out,
        out_elems * dtype.size_of(),
        clear,
        n,
    )
}

/// Joins `parts` (all of `dtype`) along `axis`.
pub fn concatenate(
    parts: &[Operand<'_>],
    dtype: Dtype,
    axis: usize,
    out_shape: &[usize],
) -> Result<ArrayData> {
    supported(dtype)?;
    let total = size_of_shape(out_shape);
    let datas: Vec<&ArrayData> = parts.iter().map(|p| &p.data).collect();
    codegen::check_size("concatenate", total, &datas)?;
    let out = alloc(out_shape, dtype)?;
    let strides = contiguous_strides(out_shape);
    let mut at = 0;
    let mut cleared = !codegen::packed(dtype);
    for part in parts {
        if part.size() > 0 {
            place(
                &out,
                total,
                &strides,
                at * strides[axis] as usize,
                part,
                !cleared,
            )?;
            cleared = true;
        }
        at += part.shape[axis];
    }
    Ok(out)
}

/// `value` as the bits of `dtype`'s compute type, rounded through `dtype`
/// as the CPU's `from_f64` does.
fn value_bits(value: f64, dtype: Dtype) -> u32 {
    crate::backend::common::dispatch!(dtype, T => {
        let v = <T as Element>::from_f64(value);
        match compute_type(dtype) {
            "f32" => cast::<T, f32>(v).to_bits(),
            "i32" => cast::<T, i32>(v) as u32,
            _ => cast::<T, u32>(v),
        }
    })
}

/// Surrounds `x` with `value`: `low[k]` elements before axis `k`, the rest
/// of `out_shape` after.
pub fn pad(x: &Operand<'_>, low: &[usize], value: f64, out_shape: &[usize]) -> Result<ArrayData> {
    let (x_shape, dtype, x) = (x.shape, x.dtype, &x.data);
    supported(dtype)?;
    let n = size_of_shape(out_shape);
    codegen::check_size("pad", n, &[x])?;
    let mut m = Meta(vec![n as u32, 0, 0, 0, value_bits(value, dtype)]);
    m.0[1] = m.view(x, x_shape);
    m.0[2] = m.list(out_shape.iter().copied());
    m.0[3] = m.list(low.iter().copied());
    let key = format!("pad:{dtype}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::input("x", 1, dtype));
        s.push_str(&codegen::output(2, dtype));
        s.push_str(&entry());
        s.push_str(&crate::backend::gpu::codegen::fill(
            INDEXING_PAD_WGSL,
            &[("t", (compute_type(dtype)))],
        ));
        s
    })?;
    let out = alloc(out_shape, dtype)?;
    dispatch(
        &pipeline,
        &m.0,
        &[x],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        n,
    )?;
    Ok(out)
}

/// A copy of `base` with the window starting at `start` with steps `step`
/// replaced by `upd` (of `base`'s dtype).
pub fn slice_update(
    base: &Operand<'_>,
    upd: &Operand<'_>,
    start: &[usize],
    step: &[isize],
) -> Result<ArrayData> {
    let (shape, dtype, upd_shape) = (base.shape, base.dtype, upd.shape);
    let (base, upd) = (&base.data, &upd.data);
    supported(dtype)?;
    let n = size_of_shape(shape);
    codegen::check_size("slice_update", n, &[base, upd])?;
    let mut m = Meta(vec![n as u32, 0, 0, 0, 0]);
    m.0[1] = m.view(base, shape);
    m.0[2] = m.view(upd, upd_shape);
    m.0[3] = m.list(start.iter().copied());
    let at = m.0.len() as u32;
    m.0.extend(step.iter().map(|&s| s as i32 as u32));
    m.0[4] = at;
    let key = format!("slice_update:{dtype}");
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::input("b", 1, dtype));
        s.push_str(&codegen::input("u", 2, dtype));
        s.push_str(&codegen::output(3, dtype));
        s.push_str(&entry());
        s.push_str(INDEXING_SLICE_UPDATE_WGSL);
        s
    })?;
    let out = alloc(shape, dtype)?;
    dispatch(
        &pipeline,
        &m.0,
        &[base, upd],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        n,
    )?;
    Ok(out)
}
