//! Fused Adam(W) steps of several parameters in one GPU dispatch (PyTorch's
//! multi-tensor `foreach`/`fused` Adam): a training step then records a
//! few optimizer kernels instead of one per parameter (39 for the
//! reference Llama, 111 for the 12-layer one), and the host's cost of
//! recording a dispatch, tens of microseconds on an H100's driver, is paid
//! that much less often. One parameter is a group of one.
//!
//! Work: each thread steps two consecutive elements of one parameter, 256
//! threads a workgroup; the parameters' workgroups follow one another, and
//! a workgroup finds its parameter by comparing its number with each
//! parameter's end (a chain of comparisons, as many as the dispatch has
//! parameters). Each element's arithmetic is the single-parameter
//! kernel's and the CPU's (`element` in `fused.rs`), operation for
//! operation in float32.
//!
//! Bindings: after `params` (the meta words), each parameter's inputs
//! (`p`, `g`, `m`, `v`, or only `g` when it steps in place on its donated
//! rows), the gate's control, then each parameter's output buffer (its
//! three rows, read and written in place) and its half-precision copy. A
//! dispatch takes as many parameters as the adapter's storage-buffer
//! limit allows ([`custom::storage_buffer_limit`], at most
//! [`MAX_PER_DISPATCH`]): on lavapipe's 32, fifteen parameters stepping in
//! place, ten with copies; WebGPU's floor of 8 still takes one.
//!
//! The copy: two elements a thread make one 32-bit word of a packed copy
//! (bfloat16, and float16 where the adapter has no native `f16`), stored
//! whole: no atomics and no cleared buffer, so the dispatch needs no clear
//! (which would end the shared compute pass). Its bits are those of
//! mlx-array's rounding, as `astype` rounds.
//!
//! `params` words: the flags (bit 0: weight decay, bit 1: bias
//! correction's denominator), the number of candidates, the control's
//! offset, a spare word, then [`COEFFICIENTS`] words per candidate, then
//! [`RECORD`] words per parameter: the end of its workgroups, its
//! elements, then the element offsets of `p`, `g`, `m`, `v`, its output
//! and its copy.

use mlx_array::backend::gpu::custom;
use mlx_array::{ArrayData, Dtype, Result};

use super::gpu::{COEFFICIENTS, MOMENTS, coefficients, parameter};
use super::{StepCoefficients, rows};

/// Threads per workgroup.
const WORKGROUP: usize = 256;

/// Elements a thread steps.
const PER_THREAD: usize = 2;

/// Parameters a dispatch takes at most (the kernel's chain of comparisons
/// and its source grow with them).
const MAX_PER_DISPATCH: usize = 32;

/// Words of `params` before the coefficients.
const HEADER: usize = 4;

/// Words of `params` per parameter.
const RECORD: usize = 8;

/// One parameter of a grouped step.
pub(super) struct Param<'a> {
    /// `[p, g, m, v]`: dense, on the GPU.
    pub data: &'a [ArrayData],
    pub shape: &'a [usize],
    /// `p`, `m` and `v` are the donated rows 0, 1, 2 of `data[0]`'s
    /// buffer, written over.
    pub in_place: bool,
    /// The gradient's dtype (half precision is widened as it is read).
    pub grad: Dtype,
}

impl Param<'_> {
    fn elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Storage buffers it binds.
    fn bindings(&self, copy: bool) -> usize {
        (if self.in_place { 2 } else { 5 }) + usize::from(copy)
    }

    /// Its workgroups.
    fn groups(&self) -> usize {
        self.elements().div_ceil(PER_THREAD).div_ceil(WORKGROUP)
    }
}

