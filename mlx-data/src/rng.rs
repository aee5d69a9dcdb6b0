//! Small deterministic pseudo-random tools: SplitMix64 and a keyed permutation.

/// SplitMix64: a tiny, fast, well-mixed deterministic generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix(self.0)
    }

    /// A uniform index below `n` (`n > 0`); the tiny modulo bias is irrelevant here.
    pub fn below(&mut self, n: usize) -> usize {
        ((self.next_u64() as u128 * n as u128) >> 64) as usize
    }

    /// Picks one element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

/// The SplitMix64 finaliser: a bijective 64-bit mixer.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A keyed pseudo-random permutation of `0..n` computed point by point in O(1) memory.
///
/// A balanced Feistel network over the smallest even power of two covering `n`,
/// with cycle walking to stay inside `0..n`. Every rank can evaluate its own
/// positions without materialising the whole shuffled order.
#[derive(Debug, Clone)]
pub struct Permutation {
    n: u64,
    half_bits: u32,
    keys: [u64; 4],
}

impl Permutation {
    /// The permutation of `0..n` selected by `key`.
    pub fn new(n: u64, key: u64) -> Self {
        let bits = 64 - n.max(2).saturating_sub(1).leading_zeros();
        let half_bits = bits.div_ceil(2).max(1);
        let mut rng = SplitMix64::new(key);
        let keys = [
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
            rng.next_u64(),
        ];
        Permutation { n, half_bits, keys }
    }

    /// The size of the permuted domain.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True for the permutation of the empty set.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The image of `i` (`i < n`).
    pub fn apply(&self, i: u64) -> u64 {
        debug_assert!(i < self.n);
        let mut x = i;
        loop {
            x = self.feistel(x);
            if x < self.n {
                return x;
            }
        }
    }

    fn feistel(&self, x: u64) -> u64 {
        let mask = (1u64 << self.half_bits) - 1;
        let mut left = x >> self.half_bits;
        let mut right = x & mask;
        for key in self.keys {
            let f = mix(right ^ key) & mask;
            (left, right) = (right, left ^ f);
        }
        (left << self.half_bits) | right
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_is_a_bijection_for_many_sizes() {
        for n in [1u64, 2, 3, 5, 16, 17, 100, 1000, 4097] {
            let p = Permutation::new(n, 7);
            let mut seen = vec![false; n as usize];
            for i in 0..n {
                let j = p.apply(i) as usize;
                assert!(!seen[j], "n={n}: {j} hit twice");
                seen[j] = true;
            }
        }
    }

    #[test]
    fn permutation_depends_on_key_and_actually_shuffles() {
        let a: Vec<u64> = (0..1000)
            .map(|i| Permutation::new(1000, 1).apply(i))
            .collect();
        let b: Vec<u64> = (0..1000)
            .map(|i| Permutation::new(1000, 2).apply(i))
            .collect();
        assert_ne!(a, b);
        let fixed = a
            .iter()
            .enumerate()
            .filter(|(i, v)| *i as u64 == **v)
            .count();
        assert!(fixed < 20, "{fixed} fixed points: not shuffled");
    }
}
