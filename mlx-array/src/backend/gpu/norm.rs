//! RMS normalisation and its gradient on the GPU (see `backend::cpu::norm`):
//! a thread per row, and for `dw` a thread per column reading the rows'
//! inverse RMS that the first gradient pass left after `dw`.

use super::codegen;
use super::{alloc, context, dense, dispatch};
use crate::primitive::ArrayData;
use crate::{Dtype, Result};

/// Shader source: bindings for `inputs`, the f32 output, and `inv_rms`.
fn header(inputs: &[&str]) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    for (i, name) in inputs.iter().enumerate() {
        s.push_str(&codegen::input(name, i as u32 + 1, Dtype::F32));
    }
    s.push_str(&codegen::output(inputs.len() as u32 + 1, Dtype::F32));
    s.push_str(
        r#"fn inv_rms(x0: u32) -> f32 {
    let width = params[1];
    var ss = 0.0;
    for (var j = 0u; j < width; j = j + 1u) { let v = load_x(x0 + j); ss = ss + v * v; }
    return 1.0 / sqrt(ss / f32(width) + bitcast<f32>(params[2]));
}
"#,
    );
    s.push_str(codegen::ENTRY);
    s.push_str(" {\n    ");
    s.push_str(codegen::THREAD_INDEX);
    s.push('\n');
    s
}

/// `x * w / sqrt(mean(x^2) + eps)` over rows.
pub fn rms_norm(x: &ArrayData, w: &ArrayData, shape: &[usize], eps: f32) -> Result<ArrayData> {
    let n = crate::shape::size_of_shape(shape);
    let width = shape.last().copied().unwrap_or(1);
    let out = alloc(shape, Dtype::F32)?;
    if n == 0 || width == 0 {
        return Ok(out);
    }
    let (x, w) = (
        dense(x, shape, Dtype::F32)?,
        dense(w, &[width], Dtype::F32)?,
    );
    codegen::check_size("rms_norm", n, &[&x, &w])?;
    let rows = n / width;
    let meta = [
        rows as u32,
        width as u32,
        eps.to_bits(),
        x.offset() as u32,
        w.offset() as u32,
    ];
    let pipeline = context()?.pipeline("rms_norm", || {
        header(&["x", "w"])
            + r#"    if (i >= params[0]) { return; }
    let width = params[1];
    let x0 = params[3] + i * width;
    let r = inv_rms(x0);
    for (var j = 0u; j < width; j = j + 1u) {
        store_out(i * width + j, load_x(x0 + j) * r * load_w(params[4] + j));
    }
}
"#
    })?;
    dispatch(&pipeline, &meta, &[&x, &w], &out, n * 4, false, rows)?;
    Ok(out)
}

/// `dx`, `dw` and each row's inverse RMS, packed, of [`rms_norm`] (with no
/// rows, `dw` is zero: the column pass sums nothing).
pub fn rms_norm_grad(
    x: &ArrayData,
    w: &ArrayData,
    ct: &ArrayData,
    shape: &[usize],
    eps: f32,
) -> Result<ArrayData> {
    let n = crate::shape::size_of_shape(shape);
    let width = shape.last().copied().unwrap_or(1);
    let rows = n.checked_div(width).unwrap_or(0);
    let total = n + width + rows;
    let out = alloc(&[total], Dtype::F32)?;
    if total == 0 {
        return Ok(out);
    }
    let (x, w, ct) = (
        dense(x, shape, Dtype::F32)?,
        dense(w, &[width], Dtype::F32)?,
        dense(ct, shape, Dtype::F32)?,
    );
    codegen::check_size("rms_norm_grad", total, &[&x, &w, &ct])?;
    let meta = [
        rows as u32,
        width as u32,
        eps.to_bits(),
        x.offset() as u32,
        w.offset() as u32,
        ct.offset() as u32,
        n as u32,
    ];
    let names = ["x", "w", "c"];
    let dx = context()?.pipeline("rms_norm_dx", || {
        header(&names)
            + r#"    if (i >= params[0]) { return; }
    let width = params[1];
    let x0 = params[3] + i * width;
    let c0 = params[5] + i * width;
    let r = inv_rms(x0);
    var xg = 0.0;
    for (var j = 0u; j < width; j = j + 1u) { xg = xg + load_x(x0 + j) * load_c(c0 + j) * load_w(params[4] + j); }
    let k = xg / f32(width) * r * r * r;
    for (var j = 0u; j < width; j = j + 1u) {
        store_out(i * width + j, r * load_w(params[4] + j) * load_c(c0 + j) - load_x(x0 + j) * k);
    }
    store_out(params[6] + width + i, r);
}
"#
    })?;
    let dw = context()?.pipeline("rms_norm_dw", || {
        header(&names)
            + r#"    let width = params[1];
    if (i >= width) { return; }
    // The weight is bound like in the row pass (one layout for both).
    _ = load_w(params[4]);
    var acc = 0.0;
    for (var row = 0u; row < params[0]; row = row + 1u) {
        let r = out[params[6] + width + row];
        acc = acc + load_c(params[5] + row * width + i) * load_x(params[3] + row * width + i) * r;
    }
    store_out(params[6] + i, acc);
}
"#
    })?;
    let inputs = [&x, &w, &ct];
    if rows > 0 {
        dispatch(&dx, &meta, &inputs, &out, total * 4, false, rows)?;
    }
    dispatch(&dw, &meta, &inputs, &out, total * 4, false, width)?;
    Ok(out)
}
