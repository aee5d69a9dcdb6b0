//! Rotary position embedding on the GPU: one thread per output element,
//! reading its pair's partner (see `backend::cpu::rope`).

use super::codegen;
use super::{alloc, context, dense, dispatch};
use crate::Result;
use crate::backend::common::rope::RopeSpec;
use crate::data::{ArrayData, Operand};

/// Rotates `x` (`[..., L, D]`, of any float dtype, computed in f32) as
/// `spec` says, into a new array of `x`'s dtype.
pub fn rope(x: &Operand<'_>, spec: &RopeSpec) -> Result<ArrayData> {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let nd = shape.len();
    let dtype = x.dtype;
    let x = dense(x)?;
    codegen::check_size("rope", n, &[&x])?;
    let out = alloc(shape, dtype)?;
    if n == 0 {
        return Ok(out);
    }
    let k = (-2.0 * (spec.base as f64).ln() / spec.dims as f64) as f32;
    let meta = [
        n as u32,
        shape[nd - 2] as u32,
        shape[nd - 1] as u32,
        spec.dims as u32,
        spec.traditional as u32,
        spec.offset as u32,
        spec.scale.to_bits(),
        k.to_bits(),
        spec.inverse as u32,
        x.offset() as u32,
    ];
    let pipeline = context()?.pipeline(&format!("rope:{dtype}"), || {
        let mut s = String::from(codegen::PRELUDE);
        s.push_str(codegen::META);
        s.push_str(&codegen::input("x", 1, dtype));
        s.push_str(&codegen::output(2, dtype));
        s.push_str(codegen::ENTRY);
        s.push_str(" {\n    ");
        s.push_str(codegen::THREAD_INDEX);
        s.push_str(
            r#"
    if (i >= params[0]) { return; }
    let width = params[2];
    let dims = params[3];
    let c = i % width;
    let x0 = params[9] + i - c;
    if (c >= dims) { store_out(i, load_x(x0 + c)); return; }
    let half = dims / 2u;
    var pair = c % half;
    var first = c < half;
    var partner = c + half;
    if (!first) { partner = c - half; }
    if (params[4] != 0u) {
        pair = c / 2u;
        first = c % 2u == 0u;
        partner = c + 1u;
        if (!first) { partner = c - 1u; }
    }
    let pos = f32(params[5] + (i / width) % params[1]) * bitcast<f32>(params[6]);
    let theta = pos * exp(f32(pair) * bitcast<f32>(params[7]));
    var s = sin(theta);
    if (params[8] != 0u) { s = -s; }
    let co = cos(theta);
    let own = load_x(x0 + c);
    let other = load_x(x0 + partner);
    if (first) { store_out(i, own * co - other * s); } else { store_out(i, other * s + own * co); }
}
"#,
        );
        s
    })?;
    let clear = codegen::packed(dtype);
    dispatch(&pipeline, &meta, &[&x], &out, n * dtype.size_of(), clear, n)?;
    Ok(out)
}
