//! Elementwise functions of two arguments, and `where`.

use half::{bf16, f16};

use super::math::FloatLike;
use super::strided::{map2, map2_in_place, map3};
use crate::backend::common::elementwise::BinaryOp;
use crate::data::{ArrayData, Operand};
use crate::{Bool8, Dtype, Error, Result};

fn float_binary<T: FloatLike + PartialOrd>(
    op: BinaryOp,
    shape: &[usize],
    a: &ArrayData,
    b: &ArrayData,
    donated: bool,
) -> ArrayData {
    use BinaryOp::*;
    macro_rules! arith {
        ($f:expr) => {
            if donated {
                map2_in_place::<T, T>(shape, a.clone(), b, |x, y| {
                    T::from_f32($f(x.to_f32(), y.to_f32()))
                })
            } else {
                map2::<T, T, T>(shape, a, b, |x, y| T::from_f32($f(x.to_f32(), y.to_f32())))
            }
        };
    }
    macro_rules! cmp {
        ($f:expr) => {
            map2::<T, T, Bool8>(shape, a, b, |x, y| Bool8($f(x.to_f32(), y.to_f32()) as u8))
        };
    }
    match op {
        Add => arith!(|x: f32, y: f32| x + y),
        Subtract => arith!(|x: f32, y: f32| x - y),
        Multiply => arith!(|x: f32, y: f32| x * y),
        Divide => arith!(|x: f32, y: f32| x / y),
        Power => arith!(f32::powf),
        Maximum => arith!(|x: f32, y: f32| if x > y || x.is_nan() { x } else { y }),
        Minimum => arith!(|x: f32, y: f32| if x < y || x.is_nan() { x } else { y }),
        Equal => cmp!(|x, y| x == y),
        NotEqual => cmp!(|x, y| x != y),
        Less => cmp!(|x, y| x < y),
        LessEqual => cmp!(|x, y| x <= y),
        Greater => cmp!(|x, y| x > y),
        GreaterEqual => cmp!(|x, y| x >= y),
        LogicalAnd => cmp!(|x, y| x != 0.0 && y != 0.0),
        LogicalOr => cmp!(|x, y| x != 0.0 || y != 0.0),
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift => {
            unreachable!("bitwise ops on floats are rejected when the op is built")
        }
    }
}

macro_rules! int_binary {
    ($t:ty, $op:expr, $shape:expr, $a:expr, $b:expr) => {{
        use BinaryOp::*;
        macro_rules! arith {
            ($f:expr) => {
                map2::<$t, $t, $t>($shape, $a, $b, $f)
            };
        }
        macro_rules! cmp {
            ($f:expr) => {
                map2::<$t, $t, Bool8>($shape, $a, $b, |x, y| Bool8($f(x, y) as u8))
            };
        }
        match $op {
            Add => arith!(|x: $t, y: $t| x.wrapping_add(y)),
            Subtract => arith!(|x: $t, y: $t| x.wrapping_sub(y)),
            Multiply => arith!(|x: $t, y: $t| x.wrapping_mul(y)),
            Divide => arith!(|x: $t, y: $t| if y == 0 { 0 } else { x.wrapping_div(y) }),
            Power => arith!(|x: $t, y: $t| int_pow(x as i64, y as i64) as $t),
            Maximum => arith!(|x: $t, y: $t| x.max(y)),
            Minimum => arith!(|x: $t, y: $t| x.min(y)),
            Equal => cmp!(|x, y| x == y),
            NotEqual => cmp!(|x, y| x != y),
            Less => cmp!(|x, y| x < y),
            LessEqual => cmp!(|x, y| x <= y),
            Greater => cmp!(|x, y| x > y),
            GreaterEqual => cmp!(|x, y| x >= y),
            LogicalAnd => cmp!(|x, y| x != 0 && y != 0),
            LogicalOr => cmp!(|x, y| x != 0 || y != 0),
            BitwiseAnd => arith!(|x: $t, y: $t| x & y),
            BitwiseOr => arith!(|x: $t, y: $t| x | y),
            BitwiseXor => arith!(|x: $t, y: $t| x ^ y),
            LeftShift => arith!(|x: $t, y: $t| x.wrapping_shl(y as u32)),
            RightShift => arith!(|x: $t, y: $t| x.wrapping_shr(y as u32)),
        }
    }};
}

