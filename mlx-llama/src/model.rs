//! The Llama model, structured and named like MLX's Llama example so that
//! safetensors weights are interchangeable.

use mlx_array::{Array, Dtype, Result, concatenate, random};
use mlx_dist::Group;
use mlx_nn::{
    AnyLinear, AttentionMask, Embedding, Linear, RMSNorm, RoPE, RopeScaling, Sharding, impl_module,
    merge_heads, scaled_dot_product_attention, shard_linear, split_heads,
};
use serde::{Deserialize, Serialize};

use crate::sampling::Sampling;

/// The dtype of the residual stream between the blocks: float32 whatever
/// dtype the weights are in. With bfloat16 or float16 weights (a model run
/// in a compute dtype, [`mlx_nn::value_and_grad_in`]) the projections,
/// attention and MLP compute in that dtype, and their outputs are added to
/// the stream in float32, as under PyTorch's autocast (where the float32
/// embedding carries the stream) or flash-attention's `residual_in_fp32`:
/// in bfloat16 each add would round the stream to 8 bits of mantissa,
/// losing whatever a block adds below 1/256 of the stream's size, a loss
/// that grows with depth. The float32 adds cost no measurable time on the
/// reference model (BENCHMARKS.md). The norms compute in float32 either
/// way.
pub const RESIDUAL_DTYPE: Dtype = Dtype::F32;

/// Model hyper-parameters; the defaults are the reference experiment's.
/// As `mlx-llama train`'s model options (`--layers`, `--dims`, ...), the
/// vocabulary defaults to 0: the tokenizer's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct LlamaConfig {
    /// Model: number of transformer blocks.
    #[arg(long = "layers", value_name = "LAYERS", default_value_t = LlamaConfig::default().num_layers)]
    pub num_layers: usize,
    /// Model: vocabulary size (rows of the embedding and the output
    /// projection); in training, 0 takes the tokenizer's (50,257 for GPT-2)
    /// and a smaller one grows to fit it.
    #[arg(long = "vocab", value_name = "VOCAB", default_value_t = 0)]
    pub vocab_size: usize,
    /// Model: width.
    #[arg(long, default_value_t = LlamaConfig::default().dims)]
    pub dims: usize,
    /// Model: hidden width of the SwiGLU MLP.
    #[arg(long, default_value_t = LlamaConfig::default().mlp_dims)]
    pub mlp_dims: usize,
    /// Model: attention heads (`dims` must divide by it unless --head-dim
    /// is given).
    #[arg(long = "heads", value_name = "HEADS", default_value_t = LlamaConfig::default().num_heads)]
    pub num_heads: usize,
    /// Model: key and value heads (grouped-query attention: each serves
    /// heads / kv-heads query heads; 1 is multi-query attention); 0: as
    /// many as --heads.
    #[serde(default)]
    #[arg(long = "kv-heads", value_name = "KV_HEADS", default_value_t = 0)]
    pub num_kv_heads: usize,
    /// Model: width of each attention head; 0: dims / heads.
    #[serde(default)]
    #[arg(long = "head-dim", value_name = "HEAD_DIM", default_value_t = 0)]
    pub head_dim: usize,
    /// Model: the output projection is the token embedding (one tensor,
    /// trained by both uses), as `tie_word_embeddings` in transformers.
    #[serde(default)]
    #[arg(long = "tie-embeddings")]
    pub tie_embeddings: bool,
    /// RMSNorm epsilon.
    #[arg(skip = LlamaConfig::default().norm_eps)]
    pub norm_eps: f64,
    /// RoPE base.
    #[arg(skip = LlamaConfig::default().rope_base)]
    pub rope_base: f64,
    /// RoPE's frequency scaling (transformers' `rope_type`: default,
    /// linear, dynamic or llama3).
    #[serde(default)]
    #[arg(skip)]
    pub rope_scaling: RopeScaling,
    /// The longest sequence the model was made for (transformers'
    /// `max_position_embeddings`, kept from an imported model and written
    /// back by `export`); 0: unknown, the training block size is taken.
    #[serde(default)]
    #[arg(skip)]
    pub max_position_embeddings: usize,
}

