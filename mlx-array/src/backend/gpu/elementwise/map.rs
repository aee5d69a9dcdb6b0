//! The elementwise kernel: an expression over `a0`, `a1`, … run for every
//! element of an array, with fused chains' intermediates as statements.
//!
//! # Work per invocation
//!
//! Each invocation computes 4 aligned *quads* of 4 consecutive output
//! elements, 256 quads apart (16,384 elements per workgroup of 256, each
//! of its quad rounds a coalesced run of 1,024 elements), and loads all
//! four of each input before it computes any. A quad is read and written
//! as one vector where the layout allows: a dense operand whose view
//! starts on a multiple of 4 elements is loaded as `vec4<f32|i32|u32>`
//! (16 bytes), `vec4<f16>` (8 bytes), two packed words of `bf16` or `f16`
//! (8 bytes) or one word of four `bool`s. A broadcast scalar (every
//! stride 0) is loaded once; a strided view whose rows (last axis) are
//! dense, with its offset, row length and other strides multiples of 4
//! (the heads of a projection, `[B, L, H, d]` viewed as `[B, H, L, d]`),
//! one vector per quad from one `loc` (four times fewer index divisions
//! than element by element); other operands (strided views, unaligned
//! offsets) per element. The output is always dense from element 0, so
//! its quad is one store of whole words: packed dtypes need neither
//! atomics nor a cleared buffer (the invocation owns every half or byte of
//! its words). The last quad may run past the array: its extra lanes read
//! a clamped element and write into the buffer's padding (pool buffers are
//! powers of two from 256 bytes, so every vector access stays inside the
//! buffer); quads wholly past it are skipped.
//!
//! # Expected speed on an H100
//!
//! A copy-like op moves `(inputs + 1) x 4` bytes per `f32` element with
//! 16-byte coalesced accesses. Measured on 2026-11-26 with one quad per
//! invocation: 44-62% of the device copy's ~3.0 TB/s (HBM3 peak 3.35).
//! One 16-byte load in flight per invocation is at most 32 KiB per SM
//! (2,048 invocations), barely HBM3's bandwidth-latency product (~23 KiB
//! per SM at 3 TB/s and ~1 us), and less between a load's return and the
//! next workgroup's start; four quads per invocation keep 64 bytes of
//! each input in flight per invocation (128 KiB per SM), as copy kernels
//! that reach 90% of the peak do. 2^26 elements take 4,096 workgroups, 8
//! resident per SM: 3.9 waves. The goal is >= 80% of the device copy.

use super::MATH;
use crate::backend::gpu::codegen::{self, compute_type};
use crate::backend::gpu::device::context;
use crate::backend::gpu::dispatch::dispatch_groups;
use crate::backend::gpu::pool::{alloc, supported};
use crate::data::ArrayData;
use crate::{Dtype, Result};

/// Elements per quad.
const QUAD: usize = 4;

/// Quads per invocation: `QUADS` quads 256 apart (each a coalesced
/// 4 KiB of f32 across the workgroup), all loaded before any is computed.
const QUADS: usize = 4;

/// How the kernel reads one operand.
#[derive(Clone, Copy, PartialEq)]
enum Read {
    /// Dense from an offset that is a multiple of [`QUAD`]: one vector per quad.
    Vector,
    /// Dense, unaligned: element by element at `offset + i`.
    Dense,
    /// One element broadcast to every position.
    Scalar,
    /// A strided view whose rows (the last axis) are dense and whose
    /// offset, row length and other strides are multiples of [`QUAD`]
    /// (the heads of a `[B, L, H, d]` projection viewed as `[B, H, L,
    /// d]`): every quad lies in one row, one `loc` and one vector per quad.
    Rows,
    /// A strided view: element by element through `loc`.
    Strided,
}

impl Read {
    fn of(data: &ArrayData, shape: &[usize]) -> Read {
        if shape
            .iter()
            .zip(data.strides())
            .all(|(&n, &s)| n == 1 || s == 0)
        {
            Read::Scalar
        } else if codegen::is_dense(data, shape) {
            if data.offset().is_multiple_of(QUAD) {
                Read::Vector
            } else {
                Read::Dense
            }
        } else if rows_of_quads(data, shape) {
            Read::Rows
        } else {
            Read::Strided
        }
    }

