//! The fused Adam(W) primitives on the GPU: one WGSL pass through
//! mlx-array's custom-kernel hook ([`mlx_array::backend::gpu::custom`]).
//!
//! One thread per element, 256 threads per workgroup, no workgroup memory:
//! each thread reads `p`, `g`, `m`, `v` once and writes `p'`, `m'`, `v'` once
//! (28 bytes per element, against about 13 kernels and 100 bytes op by op),
//! so the kernel is bound by memory bandwidth. On an H100 (132 SMs, 2,048
//! threads each) the reference model's largest parameter (50,257 x 256 =
//! 12.9 M elements) is 50,000 workgroups, full occupancy for many waves;
//! at 3 TB/s its 360 MB take about 0.12 ms.
//!
//! The arithmetic is the CPU kernel's, operation for operation in float32
//! (`element`, `moments`, `parameter` in `fused.rs`); WGSL does not promise
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
//! The state's buffer layout is the CPU's: `p'`, `m'`, `v'` the rows of one
//! output buffer, written over the previous step's rows when they are
//! donated (the kernel then binds that buffer alone, read and written, and
//! the gradient: a buffer cannot be bound twice with a writable binding).
//!
//! A step that also writes the new parameter's half-precision copy binds
//! that copy's own buffer last and stores it through mlx-array's rounding
//! (`custom::output`), so it holds exactly what `astype` would compute;
//! where the copy is packed two to a word, the buffer is cleared first and
//! stored with atomic ORs. Skipped steps write the copy of the kept
//! parameter. With the copy, a gated step that is not in place binds eight
//! storage buffers, the most every WebGPU adapter offers.

use mlx_array::backend::gpu::custom;
use mlx_array::{ArrayData, Dtype, Result};

use super::{AdamCoefficients, StepCoefficients, rows};

/// Threads per workgroup.
const WORKGROUP: usize = 256;

/// What one dispatch computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// `[p, g, m, v]` to `p'`, `m'`, `v'`.
    Step,
    /// `[g, m, v]` to `m'`, `v'`.
    Moments,
    /// `[p, m', v']` to `p'`.
    Parameter,
}

impl Pass {
    /// The rows this pass writes (and, in place, reads) in its output buffer.
    fn rows(self) -> &'static [&'static str] {
        match self {
            Pass::Step => &["p", "m", "v"],
            Pass::Moments => &["m", "v"],
            Pass::Parameter => &["p"],
        }
    }

    /// The inputs it reads, in binding order.
    fn inputs(self) -> &'static [&'static str] {
        match self {
            Pass::Step => &["p", "g", "m", "v"],
            Pass::Moments => &["g", "m", "v"],
            Pass::Parameter => &["p", "m", "v"],
        }
    }
}

/// `params` words: `n`, the flags (bit 0: weight decay, bit 1: bias
/// correction's denominator), the element offset of each bound buffer's
/// view, in binding order (inputs, then the output), the number of
/// candidates, then the eight coefficients' bits of each.
const OFFSETS_AT: usize = 2;

/// Coefficients per candidate in `params`.
const COEFFICIENTS: usize = 8;

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

/// The kernel's WGSL; `copy`: the dtype of the parameter's copy, when the
/// step writes one (its offset follows the output's in `params`); `grad`:
/// the gradient's dtype (half precision is widened as it is read).
fn source(pass: Pass, in_place: bool, gated: bool, copy: Option<Dtype>, grad: Dtype) -> String {
    let bound = bound_names(pass, in_place, gated);
    // After the offsets: the number of candidates, then their coefficients.
    let count_at = OFFSETS_AT + bound.len() + 1 + usize::from(copy.is_some());
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
    if let Some(d) = copy {
        s += &custom::output("pcopy", bound.len() as u32 + 2, d);
    }
    s += "@compute @workgroup_size(256)\n\
          fn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>) {\n\
          \x20   let i = gid.x + gid.y * nw.x * 256u;\n\
          \x20   let n = params[0];\n\
          \x20   if (i >= n) { return; }\n\
          \x20   let flags = params[1];\n";
    let out_at = OFFSETS_AT + bound.len();
    s += &format!("    let o = params[{out_at}u] + i;\n");
    // The copy's element: stored from the new (or kept) parameter.
    let store_copy = |p: &str| match copy {
        Some(_) => format!("    store_pcopy(params[{}u] + i, {p});\n", out_at + 1),
        None => String::new(),
    };
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
        s += &store_copy("p0");
        s += &format!(
            "        return;\n    }}\n\
             \x20   cb = {coefs_at}u + {COEFFICIENTS}u * (min(sel, params[{count_at}u]) - 1u);\n"
        );
    } else {
        s += &format!("    cb = {coefs_at}u;\n");
    }
    // The coefficients: b1, 1 - b1, b2, 1 - b2, numerator, denominator, eps, decay.
    let moments = "    let m1 = m0 * coef(0u) + g0 * coef(1u);\n\
                   \x20   let v1 = v0 * coef(2u) + (g0 * g0) * coef(3u);\n";
    let parameter = |m: &str, v: &str| {
        format!(
            "    var p = p0;\n\
             \x20   if ((flags & 1u) != 0u) {{ p = p * coef(7u); }}\n\
             \x20   var root = sqrt({v});\n\
             \x20   if ((flags & 2u) != 0u) {{ root = root / coef(5u); }}\n\
             \x20   let p1 = p - ({m} * coef(4u)) / (root + coef(6u));\n"
        )
    };
    match pass {
        Pass::Step => {
            s += moments;
            s += &parameter("m1", "v1");
            s += "    out[o] = p1;\n    out[o + n] = m1;\n    out[o + 2u * n] = v1;\n";
            s += &store_copy("p1");
        }
        Pass::Moments => {
            s += moments;
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

/// One candidate's coefficients in the kernel's order.
fn coefficients(c: &AdamCoefficients) -> [f32; COEFFICIENTS] {
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

/// Runs `pass` over `data` (the inputs' data in [`Pass::inputs`] order,
/// then a gated step's control, dense, on the GPU), `shape` elements each.
/// `in_place`: the inputs that are rows of the output (every one but the
/// gradient) are the donated rows of one buffer, which input `in_place`
/// views from its start. `copy` (with [`Pass::Step`] only): also write the
/// new parameter cast to that dtype. `grad`: the gradient's dtype. Returns
/// the output rows, then the copy.
pub(super) fn run(
    pass: Pass,
    c: &StepCoefficients,
    data: &[ArrayData],
    shape: &[usize],
    in_place: Option<usize>,
    copy: Option<Dtype>,
    grad: Dtype,
) -> Result<Vec<ArrayData>> {
    debug_assert!(copy.is_none() || pass == Pass::Step);
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
    let copied = copy.map(|d| custom::alloc(shape, d)).transpose()?;
    let outputs: Vec<&ArrayData> = std::iter::once(&out).chain(&copied).collect();
    if n > 0 {
        let key = format!(
            "fused_adam:{pass:?}:{}:{}:{copy:?}:{grad}",
            in_place.is_some(),
            c.gated
        );
        // A packed copy is stored with atomic ORs into cleared words.
        let clear = copy.filter(|&d| custom::packed(d)).map(|d| n * d.size_of());
        custom::dispatch_outputs(
            &key,
            || source(pass, in_place.is_some(), c.gated, copy, grad),
            &meta(c, n, &bound, &outputs),
            &bound,
            &outputs,
            clear,
            n.div_ceil(WORKGROUP),
        )?;
    }
    let mut result = rows(&out, shape, count);
    result.extend(copied);
    Ok(result)
}
