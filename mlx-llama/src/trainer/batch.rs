//! A step's inputs: its micro-batches' arrays, built once, and what the
//! step needs of them on the host.

use anyhow::Result;
use mlx_array::Array;
use mlx_data::Prefetcher;
use mlx_dist::Group;

use crate::config::{Batching, TrainConfig};
use crate::sync::SparseRows;

/// A micro-batch's inputs, targets and loss weights.
pub(super) struct Micro {
    /// Input tokens `[B, L]`.
    pub x: Array,
    /// Target tokens `[B, L]`.
    pub y: Array,
    /// Loss weights `[B, L]`: 1 where a target counts, 0 at padding and
    /// at masked prompt tokens.
    pub mask: Array,
    /// For packed examples, the example of each input token `[B, L]`
    /// (uint32): attention stays within an example.
    pub segments: Option<Array>,
    /// The input tokens (`x`), on the host: the rows of the embedding that
    /// get a gradient.
    pub tokens: Vec<u32>,
    /// The targets that count in the loss, counted on the host.
    pub targets: usize,
    /// The epoch and the store's samples of the rows, in order.
    pub drawn: Drawn,
}

/// Which samples a micro-batch holds: the epoch and each row's sample.
#[derive(Clone, serde::Serialize)]
pub(super) struct Drawn {
    /// The epoch the samples come from.
    pub epoch: u64,
    /// The store's index of each row's sample (documents or windows).
    pub samples: Vec<u64>,
}

/// The batch's arrays, built once, and what the step needs of it on the host.
pub(super) fn micro(b: &mlx_data::Batch) -> Result<Micro> {
    let a = b.to_arrays()?;
    Ok(Micro {
        x: a.inputs,
        y: a.targets,
        mask: a.loss_mask,
        segments: a.segments,
        tokens: (0..b.batch_size)
            .flat_map(|r| b.inputs(r).iter().copied())
            .collect(),
        targets: b.n_target_tokens(),
        drawn: Drawn {
            epoch: b.epoch,
            samples: b.samples.clone(),
        },
    })
}

/// One optimizer step's micro-batches on this rank.
pub(super) struct StepBatch {
    /// The micro-batches, accumulated into one gradient.
    pub micros: Vec<Micro>,
    /// What each token's loss is multiplied by: the world size over the
    /// world's count of targets, so that the averaged gradient is the
    /// gradient of the global mean loss.
    pub scale: f64,
    /// With sparse embedding gradients, the rows that travel.
    pub sparse: Option<SparseRows>,
}

impl StepBatch {
    /// The next step's `cfg.grad_accumulation` micro-batches. `tokens` is
    /// the world's targets per step when every one counts (packed rows);
    /// padded rows' targets are counted on the host and summed over the
    /// world with one small collective.
    pub(super) fn next(
        batches: &mut Prefetcher,
        cfg: &TrainConfig,
        group: &Group,
        tokens: f64,
        sparse_embedding: bool,
    ) -> Result<StepBatch> {
        let micros: Vec<Micro> = (0..cfg.grad_accumulation)
            .map(|_| micro(&batches.next_batch()?))
            .collect::<Result<_>>()?;
        let count = if cfg.batching == Batching::Pack && !cfg.mask_prompt {
            // Packed rows have no padding, and without prompt masking every
            // target of every rank counts,
            // so the world's count is known without asking the other ranks.
            tokens
        } else {
            // Counted on the host; one small message sums the world's
            // (exact: whole numbers far below f32's 2^24).
            let mut count = [micros.iter().map(|m| m.targets as f32).sum::<f32>()];
            group.all_sum(&mut count)?;
            count[0].max(1.0) as f64
        };
        let scale = group.size() as f64 / count;
        let sparse = sparse_embedding.then(|| {
            let tokens: Vec<u32> = micros
                .iter()
                .flat_map(|m| m.tokens.iter().copied())
                .collect();
            let capacity = tokens.len();
            SparseRows { tokens, capacity }
        });
        Ok(StepBatch {
            micros,
            scale,
            sparse,
        })
    }
}
