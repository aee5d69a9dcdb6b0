//! The gradient of attention: a delta pass, then the dK/dV and dQ passes
//! on the f16 fragment kernels or the f32-compute ones (or per row where
//! neither fits).

use std::sync::atomic::Ordering;

use super::super::codegen;
use super::super::device::context;
use super::super::dispatch::{dispatch, dispatch_groups};
use super::super::elementwise::{astype, dense};
use super::super::fragment::{self, Fragments};
use super::super::pool::alloc;
use super::telemetry::{FRAGMENT_GRADS, LAST_SCALAR_TILES};
use super::{
    Tiles, backward, fragment_loads, fragments_backward, heads, heads_qkv, meta, note_scalar_tiles,
    rows, scalar_kernel_loads,
};
use crate::backend::common::attention::AttentionDims;
use crate::data::{ArrayData, Operand};
use crate::settings::GpuTuning;
use crate::{Dtype, Result};

/// The gradient's kernels: the f32-compute ones with their tiles, or the
/// f16 fragment ones with the dK/dV and the dQ passes' tiles.
#[derive(Clone, Copy)]
enum GradKernels {
    Scalar(Tiles),
    Fragments(Fragments, Tiles, Tiles),
}

/// The fragment implementation and both passes' tiles of the f16 fragment
/// gradient, when it runs for `dtype` on this device.
fn fragment_grad_tiles(
    dims: &AttentionDims,
    dtype: Dtype,
    tuning: &GpuTuning,
) -> Result<Option<(Fragments, Tiles, Tiles)>> {
    let Some(f) = fragment::chosen(dtype, tuning)? else {
        return Ok(None);
    };
    let plan = |pass| {
        Tiles::plan_among(fragments_backward::candidates(pass), |t| {
            fragments_backward::bytes(dims, t, pass)
        })
    };
    Ok(
        match (
            plan(backward::Pass::KeyValue)?,
            plan(backward::Pass::Query)?,
        ) {
            (Some(kv), Some(query)) => Some((f, kv, query)),
            _ => None,
        },
    )
}

/// The gradients of [`attention`](super::attention) for the cotangent `d_out` of its output
/// (`packed` being its result; f32, or the inputs' dtype, read as stored),
/// packed as on the CPU, stored in the inputs' `dtype` (computed in f32,
/// rounded once as they are stored: a half-precision model's gradients
/// and cotangent need no casts of their own).
pub fn attention_grad(
    q: &ArrayData,
    k: &ArrayData,
    v: &ArrayData,
    packed: &ArrayData,
    d_out: &Operand<'_>,
    dims: &AttentionDims,
    dtype: Dtype,
) -> Result<ArrayData> {
    let tuning = crate::settings::gpu_tuning();
    let kernels = match fragment_grad_tiles(dims, dtype, &tuning)? {
        Some((f, kv, query)) => GradKernels::Fragments(f, kv, query),
        None => match Tiles::plan(&tuning, |t| backward::bytes(dims, t))? {
            Some(tiles) => GradKernels::Scalar(tiles),
            None => {
                LAST_SCALAR_TILES.store(0, Ordering::Relaxed);
                return rows::attention_grad(q, k, v, packed, d_out, dims, dtype);
            }
        },
    };
    let AttentionDims { b, h, lq, dv, .. } = *dims;
    let (n_out, n_lse) = dims.packed_len();
    let (nq, nk, nv) = dims.grad_len();
    let ([q, k, v], mut strides) = heads_qkv(q, k, v, dims, dtype)?;
    let packed = dense(&Operand::new(packed.clone(), &[n_out + n_lse], Dtype::F32))?;
    // The fragment kernels stage the cotangent as f16: read so from f16 or
    // f32, cast to f32 first from another dtype.
    let cast;
    let d_out = match kernels {
        GradKernels::Fragments(..) if !matches!(d_out.dtype, Dtype::F16 | Dtype::F32) => {
            cast = astype(d_out, Dtype::F32)?;
            Operand::new(cast, d_out.shape, Dtype::F32)
        }
        _ => d_out.clone(),
    };
    let gd = d_out.dtype;
    let (g, sg) = heads(&d_out.data, [b, h, lq, dv], gd)?;
    strides[3] = sg;
    codegen::check_size("attention_grad", nq + nk + nv, &[&q, &k, &v, &packed, &g])?;
    let out = alloc(&[nq + nk + nv], dtype)?;
    if nq + nk + nv == 0 {
        return Ok(out);
    }
    // delta = rowsum(dO o O), a thread per query row.
    let delta = alloc(&[n_lse], Dtype::F32)?;
    let key = format!("attention_delta:{}:{gd}", dims.dv);
    let pipeline = context()?.pipeline(&key, || backward::delta_source(dims, gd))?;
    dispatch(
        &pipeline,
        &meta(dims, &[&packed, &g], &[], &strides),
        &[&packed, &g],
        &delta,
        n_lse * 4,
        false,
        n_lse,
    )?;
    let inputs = [&q, &k, &v, &packed, &g, &delta];
    let meta = meta(dims, &inputs, &[nq as u32, (nq + nk) as u32], &strides);
    let (d, dv) = (dims.d, dims.dv);
    for pass in [backward::Pass::KeyValue, backward::Pass::Query] {
        let (pipeline, tiles) = match kernels {
            GradKernels::Scalar(tiles) => {
                note_scalar_tiles(tiles);
                let loads = scalar_kernel_loads(dims, &[&q, &k, &v, &g], &strides);
                let key =
                    format!("attention_grad:{pass:?}:{d}:{dv}:{dtype}:{gd}:{tiles:?}:{loads:?}");
                let p = context()?.pipeline(&key, || {
                    backward::source(dims, (dtype, gd), tiles, pass, loads)
                })?;
                (p, tiles)
            }
            GradKernels::Fragments(f, kv, query) => {
                let tiles = match pass {
                    backward::Pass::KeyValue => kv,
                    backward::Pass::Query => query,
                };
                let loads = fragment_loads(dims, &[&q, &k, &v, &g], &strides);
                let g16 = gd == Dtype::F16;
                let key = format!(
                    "attention_grad-fragments:{pass:?}:{d}:{dv}:{f:?}:{tiles:?}:{loads:?}:{g16}"
                );
                let p = context()?.pipeline(&key, || {
                    fragments_backward::source(dims, tiles, pass, f, (loads, g16))
                })?;
                (p, tiles)
            }
        };
        // The dK/dV pass: a workgroup per key/value head's block of keys
        // (its group's query heads walked inside); the dQ pass: per query
        // head's block of queries.
        let (heads, l, block) = match pass {
            backward::Pass::KeyValue => (dims.hkv, dims.lk, tiles.bk),
            backward::Pass::Query => (h, lq, tiles.bq),
        };
        // A packed dtype's words are OR-ed into: the first pass clears them.
        dispatch_groups(
            &pipeline,
            &meta,
            &inputs,
            &out,
            (nq + nk + nv) * dtype.size_of(),
            codegen::packed(dtype) && pass == backward::Pass::KeyValue,
            b * heads * l.div_ceil(block),
        )?;
    }
    if matches!(kernels, GradKernels::Fragments(..)) {
        FRAGMENT_GRADS.fetch_add(1, Ordering::Relaxed);
    }
    Ok(out)
}
