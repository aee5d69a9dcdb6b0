//! The sharded distributed sampler: equal shards, remainder dropped, reshuffled per epoch.

use crate::error::{DataError, Result};
use crate::rng::{Permutation, mix};

/// Which samples one rank sees in one epoch.
///
/// Each epoch the `n` samples are put in a pseudo-random order fixed by
/// `(seed, epoch)`; the first `world * (n / world)` positions are dealt round-robin
/// to the ranks (rank `r` gets positions `r, r + world, ...`) and the remainder is
/// dropped, so across ranks every kept sample is used exactly once per epoch.
/// Needs O(1) memory: positions are computed on demand.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ShardedSampler {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Shuffling seed shared by all ranks.
    pub seed: u64,
    /// Epoch number; each epoch has its own order.
    pub epoch: u64,
}

impl ShardedSampler {
    /// A sampler for `rank` of `world` at epoch 0, or an error if the rank is out of range.
    pub fn new(rank: usize, world: usize, seed: u64) -> Result<Self> {
        if world == 0 || rank >= world {
            return Err(DataError::Config(format!(
                "rank {rank} is out of range for world size {world}"
            )));
        }
        Ok(ShardedSampler {
            rank,
            world,
            seed,
            epoch: 0,
        })
    }

    /// The same sampler at `epoch`.
    pub fn with_epoch(self, epoch: u64) -> Self {
        ShardedSampler { epoch, ..self }
    }

    /// Samples per rank per epoch out of `n` (the remainder `n % world` is dropped).
    pub fn shard_len(&self, n: u64) -> u64 {
        n / self.world as u64
    }

    /// The permutation of this epoch.
    pub fn permutation(&self, n: u64) -> Permutation {
        Permutation::new(n, mix(self.seed ^ mix(self.epoch.wrapping_add(0x51ED))))
    }

    /// The `k`-th sample of this rank in this epoch (`k < shard_len(n)`).
    pub fn index(&self, perm: &Permutation, k: u64) -> u64 {
        perm.apply(self.rank as u64 + k * self.world as u64)
    }

    /// All of this rank's samples for this epoch, in order.
    pub fn indices(&self, n: u64) -> impl Iterator<Item = u64> + '_ {
        let perm = self.permutation(n);
        (0..self.shard_len(n)).map(move |k| self.index(&perm, k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_rank() {
        assert!(ShardedSampler::new(3, 3, 0).is_err());
        assert!(ShardedSampler::new(0, 0, 0).is_err());
    }
}
