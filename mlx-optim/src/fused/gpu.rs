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
//! The state's buffer layout is the CPU's: `p'`, `m'`, `v'` the rows of one
//! output buffer, written over the previous step's rows when they are
//! donated (the kernel then binds that buffer alone, read and written, and
//! the gradient: a buffer cannot be bound twice with a writable binding).

use mlx_array::backend::gpu::custom;
use mlx_array::{ArrayData, Dtype, Result};

use super::{AdamCoefficients, rows};

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
/// correction's denominator), the eight coefficients' bits, then the
/// element offset of each bound buffer's view, in binding order (inputs,
/// then the output).
const OFFSETS_AT: usize = 10;

/// The kernel's WGSL. In place, only `g` is an input and the rows are read
/// from the output buffer itself.
fn source(pass: Pass, in_place: bool) -> String {
    let bound: Vec<&str> = if in_place {
        vec!["g"]
    } else {
        pass.inputs().to_vec()
    };
    let mut s = String::from(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         fn coef(k: u32) -> f32 { return bitcast<f32>(params[k]); }\n",
    );
    for (k, name) in bound.iter().enumerate() {
        s += &format!(
            "@group(0) @binding({}) var<storage, read> in_{name}: array<f32>;\n",
            k + 1
        );
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
                format!("in_{name}[params[{}u] + i]", OFFSETS_AT + k)
            }
        };
        s += &format!("    let {name}0 = {expr};\n");
    }
    // The coefficients: b1, 1 - b1, b2, 1 - b2, numerator, denominator, eps, decay.
    let moments = "    let m1 = m0 * coef(2u) + g0 * coef(3u);\n\
                   \x20   let v1 = v0 * coef(4u) + (g0 * g0) * coef(5u);\n";
    let parameter = |m: &str, v: &str| {
        format!(
            "    var p = p0;\n\
             \x20   if ((flags & 1u) != 0u) {{ p = p * coef(9u); }}\n\
             \x20   var root = sqrt({v});\n\
             \x20   if ((flags & 2u) != 0u) {{ root = root / coef(7u); }}\n\
             \x20   let p1 = p - ({m} * coef(6u)) / (root + coef(8u));\n"
        )
    };
    match pass {
        Pass::Step => {
            s += moments;
            s += &parameter("m1", "v1");
            s += "    out[o] = p1;\n    out[o + n] = m1;\n    out[o + 2u * n] = v1;\n";
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

/// The `params` words for `n` elements, the views `bound` and the output.
fn meta(c: &AdamCoefficients, n: usize, bound: &[&ArrayData], out: &ArrayData) -> Vec<u32> {
    let flags = u32::from(c.decay.is_some()) | (u32::from(c.denominator.is_some()) << 1);
    let mut m = vec![n as u32, flags];
    m.extend(
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
        .map(f32::to_bits),
    );
    debug_assert_eq!(m.len(), OFFSETS_AT);
    m.extend(bound.iter().map(|d| d.offset() as u32));
    m.push(out.offset() as u32);
    m
}

/// Runs `pass` over `data` (the inputs' data in [`Pass::inputs`] order,
/// dense, on the GPU), `shape` elements each. `in_place`: the inputs that
/// are rows of the output (every one but the gradient) are the donated
/// rows of one buffer, which input `in_place` views from its start.
/// Returns the output rows.
pub(super) fn run(
    pass: Pass,
    c: &AdamCoefficients,
    data: &[ArrayData],
    shape: &[usize],
    in_place: Option<usize>,
) -> Result<Vec<ArrayData>> {
    let n: usize = shape.iter().product();
    if n > u32::MAX as usize / 4
        || data
            .iter()
            .any(|d| d.storage().capacity() / 4 > u32::MAX as usize)
    {
        return Err(mlx_array::Error::gpu(format!(
            "fused_adam: {n} elements exceed the GPU kernel's 32-bit indices"
        )));
    }
    let count = pass.rows().len();
    let (bound, out): (Vec<&ArrayData>, ArrayData) = match in_place {
        Some(first_row) => {
            let g = pass.inputs().iter().position(|i| *i == "g").expect("g");
            (vec![&data[g]], data[first_row].clone())
        }
        None => (
            data.iter().collect(),
            custom::alloc(&[count * n], Dtype::F32)?,
        ),
    };
    if n > 0 {
        let key = format!("fused_adam:{pass:?}:{}", in_place.is_some());
        custom::dispatch(
            &key,
            || source(pass, in_place.is_some()),
            &meta(c, n, &bound, &out),
            &bound,
            &out,
            n.div_ceil(WORKGROUP),
        )?;
    }
    Ok(rows(&out, shape, count))
}