impl LlamaConfig {
    /// The key and value heads: `num_kv_heads`, or as many as the query
    /// heads when it is 0.
    pub fn kv_heads(&self) -> usize {
        if self.num_kv_heads == 0 {
            self.num_heads
        } else {
            self.num_kv_heads
        }
    }

    /// The width of each head: `head_dim`, or `dims / num_heads` when it
    /// is 0.
    pub fn head_dim(&self) -> usize {
        if self.head_dim == 0 {
            self.dims / self.num_heads.max(1)
        } else {
            self.head_dim
        }
    }

    /// Checks that the heads fit together: at least one, key and value
    /// heads dividing the query heads, an even head width (RoPE turns
    /// pairs), and without an explicit head width, `dims` splitting into
    /// the heads.
    pub fn check(&self) -> std::result::Result<(), String> {
        let (h, kv) = (self.num_heads, self.kv_heads());
        if h == 0 || kv == 0 || !h.is_multiple_of(kv) {
            return Err(format!(
                "{h} query heads cannot be grouped over {kv} key/value heads: both must be at least 1 and the key/value heads must divide the query heads"
            ));
        }
        if self.head_dim == 0 && !self.dims.is_multiple_of(h) {
            return Err(format!(
                "dims {} must split into {h} heads (or give the head width)",
                self.dims
            ));
        }
        let d = self.head_dim();
        if d == 0 || !d.is_multiple_of(2) {
            return Err(format!(
                "heads of width {d} cannot be rotated: the head width must be even and positive"
            ));
        }
        if self.dims == 0 || self.mlp_dims == 0 || self.vocab_size == 0 {
            return Err(format!(
                "dims {}, MLP dims {} and vocabulary {} must all be at least 1",
                self.dims, self.mlp_dims, self.vocab_size
            ));
        }
        Ok(())
    }
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
            num_kv_heads: 0,
            head_dim: 0,
            tie_embeddings: false,
            rope_scaling: RopeScaling::Default,
            max_position_embeddings: 0,
        }
    }
}

/// Cached keys and values of one attention layer: `[B, H_kv, S, d]` each
/// (the key/value heads only: grouped-query attention's cache is
/// `H / H_kv` times smaller).
#[derive(Clone, Debug)]
pub struct KvCache {
    /// Keys seen so far.
    pub keys: Array,
    /// Values seen so far.
    pub values: Array,
}

