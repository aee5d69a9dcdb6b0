//! Elementwise kernels: the WGSL expression of every unary, binary and
//! conversion op, run over whole arrays by [`map`] (one kernel shape for all
//! of them and for fused chains; its design is in `map.rs`).

mod map;

pub use map::row_view_reads;
pub(in crate::backend::gpu) use map::{input4, output4, rows_of_quads};
pub(crate) use map::{map, map_with};

use super::codegen::compute_type;
use crate::backend::common::elementwise::{BinaryOp, UnaryOp};
use crate::data::{ArrayData, Operand};
use crate::{Dtype, Error, Result};

/// `x`'s data itself when it is dense for its shape from its offset (as
/// kernels that index `offset + i` need), else a dense copy.
pub(crate) fn dense(x: &Operand<'_>) -> Result<ArrayData> {
    if super::codegen::is_dense(&x.data, x.shape) {
        Ok(x.data.clone())
    } else {
        copy_contiguous(x)
    }
}

/// A dense copy of any view.
pub fn copy_contiguous(x: &Operand<'_>) -> Result<ArrayData> {
    map("copy", "a0", x.shape, &[(&x.data, x.dtype)], x.dtype)
}

/// Converts between dtypes with the CPU backend's rules (floats to integers
/// truncate toward zero, anything to bool is `!= 0`).
pub fn astype(x: &Operand<'_>, to: Dtype) -> Result<ArrayData> {
    let (data, shape, from) = (&x.data, x.shape, x.dtype);
    map(
        &format!("astype:{from}>{to}"),
        &astype_expression(from, to)?,
        shape,
        &[(data, from)],
        to,
    )
}

/// The WGSL expression converting `a0` from `from`'s compute type to `to`'s.
pub(crate) fn astype_expression(from: Dtype, to: Dtype) -> Result<String> {
    let src = compute_type(from);
    let dst = compute_type(to);
    let expr = if to == Dtype::Bool && src == "f32" {
        "select(0u, 1u, a0 != 0.0 || is_nan(a0))".to_string()
    } else if to == Dtype::Bool {
        format!("select(0u, 1u, a0 != {src}(0))")
    } else if from == Dtype::Bool {
        format!("{dst}(a0)")
    } else if src == dst {
        "a0".to_string()
    } else if src == "f32" {
        // Saturating, NaN to 0, as Rust's `as` does.
        match dst {
            "i32" => {
                "select(select(i32(a0), 2147483647, a0 >= 2147483648.0), 0, is_nan(a0))".to_string()
            }
            _ => {
                "select(select(u32(max(a0, 0.0)), 4294967295u, a0 >= 4294967296.0), 0u, is_nan(a0))"
                    .to_string()
            }
        }
    } else if dst == "f32" {
        "f32(a0)".to_string()
    } else {
        format!("bitcast<{dst}>(a0)")
    };
    Ok(expr)
}

fn unary_expr(op: UnaryOp, dtype: Dtype) -> Option<String> {
    use UnaryOp::*;
    let t = compute_type(dtype);
    let s = match (t, dtype) {
        (_, Dtype::Bool) => match op {
            LogicalNot => "select(0u, 1u, a0 == 0u)",
            Abs | Floor | Square => "a0",
            _ => return None,
        },
        ("f32", _) => match op {
            Neg => "-a0",
            Abs => "abs(a0)",
            Exp => "exp(a0)",
            Log => "log(a0)",
            Log1p => "select(log(1.0 + a0), a0 * (1.0 - a0 * (0.5 - a0 / 3.0)), abs(a0) < 1e-4)",
            Sqrt => "sqrt(a0)",
            Rsqrt => "inverseSqrt(a0)",
            Square => "a0 * a0",
            Sin => "sin(a0)",
            Cos => "cos(a0)",
            Tanh => "tanh(clamp(a0, -15.0, 15.0))",
            Sigmoid => "1.0 / (1.0 + exp(-a0))",
            Erf => "erf(a0)",
            Sign => "select(select(a0, -1.0, a0 < 0.0), 1.0, a0 > 0.0)",
            Floor => "floor(a0)",
            LogicalNot => "select(0.0, 1.0, a0 == 0.0)",
        },
        ("i32", _) => match op {
            Neg => "-a0",
            Abs => "select(a0, -a0, a0 < 0)",
            Square => "a0 * a0",
            Sign => "select(select(0, -1, a0 < 0), 1, a0 > 0)",
            Floor => "a0",
            LogicalNot => "select(0, 1, a0 == 0)",
            _ => return None,
        },
        _ => match op {
            Neg => "0u - a0",
            Abs | Floor => "a0",
            Square => "a0 * a0",
            Sign => "select(0u, 1u, a0 > 0u)",
            LogicalNot => "select(0u, 1u, a0 == 0u)",
            _ => return None,
        },
    };
    Some(s.to_string())
}

/// The error function (Abramowitz and Stegun 7.1.26, |error| < 1.5e-7).
const ERF: &str = "erf_as(a0)";

/// The WGSL expression of a unary op on `a0` of `dtype`.
pub(crate) fn unary_expression(op: UnaryOp, dtype: Dtype) -> Result<String> {
    let expr = unary_expr(op, dtype)
        .ok_or_else(|| Error::eval(op.name(), format!("no kernel for {dtype}")))?;
    Ok(expr.replace("erf(a0)", ERF))
}

