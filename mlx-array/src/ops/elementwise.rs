//! Elementwise ops: math functions, arithmetic, comparisons, `where`, casts.

use crate::primitives::elementwise::{
    AsType, Binary, BinaryOp, RememberedCast, Select, StopGradient, Unary, UnaryOp,
};
use crate::shape::broadcast_shapes;
use crate::{Array, Dtype, Error, Result};

/// Applies a unary op, casting integer inputs to float32 for functions that
/// need a float (as MLX does).
pub fn unary(op: UnaryOp, x: &Array) -> Result<Array> {
    use UnaryOp::*;
    let x = match op {
        Exp | Log | Log1p | Sqrt | Rsqrt | Sin | Cos | Tanh | Sigmoid | Erf => {
            x.astype(x.dtype().to_float())?
        }
        LogicalNot => x.astype(Dtype::Bool)?,
        Neg | Sign if x.dtype() == Dtype::Bool => {
            return Err(Error::dtype(
                op.name(),
                Dtype::Bool,
                "not defined for booleans",
            ));
        }
        _ => x.clone(),
    };
    let (shape, dtype) = (x.shape().to_vec(), x.dtype());
    Ok(Array::from_primitive(Unary(op), vec![x], shape, dtype))
}

/// Applies a binary op with MLX's promotion and NumPy broadcasting.
pub fn binary(op: BinaryOp, a: &Array, b: &Array) -> Result<Array> {
    use BinaryOp::*;
    let mut dtype = Dtype::promote(a.dtype(), b.dtype());
    match op {
        Divide if !dtype.is_float() => dtype = Dtype::F32,
        LogicalAnd | LogicalOr => dtype = Dtype::Bool,
        BitwiseAnd | BitwiseOr | BitwiseXor | LeftShift | RightShift if dtype.is_float() => {
            return Err(Error::dtype(
                op.name(),
                dtype,
                "needs integer or boolean inputs",
            ));
        }
        LeftShift | RightShift if dtype == Dtype::Bool => dtype = Dtype::U32,
        _ => {}
    }
    let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
    let a = a.astype(dtype)?.broadcast_to(&shape)?;
    let b = b.astype(dtype)?.broadcast_to(&shape)?;
    let out = if op.is_comparison() {
        Dtype::Bool
    } else {
        dtype
    };
    Ok(Array::from_primitive(Binary(op), vec![a, b], shape, out))
}

/// `silu(gate) * up` (the SwiGLU activation of Llama's MLP) as one
/// elementwise primitive, broadcasting the two; floats only.
///
/// ```
/// use mlx_array::{Array, swiglu};
/// let g = Array::from_slice(&[0.0f32, 1.0, -2.0], &[3]).unwrap();
/// let up = Array::from_slice(&[5.0f32, 2.0, 1.0], &[3]).unwrap();
/// let y = swiglu(&g, &up).unwrap().to_vec::<f32>().unwrap();
/// let silu = |x: f32| x / (1.0 + (-x).exp());
/// assert!(y.iter().zip([0.0, 2.0 * silu(1.0), silu(-2.0)]).all(|(a, b)| (a - b).abs() < 1e-6));
/// ```
pub fn swiglu(gate: &Array, up: &Array) -> Result<Array> {
    let dtype = Dtype::promote(gate.dtype(), up.dtype());
    if !dtype.is_float() {
        return Err(Error::dtype("swiglu", dtype, "needs floating point inputs"));
    }
    let shape = broadcast_shapes("swiglu", gate.shape(), up.shape())?;
    let inputs = vec![
        gate.astype(dtype)?.broadcast_to(&shape)?,
        up.astype(dtype)?.broadcast_to(&shape)?,
    ];
    Ok(Array::from_primitive(
        crate::primitives::elementwise::Swiglu,
        inputs,
        shape,
        dtype,
    ))
}

