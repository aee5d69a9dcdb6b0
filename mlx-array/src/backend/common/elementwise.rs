//! Elementwise ops: the unary and binary functions both backends implement.

/// Declares an op enum with its `ALL` list and MLX names.
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
