//! The output projection fused with the cross-entropy: its arguments, and
//! how many classes a chunk of logits takes, which both backends follow.

use crate::data::Operand;

/// Bytes of logits computed at a time when the caller does not choose.
const CHUNK_BYTES: usize = 16 << 20;

/// Vocabulary columns per chunk: `requested` when set, else about
/// [`CHUNK_BYTES`] of f32 logits for `rows` rows.
pub(crate) fn chunk_cols(rows: usize, vocab: usize, requested: usize) -> usize {
    let c = if requested > 0 {
        requested
    } else {
        (CHUNK_BYTES / 4 / rows.max(1)).max(256)
    };
    c.min(vocab).max(1)
}

/// Operands and options of a fused output projection + cross-entropy.
pub struct LceArgs<'a> {
    /// Hidden states `[..., D]`, of a float dtype (also the weight's).
    pub h: Operand<'a>,
    /// The projection weight `[V, D]`.
    pub w: Operand<'a>,
    /// Integer targets `[...]`.
    pub t: Operand<'a>,
    /// Rows with this target get no loss and no gradient.
    pub ignore_index: Option<i64>,
    /// Label smoothing in `[0, 1)`.
    pub label_smoothing: f32,
    /// Classes per chunk (0 = about 16 MiB of logits).
    pub chunk: usize,
    /// Rows per block of the one-pass loss and gradient (0 = equal blocks
    /// of at most 50 MiB of logits or a ninth of the rows, whichever is more;
    /// rounded up to a multiple of 32 on the AVX-512 path).
    pub block_rows: usize,
}
