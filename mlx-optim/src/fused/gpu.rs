//! The fused Adam(W) halves of a parameter kept apart from its moments on
//! the GPU: one WGSL pass each through mlx-array's custom-kernel hook
//! ([`mlx_array::backend::gpu::custom`]). The whole step, of one parameter
//! or many, is `group.rs`'s.
//!
//! One thread per element, 256 threads per workgroup, no workgroup memory:
//! each thread reads its inputs once and writes its outputs once, so the
//! kernel is bound by memory bandwidth.
//!
//! The arithmetic is the CPU kernel's, operation for operation in float32
//! (`moments`, `parameter` in `fused.rs`); WGSL does not promise
//! correctly rounded division and square root, and a driver may contract a
//! multiply and an add into one fused multiply-add, so on a GPU the result
//! matches the CPU's within float32 rounding, bit for bit only where the
//! driver rounds as IEEE does (lavapipe does).
//!
//! A gated step binds its control scalar last among the inputs: the kernel
//! reads it first, and when it says "keep" writes nothing in place (or
//! copies its inputs) and returns; otherwise it picks that candidate's
//! coefficients from the dispatch's arguments, which carry every candidate.
//!
//! The moments' buffer layout is the CPU's: `m'`, `v'` the rows of one
//! output buffer, written over the previous step's rows when they are
//! donated (the kernel then binds that buffer alone, read and written, and
//! the gradient: a buffer cannot be bound twice with a writable binding).

use mlx_array::backend::gpu::custom;
use mlx_array::{ArrayData, Dtype, Result};

use super::{AdamCoefficients, StepCoefficients, rows};

/// Threads per workgroup.
const WORKGROUP: usize = 256;

/// What one dispatch computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// `[g, m, v]` to `m'`, `v'`.
    Moments,
    /// `[p, m', v']` to `p'`.
    Parameter,
}

impl Pass {
    /// The rows this pass writes (and, in place, reads) in its output buffer.
    fn rows(self) -> &'static [&'static str] {
        match self {
            Pass::Moments => &["m", "v"],
            Pass::Parameter => &["p"],
        }
    }

    /// The inputs it reads, in binding order.
    fn inputs(self) -> &'static [&'static str] {
        match self {
            Pass::Moments => &["g", "m", "v"],
            Pass::Parameter => &["p", "m", "v"],
        }
    }
}

/// WGSL of the new moments `m1`, `v1` from `m0`, `v0`, `g0` and the
/// candidate's coefficients (`coef(k)`: b1, 1 - b1, b2, 1 - b2, numerator,
/// denominator, eps, decay).
pub(super) const MOMENTS: &str = "    let m1 = m0 * coef(0u) + g0 * coef(1u);\n\
                                  \x20   let v1 = v0 * coef(2u) + (g0 * g0) * coef(3u);\n";

/// WGSL of the new parameter `p1` from `p0` and the moments `m`, `v`
/// (names of WGSL values), reading `flags` (bit 0: decay, bit 1: the
/// denominator).
pub(super) fn parameter(m: &str, v: &str) -> String {
    format!(
        "    var p = p0;\n\
         \x20   if ((flags & 1u) != 0u) {{ p = p * coef(7u); }}\n\
         \x20   var root = sqrt({v});\n\
         \x20   if ((flags & 2u) != 0u) {{ root = root / coef(5u); }}\n\
         \x20   let p1 = p - ({m} * coef(4u)) / (root + coef(6u));\n"
    )
}

/// `params` words: `n`, the flags (bit 0: weight decay, bit 1: bias
/// correction's denominator), the element offset of each bound buffer's
/// view, in binding order (inputs, then the output), the number of
/// candidates, then the eight coefficients' bits of each.
const OFFSETS_AT: usize = 2;

/// Coefficients per candidate in `params`.
pub(super) const COEFFICIENTS: usize = 8;

/// One candidate's (or the single step's) coefficients in the kernels' order
/// (the grouped kernel, `group.rs`, reads them alike).
pub(super) fn coefficients(c: &AdamCoefficients) -> [f32; COEFFICIENTS] {
    [
        c.b1,
        c.one_minus_b1,
        c.b2,
        c.one_minus_b2,
        c.numerator,
        c.denominator.unwrap_or(1.0),
        c.eps,
        c.decay.unwrap_or(1.0),
    ]
}

/// The names of the buffers bound as inputs: in place only `g` (the rows
/// are read from the output buffer itself), and a gated step's control.
fn bound_names(pass: Pass, in_place: bool, gated: bool) -> Vec<&'static str> {
    let mut bound: Vec<&str> = if in_place {
        vec!["g"]
    } else {
        pass.inputs().to_vec()
    };
    if gated {
        bound.push("ctl");
    }
    bound
}

