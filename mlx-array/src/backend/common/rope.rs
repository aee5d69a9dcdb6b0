//! Rotary position embedding: the rotation both backends' kernels apply.

/// How [`crate::rope`] rotates: the first `dims` features of each row, in
/// consecutive pairs (`traditional`) or as two halves, by the angle
/// `(offset + position) * scale * base^(-2i / dims)` for pair `i`, negated
/// when `inverse` (the transpose of the rotation, for the gradient).
#[derive(Debug, Clone, Copy, PartialEq)]
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
}
