//! The Llama model, structured and named like MLX's Llama example so that
//! safetensors weights are interchangeable.

use mlx_array::{Array, Result, concatenate, random};
use mlx_nn::{
    AttentionMask, Embedding, Linear, RMSNorm, RoPE, impl_module, merge_heads,
    scaled_dot_product_attention, split_heads,
};
use serde::{Deserialize, Serialize};

/// Model hyper-parameters; the defaults are the reference experiment's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LlamaConfig {
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Vocabulary size (rows of the embedding and the output projection).
    pub vocab_size: usize,
    /// Model width.
    pub dims: usize,
    /// Hidden width of the SwiGLU MLP.
    pub mlp_dims: usize,
    /// Attention heads (`dims` must divide by it).
    pub num_heads: usize,
    /// RMSNorm epsilon.
    pub norm_eps: f64,
    /// RoPE base.
    pub rope_base: f64,
}

impl Default for LlamaConfig {
    fn default() -> Self {
        LlamaConfig {
            num_layers: 4,
            vocab_size: 50257,
            dims: 256,
            mlp_dims: 512,
            num_heads: 4,
            norm_eps: 1e-5,
            rope_base: 10_000.0,
        }
    }
}

/// Cached keys and values of one attention layer: `[B, H, S, d]` each.
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Keys seen so far.
    pub keys: Array,
    /// Values seen so far.
    pub values: Array,
}

/// Causal self-attention with RoPE (traditional pairs, as the reference).
#[derive(Clone, Debug)]
pub struct LlamaAttention {
    /// Number of heads.
    pub num_heads: usize,
    /// Rotary encoding of queries and keys.
    pub rope: RoPE,
    /// Query projection.
    pub query_proj: Linear,
    /// Key projection.
    pub key_proj: Linear,
    /// Value projection.
    pub value_proj: Linear,
    /// Output projection.
    pub out_proj: Linear,
}

impl_module!(LlamaAttention {
    query_proj,
    key_proj,
    value_proj,
    out_proj
});

impl LlamaAttention {
    fn new(c: &LlamaConfig, key: &Array) -> Result<Self> {
        let ks = random::split_keys(key, 4)?;
        let mut rope = RoPE::new(c.dims / c.num_heads, true);
        rope.base = c.rope_base;
        Ok(LlamaAttention {
            num_heads: c.num_heads,
            rope,
            query_proj: Linear::new(c.dims, c.dims, false, &ks[0])?,
            key_proj: Linear::new(c.dims, c.dims, false, &ks[1])?,
            value_proj: Linear::new(c.dims, c.dims, false, &ks[2])?,
            out_proj: Linear::new(c.dims, c.dims, false, &ks[3])?,
        })
    }

    /// Attends `x [B, L, D]`; with a cache, the new keys and values are
    /// appended at positions after the cached ones and the cache is updated.
    pub fn forward(
        &self,
        x: &Array,
        mask: AttentionMask<'_>,
        cache: Option<&mut Option<KvCache>>,
    ) -> Result<Array> {
        let h = self.num_heads;
        let offset = cache
            .as_ref()
            .and_then(|c| c.as_ref())
            .map_or(0, |c| c.keys.shape()[2]);
        let q = self
            .rope
            .forward(&split_heads(&self.query_proj.forward(x)?, h)?, offset)?;
        let mut k = self
            .rope
            .forward(&split_heads(&self.key_proj.forward(x)?, h)?, offset)?;
        let mut v = split_heads(&self.value_proj.forward(x)?, h)?;
        if let Some(slot) = cache {
            if let Some(c) = slot.as_ref() {
                k = concatenate(&[c.keys.clone(), k], 2)?;
                v = concatenate(&[c.values.clone(), v], 2)?;
            }
            *slot = Some(KvCache {
                keys: k.clone(),
                values: v.clone(),
            });
        }
        let scale = 1.0 / (*q.shape().last().expect("4-d") as f64).sqrt();
        let o = scaled_dot_product_attention(&q, &k, &v, scale, mask)?;
        self.out_proj.forward(&merge_heads(&o)?)
    }
}

