//! Fused scaled dot-product attention: the sizes both backends' kernels take.

/// The sizes of one attention: `q [b, h, lq, d]`, `k [b, hkv, lk, d]`,
/// `v [b, hkv, lk, dv]`, the score scale and whether the mask is causal
/// (query `i` sees keys `0..=i + lk - lq`, the queries being the last `lq`
/// positions). With fewer key/value heads than query heads (grouped-query
/// attention; `hkv = 1` is multi-query) query head `h` reads key/value
/// head `h / (h / hkv)` ([`AttentionDims::kv_head`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionDims {
    /// Batch.
    pub b: usize,
    /// Query heads.
    pub h: usize,
    /// Key/value heads (divides `h`).
    pub hkv: usize,
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
        let (b, h, hkv) = (self.b, self.h, self.hkv);
        [
            [b, h, self.lq, self.d],
            [b, hkv, self.lk, self.d],
            [b, hkv, self.lk, self.dv],
        ]
    }
    /// Query heads per key/value head (1 for multi-head attention).
    pub fn group(&self) -> usize {
        self.h / self.hkv
    }
    /// The key/value head that query head `h` reads.
    pub fn kv_head(&self, h: usize) -> usize {
        h / self.group()
    }
    /// Elements of the output, then of the logsumexps, in the packed buffer.
    pub fn packed_len(&self) -> (usize, usize) {
        let rows = self.b * self.h * self.lq;
        (rows * self.dv, rows)
    }
    /// Elements of `dq`, `dk`, `dv` in the packed gradient (`dk` and `dv`
    /// of `k`'s and `v`'s own shapes: each the sum over its group).
    pub fn grad_len(&self) -> (usize, usize, usize) {
        let kv = self.b * self.hkv * self.lk;
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