/// The kernel's WGSL; `grad`: the gradient's dtype (half precision is
/// widened as it is read).
fn source(pass: Pass, in_place: bool, gated: bool, grad: Dtype) -> String {
    let bound = bound_names(pass, in_place, gated);
    // After the offsets: the number of candidates, then their coefficients.
    let count_at = OFFSETS_AT + bound.len() + 1;
    let coefs_at = count_at + 1;
    let mut s = String::from(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         var<private> cb: u32;\n\
         fn coef(k: u32) -> f32 { return bitcast<f32>(params[cb + k]); }\n",
    );
    for (k, name) in bound.iter().enumerate() {
        let dtype = if *name == "g" { grad } else { Dtype::F32 };
        s += &custom::input(&format!("in_{name}"), k as u32 + 1, dtype);
    }
    s += &format!(
        "@group(0) @binding({}) var<storage, read_write> out: array<f32>;\n",
        bound.len() + 1
    );
    s += "@compute @workgroup_size(256)\n\
          fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {\n\
          \x20   let i = gid.x + gid.y * nw.x * 256u;\n\
          \x20   let n = params[0];\n\
          \x20   if (i >= n) { return; }\n\
          \x20   let flags = params[1];\n";
    let out_at = OFFSETS_AT + bound.len();
    s += &format!("    let o = params[{out_at}u] + i;\n");
    // Each value read: from its own input, or in place from its row.
    let row = |name: &str| pass.rows().iter().position(|r| *r == name);
    for &name in pass.inputs() {
        let expr = match (in_place, row(name)) {
            (true, Some(r)) => format!("out[o + {r}u * n]"),
            _ => {
                let k = bound.iter().position(|b| *b == name).expect("bound");
                format!("load_in_{name}(params[{}u] + i)", OFFSETS_AT + k)
            }
        };
        s += &format!("    let {name}0 = {expr};\n");
    }
    if gated {
        // 0: keep the state (in place there is nothing to write); j + 1:
        // candidate j (clamped: a kernel cannot fail).
        let k = bound.len() - 1;
        s += &format!(
            "    let sel = u32(load_in_ctl(params[{}u]));\n\
             \x20   if (sel == 0u) {{\n",
            OFFSETS_AT + k
        );
        if !in_place {
            for (r, name) in pass.rows().iter().enumerate() {
                s += &format!("        out[o + {r}u * n] = {name}0;\n");
            }
        }
        s += &format!(
            "        return;\n    }}\n\
             \x20   cb = {coefs_at}u + {COEFFICIENTS}u * (min(sel, params[{count_at}u]) - 1u);\n"
        );
    } else {
        s += &format!("    cb = {coefs_at}u;\n");
    }
    match pass {
        Pass::Moments => {
            s += MOMENTS;
            s += "    out[o] = m1;\n    out[o + n] = v1;\n";
        }
        Pass::Parameter => {
            s += &parameter("m0", "v0");
            s += "    out[o] = p1;\n";
        }
    }
    s += "}\n";
    s
}

/// The `params` words for `n` elements, the views `bound` and the outputs.
fn meta(c: &StepCoefficients, n: usize, bound: &[&ArrayData], outputs: &[&ArrayData]) -> Vec<u32> {
    let first = &c.candidates[0];
    let flags = u32::from(first.decay.is_some()) | (u32::from(first.denominator.is_some()) << 1);
    let mut m = vec![n as u32, flags];
    debug_assert_eq!(m.len(), OFFSETS_AT);
    m.extend(bound.iter().map(|d| d.offset() as u32));
    m.extend(outputs.iter().map(|d| d.offset() as u32));
    m.push(c.candidates.len() as u32);
    for c in &c.candidates {
        m.extend(coefficients(c).map(f32::to_bits));
    }
    m
}

/// Runs `pass` over `data` (the inputs' data in [`Pass::inputs`] order,
/// then a gated step's control, dense, on the GPU), `shape` elements each.
/// `in_place`: the inputs that are rows of the output (every one but the
/// gradient) are the donated rows of one buffer, which input `in_place`
/// views from its start. `grad`: the gradient's dtype. Returns the output
/// rows.
pub(super) fn run(
    pass: Pass,
    c: &StepCoefficients,
    data: &[ArrayData],
    shape: &[usize],
    in_place: Option<usize>,
    grad: Dtype,
) -> Result<Vec<ArrayData>> {
    let n: usize = shape.iter().product();
    crate::gpu_indices::check("fused_adam", n, data)?;
    let count = pass.rows().len();
    let (mut bound, out): (Vec<&ArrayData>, ArrayData) = match in_place {
        Some(first_row) => {
            let g = pass.inputs().iter().position(|i| *i == "g").expect("g");
            (vec![&data[g]], data[first_row].clone())
        }
        None => (
            data[..pass.inputs().len()].iter().collect(),
            custom::alloc(&[count * n], Dtype::F32)?,
        ),
    };
    if c.gated {
        bound.push(&data[data.len() - 1]);
    }
    if n > 0 {
        let key = format!(
            "fused_adam:{pass:?}:{}:{}:{grad}",
            in_place.is_some(),
            c.gated
        );
        custom::dispatch(
            &key,
            || source(pass, in_place.is_some(), c.gated, grad),
            &meta(c, n, &bound, &[&out]),
            &bound,
            &out,
            n.div_ceil(WORKGROUP),
        )?;
    }
    Ok(rows(&out, shape, count))
}