/// Causal self-attention with RoPE (traditional pairs, as the reference),
/// grouped-query when it has fewer key/value heads than query heads: query
/// head `h` attends with key/value head `h / (H / H_kv)`, read in place by
/// the fused attention (no repeated copy of the keys and values).
/// Tensor-parallel ([`Llama::shard`]), each rank holds a slice of the heads
/// (the key/value heads with their query groups): the query, key and value
/// projections are all-to-sharded and the output projection sharded-to-all.
#[derive(Clone, Debug)]
pub struct LlamaAttention {
    /// Number of query heads (this rank's, when sharded).
    pub num_heads: usize,
    /// Number of key/value heads (this rank's, when sharded).
    pub num_kv_heads: usize,
    /// Rotary encoding of queries and keys.
    pub rope: RoPE,
    /// Query projection.
    pub query_proj: AnyLinear,
    /// Key projection.
    pub key_proj: AnyLinear,
    /// Value projection.
    pub value_proj: AnyLinear,
    /// Output projection.
    pub out_proj: AnyLinear,
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
        let d = c.head_dim();
        let mut rope = RoPE::new(d, true);
        rope.base = c.rope_base;
        rope.scaling = c.rope_scaling.clone();
        let (q, kv) = (c.num_heads * d, c.kv_heads() * d);
        Ok(LlamaAttention {
            num_heads: c.num_heads,
            num_kv_heads: c.kv_heads(),
            rope,
            query_proj: Linear::new(c.dims, q, false, &ks[0])?.into(),
            key_proj: Linear::new(c.dims, kv, false, &ks[1])?.into(),
            value_proj: Linear::new(c.dims, kv, false, &ks[2])?.into(),
            out_proj: Linear::new(q, c.dims, false, &ks[3])?.into(),
        })
    }

    /// Keeps this rank's slice of the heads (see [`Llama::shard`]).
    fn shard(&mut self, group: &Group) -> Result<()> {
        for p in [
            &mut self.query_proj,
            &mut self.key_proj,
            &mut self.value_proj,
        ] {
            *p = shard_whole(p, Sharding::AllToSharded, group)?;
        }
        self.out_proj = shard_whole(&self.out_proj, Sharding::ShardedToAll, group)?;
        self.num_heads /= group.size();
        self.num_kv_heads /= group.size();
        Ok(())
    }

    /// Attends `x [B, L, D]`; with a cache, the new keys and values are
    /// appended at positions after the cached ones and the cache is updated.
    pub fn forward(
        &self,
        x: &Array,
        mask: AttentionMask<'_>,
        cache: Option<&mut Option<KvCache>>,
    ) -> Result<Array> {
        let (h, kv) = (self.num_heads, self.num_kv_heads);
        let offset = cache
            .as_ref()
            .and_then(|c| c.as_ref())
            .map_or(0, |c| c.keys.shape()[2]);
        // Sharded, the three projections' gradients are summed over the
        // group once, on their common input.
        let x = self.query_proj.sum_input_gradients(x)?;
        let q = self.rope.forward(
            &split_heads(&self.query_proj.forward_summed(&x)?, h)?,
            offset,
        )?;
        let mut k = self.rope.forward(
            &split_heads(&self.key_proj.forward_summed(&x)?, kv)?,
            offset,
        )?;
        let mut v = split_heads(&self.value_proj.forward_summed(&x)?, kv)?;
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
/// Tensor-parallel, each rank holds a slice of the MLP's hidden features
/// (gate and up projections all-to-sharded, down sharded-to-all).
#[derive(Clone, Debug)]
pub struct LlamaEncoderLayer {
    /// Self-attention.
    pub attention: LlamaAttention,
    /// Norm before attention.
    pub norm1: RMSNorm,
    /// Norm before the MLP.
    pub norm2: RMSNorm,
    /// MLP gate projection.
    pub linear1: AnyLinear,
    /// MLP up projection.
    pub linear2: AnyLinear,
    /// MLP down projection.
    pub linear3: AnyLinear,
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
            linear1: Linear::new(c.dims, c.mlp_dims, false, &ks[1])?.into(),
            linear2: Linear::new(c.dims, c.mlp_dims, false, &ks[2])?.into(),
            linear3: Linear::new(c.mlp_dims, c.dims, false, &ks[3])?.into(),
        })
    }

    /// Keeps this rank's slice of the heads and of the MLP's hidden features.
    fn shard(&mut self, group: &Group) -> Result<()> {
        self.attention.shard(group)?;
        self.linear1 = shard_whole(&self.linear1, Sharding::AllToSharded, group)?;
        self.linear2 = shard_whole(&self.linear2, Sharding::AllToSharded, group)?;
        self.linear3 = shard_whole(&self.linear3, Sharding::ShardedToAll, group)?;
        Ok(())
    }

    /// The whole block, put together from every rank's shards.
    fn unshard(&self, heads: usize, kv_heads: usize) -> Result<Self> {
        let mut whole = self.clone();
        let a = &mut whole.attention;
        for p in [
            &mut a.query_proj,
            &mut a.key_proj,
            &mut a.value_proj,
            &mut a.out_proj,
            &mut whole.linear1,
            &mut whole.linear2,
            &mut whole.linear3,
        ] {
            *p = p.unshard()?.into();
        }
        whole.attention.num_heads = heads;
        whole.attention.num_kv_heads = kv_heads;
        Ok(whole)
    }

    /// Applies the block to the residual stream `x` ([`RESIDUAL_DTYPE`]):
    /// each norm's output goes into the projections in their weights'
    /// dtype, and their results are added to the stream in its own.
    pub fn forward(
        &self,
        x: &Array,
        mask: AttentionMask<'_>,
        cache: Option<&mut Option<KvCache>>,
    ) -> Result<Array> {
        let compute = self.linear1.weight().value().dtype();
        let y = self
            .attention
            .forward(&self.norm1.forward_as(x, compute)?, mask, cache)?;
        let x = x.add(&y)?;
        let h = self
            .linear1
            .sum_input_gradients(&self.norm2.forward_as(&x, compute)?)?;
        let y = self.linear3.forward(&mlx_array::swiglu(
            &self.linear1.forward_summed(&h)?,
            &self.linear2.forward_summed(&h)?,
        )?)?;
        x.add(&y)
    }
}

