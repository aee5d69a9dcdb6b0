//! Elementwise functions of one argument.

use half::{bf16, f16};

use super::math::{self, FloatLike};
use super::strided::map1;
use crate::backend::common::elementwise::UnaryOp;
use crate::data::{ArrayData, Operand};
use crate::{Bool8, Dtype, Error, Result};

fn float_fn(op: UnaryOp) -> fn(f32) -> f32 {
    use UnaryOp::*;
    match op {
        Neg => |x| -x,
        Abs => f32::abs,
        Exp => math::exp,
        Log => f32::ln,
        Log1p => f32::ln_1p,
        Sqrt => f32::sqrt,
        Rsqrt => |x| 1.0 / x.sqrt(),
        Square => |x| x * x,
        Sin => f32::sin,
        Cos => f32::cos,
        Tanh => f32::tanh,
        Sigmoid => math::sigmoid,
        Erf => math::erf,
        Sign => |x| {
            if x > 0.0 {
                1.0
            } else if x < 0.0 {
                -1.0
            } else {
                x
            }
        },
        Floor => f32::floor,
        LogicalNot => |x| (x == 0.0) as u8 as f32,
    }
}

fn float_kernel<T: FloatLike>(op: UnaryOp, shape: &[usize], a: &ArrayData) -> ArrayData {
    // Monomorphise the hot functions so their loops vectorise.
    macro_rules! run {
        ($f:expr) => {
            map1::<T, T>(shape, a, |x| T::from_f32($f(x.to_f32())))
        };
    }
    match op {
        UnaryOp::Exp => run!(math::exp),
        UnaryOp::Neg => run!(|x: f32| -x),
        UnaryOp::Square => run!(|x: f32| x * x),
        UnaryOp::Sigmoid => run!(math::sigmoid),
        UnaryOp::Rsqrt => run!(|x: f32| 1.0 / x.sqrt()),
        UnaryOp::Sqrt => run!(f32::sqrt),
        UnaryOp::Abs => run!(f32::abs),
        _ => {
            let f = float_fn(op);
            map1::<T, T>(shape, a, |x| T::from_f32(f(x.to_f32())))
        }
    }
}

macro_rules! int_kernel {
    ($t:ty, $op:expr, $shape:expr, $a:expr) => {{
        use UnaryOp::*;
        match $op {
            Neg => Some(map1::<$t, $t>($shape, $a, |x| (0 as $t).wrapping_sub(x))),
            Abs => Some(map1::<$t, $t>($shape, $a, |x| {
                if x < 0 as $t {
                    (0 as $t).wrapping_sub(x)
                } else {
                    x
                }
            })),
            Square => Some(map1::<$t, $t>($shape, $a, |x| x.wrapping_mul(x))),
            Sign => Some(map1::<$t, $t>($shape, $a, |x| {
                if x > 0 as $t {
                    1 as $t
                } else if x == 0 as $t {
                    0 as $t
                } else {
                    (0 as $t).wrapping_sub(1)
                }
            })),
            Floor => Some(map1::<$t, $t>($shape, $a, |x| x)),
            LogicalNot => Some(map1::<$t, $t>($shape, $a, |x| (x == 0 as $t) as $t)),
            _ => None,
        }
    }};
}

/// Runs `op` on `a` (of `shape` and `dtype`); the output has the same dtype.
#[allow(unused_comparisons)]
pub fn unary(op: UnaryOp, x: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, a) = (x.shape, x.dtype, &x.data);
    let out = match dtype {
        Dtype::F32 => Some(float_kernel::<f32>(op, shape, a)),
        Dtype::F16 => Some(float_kernel::<f16>(op, shape, a)),
        Dtype::BF16 => Some(float_kernel::<bf16>(op, shape, a)),
        Dtype::I32 => int_kernel!(i32, op, shape, a),
        Dtype::I64 => int_kernel!(i64, op, shape, a),
        Dtype::U32 => int_kernel!(u32, op, shape, a),
        Dtype::Bool => match op {
            UnaryOp::LogicalNot => {
                Some(map1::<Bool8, Bool8>(shape, a, |x| Bool8((x.0 == 0) as u8)))
            }
            UnaryOp::Abs | UnaryOp::Floor | UnaryOp::Square => {
                Some(map1::<Bool8, Bool8>(shape, a, |x| x))
            }
            _ => None,
        },
    };
    out.ok_or_else(|| Error::eval(op.name(), format!("no kernel for {dtype}")))
}
