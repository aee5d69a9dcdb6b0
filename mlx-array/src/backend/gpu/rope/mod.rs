//! Rotary position embedding on the GPU (see `backend::cpu::rope`).
//!
//! The common cases, halves or adjacent pairs rotated over the whole row
//! (`dims` = the head width, a multiple of 8; this crate's Llama rotates
//! pairs, `traditional = true`), read their input where it lies: rows of
//! adjacent, aligned elements through any strides (the heads of a `[B, L,
//! H, d]` projection viewed as `[B, H, L, d]`, and the attention's packed
//! gradients so viewed), with no copy first. For halves each invocation
//! rotates 4 pairs: the quads at `c` and `c + d / 2` of one row, one
//! vector load and store each, one index computation (`loc`) and 4 angles
//! per 8 elements; for pairs, the 2 pairs of the quad at `c`. Before, a
//! dense copy
//! of the view (a kernel and a pass over the data of its own) ran first,
//! and each element computed its own index, angle, sine and cosine: on
//! an H200 the large model's 48 rotations a step took 83 us each (0.6
//! TB/s of the data they move). Designed, not measured: a read and a
//! write of the data, near the copy's bandwidth.
//!
//! Anything else (a pass-through tail, rows not of whole quads) takes a
//! dense copy and one invocation per output element, reading its pair's
//! partner.
//!
//! A rotation with explicit inverse frequencies (`RopeSpec::freqs`) runs
//! the same kernels, its table appended to the parameter words (half a
//! head's width of words: 32 for a 64-wide head) and read where the
//! others compute `exp(pair * k)`; the word that held `k` holds the
//! table's start. Without a table the kernels' source is unchanged.
//!
//! Asked to keep its input's order (the gradient's rotation: it reads the
//! attention's gradients, stored `[B, L, H, d]`, and feeds the transpose
//! back to that order), a rotation by quads of an input that is a
//! permutation of a dense block stores its output in that block's order,
//! with the input's strides: the transpose and reshape after it are then
//! views, where a `[B, H, L, d]` output took them a copy.

use super::codegen;
use super::device::context;
use super::dispatch::dispatch;
use super::elementwise::dense;
use super::elementwise::{input4, output4, rows_of_quads};
use super::pool::alloc;
use crate::Result;
use crate::backend::common::rope::RopeSpec;
use crate::data::{ArrayData, Operand};

/// Whether `x` rotates by quads in place ([`rope_quads`]): halves or
/// pairs over the whole row, a multiple of 8 wide, and a view whose rows
/// are read by aligned quads (`elementwise::rows_of_quads`).
fn by_quads(x: &Operand<'_>, spec: &RopeSpec) -> bool {
    let width = x.shape.last().copied().unwrap_or(0);
    spec.dims == width && width.is_multiple_of(8) && rows_of_quads(&x.data, x.shape)
}

/// The WGSL of a kernel of one invocation per `i`: the prelude, the
/// parameters, `bindings`, then `body` after the invocation's index.
fn source(bindings: &str, body: &str) -> String {
    let mut s = String::from(codegen::PRELUDE);
    s.push_str(codegen::META);
    s.push_str(bindings);
    s.push_str(codegen::ENTRY);
    s.push_str(" {\n    ");
    s.push_str(codegen::THREAD_INDEX);
    s.push_str(body);
    s
}

/// The angle's factors as `spec` gives them: the position scale and the
/// log-frequency step `k` (`theta = position * scale * exp(pair * k)`).
fn angle(spec: &RopeSpec) -> (f32, f32) {
    let k = (-2.0 * (spec.base as f64).ln() / spec.dims as f64) as f32;
    (spec.scale, k)
}

/// The word of the angle's frequencies (`params[at]`): the log-frequency
/// step `k`'s bits, or with a table, `table_at`, where the table will be
/// appended ([`push_table`]).
fn frequency_word(spec: &RopeSpec, table_at: usize) -> u32 {
    match spec.freqs {
        Some(_) => table_at as u32,
        None => angle(spec).1.to_bits(),
    }
}

/// Appends `spec`'s frequency table, if any, to `meta` (f32 bits).
fn push_table(meta: &mut Vec<u32>, spec: &RopeSpec) {
    if let Some(f) = &spec.freqs {
        meta.extend(f.iter().map(|v| v.to_bits()));
    }
}

/// The source for a frequency table: `exp(<pairs> * <k>)`, the frequency
/// of pairs whose `k` lies in `params[word]` (as `word` is spelled in the
/// kernel), becomes the table's entries, read from `params[params[word]]`
/// on. `vector`: the pairs are a `vec4<f32>`, else a `u32`.
fn with_table(src: &str, pairs: &str, word: &str, vector: bool) -> String {
    let exp = if vector {
        format!("exp({pairs} * bitcast<f32>(params[{word}]))")
    } else {
        format!("exp(f32({pairs}) * bitcast<f32>(params[{word}]))")
    };
    assert!(src.contains(&exp), "rope kernel: no `{exp}` to replace");
    let read = |j: &str| format!("bitcast<f32>(params[params[{word}] + {j}])");
    let table = if vector {
        let c = ["x", "y", "z", "w"].map(|c| read(&format!("u32({pairs}.{c})")));
        format!("vec4<f32>({})", c.join(", "))
    } else {
        read(pairs)
    };
    src.replace(&exp, &table)
}

