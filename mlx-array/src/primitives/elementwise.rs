//! Elementwise primitives: unary and binary math, `where`, `astype`, `stop_gradient`.

use crate::backend::cpu;
use crate::{Array, ArrayData, Primitive, Result};

macro_rules! op_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $v:ident = $s:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $v),+ }
        impl $name {
            /// Every variant.
            pub const ALL: &'static [$name] = &[$($name::$v),+];
            /// The op's name, as in MLX.
            pub const fn name(self) -> &'static str {
                match self { $($name::$v => $s),+ }
            }
        }
    };
}

op_enum! {
    /// Functions of one argument.
    UnaryOp {
        /// `-x`
        Neg = "negative",
        /// `|x|`
        Abs = "abs",
        /// `e^x`
        Exp = "exp",
        /// natural logarithm
        Log = "log",
        /// `log(1 + x)`
        Log1p = "log1p",
        /// square root
        Sqrt = "sqrt",
        /// `1 / sqrt(x)`
        Rsqrt = "rsqrt",
        /// `x * x`
        Square = "square",
        /// sine
        Sin = "sin",
        /// cosine
        Cos = "cos",
        /// hyperbolic tangent
        Tanh = "tanh",
        /// `1 / (1 + e^-x)`
        Sigmoid = "sigmoid",
        /// the error function
        Erf = "erf",
        /// -1, 0 or 1
        Sign = "sign",
        /// round toward -inf
        Floor = "floor",
        /// logical negation
        LogicalNot = "logical_not",
    }
}

op_enum! {
    /// Functions of two arguments.
    BinaryOp {
        /// `a + b`
        Add = "add",
        /// `a - b`
        Subtract = "subtract",
        /// `a * b`
        Multiply = "multiply",
        /// `a / b`
        Divide = "divide",
        /// `a ^ b`
        Power = "power",
        /// elementwise max
        Maximum = "maximum",
        /// elementwise min
        Minimum = "minimum",
        /// `a == b`
        Equal = "equal",
        /// `a != b`
        NotEqual = "not_equal",
        /// `a < b`
        Less = "less",
        /// `a <= b`
        LessEqual = "less_equal",
        /// `a > b`
        Greater = "greater",
        /// `a >= b`
        GreaterEqual = "greater_equal",
        /// logical and
        LogicalAnd = "logical_and",
        /// logical or
        LogicalOr = "logical_or",
        /// bitwise and
        BitwiseAnd = "bitwise_and",
        /// bitwise or
        BitwiseOr = "bitwise_or",
        /// bitwise xor
        BitwiseXor = "bitwise_xor",
        /// `a << b`
        LeftShift = "left_shift",
        /// `a >> b`
        RightShift = "right_shift",
    }
}

impl BinaryOp {
    /// True for ops whose result is bool whatever the input dtype.
    pub const fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(
            self,
            Equal | NotEqual | Less | LessEqual | Greater | GreaterEqual | LogicalAnd | LogicalOr
        )
    }
}

/// Applies a [`UnaryOp`].
#[derive(Debug, Clone, Copy)]
pub struct Unary(pub UnaryOp);

impl Primitive for Unary {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        cpu::unary::unary(self.0, out.shape(), inputs[0].dtype(), &inputs[0].data()?)
    }
}

/// Applies a [`BinaryOp`] to two inputs already broadcast to the output shape
/// and cast to a common dtype.
#[derive(Debug, Clone, Copy)]
pub struct Binary(pub BinaryOp);

impl Primitive for Binary {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        cpu::binary::binary(
            self.0,
            out.shape(),
            inputs[0].dtype(),
            &inputs[0].data()?,
            &inputs[1].data()?,
        )
    }
}

/// `where(cond, a, b)`: inputs broadcast to the output shape, `cond` bool.
#[derive(Debug, Clone, Copy)]
pub struct Select;

impl Primitive for Select {
    fn name(&self) -> &'static str {
        "where"
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let [c, a, b] = [&inputs[0], &inputs[1], &inputs[2]].map(|x| x.data());
        Ok(cpu::binary::select(out.shape(), out.dtype(), &c?, &a?, &b?))
    }
}

/// Converts to the output dtype (and makes the result contiguous).
#[derive(Debug, Clone, Copy)]
pub struct AsType;

impl Primitive for AsType {
    fn name(&self) -> &'static str {
        "astype"
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        Ok(cpu::copy::copy_cast(
            &inputs[0].data()?,
            out.shape(),
            inputs[0].dtype(),
            out.dtype(),
        ))
    }
}

/// The identity, through which no gradient flows.
#[derive(Debug, Clone, Copy)]
pub struct StopGradient;

impl Primitive for StopGradient {
    fn name(&self) -> &'static str {
        "stop_gradient"
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
}