/// One block: RMSNorm, attention, residual; RMSNorm, SwiGLU MLP, residual.
#[derive(Clone, Debug)]
pub struct LlamaEncoderLayer {
    /// Self-attention.
    pub attention: LlamaAttention,
    /// Norm before attention.
    pub norm1: RMSNorm,
    /// Norm before the MLP.
    pub norm2: RMSNorm,
    /// MLP gate projection.
    pub linear1: Linear,
    /// MLP up projection.
    pub linear2: Linear,
    /// MLP down projection.
    pub linear3: Linear,
}

impl_module!(LlamaEncoderLayer {
    attention,
    norm1,
    norm2,
    linear1,
    linear2,
    linear3
});

impl LlamaEncoderLayer {
    fn new(c: &LlamaConfig, key: &Array) -> Result<Self> {
        let ks = random::split_keys(key, 4)?;
        Ok(LlamaEncoderLayer {
            attention: LlamaAttention::new(c, &ks[0])?,
            norm1: RMSNorm::with_eps(c.dims, c.norm_eps),
            norm2: RMSNorm::with_eps(c.dims, c.norm_eps),
            linear1: Linear::new(c.dims, c.mlp_dims, false, &ks[1])?,
            linear2: Linear::new(c.dims, c.mlp_dims, false, &ks[2])?,
            linear3: Linear::new(c.mlp_dims, c.dims, false, &ks[3])?,
        })
    }

    /// Applies the block.
    pub fn forward(
        &self,
        x: &Array,
        mask: AttentionMask<'_>,
        cache: Option<&mut Option<KvCache>>,
    ) -> Result<Array> {
        let y = self
            .attention
            .forward(&self.norm1.forward(x)?, mask, cache)?;
        let x = x.add(&y)?;
        let h = self.norm2.forward(&x)?;
        let y = self.linear3.forward(&mlx_array::swiglu(
            &self.linear1.forward(&h)?,
            &self.linear2.forward(&h)?,
        )?)?;
        x.add(&y)
    }
}

/// The Llama language model.
#[derive(Clone, Debug)]
pub struct Llama {
    /// Token embedding.
    pub embedding: Embedding,
    /// The blocks.
    pub layers: Vec<LlamaEncoderLayer>,
    /// Final norm.
    pub norm: RMSNorm,
    /// Output projection to the vocabulary.
    pub out_proj: Linear,
    /// The configuration it was built from.
    pub config: LlamaConfig,
}

impl_module!(Llama {
    embedding,
    layers,
    norm,
    out_proj
});

impl Llama {
    /// A freshly initialised model (MLX's layer initialisations) from `seed`:
    /// every rank that uses the same seed gets the same weights.
    pub fn new(config: &LlamaConfig, seed: u64) -> Result<Llama> {
        if config.num_heads == 0
            || !config.dims.is_multiple_of(config.num_heads)
            || !(config.dims / config.num_heads).is_multiple_of(2)
        {
            return Err(mlx_array::Error::Invalid {
                op: "Llama",
                message: format!(
                    "dims {} must split into {} heads of even size",
                    config.dims, config.num_heads
                ),
            });
        }
        let ks = random::split_keys(&random::key(seed), config.num_layers + 2)?;
        let layers = (0..config.num_layers)
            .map(|i| LlamaEncoderLayer::new(config, &ks[i + 2]))
            .collect::<Result<Vec<_>>>()?;
        Ok(Llama {
            embedding: Embedding::new(config.vocab_size, config.dims, &ks[0])?,
            layers,
            norm: RMSNorm::with_eps(config.dims, config.norm_eps),
            out_proj: Linear::new(config.dims, config.vocab_size, false, &ks[1])?,
            config: config.clone(),
        })
    }

