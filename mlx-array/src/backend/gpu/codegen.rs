//! WGSL building blocks: how each dtype is stored, loaded and stored, and
//! how a thread finds its element in a strided view.
//!
//! Kernels bind a `meta: array<u32>` at 0 (sizes, shapes, strides), inputs
//! at 1.., and the output last. Every dtype is computed in a 32-bit type:
//! floats in `f32`, `i32`, and `u32` (which also carries `bool` as 0/1).

use crate::data::ArrayData;
use crate::{Dtype, Result};

/// WGSL of `loc` (a template).
const STRIDED_LOC: &str = include_str!("strided_loc.wgsl");

/// Invocations per workgroup for one-thread-per-element kernels.
pub(crate) const WORKGROUP: u32 = 256;

/// The WGSL type a dtype is computed in.
pub(crate) fn compute_type(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 | Dtype::F16 | Dtype::BF16 => "f32",
        Dtype::I32 => "i32",
        Dtype::U32 | Dtype::Bool | Dtype::I64 => "u32",
    }
}

/// True when several elements share one `u32` word: `bf16` and `bool`
/// always, `f16` unless the device stores it natively ([`super::native_f16`]).
pub(crate) fn packed(d: Dtype) -> bool {
    match d {
        Dtype::BF16 | Dtype::Bool => true,
        Dtype::F16 => !super::device::native_f16(),
        _ => false,
    }
}

fn storage_type(d: Dtype) -> &'static str {
    match d {
        Dtype::F32 => "f32",
        Dtype::I32 => "i32",
        Dtype::F16 if !packed(d) => "f16",
        _ => "u32",
    }
}

/// Shared helpers every kernel includes.
pub(crate) const PRELUDE: &str = include_str!("prelude.wgsl");

/// `var` declaration of input `name` of dtype `d` at `binding`, and a
/// `load_<name>(j: u32) -> T` reading element `j`.
pub(crate) fn input(name: &str, binding: u32, d: Dtype) -> String {
    let decl = format!(
        "@group(0) @binding({binding}) var<storage, read> {name}: array<{}>;\n",
        storage_type(d)
    );
    let body = match d {
        Dtype::F32 | Dtype::I32 | Dtype::U32 | Dtype::I64 => format!("return {name}[j];"),
        Dtype::F16 if !packed(d) => format!("return f32({name}[j]);"),
        Dtype::F16 => format!("return unpack2x16float({name}[j >> 1u])[j & 1u];"),
        Dtype::BF16 => format!(
            "return bitcast<f32>((({name}[j >> 1u] >> ((j & 1u) * 16u)) & 0xffffu) << 16u);"
        ),
        Dtype::Bool => format!("return ({name}[j >> 2u] >> ((j & 3u) * 8u)) & 0xffu;"),
    };
    format!(
        "{decl}fn load_{name}(j: u32) -> {} {{ {body} }}\n",
        compute_type(d)
    )
}

/// The output `out` of dtype `d` at `binding`, and `store_out(i: u32, v: T)`.
/// Packed outputs are written with atomic ORs into a cleared buffer.
pub(crate) fn output(binding: u32, d: Dtype) -> String {
    output_named("out", binding, d)
}

/// [`output`] named `name`: `var <name>` and `store_<name>(i, v)`.
pub(crate) fn output_named(name: &str, binding: u32, d: Dtype) -> String {
    let ty = if packed(d) {
        "atomic<u32>"
    } else {
        storage_type(d)
    };
    let decl =
        format!("@group(0) @binding({binding}) var<storage, read_write> {name}: array<{ty}>;\n");
    let body = match d {
        Dtype::F32 | Dtype::I32 | Dtype::U32 | Dtype::I64 => format!("{name}[i] = v;"),
        // Exact: the value is already an f16.
        Dtype::F16 if !packed(d) => format!("{name}[i] = f16(round_f16(v));"),
        Dtype::F16 => format!("atomicOr(&{name}[i >> 1u], f16_bits(v) << ((i & 1u) * 16u));"),
        Dtype::BF16 => format!("atomicOr(&{name}[i >> 1u], bf16_bits(v) << ((i & 1u) * 16u));"),
        Dtype::Bool => format!("atomicOr(&{name}[i >> 2u], (v & 1u) << ((i & 3u) * 8u));"),
    };
    format!(
        "{decl}fn store_{name}(i: u32, v: {}) {{ {body} }}\n",
        compute_type(d)
    )
}

