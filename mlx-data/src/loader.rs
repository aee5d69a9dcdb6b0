//! The per-rank data loader: sampler + batching over a token store, with resumable state.

use crate::batch::{Batch, BatchMode};
use crate::error::{DataError, Result};
use crate::rng::Permutation;
use crate::sampler::ShardedSampler;
use crate::store::TokenStore;
use std::sync::Arc;

/// Whether a batch size counts rows across all ranks or on this rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BatchSize {
    /// Rows across all ranks; must divide by the world size.
    Global(usize),
    /// Rows on each rank.
    PerRank(usize),
}

impl BatchSize {
    /// Rows on one rank of `world`, or [`DataError::BatchNotDivisible`].
    pub fn per_rank(self, world: usize) -> Result<usize> {
        let n = match self {
            BatchSize::Global(g) if world == 0 || g % world != 0 => {
                return Err(DataError::BatchNotDivisible { global: g, world });
            }
            BatchSize::Global(g) => g / world,
            BatchSize::PerRank(n) => n,
        };
        if n == 0 {
            return Err(DataError::Config("batch size must be at least 1".into()));
        }
        Ok(n)
    }
}

/// Settings of a [`DataLoader`]; the defaults are the reference experiment's.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LoaderConfig {
    /// Tokens predicted per row; rows hold `block_size + 1` tokens.
    pub block_size: usize,
    /// Batch size (global, split across ranks, or per rank).
    pub batch: BatchSize,
    /// Padding or packing.
    pub mode: BatchMode,
    /// Shuffle seed, identical on all ranks.
    pub seed: u64,
    /// This process's rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Drop each sample's pages from this process's resident set after copying it,
    /// so resident memory stays flat however much of the store an epoch touches.
    pub release_pages: bool,
}

impl Default for LoaderConfig {
    fn default() -> Self {
        LoaderConfig {
            block_size: 512,
            batch: BatchSize::Global(4),
            mode: BatchMode::Pad,
            seed: 42,
            rank: 0,
            world: 1,
            release_pages: true,
        }
    }
}

/// Where a loader is: enough to resume exactly, plus fields that must match on restore.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LoaderState {
    /// Current epoch.
    pub epoch: u64,
    /// Batches already produced in this epoch.
    pub batch_in_epoch: u64,
    /// Shuffle seed.
    pub seed: u64,
    /// Rank.
    pub rank: usize,
    /// World size.
    pub world: usize,
    /// Samples in the store under the loader's mode (documents or windows).
    pub n_samples: u64,
    /// Rows per batch on this rank.
    pub per_rank_batch: usize,
    /// Block size.
    pub block_size: usize,
    /// Batching mode.
    pub mode: BatchMode,
}

impl LoaderState {
    /// The state as JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Rows of one batch across the world (`per_rank_batch * world`): the
    /// unit the position counts in, whatever the world size. Saturates: a
    /// state read from a file may hold any numbers, and one whose product
    /// overflows matches no loader's (it multiplied with overflow, a panic,
    /// before).
    pub fn global_batch(&self) -> usize {
        self.per_rank_batch.saturating_mul(self.world)
    }

    /// Parses a state saved with [`LoaderState::to_json`].
    pub fn from_json(s: &str) -> Result<LoaderState> {
        serde_json::from_str(s).map_err(|e| DataError::Config(format!("loader state JSON: {e}")))
    }
}

/// Produces this rank's batches, epoch after epoch, from a shared token store.
#[derive(Debug, Clone)]
pub struct DataLoader {
    store: Arc<TokenStore>,
    cfg: LoaderConfig,
    per_rank: usize,
    n_samples: u64,
    sampler: ShardedSampler,
    perm: Permutation,
    batch_in_epoch: u64,
}