/// [`rope`] by quads of pairs, reading `x` through its view; `in_order`:
/// store the output in the order of `x`'s dense block, with its strides.
fn rope_quads(x: &Operand<'_>, spec: &RopeSpec, in_order: bool) -> Result<ArrayData> {
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let nd = shape.len();
    let dtype = x.dtype;
    codegen::check_size("rope", n, &[&x.data])?;
    let dense_out = alloc(shape, dtype)?;
    let out = if in_order {
        ArrayData::new(dense_out.storage().clone(), x.data.strides().to_vec(), 0)
    } else {
        dense_out
    };
    let width = shape[nd - 1];
    // Invocations: for halves, 4 pairs (two quads, half a row apart); for
    // pairs, the 2 of one quad.
    let quads = if spec.traditional { n / 4 } else { n / 8 };
    if quads == 0 {
        return Ok(out);
    }
    let mut meta = vec![
        quads as u32,
        width as u32,
        shape[nd - 2] as u32,
        spec.offset as u32,
        spec.scale.to_bits(),
        0,
        spec.inverse as u32,
        nd as u32,
        u32::from(in_order),
    ];
    meta.extend(shape.iter().map(|&s| s as u32));
    codegen::push_view(&mut meta, &x.data);
    meta[5] = frequency_word(spec, meta.len());
    push_table(&mut meta, spec);
    let traditional = spec.traditional;
    let table = spec.freqs.is_some();
    let key = format!("rope4:{dtype}:{traditional}:{table}");
    let pipeline = context()?.pipeline(&key, || {
        let bindings =
            input4("x", 1, dtype) + &output4(2, dtype) + &codegen::strided_loc(7, 9) + OUT_AT;
        let body = if traditional { PAIRS } else { HALVES };
        let body = if table {
            with_table(body, "pair", "5", true)
        } else {
            body.to_string()
        };
        source(&bindings, &body)
    })?;
    dispatch(
        &pipeline,
        &meta,
        &[&x.data],
        &out,
        n * dtype.size_of(),
        false,
        quads,
    )?;
    ROPE_QUADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Ok(out)
}

/// Where invocation `i`'s quad `e` (an element of the dense output) is
/// stored: at `e`, or where the input holds it, relative to the input's
/// offset (`params[8]`: keep the input's order).
const OUT_AT: &str = include_str!("out_at.wgsl");

/// The kernel's body for pairs: the 2 pairs of one quad.
const PAIRS: &str = include_str!("pairs.wgsl");

/// The kernel's body for halves: the quads at `c` and `c + width / 2`.
const HALVES: &str = include_str!("halves.wgsl");

/// Rotations run by quads of pairs since the process started.
static ROPE_QUADS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many rotations ran by quads of pairs, reading their input's view
/// in place, since the process started (for tests that check which
/// kernel a rotation took).
pub fn rope_quad_count() -> usize {
    ROPE_QUADS.load(std::sync::atomic::Ordering::Relaxed)
}

/// Rotates `x` (`[..., L, D]`, of any float dtype, computed in f32) as
/// `spec` says, into a new array of `x`'s dtype; `keep_order`: where `x`
/// rotates by quads and is a permutation of a dense block, store the
/// output in that block's order (with `x`'s strides), else densely.
pub fn rope(x: &Operand<'_>, spec: &RopeSpec, keep_order: bool) -> Result<ArrayData> {
    if x.shape.len() >= 2 && by_quads(x, spec) {
        let in_order = keep_order && crate::shape::is_permuted_dense(x.shape, x.data.strides());
        return rope_quads(x, spec, in_order);
    }
    let shape = x.shape;
    let n = crate::shape::size_of_shape(shape);
    let nd = shape.len();
    let dtype = x.dtype;
    let x = dense(x)?;
    codegen::check_size("rope", n, &[&x])?;
    let out = alloc(shape, dtype)?;
    if n == 0 {
        return Ok(out);
    }
    let mut meta = vec![
        n as u32,
        shape[nd - 2] as u32,
        shape[nd - 1] as u32,
        spec.dims as u32,
        spec.traditional as u32,
        spec.offset as u32,
        spec.scale.to_bits(),
        frequency_word(spec, 10),
        spec.inverse as u32,
        x.offset() as u32,
    ];
    push_table(&mut meta, spec);
    let table = spec.freqs.is_some();
    let pipeline = context()?.pipeline(&format!("rope:{dtype}:{table}"), || {
        let bindings = codegen::input("x", 1, dtype) + &codegen::output(2, dtype);
        let body = if table {
            with_table(ELEMENTS, "pair", "7", false)
        } else {
            ELEMENTS.to_string()
        };
        source(&bindings, &body)
    })?;
    let clear = codegen::packed(dtype);
    dispatch(&pipeline, &meta, &[&x], &out, n * dtype.size_of(), clear, n)?;
    Ok(out)
}

/// The element kernel's body: one output element, reading its pair's
/// partner.
const ELEMENTS: &str = include_str!("elements.wgsl");