/// WGSL of `fn {name}(i: u32, v: f32)`, which stores `v` with `store_out`
/// and, with a `half` dtype, also rounds it once into the output `half` at
/// `binding` (a kernel writing its f32 result and that result's cast
/// together; [`super::dispatch_groups_with_half`] binds both).
pub(crate) fn store_with_half(name: &str, binding: u32, half: Option<Dtype>) -> String {
    match half {
        None => format!("fn {name}(i: u32, v: f32) {{ store_out(i, v); }}\n"),
        Some(d) => format!(
            "{}fn {name}(i: u32, v: f32) {{ store_out(i, v); store_half(i, v); }}\n",
            output_named("half", binding, d)
        ),
    }
}

/// WGSL for `v` rounded to `d` and read back: exactly the value
/// `store_out` stores and a load returns, on every driver (the rounding is
/// integer arithmetic; the conversions around it are exact). Fused kernels
/// round their intermediates with it.
pub(crate) fn round_to(d: Dtype, v: &str) -> String {
    match d {
        Dtype::BF16 => format!("round_bf16({v})"),
        Dtype::F16 => format!("round_f16({v})"),
        _ => v.to_string(),
    }
}

/// The output `out` at `binding` stored as WGSL `f16` whether or not this
/// device stores `f16` natively (for kernels that run only where it does,
/// and for compiling them where it does not), and `store_out(i, v: f32)`.
pub(crate) fn native_f16_output(binding: u32) -> String {
    format!(
        "@group(0) @binding({binding}) var<storage, read_write> out: array<f16>;\n\
         fn store_out(i: u32, v: f32) {{ out[i] = f16(round_f16(v)); }}\n"
    )
}

/// `meta` at binding 0.
pub(crate) const META: &str = "@group(0) @binding(0) var<storage, read> params: array<u32>;\n";

/// The thread's linear index from a 2-D grid of workgroups.
pub(crate) const THREAD_INDEX: &str = "let i = gid.x + gid.y * nw.x * 256u;";

/// The kernel entry point signature.
pub(crate) const ENTRY: &str = "@compute @workgroup_size(256)\nfn main(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>)";

/// `fn loc(i, base) -> u32`: the element of a strided view (offset and
/// strides in `meta` from `base`) at row-major position `i` of a shape
/// stored in `params[shape_at..shape_at + ndim]`.
pub(crate) fn strided_loc(ndim_at: u32, shape_at: u32) -> String {
    fill(
        STRIDED_LOC,
        &[
            ("ndim_at", &ndim_at.to_string()),
            ("shape_at", &shape_at.to_string()),
        ],
    )
}

/// Appends a view's offset and strides (as `i32` bits) to `meta`.
pub(crate) fn push_view(meta: &mut Vec<u32>, data: &ArrayData) {
    meta.push(data.offset() as u32);
    meta.extend(data.strides().iter().map(|&s| s as i32 as u32));
}

/// How a kernel reads an input: directly at `offset + i` when the view is
/// dense, else through `loc`.
pub(crate) fn is_dense(data: &ArrayData, shape: &[usize]) -> bool {
    data.is_contiguous(shape)
}

/// Checks that every index fits the 32-bit arithmetic kernels use.
pub(crate) fn check_size(op: &'static str, elements: usize, data: &[&ArrayData]) -> Result<()> {
    let too_big = elements > u32::MAX as usize / 2
        || data
            .iter()
            .any(|d| d.offset() > i32::MAX as usize || d.storage().capacity() > u32::MAX as usize);
    if too_big {
        return Err(crate::Error::gpu(format!(
            "{op}: arrays beyond 2^31 elements are not supported on the GPU"
        )));
    }
    Ok(())
}

/// The entry point of kernels that work per workgroup (of [`WORKGROUP`]
/// invocations): `wid`, `nw` and the local index `lid` are in scope.
pub(crate) const GROUP_ENTRY: &str = "@compute @workgroup_size(256)\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nw: vec3<u32>, @builtin(local_invocation_index) lid: u32)";

/// The workgroup's linear index `g` from the 2-D grid of
/// [`super::dispatch_groups`].
pub(crate) const GROUP_INDEX: &str = "let g = wid.x + wid.y * nw.x;";

