//! Pipeline-parallel generation: the blocks split over the ranks in order,
//! the activations passed from rank to rank with [`mlx_dist::send`] and
//! [`mlx_dist::recv`], as the seeds' model-parallel inference. Rank 0 holds
//! the embedding and the first blocks, the last rank the last blocks, the
//! final norm and the output projection; each rank holds only its blocks'
//! weights and key-value caches, so a model too large for one process
//! generates over several. The last rank draws each token and every rank
//! learns it (a one-number sum over the group), so every rank returns the
//! same tokens as one process would.
//!
//! ```
//! use mlx_llama::{Llama, LlamaConfig, pipeline::PipelineStage};
//! let config = LlamaConfig { num_layers: 2, vocab_size: 32, dims: 16, mlp_dims: 32, num_heads: 2, ..Default::default() };
//! let whole = Llama::new(&config, 0).unwrap().generate(&[1, 2, 3], 4, 0.0, 0).unwrap();
//! let split = mlx_dist::run_local(2, |g| {
//!     let stage = PipelineStage::new(Llama::new(&config, 0).unwrap(), &g).unwrap();
//!     stage.generate(&[1, 2, 3], 4, 0.0, 0).unwrap()
//! })
//! .unwrap();
//! assert_eq!(split, vec![whole.clone(), whole]);
//! ```

use std::ops::Range;

use mlx_array::{Array, Dtype, Result, random};
use mlx_dist::Group;
use mlx_nn::{AttentionMask, Embedding, Linear, ModuleExt, RMSNorm};

use crate::model::{KvCache, Llama, LlamaEncoderLayer, check_prompt, eval_caches, sample_last};

/// One rank's part of a Llama split into a pipeline over a group.
#[derive(Debug)]
pub struct PipelineStage {
    group: Group,
    /// The indices of this rank's blocks in the whole model.
    pub blocks: Range<usize>,
    layers: Vec<LlamaEncoderLayer>,
    /// The token embedding (rank 0 only).
    embedding: Option<Embedding>,
    /// The final norm and output projection (the last rank only).
    head: Option<(RMSNorm, Linear)>,
    dims: usize,
    dtype: Dtype,
}

impl PipelineStage {
    /// This rank's stage of `model` split over `group`: blocks
    /// `[r L / N, (r + 1) L / N)` of the `L`, and the embedding or the head
    /// where they belong; the rest of `model` is dropped. Every rank needs
    /// at least one block.
    pub fn new(model: Llama, group: &Group) -> Result<PipelineStage> {
        let (n, r) = (group.size(), group.rank());
        let total = model.layers.len();
        if total < n {
            return Err(mlx_array::Error::Invalid {
                op: "pipeline",
                message: format!(
                    "{total} blocks cannot be split over {n} ranks: each rank needs at least one"
                ),
            });
        }
        let blocks = r * total / n..(r + 1) * total / n;
        let dtype = model.embedding.weight.value().dtype();
        let dims = model.config.dims;
        let Llama {
            embedding,
            layers,
            norm,
            out_proj,
            ..
        } = model;
        let layers = layers
            .into_iter()
            .skip(blocks.start)
            .take(blocks.len())
            .collect();
        Ok(PipelineStage {
            group: group.clone(),
            blocks,
            layers,
            embedding: (r == 0).then_some(embedding),
            head: (r + 1 == n).then_some((norm, out_proj)),
            dims,
            dtype,
        })
    }

    /// Parameters this rank holds.
    pub fn num_parameters(&self) -> usize {
        self.layers.num_parameters()
            + self.embedding.as_ref().map_or(0, |e| e.num_parameters())
            + self
                .head
                .as_ref()
                .map_or(0, |(n, o)| n.num_parameters() + o.num_parameters())
    }

    /// Bytes of the parameters this rank holds.
    pub fn parameter_bytes(&self) -> usize {
        self.num_parameters() * self.dtype.size_of()
    }

    /// [`Llama::generate`] through the pipeline: every rank of the group
    /// calls it with the same arguments and gets the same tokens.
    pub fn generate(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<Vec<u32>> {
        check_prompt(prompt)?;
        let (n, r) = (self.group.size(), self.group.rank());
        let mut caches: Vec<Option<KvCache>> = vec![None; self.layers.len()];
        let mut key = random::key(seed);
        let mut input = prompt.to_vec();
        let mut out = Vec::with_capacity(max_tokens);
        for _ in 0..max_tokens {
            let len = input.len();
            let mut x = match &self.embedding {
                Some(e) => e.forward(&Array::from_slice(&input, &[1, len])?)?,
                None => mlx_dist::recv(&[1, len, self.dims], self.dtype, r - 1, &self.group)?,
            };
            // New positions see every cached one and the earlier new ones.
            let mask = if len > 1 {
                AttentionMask::Causal
            } else {
                AttentionMask::None
            };
            for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
                x = layer.forward(&x, mask, Some(cache))?;
            }
            let mut id = [0u32];
            match &self.head {
                Some((norm, out_proj)) => {
                    let logits = out_proj.forward(&norm.forward(&x)?)?;
                    id[0] = sample_last(&logits, temperature, &mut key)?;
                    eval_caches(&caches)?;
                }
                None => {
                    let sent = mlx_dist::send(&x, r + 1, &self.group)?;
                    eval_caches(&caches)?;
                    sent.eval()?;
                }
            }
            // The last rank's token, to every rank (the others add zero).
            if n > 1 {
                self.group
                    .all_sum(&mut id)
                    .map_err(|e| mlx_array::Error::eval("pipeline", e.to_string()))?;
            }
            out.push(id[0]);
            input = vec![id[0]];
        }
        Ok(out)
    }
}
