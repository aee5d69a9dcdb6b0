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

/// WGSL of `cumsum` (a template).
const SCAN_CUMSUM_WGSL: &str = include_str!("cumsum.wgsl");

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
        src.push_str(&crate::backend::gpu::codegen::fill(
            SCAN_CUMSUM_WGSL,
            &[
                ("acc", acc),
                ("entry", codegen::GROUP_ENTRY),
                ("index", codegen::GROUP_INDEX),
                ("zero", zero),
                ("pos", pos),
                ("conv", conv),
                ("conv0", &(conv.replace('x', "x0")).to_string()),
                ("before", before),
                ("after", after),
            ],
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