impl DataLoader {
    /// A loader at epoch 0 for `cfg.rank` of `cfg.world`.
    pub fn new(store: Arc<TokenStore>, cfg: LoaderConfig) -> Result<DataLoader> {
        if cfg.block_size == 0 {
            return Err(DataError::Config("block_size must be at least 1".into()));
        }
        let per_rank = cfg.batch.per_rank(cfg.world)?;
        let sampler = ShardedSampler::new(cfg.rank, cfg.world, cfg.seed)?;
        let n_samples = match cfg.mode {
            BatchMode::Pad => store.n_docs(),
            BatchMode::Pack => store.n_tokens().saturating_sub(1) / cfg.block_size as u64,
        };
        let needed = (per_rank * cfg.world) as u64;
        if n_samples < needed {
            return Err(DataError::NotEnoughData {
                what: format!(
                    "one batch of {per_rank} rows on each of {} ranks ({:?} mode, block size {})",
                    cfg.world, cfg.mode, cfg.block_size
                ),
                needed,
                available: n_samples,
            });
        }
        let perm = sampler.permutation(n_samples);
        Ok(DataLoader {
            store,
            cfg,
            per_rank,
            n_samples,
            sampler,
            perm,
            batch_in_epoch: 0,
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LoaderConfig {
        &self.cfg
    }

    /// The token store read from.
    pub fn store(&self) -> &Arc<TokenStore> {
        &self.store
    }

    /// Rows per batch on this rank.
    pub fn per_rank_batch(&self) -> usize {
        self.per_rank
    }

    /// Samples (documents or windows) in the store under this mode.
    pub fn n_samples(&self) -> u64 {
        self.n_samples
    }

    /// Full batches per epoch on each rank (a final partial batch is dropped).
    pub fn batches_per_epoch(&self) -> u64 {
        self.sampler.shard_len(self.n_samples) / self.per_rank as u64
    }

    /// The current epoch.
    pub fn epoch(&self) -> u64 {
        self.sampler.epoch
    }

    /// The resumable state (the next batch produced is the one after it).
    pub fn state(&self) -> LoaderState {
        LoaderState {
            epoch: self.sampler.epoch,
            batch_in_epoch: self.batch_in_epoch,
            seed: self.cfg.seed,
            rank: self.cfg.rank,
            world: self.cfg.world,
            n_samples: self.n_samples,
            per_rank_batch: self.per_rank,
            block_size: self.cfg.block_size,
            mode: self.cfg.mode,
        }
    }

    /// Continues from a saved state; fails if it was saved by a differently
    /// configured loader.
    ///
    /// The state may come from any rank of any world size whose batches have
    /// as many rows across the world as this loader's (`per_rank_batch *
    /// world`): batch `b` of an epoch takes positions `b * G .. (b + 1) * G`
    /// of the epoch's order (`G` rows across the world), which depends on
    /// the seed, the epoch and the number of samples alone, and an epoch has
    /// `n_samples / G` batches whatever the world size. So a run that stops
    /// at world `N` and resumes at world `M` uses every sample of the epoch
    /// exactly once across the change; each batch holds the same samples,
    /// dealt to the ranks differently.
    pub fn restore(&mut self, s: &LoaderState) -> Result<()> {
        let mine = self.state();
        let check = |field: &'static str, expected: String, found: String| {
            if expected == found {
                Ok(())
            } else {
                Err(DataError::StateMismatch {
                    field,
                    expected,
                    found,
                })
            }
        };
        check("seed", mine.seed.to_string(), s.seed.to_string())?;
        check(
            "n_samples",
            mine.n_samples.to_string(),
            s.n_samples.to_string(),
        )?;
        let rows = |s: &LoaderState| {
            format!(
                "{} rows ({} on each of {} ranks)",
                s.global_batch(),
                s.per_rank_batch,
                s.world
            )
        };
        if mine.global_batch() != s.global_batch() {
            return Err(DataError::StateMismatch {
                field: "the global batch",
                expected: rows(&mine),
                found: rows(s),
            });
        }
        check(
            "block_size",
            mine.block_size.to_string(),
            s.block_size.to_string(),
        )?;
        check("mode", format!("{:?}", mine.mode), format!("{:?}", s.mode))?;
        if s.batch_in_epoch > self.batches_per_epoch() {
            return Err(DataError::StateMismatch {
                field: "batch_in_epoch",
                expected: format!("at most {}", self.batches_per_epoch()),
                found: s.batch_in_epoch.to_string(),
            });
        }
        self.set_epoch(s.epoch);
        self.batch_in_epoch = s.batch_in_epoch;
        Ok(())
    }

    fn set_epoch(&mut self, epoch: u64) {
        self.sampler = self.sampler.with_epoch(epoch);
        self.perm = self.sampler.permutation(self.n_samples);
        self.batch_in_epoch = 0;
    }

    /// The next batch, moving to the next epoch when this one is exhausted.
    pub fn next_batch(&mut self) -> Result<Batch> {
        if self.batch_in_epoch >= self.batches_per_epoch() {
            // A restored state may name any epoch: the last one has no next.
            let next = self.sampler.epoch.checked_add(1).ok_or_else(|| {
                DataError::Config(format!("the epoch count {} overflows", self.sampler.epoch))
            })?;
            self.set_epoch(next);
        }
        let l = self.cfg.block_size + 1;
        let b = self.per_rank;
        let mut tokens = vec![self.store.eos(); b * l];
        let mut loss_mask = vec![1u8; b * self.cfg.block_size];
        let mut samples = Vec::with_capacity(b);
        let packed_examples = self.cfg.mode == BatchMode::Pack && self.store.is_examples();
        let mut segments = packed_examples.then(|| vec![0u32; b * self.cfg.block_size]);
        for row in 0..b {
            let k = self.batch_in_epoch * b as u64 + row as u64;
            let sample = self.sampler.index(&self.perm, k);
            samples.push(sample);
            let out = &mut tokens[row * l..(row + 1) * l];
            let (start, end) = match self.cfg.mode {
                BatchMode::Pad => {
                    let (s, e) = self.store.doc_range(sample)?;
                    let n = self.store.tokens(s, e).copy_to(out);
                    // Padding is EOS already; targets past the first EOS do not count.
                    let mask = &mut loss_mask[row * self.cfg.block_size..][..self.cfg.block_size];
                    mask.iter_mut().skip(n).for_each(|m| *m = 0);
                    // Target j is stream token s + j + 1 (the EOS at e included).
                    if let Some(flags) = self.store.loss_flags(s, e + 1) {
                        for (m, &f) in mask.iter_mut().zip(flags.iter().skip(1)) {
                            *m &= u8::from(f != 0);
                        }
                    }
                    (s, e)
                }
                BatchMode::Pack => {
                    let s = sample * self.cfg.block_size as u64;
                    let n = self.store.tokens(s, s + l as u64).copy_to(out);
                    debug_assert_eq!(n, l);
                    let t = self.cfg.block_size;
                    if let Some(flags) = self.store.loss_flags(s, s + l as u64) {
                        let mask = &mut loss_mask[row * t..][..t];
                        for (m, &f) in mask.iter_mut().zip(flags.iter().skip(1)) {
                            *m = u8::from(f != 0);
                        }
                    }
                    if let Some(seg) = &mut segments {
                        let first = self.store.doc_of(s);
                        let (mut doc, mut next) = (first, self.store.doc_start(first + 1));
                        for (j, out) in seg[row * t..][..t].iter_mut().enumerate() {
                            while s + j as u64 >= next {
                                doc += 1;
                                next = self.store.doc_start(doc + 1);
                            }
                            *out = (doc - first) as u32;
                        }
                    }
                    (s, s + l as u64)
                }
            };
            if self.cfg.release_pages {
                self.store.release(start, end);
            }
        }
        self.batch_in_epoch += 1;
        Ok(Batch {
            tokens,
            loss_mask,
            batch_size: b,
            block_size: self.cfg.block_size,
            samples,
            epoch: self.sampler.epoch,
            segments,
        })
    }
}

impl Iterator for DataLoader {
    type Item = Result<Batch>;

    /// Never ends: epochs follow one another.
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_batch())
    }
}
