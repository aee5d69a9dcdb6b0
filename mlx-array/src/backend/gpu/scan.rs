//! Cumulative sums along one axis: one workgroup per row. Each of the 256
//! invocations sums a contiguous chunk of the row, a scan in workgroup
//! memory turns the chunk sums into chunk starts, and each invocation then
//! writes its chunk's running sums.

use super::codegen::{self, compute_type};
use super::device::context;
use super::dispatch::dispatch_groups;
use super::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::shape::{contiguous_strides, size_of_shape};
use crate::{Dtype, Result};

/// Inclusive or exclusive cumulative sum of `data` (any view) along `axis`,
/// optionally from the end. The output is contiguous with the input's shape
/// and dtype (bool counts in i32); floats accumulate in f32 (the CPU rounds
/// f16 and bf16 running sums at every step, so those may differ by a few
/// ulps), integers wrap.
pub fn cumsum(x: &Operand<'_>, axis: usize, reverse: bool, inclusive: bool) -> Result<ArrayData> {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    supported(dtype)?;
    let odt = if dtype == Dtype::Bool {
        Dtype::I32
    } else {
        dtype
    };
    let n = size_of_shape(shape);
    codegen::check_size("cumsum", n, &[data])?;
    let out = alloc(shape, odt)?;
    let len = shape[axis];
    if n == 0 {
        return Ok(out);
    }
    let ostrides = contiguous_strides(shape);
    let others: Vec<usize> = (0..shape.len()).filter(|&a| a != axis).collect();
    let rows = n / len;
    let mut meta = vec![
        rows as u32,
        len as u32,
        others.len() as u32,
        data.offset() as u32,
        data.strides()[axis] as i32 as u32,
        ostrides[axis] as u32,
    ];
    meta.extend(others.iter().map(|&a| shape[a] as u32));
    meta.extend(others.iter().map(|&a| data.strides()[a] as i32 as u32));
    meta.extend(others.iter().map(|&a| ostrides[a] as u32));
    let (acc, zero, conv) = match compute_type(dtype) {
        "f32" => ("f32", "0.0", "x"),
        _ if dtype == Dtype::Bool => ("i32", "0", "i32(x)"),
        t => (t, if t == "i32" { "0" } else { "0u" }, "x"),
    };
    let key = format!("cumsum:{dtype}:{reverse}:{inclusive}");
    let pipeline = context()?.pipeline(&key, || {
        let mut src = String::from(codegen::PRELUDE);
        src.push_str(codegen::META);
        src.push_str(&codegen::input("in0", 1, dtype));
        src.push_str(&codegen::output(2, odt));
        let pos = if reverse { "len - 1u - k" } else { "k" };
        let (before, after) = if inclusive {
            ("acc = acc + x;", "store_out(u32(ob + i32(j) * so), acc);")
        } else {
            ("store_out(u32(ob + i32(j) * so), acc);", "acc = acc + x;")
        };
        src.push_str(&format!(
            r#"
var<workgroup> part: array<{acc}, 256>;
{entry} {{
    {index}
    let live = g < params[0];
    let len = params[1];
    let nk = params[2];
    let sa = bitcast<i32>(params[4]);
    let so = i32(params[5]);
    var ib = bitcast<i32>(params[3]);
    var ob = 0;
    var rem = g;
    for (var d = i32(nk) - 1; d >= 0; d = d - 1) {{
        let s = params[6u + u32(d)];
        let c = i32(rem % s);
        ib = ib + c * bitcast<i32>(params[6u + nk + u32(d)]);
        ob = ob + c * i32(params[6u + 2u * nk + u32(d)]);
        rem = rem / s;
    }}
    let chunk = (len + 255u) / 256u;
    let lo = min(lid * chunk, len);
    let hi = min(lo + chunk, len);
    var sum: {acc} = {zero};
    if (live) {{
        for (var k = lo; k < hi; k = k + 1u) {{
            let j = {pos};
            let x = load_in0(u32(ib + i32(j) * sa));
            sum = sum + {conv};
        }}
    }}
    part[lid] = sum;
    workgroupBarrier();
    for (var off = 1u; off < 256u; off = off << 1u) {{
        var v = part[lid];
        if (lid >= off) {{ v = v + part[lid - off]; }}
        workgroupBarrier();
        part[lid] = v;
        workgroupBarrier();
    }}
    var acc: {acc} = {zero};
    if (lid > 0u) {{ acc = part[lid - 1u]; }}
    if (live) {{
        for (var k = lo; k < hi; k = k + 1u) {{
            let j = {pos};
            let x0 = load_in0(u32(ib + i32(j) * sa));
            let x = {conv0};
            {before}
            {after}
        }}
    }}
}}
"#,
            entry = codegen::GROUP_ENTRY,
            index = codegen::GROUP_INDEX,
            conv0 = conv.replace('x', "x0"),
        ));
        src
    })?;
    dispatch_groups(
        &pipeline,
        &meta,
        &[data],
        &out,
        n * odt.size_of(),
        codegen::packed(odt),
        rows,
    )?;
    Ok(out)
}
