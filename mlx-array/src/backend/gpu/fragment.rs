//! 16 x 16 x 16 matrix fragments (f16 operands, f32 accumulators) in two
//! implementations, for the kernel templates that multiply in them (the
//! tensor-core GEMM, `matmul::coop`, and the f16 flash attention,
//! `attention::fragments`):
//!
//! - [`Fragments::Cooperative`]: WGSL cooperative matrices
//!   (`coop_mat16x16`, tensor cores where the adapter has them);
//! - [`Fragments::Plain`]: plain WGSL over workgroup memory, on every
//!   adapter (lavapipe in CI). An operand fragment is its offset in a
//!   workgroup array; each of a subgroup's 32 invocations accumulates 8 of
//!   an output fragment's 256 values (row `prow = lane / 2`, columns
//!   `pcol = 8 (lane % 2)..+8`, see [`LANES`]).
//!
//! A template writes its tiling, staging and edges once and asks this
//! module for the fragment operations, so the plain variant tests what the
//! tensor-core variant does around its intrinsics. Index arguments must be
//! names of `let`s, never inline expressions: naga's SPIR-V back end panics
//! on a cooperative load or store indexed by an expression.

use crate::settings::{GpuCoopmat, GpuTuning};
use crate::{Dtype, Result};

/// How the 16 x 16 fragment operations are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fragments {
    /// WGSL cooperative matrices (`enable wgpu_cooperative_matrix;`).
    Cooperative,
    /// Plain WGSL over workgroup memory, for every adapter.
    Plain,
}

/// How a 16 x 16 operand lies in its workgroup array.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Element `(r, c)` at `index + r * stride + c`.
    RowMajor,
    /// Element `(r, c)` at `index + c * stride + r` (a transposed view).
    ColMajor,
}

/// An operand fragment: its name (a cooperative matrix's `let`), the f16
/// workgroup array it is loaded from, the name of the `let` holding its
/// first element's index there, the row (or column) stride and layout.
pub(crate) struct Operand<'a> {
    /// Name of the fragment's `let` (cooperative only).
    pub name: &'a str,
    /// The workgroup array (of f16).
    pub array: &'a str,
    /// Name of the `let` holding the index of element `(0, 0)`.
    pub index: &'a str,
    /// Elements between rows (row-major) or columns (column-major).
    pub stride: usize,
    /// Row- or column-major.
    pub layout: Layout,
}

/// The plain fragments' lane layout: `prow`, `pcol` from `lane` (the
/// invocation's index in its subgroup of 32).
pub(crate) const LANES: &str = "let prow = lane / 2u;\n    let pcol = (lane % 2u) * 8u;\n";

/// The fragment implementation for f16 products on this device, or `None`
/// for the f32-compute kernels: f16 stored natively, and
/// the tuning's [`GpuTuning::coopmat`] either `Plain` or `Auto` on a device
/// with cooperative matrices ([`super::device::coopmat_usable`]).
pub(crate) fn chosen(dtype: Dtype, tuning: &GpuTuning) -> Result<Option<Fragments>> {
    if dtype != Dtype::F16 || super::codegen::packed(dtype) {
        return Ok(None);
    }
    let c = super::device::context()?;
    Ok(match tuning.coopmat {
        GpuCoopmat::Off => None,
        GpuCoopmat::Plain => Some(Fragments::Plain),
        GpuCoopmat::Auto if c.coopmat => Some(Fragments::Cooperative),
        GpuCoopmat::Auto => None,
    })
}

impl Fragments {
    /// The `enable` line a shader needs (after `enable f16;`).
    pub fn enable(self) -> &'static str {
        match self {
            Fragments::Cooperative => "enable wgpu_cooperative_matrix;\n",
            Fragments::Plain => "",
        }
    }

    /// WGSL expression of a zeroed f32 accumulator.
    pub fn zero(self) -> &'static str {
        match self {
            Fragments::Cooperative => "coop_mat16x16<f32, C>()",
            Fragments::Plain => "array<f32, 8>()",
        }
    }

    /// WGSL statement declaring the f32 accumulator `acc`, zeroed.
    pub fn declare(self, acc: &str) -> String {
        format!("var {acc} = {};\n", self.zero())
    }

    /// WGSL loading operand `a` of a product (the left, `A`, role): a
    /// `let` for cooperative matrices, nothing for plain ones.
    pub fn load_a(self, a: &Operand) -> String {
        self.load(a, "A")
    }

    /// WGSL loading operand `b` (the right, `B`, role).
    pub fn load_b(self, b: &Operand) -> String {
        self.load(b, "B")
    }

    fn load(self, x: &Operand, role: &str) -> String {
        match self {
            Fragments::Cooperative => {
                let f = match x.layout {
                    Layout::RowMajor => "coopLoadT",
                    Layout::ColMajor => "coopLoad",
                };
                format!(
                    "let {name} = {f}<coop_mat16x16<f16, {role}>>(&{array}[{index}], {stride}u);\n",
                    name = x.name,
                    array = x.array,
                    index = x.index,
                    stride = x.stride,
                )
            }
            Fragments::Plain => String::new(),
        }
    }

    /// WGSL for `acc += a @ b` (both loaded before, by [`Self::load_a`]
    /// and [`Self::load_b`]).
    pub fn multiply_add(self, acc: &str, a: &Operand, b: &Operand) -> String {
        match self {
            Fragments::Cooperative => {
                format!("{acc} = coopMultiplyAdd({}, {}, {acc});\n", a.name, b.name)
            }
            Fragments::Plain => {
                let at = |r: &str, c: &str| element(a, r, c);
                let mut s = format!(
                    "for (var q = 0u; q < 16u; q = q + 1u) {{\n\
                     \x20   let av = f32({}[{}]);\n",
                    a.array,
                    at("prow", "q"),
                );
                for c in 0..8 {
                    s.push_str(&format!(
                        "    {acc}[{c}] = fma(av, f32({}[{}]), {acc}[{c}]);\n",
                        b.array,
                        element(b, "q", &format!("pcol + {c}u")),
                    ));
                }
                s.push_str("}\n");
                s
            }
        }
    }

    /// WGSL storing accumulator `acc` row-major into the f32 workgroup
    /// array `array` from the index in the `let` named `index`, rows
    /// `stride` apart.
    pub fn store(self, acc: &str, array: &str, index: &str, stride: usize) -> String {
        self.store_strided(acc, array, index, &format!("{stride}u"))
    }

    /// [`Fragments::store`] with the row stride a WGSL `u32` expression
    /// (`array` may be an f32 storage array: the plain implementation
    /// writes its elements, the cooperative one the whole fragment).
    pub fn store_strided(self, acc: &str, array: &str, index: &str, stride: &str) -> String {
        match self {
            Fragments::Cooperative => {
                format!("coopStoreT({acc}, &{array}[{index}], {stride});\n")
            }
            Fragments::Plain => (0..8)
                .map(|c| {
                    format!("{array}[{index} + prow * {stride} + pcol + {c}u] = {acc}[{c}];\n")
                })
                .collect(),
        }
    }
}

/// The index expression of element `(r, c)` of the plain operand `x`.
fn element(x: &Operand, r: &str, c: &str) -> String {
    let (index, stride) = (x.index, x.stride);
    match x.layout {
        Layout::RowMajor => format!("{index} + ({r}) * {stride}u + {c}"),
        Layout::ColMajor => format!("{index} + ({c}) * {stride}u + {r}"),
    }
}