/// `x^y` for integers by squaring; negative exponents give 0 (or ±1 for x = ±1).
fn int_pow(x: i64, y: i64) -> i64 {
    if y < 0 {
        return match x {
            1 => 1,
            -1 => {
                if y % 2 == 0 {
                    1
                } else {
                    -1
                }
            }
            _ => 0,
        };
    }
    let (mut base, mut e, mut acc) = (x, y as u64, 1i64);
    while e > 0 {
        if e & 1 == 1 {
            acc = acc.wrapping_mul(base);
        }
        base = base.wrapping_mul(base);
        e >>= 1;
    }
    acc
}

fn bool_binary(op: BinaryOp, shape: &[usize], a: &ArrayData, b: &ArrayData) -> Result<ArrayData> {
    use BinaryOp::*;
    let f: fn(u8, u8) -> bool = match op {
        Add | Maximum | LogicalOr | BitwiseOr => |x, y| x | y != 0,
        Multiply | Minimum | LogicalAnd | BitwiseAnd => |x, y| x & y != 0,
        Subtract | BitwiseXor | NotEqual => |x, y| x != y,
        Equal => |x, y| x == y,
        Less => |x, y| x < y,
        LessEqual => |x, y| x <= y,
        Greater => |x, y| x > y,
        GreaterEqual => |x, y| x >= y,
        Power => |x, y| x != 0 || y == 0,
        Divide | LeftShift | RightShift => {
            return Err(Error::eval(op.name(), "no kernel for bool"));
        }
    };
    Ok(map2::<Bool8, Bool8, Bool8>(shape, a, b, |x, y| {
        Bool8(f(x.0, y.0) as u8)
    }))
}

/// Runs `op` on two inputs of the same (already broadcast) shape and dtype.
/// With `donated` (a float op whose result has `a`'s dtype, and `a` dense
/// and read by nobody else), the result is written over `a`'s buffer.
pub fn binary(op: BinaryOp, a: &Operand<'_>, b: &Operand<'_>, donated: bool) -> Result<ArrayData> {
    let (shape, dtype, a, b) = (a.shape, a.dtype, &a.data, &b.data);
    Ok(match dtype {
        Dtype::F32 => float_binary::<f32>(op, shape, a, b, donated),
        Dtype::F16 => float_binary::<f16>(op, shape, a, b, donated),
        Dtype::BF16 => float_binary::<bf16>(op, shape, a, b, donated),
        Dtype::I32 => int_binary!(i32, op, shape, a, b),
        Dtype::I64 => int_binary!(i64, op, shape, a, b),
        Dtype::U32 => int_binary!(u32, op, shape, a, b),
        Dtype::Bool => return bool_binary(op, shape, a, b),
    })
}

/// `silu(gate) * up` (`gate * sigmoid(gate) * up`, in f32, as the ops it
/// replaces compute it) over two float inputs of the same shape and dtype.
pub fn swiglu(gate: &Operand<'_>, up: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, gate, up) = (gate.shape, gate.dtype, &gate.data, &up.data);
    fn run<T: FloatLike>(shape: &[usize], g: &ArrayData, u: &ArrayData) -> ArrayData {
        map2::<T, T, T>(shape, g, u, |g, u| {
            let g = g.to_f32();
            T::from_f32(g * super::math::sigmoid(g) * u.to_f32())
        })
    }
    Ok(match dtype {
        Dtype::F32 => run::<f32>(shape, gate, up),
        Dtype::F16 => run::<f16>(shape, gate, up),
        Dtype::BF16 => run::<bf16>(shape, gate, up),
        d => {
            return Err(Error::eval(
                "swiglu",
                format!("the inputs must be floating point, got {d}"),
            ));
        }
    })
}

/// `where(cond, a, b)` over three inputs of the same shape; `cond` is bool.
pub fn select(c: &Operand<'_>, a: &Operand<'_>, b: &Operand<'_>) -> ArrayData {
    let (shape, dtype, c, a, b) = (a.shape, a.dtype, &c.data, &a.data, &b.data);
    super::dispatch!(dtype, T => map3::<Bool8, T, T, T>(shape, c, a, b, |c, x, y| if c.0 != 0 { x } else { y }))
}