    fn tag(self) -> char {
        match self {
            Read::Vector => 'v',
            Read::Dense => 'd',
            Read::Scalar => 'c',
            Read::Rows => 'r',
            Read::Strided => 's',
        }
    }
}

/// Operands read as [`Read::Rows`] since the process started.
static ROW_VIEW_READS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many elementwise operands were read a quad per row position
/// (strided views with dense, aligned rows) since the process started
/// (for tests that check which reads a kernel took).
pub fn row_view_reads() -> usize {
    ROW_VIEW_READS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Whether the view `data` of `shape` has dense rows along its last axis,
/// a row length that is a multiple of [`QUAD`], and its offset and every
/// other stride (of axes longer than one) multiples of [`QUAD`]: each
/// aligned quad of the output then reads 4 adjacent, aligned elements.
pub(in crate::backend::gpu) fn rows_of_quads(data: &ArrayData, shape: &[usize]) -> bool {
    let strides = data.strides();
    let (Some(&last), Some(&unit)) = (shape.last(), strides.last()) else {
        return false;
    };
    let quad = QUAD as isize;
    unit == 1
        && last.is_multiple_of(QUAD)
        && data.offset().is_multiple_of(QUAD)
        && shape[..shape.len() - 1]
            .iter()
            .zip(strides)
            .all(|(&n, &s)| n == 1 || s.rem_euclid(quad) == 0)
}

/// Runs `expr` (WGSL over `a0`, `a1`, … in each input's compute type) for
/// every element of `shape`, producing `out_dtype`. `key` names the
/// expression in the pipeline cache.
pub(crate) fn map(
    key: &str,
    expr: &str,
    shape: &[usize],
    inputs: &[(&ArrayData, Dtype)],
    out_dtype: Dtype,
) -> Result<ArrayData> {
    map_with(key, "", expr, shape, inputs, out_dtype)
}

/// Like [`map`], with WGSL statements run before `expr` (fused chains
/// compute their intermediates there).
pub(crate) fn map_with(
    key: &str,
    statements: &str,
    expr: &str,
    shape: &[usize],
    inputs: &[(&ArrayData, Dtype)],
    out_dtype: Dtype,
) -> Result<ArrayData> {
    supported(out_dtype)?;
    for (_, d) in inputs {
        supported(*d)?;
    }
    let n = crate::shape::size_of_shape(shape);
    let datas: Vec<&ArrayData> = inputs.iter().map(|(d, _)| *d).collect();
    codegen::check_size(key_op(key), n, &datas)?;
    let reads: Vec<Read> = inputs.iter().map(|(d, _)| Read::of(d, shape)).collect();
    ROW_VIEW_READS.fetch_add(
        reads.iter().filter(|r| **r == Read::Rows).count(),
        std::sync::atomic::Ordering::Relaxed,
    );
    let full_key = format!(
        "map4:{key}:{}:{}",
        inputs
            .iter()
            .zip(&reads)
            .map(|((_, d), r)| format!("{d}{}", r.tag()))
            .collect::<Vec<_>>()
            .join(","),
        out_dtype
    );
    let pipeline = context()?.pipeline(&full_key, || {
        source(statements, expr, inputs, &reads, out_dtype)
    })?;
    let mut meta = vec![n as u32, shape.len() as u32];
    meta.extend(shape.iter().map(|&s| s as u32));
    for (d, _) in inputs {
        codegen::push_view(&mut meta, d);
    }
    let out = alloc(shape, out_dtype)?;
    dispatch_groups(
        &pipeline,
        &meta,
        &datas,
        &out,
        n * out_dtype.size_of(),
        false,
        n.div_ceil(QUADS * QUAD * codegen::WORKGROUP as usize),
    )?;
    Ok(out)
}

fn source(
    statements: &str,
    expr: &str,
    inputs: &[(&ArrayData, Dtype)],
    reads: &[Read],
    out_dtype: Dtype,
) -> String {
    let mut src = String::from(codegen::PRELUDE);
    src.push_str(MATH);
    src.push_str(codegen::META);
    for (k, ((_, d), r)) in inputs.iter().zip(reads).enumerate() {
        let name = format!("in{k}");
        if matches!(r, Read::Vector | Read::Rows) {
            src.push_str(&input4(&name, k as u32 + 1, *d));
        } else {
            src.push_str(&codegen::input(&name, k as u32 + 1, *d));
        }
    }
    src.push_str(&output4(inputs.len() as u32 + 1, out_dtype));
    src.push_str(&codegen::strided_loc(1, 2));
    // One element's value, from one element of each input.
    let params: Vec<String> = inputs
        .iter()
        .enumerate()
        .map(|(k, (_, d))| format!("a{k}: {}", compute_type(*d)))
        .collect();
    src.push_str(&format!(
        "fn elem({}) -> {} {{\n{statements}    return {expr};\n}}\n",
        params.join(", "),
        compute_type(out_dtype)
    ));
    src.push_str(codegen::GROUP_ENTRY);
    src.push_str(" {\n    ");
    src.push_str(codegen::GROUP_INDEX);
    src.push_str(&format!(
        "
    let n = params[0];
    let first = g * {per_group}u + lid;
    if (first * 4u >= n) {{ return; }}
    let nd = params[1];
    let last = n - 1u;
",
        per_group = QUADS * codegen::WORKGROUP as usize
    ));
    // The WGSL of input `k`'s quad at element `e` (`None`: a broadcast
    // scalar, loaded once).
    let read = |k: usize, e: &str| -> Option<String> {
        let (_, d) = inputs[k];
        let base = format!("(2u + nd + {k}u * (nd + 1u))");
        let t = compute_type(d);
        let lanes = |lane: &dyn Fn(u32) -> String| {
            format!(
                "vec4<{t}>({}, {}, {}, {})",
                lane(0),
                lane(1),
                lane(2),
                lane(3)
            )
        };
        match reads[k] {
            Read::Vector => Some(format!("load4_in{k}((params[{base}] + {e}) >> 2u)")),
            Read::Scalar => None,
            Read::Dense => Some(lanes(&|c| {
                format!("load_in{k}(params[{base}] + min({e} + {c}u, last))")
            })),
            Read::Rows => Some(format!("load4_in{k}(loc({e}, {base}) >> 2u)")),
            Read::Strided => Some(lanes(&|c| {
                format!("load_in{k}(loc(min({e} + {c}u, last), {base}))")
            })),
        }
    };
    for (k, (_, d)) in inputs.iter().enumerate() {
        if reads[k] == Read::Scalar {
            let base = format!("(2u + nd + {k}u * (nd + 1u))");
            src.push_str(&format!(
                "    let x{k} = vec4<{t}>(load_in{k}(params[{base}]));\n",
                t = compute_type(*d)
            ));
        }
    }
    // Every quad's loads first, so that they are in flight together.
    for j in 0..QUADS {
        src.push_str(&format!(
            "    let q{j} = first + {off}u;\n    let e{j} = q{j} * 4u;\n",
            off = j * codegen::WORKGROUP as usize
        ));
        for (k, (_, d)) in inputs.iter().enumerate() {
            if let Some(line) = read(k, &format!("e{j}")) {
                src.push_str(&format!(
                    "    var x{k}_{j} = vec4<{t}>();\n    if (e{j} < n) {{ x{k}_{j} = {line}; }}\n",
                    t = compute_type(*d)
                ));
            }
        }
    }
    for j in 0..QUADS {
        let lane = |c: &str| {
            let args: Vec<String> = (0..inputs.len())
                .map(|k| {
                    if reads[k] == Read::Scalar {
                        format!("x{k}.{c}")
                    } else {
                        format!("x{k}_{j}.{c}")
                    }
                })
                .collect();
            format!("elem({})", args.join(", "))
        };
        src.push_str(&format!(
            "    if (e{j} < n) {{ store4(q{j}, vec4<{}>({}, {}, {}, {})); }}\n",
            compute_type(out_dtype),
            lane("x"),
            lane("y"),
            lane("z"),
            lane("w")
        ));
    }
    src.push_str("}\n");
    src
}

/// A dense input read a quad at a time: `load4_<name>(quad)` returns elements
/// `4q .. 4q + 4` of the buffer in the dtype's compute type.
pub(in crate::backend::gpu) fn input4(name: &str, binding: u32, d: Dtype) -> String {
    let (ty, body) = match d {
        Dtype::F32 => ("vec4<f32>", format!("return {name}[quad];")),
        Dtype::I32 => ("vec4<i32>", format!("return {name}[quad];")),
        Dtype::U32 | Dtype::I64 => ("vec4<u32>", format!("return {name}[quad];")),
        Dtype::F16 if !codegen::packed(d) => {
            ("vec4<f16>", format!("return vec4<f32>({name}[quad]);"))
        }
        Dtype::F16 => (
            "vec2<u32>",
            format!(
                "let w = {name}[quad]; return vec4<f32>(unpack2x16float(w.x), unpack2x16float(w.y));"
            ),
        ),
        Dtype::BF16 => (
            "vec2<u32>",
            format!(
                "let w = {name}[quad]; return bitcast<vec4<f32>>(vec4<u32>(w.x << 16u, w.x & 0xffff0000u, w.y << 16u, w.y & 0xffff0000u));"
            ),
        ),
        Dtype::Bool => (
            "u32",
            format!(
                "let w = {name}[quad]; return vec4<u32>(w & 0xffu, (w >> 8u) & 0xffu, (w >> 16u) & 0xffu, w >> 24u);"
            ),
        ),
    };
    format!(
        "@group(0) @binding({binding}) var<storage, read> {name}: array<{ty}>;\nfn load4_{name}(quad: u32) -> vec4<{}> {{ {body} }}\n",
        compute_type(d)
    )
}

/// The dense output `out`, written a quad at a time by `store4(q, v)`:
/// whole words, so packed dtypes need no atomics. Half dtypes round to
/// nearest even as every store does ([`codegen::round_to`]).
pub(in crate::backend::gpu) fn output4(binding: u32, d: Dtype) -> String {
    let (ty, body) = match d {
        Dtype::F32 => ("vec4<f32>", "out[q] = v;"),
        Dtype::I32 => ("vec4<i32>", "out[q] = v;"),
        Dtype::U32 | Dtype::I64 => ("vec4<u32>", "out[q] = v;"),
        Dtype::F16 if !codegen::packed(d) => (
            "vec4<f16>",
            "out[q] = vec4<f16>(vec4<f32>(round_f16(v.x), round_f16(v.y), round_f16(v.z), round_f16(v.w)));",
        ),
        Dtype::F16 => (
            "vec2<u32>",
            "out[q] = vec2<u32>(f16_bits(v.x) | (f16_bits(v.y) << 16u), f16_bits(v.z) | (f16_bits(v.w) << 16u));",
        ),
        Dtype::BF16 => (
            "vec2<u32>",
            "out[q] = vec2<u32>(bf16_bits(v.x) | (bf16_bits(v.y) << 16u), bf16_bits(v.z) | (bf16_bits(v.w) << 16u));",
        ),
        Dtype::Bool => (
            "u32",
            "out[q] = (v.x & 1u) | ((v.y & 1u) << 8u) | ((v.z & 1u) << 16u) | ((v.w & 1u) << 24u);",
        ),
    };
    format!(
        "@group(0) @binding({binding}) var<storage, read_write> out: array<{ty}>;\nfn store4(q: u32, v: vec4<{}>) {{ {body} }}\n",
        compute_type(d)
    )
}

fn key_op(key: &str) -> &'static str {
    // Size errors name the family; the key itself is not 'static.
    if key.starts_with("unary") {
        "unary"
    } else if key.starts_with("binary") {
        "binary"
    } else {
        "elementwise"
    }
}
