//! Element types and MLX's type-promotion rules.

use std::fmt;

use half::{bf16, f16};

/// The element type of an [`Array`](crate::Array).
///
/// ```
/// use mlx_array::Dtype;
/// assert_eq!(Dtype::promote(Dtype::I32, Dtype::F16), Dtype::F16);
/// assert_eq!(Dtype::F32.size_of(), 4);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Dtype {
    /// Boolean, stored as one byte (0 or 1).
    Bool,
    /// Unsigned 32-bit integer.
    U32,
    /// Signed 32-bit integer.
    I32,
    /// Signed 64-bit integer.
    I64,
    /// IEEE half precision.
    F16,
    /// Brain floating point (8-bit exponent, 7-bit mantissa).
    BF16,
    /// IEEE single precision.
    F32,
}

/// Every dtype, in promotion order.
pub const ALL_DTYPES: [Dtype; 7] = [
    Dtype::Bool,
    Dtype::U32,
    Dtype::I32,
    Dtype::I64,
    Dtype::F16,
    Dtype::BF16,
    Dtype::F32,
];

impl Dtype {
    /// Bytes per element.
    pub const fn size_of(self) -> usize {
        match self {
            Dtype::Bool => 1,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::U32 | Dtype::I32 | Dtype::F32 => 4,
            Dtype::I64 => 8,
        }
    }

    /// True for f16, bf16 and f32.
    pub const fn is_float(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16 | Dtype::F32)
    }

    /// True for the half-precision floats, f16 and bf16.
    pub const fn is_half(self) -> bool {
        matches!(self, Dtype::F16 | Dtype::BF16)
    }

    /// True for the integer types (not bool).
    pub const fn is_integer(self) -> bool {
        matches!(self, Dtype::U32 | Dtype::I32 | Dtype::I64)
    }

    /// True for the signed integer types.
    pub const fn is_signed_integer(self) -> bool {
        matches!(self, Dtype::I32 | Dtype::I64)
    }

    /// The lower-case name MLX and NumPy use (`float32`, `bfloat16`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            Dtype::Bool => "bool",
            Dtype::U32 => "uint32",
            Dtype::I32 => "int32",
            Dtype::I64 => "int64",
            Dtype::F16 => "float16",
            Dtype::BF16 => "bfloat16",
            Dtype::F32 => "float32",
        }
    }

    /// The safetensors name of the dtype (`F32`, `BF16`, `BOOL`, ...).
    pub const fn safetensors_name(self) -> &'static str {
        match self {
            Dtype::Bool => "BOOL",
            Dtype::U32 => "U32",
            Dtype::I32 => "I32",
            Dtype::I64 => "I64",
            Dtype::F16 => "F16",
            Dtype::BF16 => "BF16",
            Dtype::F32 => "F32",
        }
    }

    /// Parses a name as printed by [`Dtype::name`] or [`Dtype::safetensors_name`].
    pub fn from_name(name: &str) -> Option<Dtype> {
        ALL_DTYPES
            .into_iter()
            .find(|d| d.name() == name || d.safetensors_name() == name)
    }

    /// The result type of a binary operation on `a` and `b`, following MLX:
    /// bool promotes to anything; mixing signed and unsigned 32-bit integers gives
    /// int64; integers with a float give that float; f16 with bf16 gives f32.
    pub fn promote(a: Dtype, b: Dtype) -> Dtype {
        use Dtype::*;
        if a == b {
            return a;
        }
        match (a, b) {
            (Bool, x) | (x, Bool) => x,
            (F32, _) | (_, F32) => F32,
            (F16, BF16) | (BF16, F16) => F32,
            (F16, _) | (_, F16) => F16,
            (BF16, _) | (_, BF16) => BF16,
            // Only integers remain.
            (I64, _) | (_, I64) => I64,
            (U32, I32) | (I32, U32) => I64,
            _ => unreachable!("all dtype pairs are covered"),
        }
    }

    /// The float type an operation on this dtype computes in (ints and bool give f32).
    pub fn to_float(self) -> Dtype {
        if self.is_float() { self } else { Dtype::F32 }
    }
}

impl fmt::Display for Dtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be stored in an [`Array`](crate::Array).
pub trait Element: bytemuck::Pod + Send + Sync + Copy + PartialEq + fmt::Debug + 'static {
    /// The matching [`Dtype`].
    const DTYPE: Dtype;
    /// Converts to f64 (exact for every supported type but i64 beyond 2^53).
    fn to_f64(self) -> f64;
    /// Converts from f64 with Rust's `as` semantics (saturating, NaN to 0 for ints).
    fn from_f64(v: f64) -> Self;
    /// Converts to i64 (floats truncate toward zero, saturating).
    fn to_i64(self) -> i64;
    /// Converts from i64 with C's wrapping semantics for narrower integers.
    fn from_i64(v: i64) -> Self;
}

/// Converts one element between dtypes as `astype` does: through f64 when
/// either side is a float, through i64 between integers, bool as 0/1.
///
/// Between f32 and bfloat16 (the casts of mixed precision, every step) it
/// works on the bits instead, giving the same values without going
/// through f64, so that loops of it vectorise.
#[inline(always)]
pub fn cast<A: Element, B: Element>(a: A) -> B {
    match (A::DTYPE, B::DTYPE) {
        (Dtype::F32, Dtype::BF16) => {
            return bytemuck::cast(f32_bits_to_bf16(bytemuck::cast::<A, u32>(a)));
        }
        (Dtype::BF16, Dtype::F32) => {
            return bytemuck::cast((bytemuck::cast::<A, u16>(a) as u32) << 16);
        }
        _ => {}
    }
    if A::DTYPE.is_float() || B::DTYPE.is_float() {
        B::from_f64(a.to_f64())
    } else {
        B::from_i64(a.to_i64())
    }
}