/// `cond ? a : b` elementwise, broadcasting all three.
pub fn where_(cond: &Array, a: &Array, b: &Array) -> Result<Array> {
    let dtype = Dtype::promote(a.dtype(), b.dtype());
    let shape = broadcast_shapes(
        "where",
        &broadcast_shapes("where", cond.shape(), a.shape())?,
        b.shape(),
    )?;
    let inputs = vec![
        cond.astype(Dtype::Bool)?.broadcast_to(&shape)?,
        a.astype(dtype)?.broadcast_to(&shape)?,
        b.astype(dtype)?.broadcast_to(&shape)?,
    ];
    Ok(Array::from_primitive(Select, inputs, shape, dtype))
}

/// Converts to `dtype` (the array itself when it already has it; the cast
/// computed beside it, with no kernel of its own, when one was recorded:
/// [`Array::remember_cast`]).
pub fn astype(x: &Array, dtype: Dtype) -> Result<Array> {
    if x.dtype() == dtype {
        return Ok(x.clone());
    }
    if let Some(copy) = x.remembered_cast(dtype) {
        return Ok(Array::from_primitive(
            RememberedCast,
            vec![x.clone(), copy],
            x.shape().to_vec(),
            dtype,
        ));
    }
    Ok(Array::from_primitive(
        AsType,
        vec![x.clone()],
        x.shape().to_vec(),
        dtype,
    ))
}

/// The cotangent `ct` of a cast from `dtype`, carried back to `dtype` (the
/// cast's vector-Jacobian product, `astype`'s and a remembered cast's):
/// `ct.astype(dtype)`, or, when `ct` is itself a pending cast of an array
/// of `dtype`, that array, since the round trip would only round it (the
/// fused loss's float32 weight gradient of a half-precision copy of
/// float32 master weights comes back unrounded).
pub(crate) fn cast_cotangent(ct: &Array, dtype: Dtype) -> Result<Array> {
    match crate::ops::pending_cast_from(ct, dtype) {
        Some(source) => Ok(source),
        None => ct.astype(dtype),
    }
}

/// The identity, but no gradient flows through it.
pub fn stop_gradient(x: &Array) -> Result<Array> {
    Ok(Array::from_primitive(
        StopGradient,
        vec![x.clone()],
        x.shape().to_vec(),
        x.dtype(),
    ))
}

/// Clamps to `[lo, hi]` (either bound optional).
pub fn clip(x: &Array, lo: Option<f64>, hi: Option<f64>) -> Result<Array> {
    let mut y = x.clone();
    if let Some(lo) = lo {
        y = y.maximum(&x.scalar_like(lo))?;
    }
    if let Some(hi) = hi {
        y = y.minimum(&x.scalar_like(hi))?;
    }
    Ok(y)
}