/// `p`, a whole layer, cut for `group`; a group of one keeps it whole.
fn shard_whole(p: &AnyLinear, sharding: Sharding, group: &Group) -> Result<AnyLinear> {
    match (p.as_linear(), group.size()) {
        (_, 1) => Ok(p.clone()),
        (Some(l), _) => shard_linear(l, sharding, 1, group),
        (None, _) => Err(mlx_array::Error::Invalid {
            op: "shard",
            message: "a projection is sharded already".into(),
        }),
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
    /// Output projection to the vocabulary; `None` when it is tied to the
    /// embedding ([`LlamaConfig::tie_embeddings`]: one tensor, whose
    /// gradient sums both uses).
    pub out_proj: Option<Linear>,
    /// The configuration it was built from.
    pub config: LlamaConfig,
    /// Which blocks recompute their activations in the backward pass
    /// instead of keeping them (none unless set; it changes no value).
    pub grad_checkpoint: crate::grad_checkpoint::GradCheckpoint,
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
        config
            .check()
            .map_err(|message| mlx_array::Error::Invalid {
                op: "Llama",
                message,
            })?;
        let ks = random::split_keys(&random::key(seed), config.num_layers + 2)?;
        let layers = (0..config.num_layers)
            .map(|i| LlamaEncoderLayer::new(config, &ks[i + 2]))
            .collect::<Result<Vec<_>>>()?;
        let out_proj = match config.tie_embeddings {
            true => None,
            false => Some(Linear::new(config.dims, config.vocab_size, false, &ks[1])?),
        };
        Ok(Llama {
            embedding: Embedding::new(config.vocab_size, config.dims, &ks[0])?,
            layers,
            norm: RMSNorm::with_eps(config.dims, config.norm_eps),
            out_proj,
            config: config.clone(),
            grad_checkpoint: Default::default(),
        })
    }

    /// The output projection's weight `[vocab, dims]`: its own, or the
    /// embedding's when they are tied.
    pub fn head_weight(&self) -> &Array {
        head_weight(&self.embedding, self.out_proj.as_ref())
    }

    /// Tensor parallelism: keeps this rank's slice of every block's
    /// attention heads and MLP hidden features, the projections replaced by
    /// their sharded forms (Megatron-LM's layout, as mlx-lm's `shard`):
    /// each block then communicates twice forward (the sums of the
    /// attention's and the MLP's output projections) and twice backward.
    /// The embedding, the norms and the output projection stay whole on
    /// every rank, so every rank computes the same logits and loss. The
    /// heads and the MLP width must divide by the group's size (a model that
    /// does not split is left as it is). Each whole projection is freed as
    /// soon as it is cut: a lazily built model ([`Llama::new`]) is computed
    /// one projection at a time.
    pub fn shard(&mut self, group: &Group) -> Result<()> {
        let n = group.size();
        let c = &self.config;
        if !c.num_heads.is_multiple_of(n)
            || !c.kv_heads().is_multiple_of(n)
            || !c.mlp_dims.is_multiple_of(n)
        {
            return Err(mlx_array::Error::Invalid {
                op: "shard",
                message: format!(
                    "{} heads, {} key/value heads and an MLP of {} do not split over {n} ranks: all must divide by {n}",
                    c.num_heads,
                    c.kv_heads(),
                    c.mlp_dims
                ),
            });
        }
        if self.is_sharded() {
            return Err(mlx_array::Error::Invalid {
                op: "shard",
                message: "the model is sharded already".into(),
            });
        }
        // In place, each whole projection dropped as soon as it is cut (a
        // copy of the blocks would keep every whole weight alive until the
        // end).
        for l in &mut self.layers {
            l.shard(group)?;
        }
        Ok(())
    }

    /// Whether [`Llama::shard`] has cut the model over a group of more than
    /// one rank.
    pub fn is_sharded(&self) -> bool {
        self.layers
            .first()
            .is_some_and(|l| l.attention.query_proj.sharding().is_some())
    }

    /// The whole model, put together from every rank's shards (every rank
    /// of the group must call it; lazy): what a checkpoint holds, the model
    /// of one process.
    pub fn unshard(&self) -> Result<Llama> {
        let mut whole = self.clone();
        whole.layers = self
            .layers
            .iter()
            .map(|l| l.unshard(self.config.num_heads, self.config.kv_heads()))
            .collect::<Result<_>>()?;
        Ok(whole)
    }

    /// Logits `[B, L, vocab]` for token ids `[B, L]` (causal).
    pub fn forward(&self, tokens: &Array) -> Result<Array> {
        project(&self.hidden(tokens)?, self.head_weight())
    }

    /// The final normed hidden states `[B, L, dims]` for token ids `[B, L]`
    /// (causal), in the output projection's dtype: everything but the
    /// output projection.
    pub fn hidden(&self, tokens: &Array) -> Result<Array> {
        self.hidden_masked(tokens, AttentionMask::Causal)
    }

    /// [`Llama::hidden`] with the attention's mask given: causal, or an
    /// additive mask such as [`segment_mask`]'s.
    pub fn hidden_masked(&self, tokens: &Array, mask: AttentionMask<'_>) -> Result<Array> {
        let mut x = embed(&self.embedding, tokens)?;
        for (i, layer) in self.layers.iter().enumerate() {
            x = if self.grad_checkpoint.applies(i) {
                crate::grad_checkpoint::checkpointed_forward(layer, &x, mask)?
            } else {
                layer.forward(&x, mask, None)?
            };
        }
        head_input(&self.norm, self.head_weight(), &x)
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
            self.head_weight(),
            targets,
            row_weights,
            &Default::default(),
        )
    }

    /// [`Llama::loss`] of rows that pack several examples: with `segments`
    /// (`[B, L]` integers, the example each input token belongs to) a token
    /// attends only to earlier tokens of its own example ([`segment_mask`]);
    /// without, causally over the whole row.
    pub fn loss_in(
        &self,
        tokens: &Array,
        targets: &Array,
        row_weights: &Array,
        segments: Option<&Array>,
    ) -> Result<Array> {
        let Some(segments) = segments else {
            return self.loss(tokens, targets, row_weights);
        };
        let mask = segment_mask(segments, self.head_weight().dtype())?;
        mlx_array::linear_cross_entropy_sum(
            &self.hidden_masked(tokens, AttentionMask::Additive(&mask))?,
            self.head_weight(),
            targets,
            row_weights,
            &Default::default(),
        )
    }

    /// Logits for new tokens given the caches of earlier ones (one per layer;
    /// start with `vec![None; num_layers]`).
    pub fn forward_cached(&self, tokens: &Array, caches: &mut [Option<KvCache>]) -> Result<Array> {
        let x = blocks_cached(&self.layers, &embed(&self.embedding, tokens)?, caches)?;
        let w = self.head_weight();
        project(&head_input(&self.norm, w, &x)?, w)
    }

    /// Samples `max_tokens` continuations of `prompt` (token ids) with
    /// temperature (0 picks the most likely token) from `seed`. Sharded
    /// ([`Llama::shard`]), every rank of the group calls it and gets the
    /// same tokens.
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

    /// [`Llama::generate`] with mlx-lm's sampling options: it stops before
    /// a token of `stop` (which is not returned) and hands every token to
    /// `on_token` as soon as it is drawn (to stream it).
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
        let mut caches: Vec<Option<KvCache>> = vec![None; self.layers.len()];
        let mut key = random::key(seed);
        let mut input = Array::from_slice(prompt, &[1, prompt.len()])?;
        let mut history = prompt.to_vec();
        for _ in 0..max_tokens {
            let logits = self.forward_cached(&input, &mut caches)?;
            let id = sample_last(&logits, sampling, &history, &mut key)?;
            if stop.contains(&id) {
                break;
            }
            history.push(id);
            on_token(id)?;
            input = Array::from_slice(&[id], &[1, 1])?;
            eval_caches(&caches)?;
        }
        Ok(history.split_off(prompt.len()))
    }
}

