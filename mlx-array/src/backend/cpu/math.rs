//! Scalar math shared by the kernels: a vectorisable `exp`, `erf`, and
//! conversions between the float storage types and f32.

use half::{bf16, f16};

/// Float storage types that compute in f32.
pub trait FloatLike: crate::Element + Default {
    /// Widens to f32.
    fn to_f32(self) -> f32;
    /// Narrows from f32 (round to nearest even).
    fn from_f32(v: f32) -> Self;
}

impl FloatLike for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        v
    }
}

impl FloatLike for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        f16::from_f32(v)
    }
}

impl FloatLike for bf16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        bf16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(v: f32) -> Self {
        bf16::from_f32(v)
    }
}

/// `e^x` in f32 to about 1 ulp, written without branches or calls so that the
/// compiler vectorises loops over it (Cephes' polynomial, Cody-Waite reduction).
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23: adding it rounds to an integer.
    const HI: f32 = 88.722_83;
    // Just above -126 ln 2, so that even the clamped input's 2^n * y stays a
    // normal number: a subnormal intermediate costs a microcode assist of
    // ~100 cycles per element on x86 (a causal mask's -1e9 made the
    // attention softmax 5x slower), and is flushed below anyway.
    const LO: f32 = -87.336_5;
    // max/min rather than clamp: NaN becomes a bound here and is restored at the end.
    #[allow(clippy::manual_clamp)]
    let xc = x.max(LO).min(HI);
    let t = xc * LOG2E + ROUND;
    let n = t - ROUND;
    // The integer n sits in the low mantissa bits of t.
    let ni = t.to_bits() as i32 - 0x4B40_0000;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // 2^n as two factors, so that n = 128 and n = -126 both stay representable.
    let half = ni >> 1;
    let s1 = f32::from_bits(((half + 127) as u32) << 23);
    let s2 = f32::from_bits(((ni - half + 127) as u32) << 23);
    let v = y * s1 * s2;
    let v = if x > HI { f32::INFINITY } else { v };
    // Below the smallest normal f32: flush to zero (as GPU kernels do).
    let v = if x < LO { 0.0 } else { v };
    if x.is_nan() { x } else { v }
}

/// The logistic function `1 / (1 + e^-x)`, accurate for large |x| of either sign.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    let s = 1.0 / (1.0 + e);
    if x >= 0.0 { s } else { e * s }
}

/// The error function, to about 1e-7 absolute (W. J. Cody's rational
/// approximations, as in most libm implementations).
pub fn erf(x: f32) -> f32 {
    erf64(x as f64) as f32
}

fn erf64(x: f64) -> f64 {
    // Abramowitz & Stegun 7.1.26 is too coarse for f32 near 0; use the series
    // for small |x| and the continued fraction via erfc for large |x|.
    let ax = x.abs();
    let r = if ax < 2.5 {
        // Maclaurin series: erf(x) = 2/sqrt(pi) * sum (-1)^n x^(2n+1) / (n! (2n+1))
        let mut term = ax;
        let mut sum = ax;
        let x2 = ax * ax;
        let mut n = 0.0;
        while term.abs() > 1e-17 * sum.abs() {
            n += 1.0;
            term *= -x2 / n;
            sum += term / (2.0 * n + 1.0);
            if n > 200.0 {
                break;
            }
        }
        sum * std::f64::consts::FRAC_2_SQRT_PI
    } else {
        // erfc(x) = exp(-x^2)/sqrt(pi) * 1/(x + 1/2/(x + 1/(x + 3/2/(x + ...))))
        let mut f = ax;
        for k in (1..60).rev() {
            f = ax + (k as f64 / 2.0) / f;
        }
        1.0 - (-ax * ax).exp() / (std::f64::consts::PI.sqrt() * f)
    };
    if x < 0.0 { -r } else { r }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_matches_f64_to_a_few_ulp() {
        let mut x = -100.0f32;
        while x < 100.0 {
            let want = (x as f64).exp();
            let got = exp(x) as f64;
            if want.is_finite() && want < f32::MAX as f64 {
                let tol = want.abs() * 3.0 * f32::EPSILON as f64 + 1.2e-38;
                assert!((got - want).abs() <= tol, "exp({x}) = {got}, want {want}");
            }
            x += 0.013;
        }
        assert!(exp(f32::NAN).is_nan());
        assert_eq!(exp(1000.0), f32::INFINITY);
        assert_eq!(exp(f32::NEG_INFINITY), 0.0);
        // A masked score: flushed to zero; just above the bound: a normal number.
        assert_eq!(exp(-1e9), 0.0);
        assert!(exp(-87.3365).is_normal() && exp(-87.3366) == 0.0);
    }

    #[test]
    fn erf_known_values() {
        // Values from Abramowitz & Stegun table 7.1.
        for (x, want) in [
            (0.0, 0.0),
            (0.5, 0.520_499_877_8),
            (1.0, 0.842_700_792_9),
            (2.0, 0.995_322_265_0),
            (3.0, 0.999_977_909_5),
        ] {
            assert!((erf64(x) - want).abs() < 1e-9, "erf({x})");
            assert!((erf64(-x) + want).abs() < 1e-9, "erf(-{x})");
        }
    }
}