/// Applies a unary op; the output has the input's dtype.
pub fn unary(op: UnaryOp, x: &Operand<'_>) -> Result<ArrayData> {
    let (a, shape, dtype) = (&x.data, x.shape, x.dtype);
    let expr = unary_expression(op, dtype)?;
    map(
        &format!("unary:{}", op.name()),
        &expr,
        shape,
        &[(a, dtype)],
        dtype,
    )
}

fn binary_expr(op: BinaryOp, dtype: Dtype) -> Option<(String, bool)> {
    use BinaryOp::*;
    let t = compute_type(dtype);
    let cmp = |e: &str| Some((format!("select(0u, 1u, {e})"), true));
    match op {
        Equal => return cmp("a0 == a1"),
        NotEqual => return cmp("a0 != a1"),
        Less => return cmp("a0 < a1"),
        LessEqual => return cmp("a0 <= a1"),
        Greater => return cmp("a0 > a1"),
        GreaterEqual => return cmp("a0 >= a1"),
        _ => {}
    }
    let zero = match t {
        "f32" => "0.0",
        "i32" => "0",
        _ => "0u",
    };
    match op {
        LogicalAnd => return cmp(&format!("a0 != {zero} && a1 != {zero}")),
        LogicalOr => return cmp(&format!("a0 != {zero} || a1 != {zero}")),
        _ => {}
    }
    if dtype == Dtype::Bool {
        let e = match op {
            Add | Maximum | BitwiseOr => "a0 | a1",
            Multiply | Minimum | BitwiseAnd => "a0 & a1",
            Subtract | BitwiseXor => "a0 ^ a1",
            Power => "select(0u, 1u, a0 != 0u || a1 == 0u)",
            _ => return None,
        };
        return Some((e.to_string(), false));
    }
    let e = match (op, t) {
        (Add, _) => "a0 + a1".to_string(),
        (Subtract, _) => "a0 - a1".to_string(),
        (Multiply, _) => "a0 * a1".to_string(),
        (Divide, "f32") => "a0 / a1".to_string(),
        (Divide, _) => format!("select(a0 / a1, {zero}, a1 == {zero})"),
        (Power, "f32") => "pow_signed(a0, a1)".to_string(),
        (Power, "i32") => "ipow(a0, a1)".to_string(),
        (Power, _) => "upow(a0, a1)".to_string(),
        (Maximum, "f32") => "select(a1, a0, a0 > a1 || is_nan(a0))".to_string(),
        (Minimum, "f32") => "select(a1, a0, a0 < a1 || is_nan(a0))".to_string(),
        (Maximum, _) => "max(a0, a1)".to_string(),
        (Minimum, _) => "min(a0, a1)".to_string(),
        (BitwiseAnd, "f32") | (BitwiseOr, "f32") | (BitwiseXor, "f32") => return None,
        (LeftShift, "f32") | (RightShift, "f32") => return None,
        (BitwiseAnd, _) => "a0 & a1".to_string(),
        (BitwiseOr, _) => "a0 | a1".to_string(),
        (BitwiseXor, _) => "a0 ^ a1".to_string(),
        (LeftShift, _) => "a0 << (u32(a1) & 31u)".to_string(),
        (RightShift, _) => "a0 >> (u32(a1) & 31u)".to_string(),
        _ => return None,
    };
    Some((e, false))
}

/// Helpers some binary expressions call.
pub(crate) const MATH: &str = include_str!("math.wgsl");

/// The WGSL expression of a binary op on `a0`, `a1` of `dtype`, and the
/// output dtype.
pub(crate) fn binary_expression(op: BinaryOp, dtype: Dtype) -> Result<(String, Dtype)> {
    let (expr, is_bool) = binary_expr(op, dtype)
        .ok_or_else(|| Error::eval(op.name(), format!("no kernel for {dtype}")))?;
    Ok((expr, if is_bool { Dtype::Bool } else { dtype }))
}

/// `where`'s expression: `a0` is the bool condition.
pub(crate) const WHERE: &str = "select(a2, a1, a0 != 0u)";

/// [`WHERE`] for the fusion hook ([`crate::Primitive::gpu_expression`]).
pub(crate) fn where_expression() -> Result<String> {
    Ok(WHERE.to_string())
}

/// Applies a binary op to two inputs of one dtype already broadcast to one shape.
pub fn binary(op: BinaryOp, a: &Operand<'_>, b: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, a, b) = (a.shape, a.dtype, &a.data, &b.data);
    let (expr, out) = binary_expression(op, dtype)?;
    map(
        &format!("binary:{}", op.name()),
        &expr,
        shape,
        &[(a, dtype), (b, dtype)],
        out,
    )
}

/// `cond ? a : b`, elementwise, all of one shape; `cond` is bool, `a` and
/// `b` share a dtype.
pub fn where_(cond: &Operand<'_>, a: &Operand<'_>, b: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, cond, a, b) = (a.shape, a.dtype, &cond.data, &a.data, &b.data);
    map(
        "where",
        WHERE,
        shape,
        &[(cond, Dtype::Bool), (a, dtype), (b, dtype)],
        dtype,
    )
}