/// Steps every parameter of `params` with the coefficients `c` (reading
/// the gate's `control` when gated), writing each new parameter's copy in
/// `copy` when given. Returns, per parameter, its rows `p'`, `m'`, `v'`
/// (of one buffer) and then its copy.
pub(super) fn run(
    c: &StepCoefficients,
    copy: Option<Dtype>,
    params: &[Param<'_>],
    control: Option<&ArrayData>,
) -> Result<Vec<Vec<ArrayData>>> {
    debug_assert_eq!(c.gated, control.is_some());
    let mut outs = Vec::with_capacity(params.len());
    let mut copies = Vec::with_capacity(params.len());
    for p in params {
        let n = p.elements();
        crate::gpu_indices::check("fused_adam", n, p.data)?;
        outs.push(if p.in_place {
            p.data[0].clone()
        } else {
            custom::alloc(&[3 * n], Dtype::F32)?
        });
        copies.push(copy.map(|d| custom::alloc(p.shape, d)).transpose()?);
    }
    let budget = custom::storage_buffer_limit()?
        .saturating_sub(1 + usize::from(c.gated))
        .max(1);
    let mut batch: Vec<usize> = Vec::new();
    let mut bound = 0;
    let live = (0..params.len()).filter(|&j| params[j].elements() > 0);
    for j in live {
        let b = params[j].bindings(copy.is_some());
        if !batch.is_empty() && (bound + b > budget || batch.len() == MAX_PER_DISPATCH) {
            dispatch(c, copy, params, &batch, &outs, &copies, control)?;
            (batch, bound) = (Vec::new(), 0);
        }
        batch.push(j);
        bound += b;
    }
    if !batch.is_empty() {
        dispatch(c, copy, params, &batch, &outs, &copies, control)?;
    }
    Ok(params
        .iter()
        .zip(outs.iter().zip(copies))
        .map(|(p, (out, copied))| {
            let mut r = rows(out, p.shape, 3);
            r.extend(copied);
            r
        })
        .collect())
}

/// Records the dispatch of the parameters `batch` (indices into `params`,
/// `outs` and `copies`).
fn dispatch(
    c: &StepCoefficients,
    copy: Option<Dtype>,
    params: &[Param<'_>],
    batch: &[usize],
    outs: &[ArrayData],
    copies: &[Option<ArrayData>],
    control: Option<&ArrayData>,
) -> Result<()> {
    let first = &c.candidates[0];
    let flags = u32::from(first.decay.is_some()) | (u32::from(first.denominator.is_some()) << 1);
    let mut meta = vec![
        flags,
        c.candidates.len() as u32,
        control.map_or(0, |d| d.offset() as u32),
        0,
    ];
    for cand in &c.candidates {
        meta.extend(coefficients(cand).map(f32::to_bits));
    }
    let mut inputs: Vec<&ArrayData> = Vec::new();
    let mut outputs: Vec<&ArrayData> = Vec::new();
    let mut end = 0;
    let mut shapes = Vec::with_capacity(batch.len());
    for &j in batch {
        let p = &params[j];
        end += p.groups();
        let offset = |k: usize| p.data[k].offset() as u32;
        let copy_offset = copies[j].as_ref().map_or(0, |d| d.offset() as u32);
        debug_assert_eq!(copy_offset, 0, "a packed copy is stored a word at a time");
        meta.extend([
            end as u32,
            p.elements() as u32,
            offset(0),
            offset(1),
            offset(2),
            offset(3),
            outs[j].offset() as u32,
            copy_offset,
        ]);
        if p.in_place {
            inputs.push(&p.data[1]);
        } else {
            inputs.extend(&p.data[..4]);
        }
        outputs.push(&outs[j]);
        outputs.extend(copies[j].as_ref());
        shapes.push(Shape {
            in_place: p.in_place,
            grad: p.grad,
        });
    }
    inputs.extend(control);
    let key = format!(
        "fused_adam_group:{}:{copy:?}:{}",
        c.gated,
        shapes
            .iter()
            .map(|s| format!("{}{}", if s.in_place { 'i' } else { 'n' }, s.grad))
            .collect::<Vec<_>>()
            .join(",")
    );
    custom::dispatch_outputs(
        &key,
        || source(&shapes, c.gated, copy),
        &meta,
        &inputs,
        &outputs,
        None,
        end,
    )
}

/// What the kernel's source depends on, per parameter.
struct Shape {
    in_place: bool,
    grad: Dtype,
}

/// The kernel's WGSL for parameters of `shapes`, in binding order.
fn source(shapes: &[Shape], gated: bool, copy: Option<Dtype>) -> String {
    let mut s = String::from(
        "@group(0) @binding(0) var<storage, read> params: array<u32>;\n\
         var<private> cb: u32;\n\
         var<private> keep: bool;\n\
         fn coef(k: u32) -> f32 { return bitcast<f32>(params[cb + k]); }\n",
    );
    let mut binding = 1u32;
    let mut next = || {
        binding += 1;
        binding - 1
    };
    for (j, sh) in shapes.iter().enumerate() {
        let names: &[&str] = if sh.in_place {
            &["g"]
        } else {
            &["p", "g", "m", "v"]
        };
        for name in names {
            let d = if *name == "g" { sh.grad } else { Dtype::F32 };
            s += &custom::input(&format!("{name}{j}"), next(), d);
        }
    }
    if gated {
        s += &custom::input("ctl", next(), Dtype::F32);
    }
    for j in 0..shapes.len() {
        s += &format!(
            "@group(0) @binding({}) var<storage, read_write> out{j}: array<f32>;\n",
            next()
        );
        match copy {
            Some(d) if custom::packed(d) => {
                s += &format!(
                    "@group(0) @binding({}) var<storage, read_write> pc{j}: array<u32>;\n",
                    next()
                );
            }
            Some(d) => s += &custom::output(&format!("pc{j}"), next(), d),
            None => {}
        }
    }
    for (j, sh) in shapes.iter().enumerate() {
        s += &element(j, sh.in_place);
        s += &pair(j, copy);
    }
    s += "@compute @workgroup_size(256)\n\
          fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>,\n\
          \x20       @builtin(local_invocation_index) li: u32) {\n\
          \x20   let w = wid.x + wid.y * nw.x;\n";
    s += &format!("    let rb = {HEADER}u + {COEFFICIENTS}u * params[1];\n");
    if gated {
        // 0: keep the state; j + 1: candidate j (clamped: a kernel cannot
        // fail).
        s += &format!(
            "    let sel = u32(load_ctl(params[2]));\n\
             \x20   keep = sel == 0u;\n\
             \x20   cb = {HEADER}u + {COEFFICIENTS}u * (min(max(sel, 1u), params[1]) - 1u);\n"
        );
    } else {
        s += &format!("    keep = false;\n    cb = {HEADER}u;\n");
    }
    for j in 0..shapes.len() {
        let start = if j == 0 {
            "0u".to_string()
        } else {
            format!("params[rb + {}u]", RECORD * (j - 1))
        };
        s += &format!(
            "    if (w < params[rb + {r}u]) {{\n\
             \x20       pair{j}(rb + {r}u, (w - {start}) * 256u + li);\n\
             \x20       return;\n\
             \x20   }}\n",
            r = RECORD * j
        );
    }
    s += "}\n";
    s
}

/// WGSL `fn el<j>(r, i) -> f32`: element `i` of parameter `j` (record at
/// `params[r]`) stepped (or kept), its rows written; returns the new (or
/// kept) parameter.
fn element(j: usize, in_place: bool) -> String {
    let read = |name: &str, k: usize, row: usize| {
        if in_place {
            format!("    let {name}0 = out{j}[o + {row}u * n];\n")
        } else {
            format!("    let {name}0 = load_{name}{j}(params[r + {k}u] + i);\n")
        }
    };
    let mut s = format!(
        "fn el{j}(r: u32, i: u32) -> f32 {{\n\
         \x20   let n = params[r + 1u];\n\
         \x20   let o = params[r + 6u] + i;\n"
    );
    s += &read("p", 2, 0);
    s += &format!("    let g0 = load_g{j}(params[r + 3u] + i);\n");
    s += &read("m", 4, 1);
    s += &read("v", 5, 2);
    s += "    if (keep) {\n";
    if !in_place {
        s += &format!(
            "        out{j}[o] = p0;\n\
             \x20       out{j}[o + n] = m0;\n\
             \x20       out{j}[o + 2u * n] = v0;\n"
        );
    }
    s += "        return p0;\n    }\n    let flags = params[0];\n";
    s += MOMENTS;
    s += &parameter("m1", "v1");
    s += &format!(
        "    out{j}[o] = p1;\n    out{j}[o + n] = m1;\n    out{j}[o + 2u * n] = v1;\n\
         \x20   return p1;\n}}\n"
    );
    s
}

/// WGSL `fn pair<j>(r, t)`: thread `t`'s two elements of parameter `j`,
/// and their copy.
fn pair(j: usize, copy: Option<Dtype>) -> String {
    let mut s = format!(
        "fn pair{j}(r: u32, t: u32) {{\n\
         \x20   let n = params[r + 1u];\n\
         \x20   let i = {PER_THREAD}u * t;\n\
         \x20   if (i >= n) {{ return; }}\n\
         \x20   let a = el{j}(r, i);\n\
         \x20   let two = i + 1u < n;\n\
         \x20   var b: f32 = 0.0;\n\
         \x20   if (two) {{ b = el{j}(r, i + 1u); }}\n"
    );
    match copy {
        // Zero's bits are zero: a lone last element leaves the high half
        // clear.
        Some(d) if custom::packed(d) => {
            let bits = if d == Dtype::BF16 {
                "bf16_bits"
            } else {
                "f16_bits"
            };
            s += &format!(
                "    pc{j}[(params[r + 7u] + i) >> 1u] = {bits}(a) | ({bits}(b) << 16u);\n"
            );
        }
        Some(_) => {
            s += &format!(
                "    store_pc{j}(params[r + 7u] + i, a);\n\
                 \x20   if (two) {{ store_pc{j}(params[r + 7u] + i + 1u, b); }}\n"
            );
        }
        None => {}
    }
    s += "}\n";
    s
}