/// The additive attention mask `[B, 1, L, L]` of rows packing several
/// examples: 0 where key `j` is at or before query `i` and in the same
/// example (`segments[b, i] == segments[b, j]`), a large negative number
/// elsewhere, in `dtype`.
pub fn segment_mask(segments: &Array, dtype: Dtype) -> Result<Array> {
    let (b, l) = (segments.shape()[0] as i64, segments.shape()[1] as i64);
    let pos = mlx_array::arange(0.0, l as f64, 1.0, Dtype::I32)?;
    let future = pos.reshape(&[l, 1])?.less(&pos.reshape(&[1, l])?)?;
    let other = segments
        .reshape(&[b, 1, l, 1])?
        .not_equal(&segments.reshape(&[b, 1, 1, l])?)?;
    // A select, not `blocked * -1e9`: in float16 that is 0 * -inf, NaN.
    future
        .logical_or(&other)?
        .where_(&Array::full(&[], -1e9, dtype), &Array::zeros(&[], dtype))
}

/// The embedding of `tokens`: the start of the residual stream, in
/// [`RESIDUAL_DTYPE`].
pub fn embed(embedding: &Embedding, tokens: &Array) -> Result<Array> {
    embedding.forward(tokens)?.astype(RESIDUAL_DTYPE)
}

