//! A batch of token rows with its loss mask, as plain Rust data.

/// How stories become fixed-length rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum BatchMode {
    /// One story per row, truncated or padded with EOS to `block_size + 1`; the
    /// loss mask is 0 on targets that are padding (the first EOS still counts).
    #[default]
    Pad,
    /// Stories concatenated with EOS and cut into windows of `block_size + 1`
    /// tokens with stride `block_size` (each token is a target once); no padding.
    Pack,
}

/// `batch_size` rows of `block_size + 1` tokens plus a `(batch_size, block_size)`
/// loss mask aligned with the targets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Batch {
    /// Row-major `(batch_size, block_size + 1)` token ids.
    pub tokens: Vec<u32>,
    /// Row-major `(batch_size, block_size)`: 1 where `targets[b, j]` counts in the loss.
    pub loss_mask: Vec<u8>,
    /// Rows in this batch (this rank's share).
    pub batch_size: usize,
    /// Tokens predicted per row (`block_size`).
    pub block_size: usize,
    /// Sample ids (document or window numbers) of the rows, for checks and logs.
    pub samples: Vec<u64>,
    /// Epoch the batch belongs to.
    pub epoch: u64,
    /// Row-major `(batch_size, block_size)` for packed examples (instruction
    /// data): the example each input token belongs to, counted from 0 along
    /// its row, so that attention can stay within one example. `None`
    /// otherwise.
    pub segments: Option<Vec<u32>>,
}

impl Batch {
    /// Row length, `block_size + 1`.
    pub fn row_len(&self) -> usize {
        self.block_size + 1
    }

    /// Row `b` (all `block_size + 1` tokens).
    pub fn row(&self, b: usize) -> &[u32] {
        &self.tokens[b * self.row_len()..(b + 1) * self.row_len()]
    }

    /// Inputs of row `b`: `row[:-1]`.
    pub fn inputs(&self, b: usize) -> &[u32] {
        &self.row(b)[..self.block_size]
    }

    /// Targets of row `b`: `row[1:]`.
    pub fn targets(&self, b: usize) -> &[u32] {
        &self.row(b)[1..]
    }

    /// Loss mask of row `b`, aligned with [`Batch::targets`].
    pub fn mask(&self, b: usize) -> &[u8] {
        &self.loss_mask[b * self.block_size..(b + 1) * self.block_size]
    }

    /// Number of targets that count in the loss.
    pub fn n_target_tokens(&self) -> usize {
        self.loss_mask.iter().map(|&m| m as usize).sum()
    }
}