/// The bfloat16 bits nearest to the f32 bits `b` (ties to even), NaN kept
/// a quiet NaN of the same sign: what `half::bf16::from_f32` gives, without
/// its branches on the value.
#[inline(always)]
fn f32_bits_to_bf16(b: u32) -> u16 {
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        ((b >> 16) | 0x40) as u16
    } else {
        ((b + 0x7FFF + ((b >> 16) & 1)) >> 16) as u16
    }
}

/// Booleans are stored as one byte; `bool` itself is not `Pod`, so arrays of
/// booleans are read and written as this wrapper.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default, bytemuck::Pod, bytemuck::Zeroable,
)]
#[repr(transparent)]
pub struct Bool8(pub u8);

impl From<bool> for Bool8 {
    fn from(b: bool) -> Self {
        Bool8(b as u8)
    }
}

impl From<Bool8> for bool {
    fn from(b: Bool8) -> Self {
        b.0 != 0
    }
}

macro_rules! element {
    ($t:ty, $d:expr, |$v:ident| $to:expr, |$w:ident| $from:expr, |$x:ident| $toi:expr, |$y:ident| $fromi:expr) => {
        impl Element for $t {
            const DTYPE: Dtype = $d;
            #[inline]
            fn to_f64(self) -> f64 {
                let $v = self;
                $to
            }
            #[inline]
            fn from_f64(v: f64) -> Self {
                let $w = v;
                $from
            }
            #[inline]
            fn to_i64(self) -> i64 {
                let $x = self;
                $toi
            }
            #[inline]
            fn from_i64(v: i64) -> Self {
                let $y = v;
                $fromi
            }
        }
    };
}

element!(
    Bool8,
    Dtype::Bool,
    |v| v.0 as f64,
    |w| Bool8((w != 0.0) as u8),
    |x| x.0 as i64,
    |y| Bool8((y != 0) as u8)
);
element!(
    u32,
    Dtype::U32,
    |v| v as f64,
    |w| w as u32,
    |x| x as i64,
    |y| y as u32
);
element!(
    i32,
    Dtype::I32,
    |v| v as f64,
    |w| w as i32,
    |x| x as i64,
    |y| y as i32
);
element!(i64, Dtype::I64, |v| v as f64, |w| w as i64, |x| x, |y| y);
element!(
    f16,
    Dtype::F16,
    |v| v.to_f64(),
    |w| f16::from_f64(w),
    |x| x.to_f64() as i64,
    |y| f16::from_f64(y as f64)
);
element!(
    bf16,
    Dtype::BF16,
    |v| v.to_f64(),
    |w| bf16::from_f64(w),
    |x| x.to_f64() as i64,
    |y| bf16::from_f64(y as f64)
);
element!(
    f32,
    Dtype::F32,
    |v| v as f64,
    |w| w as f32,
    |x| x as i64,
    |y| y as f32
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The bit-level casts between f32 and bfloat16 agree with the `half`
    /// crate's conversions on every class of value: both signs, zeros,
    /// subnormals, ties (odd and even), the largest finite value (which
    /// rounds to infinity), infinities and NaNs, and a sweep of bit
    /// patterns.
    #[test]
    fn f32_bfloat16_casts_agree_with_half() {
        let mut bits: Vec<u32> = vec![
            0,
            1,
            0x0000_8000,
            0x0001_8000,
            0x3F80_8000,
            0x3F81_8000,
            0x3F80_8001,
            0x7F7F_FFFF,
            0x7F80_0000,
            0x7F80_0001,
            0x7FC0_0000,
            0x7FFF_FFFF,
        ];
        bits.extend((0..1u64 << 32).step_by(65_521).map(|b| b as u32));
        for b in bits {
            for b in [b, b | 0x8000_0000] {
                let x = f32::from_bits(b);
                let got: half::bf16 = cast(x);
                let want = half::bf16::from_f32(x);
                if x.is_nan() {
                    assert!(got.is_nan() && got.is_sign_negative() == x.is_sign_negative());
                } else {
                    assert_eq!(got.to_bits(), want.to_bits(), "{x:e} ({b:#010x})");
                }
                let back: f32 = cast(want);
                assert_eq!(back.to_bits(), want.to_f32().to_bits());
            }
        }
    }

    #[test]
    fn promotion_matches_mlx_table() {
        use Dtype::*;
        let cases = [
            (Bool, I32, I32),
            (U32, I32, I64),
            (U32, I64, I64),
            (I32, F16, F16),
            (I64, BF16, BF16),
            (F16, BF16, F32),
            (BF16, F32, F32),
            (Bool, Bool, Bool),
        ];
        for (a, b, want) in cases {
            assert_eq!(Dtype::promote(a, b), want, "{a} with {b}");
            assert_eq!(Dtype::promote(b, a), want, "{b} with {a}");
        }
    }

    #[test]
    fn names_round_trip() {
        for d in ALL_DTYPES {
            assert_eq!(Dtype::from_name(d.name()), Some(d));
            assert_eq!(Dtype::from_name(d.safetensors_name()), Some(d));
        }
        assert_eq!(Dtype::from_name("complex64"), None);
    }
}