/// The residual stream `x` normed by the final `norm`, in the dtype of
/// the output projection's weight `head`: what the projection reads.
pub fn head_input(norm: &RMSNorm, head: &Array, x: &Array) -> Result<Array> {
    norm.forward_as(x, head.dtype())
}

/// The output projection's weight: `out_proj`'s, or the `embedding`'s when
/// there is none (tied).
pub fn head_weight<'a>(embedding: &'a Embedding, out_proj: Option<&'a Linear>) -> &'a Array {
    out_proj.map_or(embedding.weight.value(), |l| l.weight.value())
}

/// `x @ weight^T`: the logits of `x` under an output projection's weight
/// `[vocab, dims]` (a bias-free linear layer).
pub fn project(x: &Array, weight: &Array) -> Result<Array> {
    x.matmul(&weight.t()?)
}

/// `x` `[B, L, D]` of new positions through `layers`, with their caches
/// (one per layer), which are updated.
pub(crate) fn blocks_cached(
    layers: &[LlamaEncoderLayer],
    x: &Array,
    caches: &mut [Option<KvCache>],
) -> Result<Array> {
    // New positions see every cached position and earlier new ones: the
    // causal mask with the queries as the last positions.
    let mask = if x.shape()[1] > 1 {
        AttentionMask::Causal
    } else {
        AttentionMask::None
    };
    let mut x = x.clone();
    for (layer, cache) in layers.iter().zip(caches.iter_mut()) {
        x = layer.forward(&x, mask, Some(cache))?;
    }
    Ok(x)
}

/// Checks a generation request's prompt.
pub(crate) fn check_prompt(prompt: &[u32]) -> Result<()> {
    if prompt.is_empty() {
        return Err(mlx_array::Error::Invalid {
            op: "generate",
            message: "the prompt must hold at least one token".into(),
        });
    }
    Ok(())
}

/// The token drawn from the last position of `logits` `[1, L, vocab]`
/// after `history` (prompt and tokens so far): the most likely at
/// temperature 0, else a sample at the temperature with the next key of
/// `key`, after [`Sampling::scores`]' penalty and filters.
pub(crate) fn sample_last(
    logits: &Array,
    sampling: &Sampling,
    history: &[u32],
    key: &mut Array,
) -> Result<u32> {
    let mut last = logits
        .slice_axis(1, -1, logits.shape()[1] as i64)?
        .reshape(&[-1])?;
    if sampling.filters() {
        let scores = sampling.scores(&last.astype(Dtype::F32)?.to_vec::<f32>()?, history);
        last = Array::from_slice(&scores, &[scores.len()])?;
    }
    let next = if sampling.temperature <= 0.0 {
        last.argmax(-1, false)?
    } else {
        let [k1, k2] = random::split2(key)?;
        *key = k2;
        random::categorical(&k1, &last.mul_scalar(1.0 / sampling.temperature)?, -1)?
    };
    next.item::<u32>()
}

/// Evaluates the caches, keeping the graph of the next token small.
pub(crate) fn eval_caches(caches: &[Option<KvCache>]) -> Result<()> {
    let arrays: Vec<Array> = caches
        .iter()
        .flatten()
        .flat_map(|c| [c.keys.clone(), c.values.clone()])
        .collect();
    mlx_array::eval(&arrays)
}