/// `is_nan(x: f32) -> bool`, exact whatever the compiler assumes about NaNs.
pub(crate) const IS_NAN: &str = r#"
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}
"#;

/// Drops size-1 dimensions of `(size, stride)` pairs (outermost first) and
/// merges neighbours that walk memory as one dimension.
pub(crate) fn collapse(dims: impl IntoIterator<Item = (usize, isize)>) -> Vec<(usize, isize)> {
    let mut out: Vec<(usize, isize)> = Vec::new();
    for (size, stride) in dims {
        if size == 1 {
            continue;
        }
        match out.last_mut() {
            Some(last) if last.1 == stride * size as isize => *last = (last.0 * size, stride),
            _ => out.push((size, stride)),
        }
    }
    out
}

/// Loads per invocation that the row kernels (reductions, softmax) aim
/// for, and the most a [`row_walk`] round issues at once.
pub(crate) const ROW_LOADS: usize = 16;

/// The team size for rows of `loads` loads: about one invocation per
/// [`ROW_LOADS`] of them, a power of two from 8 to 256.
pub(crate) fn row_team(loads: usize) -> usize {
    loads.div_ceil(ROW_LOADS).next_power_of_two().clamp(8, 256)
}

/// Loads per invocation and round of [`row_walk`] for rows of `loads`
/// loads and teams of `team`: all of an invocation's loads up to
/// [`ROW_LOADS`], so that rows up to `team x ROW_LOADS` long take one
/// round.
pub(crate) fn row_unroll(loads: usize, team: usize) -> usize {
    loads.div_ceil(team).clamp(1, ROW_LOADS)
}

/// WGSL walking invocation `k`'s share of a row of `loads` (a WGSL `u32`)
/// loads in a team of `team` (each invocation every `team`-th load), in
/// rounds of `unroll` loads that are all issued before any is used:
/// `load(i)` is the WGSL value of load `i` (of type `ty`), `take(x, i)`
/// the statements using it (in the order of `i`, as a plain loop would).
/// The round is unrolled by the generator, so the loads are in flight
/// together whatever the driver does with loops (wgpu's loop guards hide
/// their trip counts), where a loop of one load per step waits for each.
pub(crate) fn row_walk(
    loads: &str,
    (team, unroll): (usize, usize),
    ty: &str,
    load: &dyn Fn(&str) -> String,
    take: &dyn Fn(&str, &str) -> String,
) -> String {
    let mut fetch = String::new();
    let mut uses = String::new();
    for j in 0..unroll {
        fetch.push_str(&format!(
            "        let i{j} = u + {off}u;\n        var x{j} = {ty}();\n        if (i{j} < {loads}) {{ x{j} = {}; }}\n",
            load(&format!("i{j}")),
            off = j * team
        ));
        uses.push_str(&format!(
            "        if (i{j} < {loads}) {{ {} }}\n",
            take(&format!("x{j}"), &format!("i{j}"))
        ));
    }
    format!(
        "    for (var u = k; u < {loads}; u = u + {step}u) {{\n{fetch}{uses}    }}\n",
        step = team * unroll
    )
}

/// Fills a WGSL template (a `.wgsl` file whose first lines, starting with
/// `//!`, say that it is one and name its placeholders): the header is
/// dropped and each `{name}` of `values` replaced by its text, in one pass
/// (replaced text is not searched again). Other braces are WGSL's own.
pub(crate) fn fill(template: &str, values: &[(&str, &str)]) -> String {
    let mut rest = template;
    while rest.starts_with("//!") {
        rest = rest.split_once('\n').map_or("", |(_, after)| after);
    }
    let mut out = String::with_capacity(rest.len());
    while let Some(at) = rest.find('{') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let named = after
            .find('}')
            .and_then(|end| values.iter().find(|(name, _)| *name == &after[..end]));
        match named {
            Some((name, value)) => {
                out.push_str(value);
                rest = &after[name.len() + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod fill_tests {
    use super::fill;

    /// The header goes, placeholders are filled once, WGSL's braces stay.
    #[test]
    fn fills_placeholders_once_and_keeps_wgsl_braces() {
        let t = "//! A template: {a}.\n//! More.\nfn f() { {a}; {b} {c} }\n";
        assert_eq!(
            fill(t, &[("a", "x{b}"), ("b", "y")]),
            "fn f() { x{b}; y {c} }\n"
        );
    }
}
