//! Index of the first maximum (or minimum) along an axis: one invocation
//! per output where runs are short, else a workgroup per output.

use super::super::codegen::{self, compute_type};
use super::super::device::context;
use super::super::dispatch::{dispatch, dispatch_groups};
use super::super::pool::{alloc, supported};
use super::{locators, plan};
use crate::data::{ArrayData, Operand};
use crate::shape::size_of_shape;
use crate::{Dtype, Result};

/// The kernel of an output per workgroup (a template).
const PER_GROUP: &str = include_str!("arg_per_group.wgsl");

/// The kernel of an output per invocation (a template).
const PER_THREAD: &str = include_str!("arg_per_thread.wgsl");

/// The WGSL of `take` (a template).
const TAKE: &str = include_str!("arg_take.wgsl");

/// Index (uint32) of the first maximum (or minimum) along `axis`, kept
/// dimensions only; a NaN counts as the extreme (the first NaN wins), as
/// on the CPU. The axis must not be empty.
pub fn arg_reduce(is_max: bool, x: &Operand<'_>, axis: usize) -> Result<ArrayData> {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    supported(dtype)?;
    codegen::check_size("arg_reduce", size_of_shape(shape), &[data])?;
    let p = plan(data, shape, &[axis]);
    let kept: Vec<usize> = (0..shape.len())
        .filter(|&a| a != axis)
        .map(|a| shape[a])
        .collect();
    let out = alloc(&kept, Dtype::U32)?;
    if p.n_out == 0 {
        return Ok(out);
    }
    let t = compute_type(dtype);
    let key = format!(
        "argreduce:{is_max}:{dtype}:{}",
        if p.per_thread { "thread" } else { "group" }
    );
    let pipeline = context()?.pipeline(&key, || {
        let mut src = String::from(codegen::PRELUDE);
        src.push_str(codegen::IS_NAN);
        src.push_str(codegen::META);
        src.push_str(&codegen::input("in0", 1, dtype));
        src.push_str(&codegen::output(2, Dtype::U32));
        src.push_str(&locators(true));
        let nan = if t == "f32" {
            "    let an = is_nan(av);\n    let bn = is_nan(bv);\n    \
             if (an || bn) { return bn && (!an || bi < ai); }\n"
        } else {
            ""
        };
        let cmp = if is_max { ">" } else { "<" };
        // Whether candidate (bv, bi) replaces (av, ai); index EMPTY is no candidate.
        src.push_str(&codegen::fill(
            TAKE,
            &[("t", t), ("nan", nan), ("cmp", cmp)],
        ));
        if p.per_thread {
            src.push_str(codegen::ENTRY);
            src.push_str(&codegen::fill(
                PER_THREAD,
                &[("index", codegen::THREAD_INDEX)],
            ));
        } else {
            src.push_str(&format!(
                "var<workgroup> part_v: array<{t}, 256>;\n\
                 var<workgroup> part_i: array<u32, 256>;\n{}",
                codegen::GROUP_ENTRY
            ));
            src.push_str(&codegen::fill(
                PER_GROUP,
                &[("index", codegen::GROUP_INDEX), ("t", t)],
            ));
        }
        src
    })?;
    let bytes = p.n_out * 4;
    if p.per_thread {
        dispatch(&pipeline, &p.meta, &[data], &out, bytes, false, p.n_out)?;
    } else {
        dispatch_groups(&pipeline, &p.meta, &[data], &out, bytes, false, p.n_out)?;
    }
    Ok(out)
}
