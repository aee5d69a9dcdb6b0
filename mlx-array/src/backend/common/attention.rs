//! Fused scaled dot-product attention: the sizes both backends' kernels take.

/// The sizes of one attention: `q [b, h, lq, d]`, `k [b, h, lk, d]`,
/// `v [b, h, lk, dv]`, the score scale and whether the mask is causal (query
/// `i` sees keys `0..=i + lk - lq`, the queries being the last `lq`
/// positions).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDims {
    /// Batch.
    pub b: usize,
    /// Heads.
    pub h: usize,
    /// Query positions.
    pub lq: usize,
    /// Key (and value) positions.
    pub lk: usize,
    /// Query and key width.
    pub d: usize,
    /// Value width.
    pub dv: usize,
    /// Multiplies the scores before the softmax.
    pub scale: f32,
    /// Each query sees only the keys up to its own position.
    pub causal: bool,
}

impl AttentionDims {
    /// The shapes of `q`, `k` and `v`.
    pub fn shapes(&self) -> [[usize; 4]; 3] {
        let (b, h) = (self.b, self.h);
        [
            [b, h, self.lq, self.d],
            [b, h, self.lk, self.d],
            [b, h, self.lk, self.dv],
        ]
    }
    /// Elements of the output, then of the logsumexps, in the packed buffer.
    pub fn packed_len(&self) -> (usize, usize) {
        let rows = self.b * self.h * self.lq;
        (rows * self.dv, rows)
    }
    /// Elements of `dq`, `dk`, `dv` in the packed gradient.
    pub fn grad_len(&self) -> (usize, usize, usize) {
        let kv = self.b * self.h * self.lk;
        (
            self.b * self.h * self.lq * self.d,
            kv * self.d,
            kv * self.dv,
        )
    }
    /// The keys query row `i` sees: `0..limit(i)`.
    pub fn limit(&self, i: usize) -> usize {
        if self.causal {
            (i + 1 + self.lk - self.lq).min(self.lk)
        } else {
            self.lk
        }
    }
}
