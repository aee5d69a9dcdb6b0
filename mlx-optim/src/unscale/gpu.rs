//! The unscale-and-check primitive on the GPU: one WGSL pass over a group
//! of gradients, through mlx-array's custom-kernel hook.
//!
//! Each invocation takes four consecutive elements of one gradient (the
//! gradients' elements are numbered in groups of four, one gradient after
//! another; an invocation finds its gradient among the group's ranges),
//! reads them in the gradient's dtype, multiplies them by the inverse scale
//! in float32 and writes them, and when one is not finite writes 1 to the
//! flag, which the dispatch cleared first. Every invocation that writes the
//! flag writes the same value, and nothing in the pass reads it. The pass is
//! bound by memory: on an H100 it streams the reference model's 9.5 M
//! gradient elements in some 15 us a group, where op by op each gradient
//! took a multiply and a (two-pass) sum of its own.

use mlx_array::backend::gpu::custom;
use mlx_array::{Array, ArrayData, Dtype, Result};

use super::ALIGN;

/// Threads per workgroup.
const WORKGROUP: usize = 256;

/// `params` words before the gradients' four each: the inverse scale's
/// offset, and the number of four-element groups in all.
const HEADER: usize = 2;

/// The kernel's WGSL for gradients of `dtypes`.
fn source(dtypes: &[Dtype]) -> String {
    let mut s = String::from(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         @group(0) @binding(1) var<storage, read> inverse: array<f32>;\n",
    );
    for (t, &d) in dtypes.iter().enumerate() {
        s += &custom::input(&format!("g{t}"), t as u32 + 2, d);
    }
    s += &format!(
        "@group(0) @binding({}) var<storage, read_write> out: array<f32>;\n",
        dtypes.len() + 2
    );
    s += "fn non_finite(v: f32) -> bool {\n\
          \x20   return (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u;\n\
          }\n\
          @compute @workgroup_size(256)\n\
          fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {\n\
          \x20   let q = gid.x + gid.y * nw.x * 256u;\n\
          \x20   if (q >= params[1]) { return; }\n\
          \x20   let inv = inverse[params[0]];\n\
          \x20   var found = false;\n";
    for t in 0..dtypes.len() {
        let at = HEADER + 4 * t;
        s += &format!(
            "    {{\n\
             \x20       let first = params[{at}u];\n\
             \x20       let n = params[{}u];\n\
             \x20       if (q >= first && q - first < (n + 3u) / 4u) {{\n\
             \x20           let src = params[{}u];\n\
             \x20           let dst = params[{}u];\n\
             \x20           let j0 = (q - first) * 4u;\n\
             \x20           for (var e = 0u; e < 4u; e++) {{\n\
             \x20               let j = j0 + e;\n\
             \x20               if (j < n) {{\n\
             \x20                   let v = load_g{t}(src + j) * inv;\n\
             \x20                   out[dst + j] = v;\n\
             \x20                   found = found || non_finite(v);\n\
             \x20               }}\n\
             \x20           }}\n\
             \x20       }}\n\
             \x20   }}\n",
            at + 1,
            at + 2,
            at + 3,
        );
    }
    s += "    if (found) { out[0] = 1.0; }\n}\n";
    s
}

/// Runs the pass over `inputs` (`[inverse, g...]`, dense, on the GPU);
/// returns the products and the flag, views of one new buffer.
pub(super) fn run(inputs: &[Array]) -> Result<Vec<ArrayData>> {
    let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
    let grads = &inputs[1..];
    let mut meta = vec![data[0].offset() as u32, 0];
    let mut offsets = Vec::with_capacity(grads.len());
    let (mut quads, mut end) = (0usize, ALIGN);
    for (g, d) in grads.iter().zip(&data[1..]) {
        let n = g.size();
        meta.extend([quads, n, d.offset(), end].map(|w| w as u32));
        offsets.push(end);
        quads += n.div_ceil(4);
        end = (end + n).next_multiple_of(ALIGN);
    }
    meta[1] = quads as u32;
    crate::gpu_indices::check("unscale_check", end, &data)?;
    let out = custom::alloc(&[end], Dtype::F32)?;
    let dtypes: Vec<Dtype> = grads.iter().map(Array::dtype).collect();
    let key = format!("unscale_check:{dtypes:?}");
    let bound: Vec<&ArrayData> = data.iter().collect();
    // At least one workgroup: the flag is cleared by the dispatch.
    custom::dispatch_outputs(
        &key,
        || source(&dtypes),
        &meta,
        &bound,
        &[&out],
        Some(size_of::<f32>()),
        quads.div_ceil(WORKGROUP).max(1),
    )?;
    let mut outputs: Vec<ArrayData> = grads
        .iter()
        .zip(offsets)
        .map(|(g, at)| {
            ArrayData::new(
                out.storage().clone(),
                mlx_array::shape::contiguous_strides(g.shape()),
                at,
            )
        })
        .collect();
    outputs.push(ArrayData::new(out.storage().clone(), Vec::new(), 0));
    Ok(outputs)
}
