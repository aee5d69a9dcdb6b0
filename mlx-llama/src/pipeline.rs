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

use std::collections::BTreeSet;
use std::ops::Range;
use std::path::Path;

use anyhow::Context;
use mlx_array::{Array, Result, random};
use mlx_dist::Group;
use mlx_nn::{Embedding, Linear, Module, ModuleExt, Param, RMSNorm};

use crate::model::{
    KvCache, Llama, LlamaEncoderLayer, RESIDUAL_DTYPE, blocks_cached, check_prompt, embed,
    eval_caches, head_input, project, sample_last,
};
use crate::sampling::Sampling;

/// One rank's part of a Llama split into a pipeline over a group.
#[derive(Debug)]
pub struct PipelineStage {
    group: Group,
    /// The indices of this rank's blocks in the whole model.
    pub blocks: Range<usize>,
    layers: Vec<LlamaEncoderLayer>,
    /// The token embedding (rank 0 only; also the last rank's when it is
    /// the output projection, tied).
    embedding: Option<Embedding>,
    /// The final norm and output projection (the last rank only; no
    /// projection of its own when tied to the embedding).
    head: Option<(RMSNorm, Option<Linear>)>,
    dims: usize,
}

/// The stage's parameters under their names in the whole model
/// (`layers.5.norm1.weight` for the second block of a stage starting at 4).
impl Module for PipelineStage {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        let join = mlx_nn::module::join;
        self.embedding.visit(&join(prefix, "embedding"), f);
        for (j, l) in self.layers.iter().enumerate() {
            l.visit(
                &join(prefix, &format!("layers.{}", self.blocks.start + j)),
                f,
            );
        }
        if let Some((norm, out_proj)) = &self.head {
            norm.visit(&join(prefix, "norm"), f);
            out_proj.visit(&join(prefix, "out_proj"), f);
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        let join = mlx_nn::module::join;
        self.embedding.visit_mut(&join(prefix, "embedding"), f);
        for (j, l) in self.layers.iter_mut().enumerate() {
            l.visit_mut(
                &join(prefix, &format!("layers.{}", self.blocks.start + j)),
                f,
            );
        }
        if let Some((norm, out_proj)) = &mut self.head {
            norm.visit_mut(&join(prefix, "norm"), f);
            out_proj.visit_mut(&join(prefix, "out_proj"), f);
        }
    }
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
            embedding: (r == 0 || (r + 1 == n && out_proj.is_none())).then_some(embedding),
            head: (r + 1 == n).then_some((norm, out_proj)),
            dims,
        })
    }

    /// This rank's stage of the model of a checkpoint folder, or of the
    /// newest intact checkpoint of a run folder, and the run's
    /// configuration: only this stage's tensors are read from the file, so
    /// no rank holds the whole model. Every rank of `group` calls it.
    pub fn load(
        checkpoint_or_run: &Path,
        group: &Group,
    ) -> anyhow::Result<(PipelineStage, crate::TrainConfig)> {
        let (dir, config, model_config) = crate::checkpoint::locate(checkpoint_or_run)?;
        // Built lazily: the initial weights of the blocks dropped here are
        // never computed, and the loaded ones replace the rest.
        let mut stage = PipelineStage::new(Llama::new(&model_config, 0)?, group)?;
        let mine: BTreeSet<String> = stage
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        let weights = dir.join("model.safetensors");
        mlx_nn::load_sharded_weights_except(&mut stage, &weights, group, |name| {
            !mine.contains(name)
        })
        .with_context(|| format!("loading {}", weights.display()))?;
        Ok((stage, config))
    }

    /// Bytes of the parameters this rank holds.
    pub fn parameter_bytes(&self) -> usize {
        self.named_parameters()
            .iter()
            .map(|(_, a)| a.nbytes())
            .sum()
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
        let sampling = Sampling::temperature(temperature);
        self.generate_with(prompt, max_tokens, &sampling, seed, &[], &mut |_| Ok(()))
    }

    /// [`Llama::generate_with`] through the pipeline: every rank of the
    /// group calls it with the same arguments, gets the same tokens and
    /// stops at the same one.
    pub fn generate_with(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        sampling: &Sampling,
        seed: u64,
        stop: &[u32],
        on_token: &mut dyn FnMut(u32) -> Result<()>,
    ) -> Result<Vec<u32>> {
        check_prompt(prompt)?;
        let (n, r) = (self.group.size(), self.group.rank());
        let mut caches: Vec<Option<KvCache>> = vec![None; self.layers.len()];
        let mut key = random::key(seed);
        let mut input = prompt.to_vec();
        let mut history = prompt.to_vec();
        for _ in 0..max_tokens {
            let len = input.len();
            let x = match (&self.embedding, r) {
                (Some(e), 0) => embed(e, &Array::from_slice(&input, &[1, len])?)?,
                _ => mlx_dist::recv(&[1, len, self.dims], RESIDUAL_DTYPE, r - 1, &self.group)?,
            };
            let x = blocks_cached(&self.layers, &x, &mut caches)?;
            let mut id = [0u32];
            match &self.head {
                Some((norm, out_proj)) => {
                    let w = match (out_proj, &self.embedding) {
                        (Some(l), _) => l.weight.value(),
                        (None, Some(e)) => e.weight.value(),
                        (None, None) => unreachable!("a tied head keeps the embedding"),
                    };
                    let logits = project(&head_input(norm, w, &x)?, w)?;
                    id[0] = sample_last(&logits, sampling, &history, &mut key)?;
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
            if stop.contains(&id[0]) {
                break;
            }
            history.push(id[0]);
            on_token(id[0])?;
            input = vec![id[0]];
        }
        Ok(history.split_off(prompt.len()))
    }
}