macro_rules! unary_ops {
    ($($(#[$m:meta])* $f:ident => $op:ident),+ $(,)?) => {
        $(
            $(#[$m])*
            pub fn $f(x: &Array) -> Result<Array> {
                unary(UnaryOp::$op, x)
            }
        )+
        impl Array {
            $(
                $(#[$m])*
                pub fn $f(&self) -> Result<Array> {
                    unary(UnaryOp::$op, self)
                }
            )+
        }
    };
}

unary_ops! {
    /// `-x`.
    negative => Neg,
    /// `|x|`.
    abs => Abs,
    /// `e^x`.
    exp => Exp,
    /// Natural logarithm.
    log => Log,
    /// `log(1 + x)`, accurate near 0.
    log1p => Log1p,
    /// Square root.
    sqrt => Sqrt,
    /// `1 / sqrt(x)`.
    rsqrt => Rsqrt,
    /// `x * x`.
    square => Square,
    /// Sine.
    sin => Sin,
    /// Cosine.
    cos => Cos,
    /// Hyperbolic tangent.
    tanh => Tanh,
    /// `1 / (1 + e^-x)`.
    sigmoid => Sigmoid,
    /// The error function.
    erf => Erf,
    /// -1, 0 or 1 by the sign of `x`.
    sign => Sign,
    /// Largest integer not above `x`.
    floor => Floor,
    /// Logical negation (input cast to bool).
    logical_not => LogicalNot,
}

macro_rules! binary_ops {
    ($($(#[$m:meta])* $f:ident => $op:ident),+ $(,)?) => {
        $(
            $(#[$m])*
            pub fn $f(a: &Array, b: &Array) -> Result<Array> {
                binary(BinaryOp::$op, a, b)
            }
        )+
        impl Array {
            $(
                $(#[$m])*
                pub fn $f(&self, other: &Array) -> Result<Array> {
                    binary(BinaryOp::$op, self, other)
                }
            )+
        }
    };
}

binary_ops! {
    /// `a + b`.
    add => Add,
    /// `a - b`.
    subtract => Subtract,
    /// `a * b`.
    multiply => Multiply,
    /// `a / b` (true division: integers give float32).
    divide => Divide,
    /// `a ^ b`.
    power => Power,
    /// Elementwise maximum (NaN propagates).
    maximum => Maximum,
    /// Elementwise minimum (NaN propagates).
    minimum => Minimum,
    /// `a == b`.
    equal => Equal,
    /// `a != b`.
    not_equal => NotEqual,
    /// `a < b`.
    less => Less,
    /// `a <= b`.
    less_equal => LessEqual,
    /// `a > b`.
    greater => Greater,
    /// `a >= b`.
    greater_equal => GreaterEqual,
    /// Logical and (inputs cast to bool).
    logical_and => LogicalAnd,
    /// Logical or (inputs cast to bool).
    logical_or => LogicalOr,
    /// Bitwise and of integers.
    bitwise_and => BitwiseAnd,
    /// Bitwise or of integers.
    bitwise_or => BitwiseOr,
    /// Bitwise xor of integers.
    bitwise_xor => BitwiseXor,
    /// `a << b` for integers.
    left_shift => LeftShift,
    /// `a >> b` for integers.
    right_shift => RightShift,
}

impl Array {
    /// `self - b`; shorter name for [`subtract`].
    pub fn sub(&self, b: &Array) -> Result<Array> {
        subtract(self, b)
    }
    /// `self * b`; shorter name for [`multiply`].
    pub fn mul(&self, b: &Array) -> Result<Array> {
        multiply(self, b)
    }
    /// `self / b`; shorter name for [`divide`].
    pub fn div(&self, b: &Array) -> Result<Array> {
        divide(self, b)
    }
    /// `self + v` with `v` a weak scalar (keeps this array's dtype).
    pub fn add_scalar(&self, v: f64) -> Result<Array> {
        add(self, &self.scalar_like(v))
    }
    /// `self - v` with `v` a weak scalar.
    pub fn sub_scalar(&self, v: f64) -> Result<Array> {
        subtract(self, &self.scalar_like(v))
    }
    /// `self * v` with `v` a weak scalar.
    pub fn mul_scalar(&self, v: f64) -> Result<Array> {
        multiply(self, &self.scalar_like(v))
    }
    /// `self / v` with `v` a weak scalar.
    pub fn div_scalar(&self, v: f64) -> Result<Array> {
        divide(self, &self.scalar_like(v))
    }
    /// `self ^ v` with `v` a weak scalar.
    pub fn pow_scalar(&self, v: f64) -> Result<Array> {
        power(self, &self.scalar_like(v))
    }
    /// See [`where_`]: `self` is the condition.
    pub fn where_(&self, a: &Array, b: &Array) -> Result<Array> {
        where_(self, a, b)
    }
    /// See [`astype`].
    pub fn astype(&self, dtype: Dtype) -> Result<Array> {
        astype(self, dtype)
    }
    /// See [`stop_gradient`].
    pub fn stop_gradient(&self) -> Result<Array> {
        stop_gradient(self)
    }
    /// See [`clip`].
    pub fn clip(&self, lo: Option<f64>, hi: Option<f64>) -> Result<Array> {
        clip(self, lo, hi)
    }
}
