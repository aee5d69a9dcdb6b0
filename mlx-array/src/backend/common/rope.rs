//! Rotary position embedding: the rotation both backends' kernels apply.

use std::sync::Arc;

/// How [`crate::rope`] and [`crate::rope_with_freqs`] rotate: the first
/// `dims` features of each row, in consecutive pairs (`traditional`) or as
/// two halves, by the angle `(offset + position) * scale * f_i` for pair
/// `i`, where `f_i = base^(-2i / dims)`, or `freqs[i]` when a frequency
/// table is given (then `base` is unused); negated when `inverse` (the
/// transpose of the rotation, for the gradient).
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Features rotated (even, at most the row width).
    pub dims: usize,
    /// Consecutive pairs (true) or halves (false).
    pub traditional: bool,
    /// Base of the frequencies.
    pub base: f32,
    /// Multiplies positions.
    pub scale: f32,
    /// Position of the first row.
    pub offset: usize,
    /// Rotate by minus the angle.
    pub inverse: bool,
    /// Explicit inverse frequencies, one per pair (`dims / 2`), in place of
    /// `base`'s.
    pub freqs: Option<Arc<[f32]>>,
}