    /// Logits `[B, L, vocab]` for token ids `[B, L]` (causal).
    pub fn forward(&self, tokens: &Array) -> Result<Array> {
        self.out_proj.forward(&self.hidden(tokens)?)
    }

    /// The final normed hidden states `[B, L, dims]` for token ids `[B, L]`
    /// (causal): everything but the output projection.
    pub fn hidden(&self, tokens: &Array) -> Result<Array> {
        let mut x = self.embedding.forward(tokens)?;
        for layer in &self.layers {
            x = layer.forward(&x, AttentionMask::Causal, None)?;
        }
        self.norm.forward(&x)
    }

    /// `sum(row_weights * per-token cross-entropy)` of the next-token
    /// predictions for `tokens` against `targets` (both `[B, L]`).
    /// `row_weights` are floats shaped like `targets` (a loss mask, times a
    /// normalisation if wanted) and get no gradient. The output projection
    /// is fused with the loss, so the `[B, L, vocab]` logits are never held
    /// in memory; under `value_and_grad` the gradient is computed in the
    /// same pass, and otherwise (evaluation) the loss alone (see
    /// [`mlx_array::linear_cross_entropy_sum`]).
    pub fn loss(&self, tokens: &Array, targets: &Array, row_weights: &Array) -> Result<Array> {
        mlx_array::linear_cross_entropy_sum(
            &self.hidden(tokens)?,
            self.out_proj.weight.value(),
            targets,
            row_weights,
            &Default::default(),
        )
    }

    /// Logits for new tokens given the caches of earlier ones (one per layer;
    /// start with `vec![None; num_layers]`).
    pub fn forward_cached(&self, tokens: &Array, caches: &mut [Option<KvCache>]) -> Result<Array> {
        let l = tokens.shape()[1];
        // New positions see every cached position and earlier new ones: the
        // causal mask with the queries as the last positions.
        let mask = if l > 1 {
            AttentionMask::Causal
        } else {
            AttentionMask::None
        };
        let mut x = self.embedding.forward(tokens)?;
        for (layer, cache) in self.layers.iter().zip(caches.iter_mut()) {
            x = layer.forward(&x, mask, Some(cache))?;
        }
        self.out_proj.forward(&self.norm.forward(&x)?)
    }

    /// Samples `max_tokens` continuations of `prompt` (token ids) with
    /// temperature (0 picks the most likely token) from `seed`.
    pub fn generate(
        &self,
        prompt: &[u32],
        max_tokens: usize,
        temperature: f64,
        seed: u64,
    ) -> Result<Vec<u32>> {
        if prompt.is_empty() {
            return Err(mlx_array::Error::Invalid {
                op: "generate",
                message: "the prompt must hold at least one token".into(),
            });
        }
        let mut caches: Vec<Option<KvCache>> = vec![None; self.layers.len()];
        let mut key = random::key(seed);
        let mut input = Array::from_slice(prompt, &[1, prompt.len()])?;
        let mut out = Vec::with_capacity(max_tokens);
        for _ in 0..max_tokens {
            let logits = self.forward_cached(&input, &mut caches)?;
            let last = logits
                .slice_axis(1, -1, logits.shape()[1] as i64)?
                .reshape(&[-1])?;
            let next = if temperature <= 0.0 {
                last.argmax(-1, false)?
            } else {
                let [k1, k2] = random::split2(&key)?;
                key = k2;
                random::categorical(&k1, &last.mul_scalar(1.0 / temperature)?, -1)?
            };
            let id = next.item::<u32>()?;
            out.push(id);
            input = Array::from_slice(&[id], &[1, 1])?;
            // Keep the caches small in the graph: evaluate them now.
            let arrays: Vec<Array> = caches
                .iter()
                .flatten()
                .flat_map(|c| [c.keys.clone(), c.values.clone()])
                .collect();
            mlx_array::eval(&arrays)?;
        }
        Ok(out)
    }
}
