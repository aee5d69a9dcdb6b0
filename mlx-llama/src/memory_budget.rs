//! What a training run would hold per rank, before it starts
//! (`mlx-llama train --memory-budget BYTES`): an estimate by part
//! (parameters, gradients, optimizer state, activations, communication
//! buffers) from the model's shape and the run's layout, and the check that
//! refuses a run whose estimate is over the budget, naming its largest part
//! and what would shrink it. With `--shard parameters`, validation and
//! checkpoints gather a unit (a checkpoint: a parameter) at a time, less
//! than a step holds, so the step is the run's peak whatever the layout.
//!
//! It is a model of this trainer, not a measurement: each part is a count
//! of the arrays the step keeps at its peak (see [`Estimate`]'s fields for
//! the formulas), written from what the code holds (the Llama block's
//! forward pass, the fused attention and output projection + loss, the
//! `--shard` layouts) and checked against the measured peak of real runs
//! (`tests/memory_budget.rs`). It leaves out the allocator's slack, the data
//! pipeline, the host's own memory, the optimizer step's transient copies
//! and a checkpoint's write buffers, and counts every gradient as held at
//! once (the evaluator frees most of them as soon as the update has read
//! them): an upper-ish bound of the array memory a rank peaks at
//! (`Summary::peak_mib`).
//!
//! ```
//! use mlx_llama::memory_budget::{Plan, estimate, parse_bytes};
//! use mlx_llama::{Llama, LlamaConfig, ShardMode, TrainConfig};
//! let mut cfg = TrainConfig::default();
//! cfg.model = LlamaConfig { vocab_size: 1000, ..LlamaConfig::default() };
//! cfg.block_size = 256;
//! // Built lazily: nothing is computed, only the parameters' shapes are read.
//! let model = Llama::new(&cfg.model, 0).unwrap();
//! let replicated = estimate(&Plan::new(&cfg, &model, 1));
//! // AdamW keeps two float32 moments per parameter.
//! assert_eq!(replicated.optimizer_state, 2 * replicated.parameters);
//! // ZeRO-3 over 4 ranks keeps about a quarter of the state.
//! cfg.shard = ShardMode::Parameters;
//! let zero3 = estimate(&Plan::new(&cfg, &model, 4));
//! assert!(zero3.optimizer_state * 4 < replicated.optimizer_state * 11 / 10);
//! println!("{}", zero3.table());
//! assert_eq!(parse_bytes("1.5GiB"), Ok(3 << 29));
//! assert!(zero3.check(1 << 20).unwrap_err().contains("over the budget of 1.0 MiB"));
//! ```

use crate::config::{FloatDtype, ShardMode, TrainConfig};
use crate::grad_checkpoint::GradCheckpoint;
use crate::{Llama, LlamaConfig};
use mlx_nn::Module;

/// Bytes per element of the residual stream between the blocks
/// ([`crate::model::RESIDUAL_DTYPE`], float32 whatever the compute dtype).
const RESIDUAL_BYTES: u64 = 4;

/// Bytes per element of gradients and AdamW moments (float32 always: the
/// master weights' dtype).
const MASTER_BYTES: u64 = 4;

/// AdamW's slots per parameter (`m` and `v`).
const ADAMW_SLOTS: u64 = 2;

/// The fused output projection + loss takes rows a block at a time, each
/// block's float32 logits over the whole vocabulary at most this large (or
/// a ninth of the rows, when that is more): mlx-array's CPU kernel.
const LOSS_BLOCK_BYTES: u64 = 50 << 20;
/// The most blocks the loss's rows are cut into.
const LOSS_MAX_BLOCKS: u64 = 9;

/// One parameter of the model as the estimate counts it.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Its dotted name (`layers.0.attention.query_proj.weight`).
    pub name: String,
    /// Elements of the whole tensor.
    pub elements: u64,
    /// Bytes per element as it is kept (4 for float32 master weights; an
    /// adapter run's frozen base in `--base-dtype`).
    pub bytes: u64,
    /// Whether it trains (has a gradient and optimizer state): every
    /// parameter of a full run, the adapters of a `--fine-tune` run.
    pub trainable: bool,
}

/// What the estimate reads: the model's parameters and shape, and the
/// run's layout. [`Plan::new`] makes it from a run's options and its
/// model; every field may be set by hand.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The model's shape (its vocabulary the one trained).
    pub model: LlamaConfig,
    /// Every parameter, whole (before tensor parallelism cuts them).
    pub tensors: Vec<Tensor>,
    /// Data-parallel ranks: the world, or the replicas with tensor
    /// parallelism.
    pub replicas: usize,
    /// Ranks each model is split over (`--tensor-parallel`).
    pub tensor_parallel: usize,
    /// What each data-parallel rank keeps ([`TrainConfig::sharding`]);
    /// with one replica, or with tensor parallelism, everything is whole
    /// whatever it says (the trainer's layouts).
    pub shard: ShardMode,
    /// Which blocks recompute their activations in the backward pass.
    pub grad_checkpoint: GradCheckpoint,
    /// The dtype the model computes in (`--dtype`).
    pub compute: FloatDtype,
    /// Sequences per rank in one micro-batch.
    pub batch: usize,
    /// Micro-batches per optimizer step (`--grad-accumulation`).
    pub micro_batches: usize,
    /// Tokens per sequence (`--block-size`).
    pub block_size: usize,
    /// Bytes per gradient communication bucket (`--all-reduce-size`).
    pub bucket_bytes: usize,
    /// Whether the attention takes an additive mask (rows packing several
    /// chat or prompt/completion examples): the composite attention then
    /// keeps its `[B, H, L, L]` probabilities, the fused one only a
    /// logsumexp per query.
    pub masked_attention: bool,
}

impl Plan {
    /// The plan of a run of `cfg` on `world` ranks training `model` (built
    /// as the run builds it: its vocabulary resolved, its adapters added;
    /// a lazily built model is fine, only shapes and dtypes are read). The
    /// attention is taken as unmasked; the trainer sets
    /// [`Plan::masked_attention`] from its data.
    pub fn new(cfg: &TrainConfig, model: &Llama, world: usize) -> Plan {
        let mut tensors = Vec::new();
        model.visit("", &mut |name, p| {
            let v = p.value();
            tensors.push(Tensor {
                name: name.to_string(),
                elements: v.size() as u64,
                bytes: v.dtype().size_of() as u64,
                trainable: !p.is_frozen(),
            });
        });
        let tensor_parallel = cfg.tensor_parallel.max(1);
        let replicas = (world / tensor_parallel).max(1);
        let batch = cfg
            .per_rank_batch
            .unwrap_or(cfg.global_batch / replicas)
            .max(1);
        Plan {
            model: model.config.clone(),
            tensors,
            replicas,
            tensor_parallel,
            shard: cfg.sharding(),
            grad_checkpoint: cfg.grad_checkpoint,
            compute: cfg.dtype,
            batch,
            micro_batches: cfg.grad_accumulation.max(1),
            block_size: cfg.block_size,
            bucket_bytes: cfg.all_reduce_size,
            masked_attention: false,
        }
    }

    /// The layout the trainer runs (`sync::for_config`): one replica, or
    /// tensor parallelism, keep everything whole on every rank.
    pub fn layout(&self) -> ShardMode {
        if self.replicas <= 1 || self.tensor_parallel > 1 {
            ShardMode::None
        } else {
            self.shard
        }
    }

    /// Bytes per element of the compute dtype.
    fn compute_bytes(&self) -> u64 {
        self.compute.dtype().size_of() as u64
    }

    /// Elements of `t` on one rank of a tensor-parallel model: every
    /// block's projections are cut over the ranks, the rest is whole.
    fn per_rank_elements(&self, t: &Tensor) -> u64 {
        if self.tensor_parallel > 1 && is_tensor_parallel_cut(&t.name) {
            t.elements / self.tensor_parallel as u64
        } else {
            t.elements
        }
    }

    /// Elements of `t`'s shard in the sharded layouts: `ceil(n / N)` (flat,
    /// zero padded: [`mlx_optim::shard_of`]).
    fn shard_elements(&self, t: &Tensor) -> u64 {
        t.elements.div_ceil(self.replicas as u64)
    }

    /// The units ZeRO-3 gathers whole (the embedding, each block, the final
    /// norm, the output projection): elements of each.
    fn units(&self) -> Vec<u64> {
        let mut units: Vec<(String, u64)> = Vec::new();
        for t in &self.tensors {
            let unit = crate::sync::unit_of(&t.name);
            match units.iter_mut().find(|(u, _)| u == unit) {
                Some((_, n)) => *n += t.elements,
                None => units.push((unit.to_string(), t.elements)),
            }
        }
        units.into_iter().map(|(_, n)| n).collect()
    }
}

/// Whether `name` is one of the block projections tensor parallelism cuts
/// (the attention's four, the MLP's three).
fn is_tensor_parallel_cut(name: &str) -> bool {
    const CUT: [&str; 7] = [
        ".attention.query_proj.weight",
        ".attention.key_proj.weight",
        ".attention.value_proj.weight",
        ".attention.out_proj.weight",
        ".linear1.weight",
        ".linear2.weight",
        ".linear3.weight",
    ];
    name.starts_with("layers.") && CUT.iter().any(|s| name.ends_with(s))
}

/// One of the estimate's parts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    /// [`Estimate::parameters`].
    Parameters,
    /// [`Estimate::gradients`].
    Gradients,
    /// [`Estimate::optimizer_state`].
    OptimizerState,
    /// [`Estimate::activations`].
    Activations,
    /// [`Estimate::communication`].
    Communication,
}

impl Part {
    /// Its name in the table and the error.
    pub fn name(self) -> &'static str {
        match self {
            Part::Parameters => "parameters",
            Part::Gradients => "gradients",
            Part::OptimizerState => "optimizer state",
            Part::Activations => "activations",
            Part::Communication => "communication buffers",
        }
    }
}

/// What one rank would hold at a step's peak, bytes by part.
///
/// Notation: `P_i` the elements of parameter `i` on this rank (a block
/// projection's `1/T` with `--tensor-parallel T`), `s_i` its bytes per
/// element as kept, `N` the data-parallel ranks, `c` the compute dtype's
/// bytes (4 for f32, 2 for bf16/f16), `B` sequences per rank in a
/// micro-batch, `L` the block size, `D` dims, `F` the MLP's width, `H` and
/// `K` the query and key/value heads and `d` their width (`H`, `K` and `F`
/// divided by `T`), `V` the vocabulary.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Estimate {
    /// Weights: `sum_i P_i s_i`, plus, for each float weight not kept in
    /// the compute dtype (a bf16/f16 run's float32 masters), its compute
    /// copy read by the forward pass and kept for the backward: `P_i c`.
    /// ZeRO-3 (`--shard parameters`, `N > 1`): the float32 master shards
    /// `sum_i ceil(P_i / N) * 4` and the two largest units (embedding,
    /// block, final norm, output projection) gathered whole in the compute
    /// dtype, `(u_1 + u_2) c`: the unit computing and the next one in flight.
    pub parameters: u64,
    /// Float32 gradients of the trainable parameters: `sum_t P_t * 4`
    /// replicated; ZeRO-1/2/3 (`N > 1`) this rank's shards of the averaged
    /// gradients, `sum_t ceil(P_t / N) * 4` (the whole ones exist only a
    /// bucket at a time: see `communication`). With `M > 1` micro-batches
    /// (`--grad-accumulation`), also the running sums of the micro-batches
    /// before the last, held while the next one computes: this rank's
    /// whole gradients, `sum_t P_t * 4` (they are averaged once per step),
    /// or under ZeRO-3 its shards, `sum_t ceil(P_t / N) * 4` (each
    /// micro-batch's come back reduce-scattered); and, until the first
    /// micro-batch's sums are formed, the buffers its norms' weight
    /// gradients are views of (each shares one with its input's gradient):
    /// `(2 layers + 1) B L D * 4`.
    pub gradients: u64,
    /// AdamW's two float32 moments of the trainable parameters:
    /// `2 sum_t P_t * 4`, or with any sharding `2 sum_t ceil(P_t / N) * 4`.
    pub optimizer_state: u64,
    /// What the forward pass keeps for the backward pass. A block keeps
    /// `A = B L D (4 + 4 + 2c)` (its float32 input and the stream after
    /// attention; the two norms' outputs, read by the projections) `+ B L
    /// d c (H + 2K)` (the rotated queries and keys, the values) `+ B L d H
    /// (4 + h)` (the fused attention's float32 output, already laid out as
    /// the merged heads, and in half precision its copy in the compute
    /// dtype: `h = c` for bf16/f16, 0 for f32) `+ 4 B H L` (its logsumexp
    /// per query) `+ 3 B L F c` (the gate and up
    /// projections, and the SwiGLU the down projection reads) `[+ c B H L^2`
    /// with an additive mask: the probabilities, and the mask `c B L^2`
    /// once]. A checkpointed block keeps only its input, `4 B L D`. After
    /// the blocks: the last stream, `4 B L D`, and the head's normed input
    /// and its gradient, `B L D (c + 4)`, plus the tokens, targets and
    /// weights, `12 B L`. A checkpointed block's `A - 4 B L D` is
    /// recomputed in the backward pass (one block at a time), and the
    /// backward pass works on the stream's gradient and a block's gate and
    /// up gradients, `4 B L D + 2 B L F c`. All of that for one micro-batch
    /// of `--grad-accumulation`'s: each is evaluated before the next one
    /// is built (as one graph, every forward pass ran before the first
    /// backward pass: two micro-batches peaked at twice one's activations;
    /// the reference model's step on one rank, micro-batches of 2 x 256,
    /// peaked at 68 MiB with one, 158 MiB with four as one graph, 82 MiB
    /// with four one by one). Once per step,
    /// one block of float32 logits `4 R V` (`R` rows: `B L` cut into blocks
    /// of at most 50 MiB of logits or a ninth of the rows; the fused output
    /// projection + loss never holds the `[B, L, V]` logits).
    pub activations: u64,
    /// Buffers in flight between the ranks: none on one replica. ZeRO-3:
    /// the whole gradient of the largest unit before its reduce-scatter,
    /// `u_1 c`. Otherwise one bucket's own gradients and the bucket they
    /// are concatenated into, `2 min(G, max(b, g))`, with `b` the bucket
    /// bytes, `g` the largest trainable tensor's gradient bytes (a tensor
    /// larger than a bucket travels alone) and `G` all the gradients' bytes.
    pub communication: u64,
}

impl Estimate {
    /// The parts in the table's order, with their bytes.
    pub fn parts(&self) -> [(Part, u64); 5] {
        [
            (Part::Parameters, self.parameters),
            (Part::Gradients, self.gradients),
            (Part::OptimizerState, self.optimizer_state),
            (Part::Activations, self.activations),
            (Part::Communication, self.communication),
        ]
    }

    /// Their sum.
    pub fn total(&self) -> u64 {
        self.parts().iter().map(|(_, b)| b).sum()
    }

    /// The largest part (the first of equals).
    pub fn largest(&self) -> (Part, u64) {
        self.parts()
            .into_iter()
            .fold((Part::Parameters, 0), |m, p| if p.1 > m.1 { p } else { m })
    }

    /// One line per part and the total, in MiB.
    pub fn table(&self) -> String {
        let mut s = String::new();
        for (part, bytes) in self.parts() {
            s.push_str(&format!("  {:<22}{:>10.1} MiB\n", part.name(), mib(bytes)));
        }
        s.push_str(&format!("  {:<22}{:>10.1} MiB", "total", mib(self.total())));
        s
    }

    /// `Ok` when the total fits in `budget` bytes; otherwise the error the
    /// run stops with: the total, the budget, the largest part and what
    /// would shrink it (for the layout the estimate was made for, see
    /// [`Estimate::check_plan`]).
    pub fn check(&self, budget: u64) -> Result<(), String> {
        self.check_with(budget, None)
    }

    /// [`Estimate::check`] whose advice knows `plan` (the estimate's own):
    /// it suggests only what would make the largest part smaller there.
    pub fn check_plan(&self, budget: u64, plan: &Plan) -> Result<(), String> {
        self.check_with(budget, Some(plan))
    }

    fn check_with(&self, budget: u64, plan: Option<&Plan>) -> Result<(), String> {
        let total = self.total();
        if total <= budget {
            return Ok(());
        }
        let (part, bytes) = self.largest();
        Err(format!(
            "this configuration needs about {:.1} MiB per rank, over the budget of {:.1} MiB; the largest part is {} ({:.1} MiB): try {}",
            mib(total),
            mib(budget),
            part.name(),
            mib(bytes),
            advice(part, plan).join(" / ")
        ))
    }
}

/// `bytes` in MiB.
fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 20) as f64
}

/// What would make `part` smaller, given the plan when known.
fn advice(part: Part, plan: Option<&Plan>) -> Vec<&'static str> {
    let layout = plan.map(Plan::layout);
    let one_replica = plan.is_some_and(|p| p.replicas <= 1 && p.tensor_parallel <= 1);
    let adapters = plan.is_some_and(|p| p.tensors.iter().any(|t| !t.trainable));
    let half = plan.is_some_and(|p| p.compute != FloatDtype::F32);
    // Tensor parallelism keeps each shard's optimizer state whole and does
    // not combine with --shard parameters: more of it is what shrinks them.
    let tensor = plan.is_some_and(|p| p.tensor_parallel > 1);
    let mut tips = Vec::new();
    let shard_tip = |tips: &mut Vec<&'static str>, with: &'static str, more: &'static str| {
        tips.push(if one_replica { more } else { with });
    };
    match part {
        Part::Parameters => {
            if tensor {
                tips.push("a larger --tensor-parallel");
            } else if layout != Some(ShardMode::Parameters) {
                shard_tip(
                    &mut tips,
                    "--shard parameters",
                    "more ranks with --shard parameters",
                );
            }
            if half {
                tips.push("--dtype f32 (a half-precision run keeps compute copies beside its float32 weights)");
            }
            if !adapters {
                tips.push("--fine-tune lora with --base-dtype bf16");
            }
            tips.push("a smaller model");
        }
        Part::Gradients | Part::OptimizerState => {
            match layout {
                _ if tensor => tips.push("a larger --tensor-parallel"),
                Some(ShardMode::None) | None => shard_tip(
                    &mut tips,
                    "--shard optimizer (or parameters)",
                    "more ranks with --shard optimizer (or parameters)",
                ),
                _ => tips.push("more ranks"),
            }
            if !adapters {
                tips.push("--fine-tune lora");
            }
            tips.push("a smaller model");
        }
        Part::Activations => {
            let every_block = plan.is_some_and(|p| p.grad_checkpoint == GradCheckpoint::ALL);
            if !every_block {
                tips.push("--grad-checkpoint");
            }
            tips.push("a smaller --per-rank-batch (with a larger --grad-accumulation)");
            tips.push("a smaller --block-size");
            if !half {
                tips.push("--dtype bf16");
            }
            if plan.is_none_or(|p| p.tensor_parallel <= 1) {
                tips.push("--tensor-parallel");
            }
        }
        Part::Communication => {
            if layout == Some(ShardMode::Parameters) {
                tips.push("more ranks (each unit's gradient is reduce-scattered whole)");
            } else {
                tips.push("a smaller --all-reduce-size");
            }
        }
    }
    tips
}

/// The bytes `plan` would hold per rank, by part (see [`Estimate`]'s
/// fields for each formula). Pure: reads nothing but the plan.
pub fn estimate(plan: &Plan) -> Estimate {
    let layout = plan.layout();
    let c = plan.compute_bytes();
    let n = plan.replicas as u64;
    let sharded = layout != ShardMode::None;
    let trainable: Vec<&Tensor> = plan.tensors.iter().filter(|t| t.trainable).collect();
    // Elements of each trainable tensor this rank keeps state for.
    let kept = |t: &Tensor| {
        if sharded {
            plan.shard_elements(t)
        } else {
            plan.per_rank_elements(t)
        }
    };
    let trained_elements: u64 = trainable.iter().map(|t| kept(t)).sum();
    let units = {
        let mut u = plan.units();
        u.sort_unstable_by(|a, b| b.cmp(a));
        u
    };
    let largest_unit = units.first().copied().unwrap_or(0);

    let parameters = if layout == ShardMode::Parameters {
        let shards: u64 = plan
            .tensors
            .iter()
            .map(|t| plan.shard_elements(t) * MASTER_BYTES)
            .sum();
        let in_flight: u64 = units.iter().take(2).sum();
        shards + in_flight * c
    } else {
        plan.tensors
            .iter()
            .map(|t| {
                let e = plan.per_rank_elements(t);
                let copy = if t.bytes != c { e * c } else { 0 };
                e * t.bytes + copy
            })
            .sum()
    };
    let running_sums = if plan.micro_batches > 1 {
        let summed: u64 = if layout == ShardMode::Parameters {
            trained_elements
        } else {
            trainable.iter().map(|t| plan.per_rank_elements(t)).sum()
        };
        let norms = 2 * plan.model.num_layers as u64 + 1;
        let stream = (plan.batch * plan.block_size * plan.model.dims) as u64 * RESIDUAL_BYTES;
        summed * MASTER_BYTES + norms * stream
    } else {
        0
    };
    let gradients = trained_elements * MASTER_BYTES + running_sums;
    let optimizer_state = ADAMW_SLOTS * trained_elements * MASTER_BYTES;

    let communication = if n <= 1 {
        0
    } else if layout == ShardMode::Parameters {
        largest_unit * c
    } else {
        let all: u64 = trainable
            .iter()
            .map(|t| plan.per_rank_elements(t) * MASTER_BYTES)
            .sum();
        let one = trainable
            .iter()
            .map(|t| plan.per_rank_elements(t) * MASTER_BYTES)
            .max()
            .unwrap_or(0);
        2 * all.min((plan.bucket_bytes as u64).max(one))
    };

    Estimate {
        parameters,
        gradients,
        optimizer_state,
        activations: activations(plan),
        communication,
    }
}

/// [`Estimate::activations`].
fn activations(plan: &Plan) -> u64 {
    let m = &plan.model;
    let t = plan.tensor_parallel.max(1) as u64;
    let c = plan.compute_bytes();
    let (b, l) = (plan.batch as u64, plan.block_size as u64);
    let tokens = b * l;
    let dims = m.dims as u64;
    let (heads, kv) = (m.num_heads as u64 / t, m.kv_heads() as u64 / t);
    let head_dim = m.head_dim() as u64;
    let mlp = m.mlp_dims as u64 / t;
    let vocab = m.vocab_size as u64;

    let input = tokens * dims * RESIDUAL_BYTES;
    // The fused attention's float32 output (laid out [B, L, H d]: merging
    // the heads is a view), and a half-precision run's copy in its dtype.
    let attention_out = 4 + if c < 4 { c } else { 0 };
    let mut block = 2 * input
        + 2 * tokens * dims * c
        + tokens * head_dim * (c * (heads + 2 * kv) + heads * attention_out)
        + 4 * b * heads * l
        + 3 * tokens * mlp * c;
    if plan.masked_attention {
        block += c * b * heads * l * l;
    }
    let layers = m.num_layers;
    let checkpointed = (0..layers)
        .filter(|&i| plan.grad_checkpoint.applies(i))
        .count() as u64;
    let plain = layers as u64 - checkpointed;
    let head = input + tokens * dims * (c + 4) + 12 * tokens;
    let mask = if plan.masked_attention {
        c * b * l * l
    } else {
        0
    };
    let per_micro = plain * block + checkpointed * input + head + mask;
    // One checkpointed block's activations recomputed at a time.
    let recomputed = if checkpointed > 0 { block - input } else { 0 };
    // The output projection + loss: the rows of one block of logits.
    let most = (LOSS_BLOCK_BYTES / 4 / vocab.max(1))
        .max(8)
        .max(tokens.div_ceil(LOSS_MAX_BLOCKS));
    let rows = tokens.div_ceil(tokens.div_ceil(most).max(1)).min(tokens);
    let logits = 4 * rows * vocab;
    let working = input + 2 * tokens * mlp * c;
    per_micro + recomputed + working + logits
}

/// The trainer's check at the start of a run (`Run::start`): with
/// `--memory-budget`, the estimate of `cfg` training `model` on `world`
/// ranks ([`Plan::new`]; `masked_attention` when its rows pack examples),
/// printed when `report` (rank 0), and an error when it is over the
/// budget. Every rank computes the same estimate, so every rank refuses
/// together, without communicating. Within the budget, the buffer cache is
/// capped at what the budget leaves over the estimate.
pub fn check_run(
    cfg: &TrainConfig,
    model: &Llama,
    world: usize,
    masked_attention: bool,
    report: bool,
) -> anyhow::Result<()> {
    let Some(budget) = cfg.memory_budget else {
        return Ok(());
    };
    let plan = &Plan {
        masked_attention,
        ..Plan::new(cfg, model, world)
    };
    let e = estimate(plan);
    if report {
        let layout = match plan.layout() {
            ShardMode::None if plan.tensor_parallel > 1 => {
                format!("tensor parallel over {}", plan.tensor_parallel)
            }
            ShardMode::None => "replicated".to_string(),
            ShardMode::Optimizer => "ZeRO-1 (--shard optimizer)".to_string(),
            ShardMode::Gradients => "ZeRO-2 (--shard gradients)".to_string(),
            ShardMode::Parameters => "ZeRO-3 (--shard parameters)".to_string(),
        };
        crate::console::line(&format!(
            "memory estimate per rank ({} data-parallel rank(s), {layout}, --grad-checkpoint {}, --dtype {}, {} micro-batch(es) of {} x {} tokens), budget {:.1} MiB:\n{}",
            plan.replicas,
            plan.grad_checkpoint,
            plan.compute.dtype().name(),
            plan.micro_batches,
            plan.batch,
            plan.block_size,
            mib(budget),
            e.table()
        ));
    }
    e.check_plan(budget, plan).map_err(|m| anyhow::anyhow!(m))?;
    // Freed buffers are kept for reuse only within what the budget leaves
    // over the estimate: beyond it they go back to the system, so that the
    // process, not only its arrays, stays within the budget.
    let spare = budget.saturating_sub(e.total());
    mlx_array::memory::set_cache_limit(usize::try_from(spare).unwrap_or(usize::MAX));
    Ok(())
}

/// A size in bytes: a number, whole or with a fraction (`1.5`), and an
/// optional unit: none or `B` (bytes), `KiB`/`MiB`/`GiB`/`TiB` (powers of
/// 1024; `K`, `M`, `G`, `T` alone too, as `--all-reduce-size` reads them)
/// or `KB`/`MB`/`GB`/`TB` (powers of 1000), in any case, with or without a
/// space. A fraction of a byte is rounded to the nearest byte.
///
/// ```
/// use mlx_llama::memory_budget::parse_bytes;
/// assert_eq!(parse_bytes("800MiB"), Ok(800 << 20));
/// assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
/// assert!(parse_bytes("lots").unwrap_err().contains("like 1.5GiB"));
/// ```
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|ch: char| !(ch.is_ascii_digit() || ch == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || format!("expected a number of bytes like 1.5GiB, 800MiB, 2GB or 123, got `{s}`");
    if number.is_empty() || number.starts_with('.') || number.ends_with('.') {
        return Err(bad());
    }
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        u => {
            return Err(format!(
                "unknown unit `{u}` in `{s}`: use B, KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)"
            ));
        }
    };
    let too_large = || format!("`{s}` is too large");
    if !number.contains('.') {
        let n: u64 = number.parse().map_err(|_| too_large())?;
        return n.checked_mul(scale).ok_or_else(too_large);
    }
    let x: f64 = number.parse().map_err(|_| bad())?;
    let bytes = (x * scale as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(too_large());
    }
    Ok(bytes as u64)
}

/// `--memory-budget`'s value: [`parse_bytes`], and more than nothing.
pub fn parse_budget(s: &str) -> Result<u64, String> {
    match parse_bytes(s)? {
        0 => Err(format!(
            "a memory budget of `{s}` holds nothing: give the bytes a rank may use, like 1.5GiB"
        )),
        n => Ok(n),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_parse_with_binary_and_decimal_units() {
        assert_eq!(parse_bytes("123"), Ok(123));
        assert_eq!(parse_bytes("1.5GiB"), Ok(1536 << 20));
        assert_eq!(parse_bytes("800MiB"), Ok(800 << 20));
        assert_eq!(parse_bytes("800 mib"), Ok(800 << 20));
        assert_eq!(parse_bytes("2GB"), Ok(2_000_000_000));
        assert_eq!(parse_bytes("4K"), Ok(4096));
        assert_eq!(parse_bytes("0.5KB"), Ok(500));
        assert_eq!(parse_bytes("1TiB"), Ok(1 << 40));
        for bad in ["", "GiB", "1.2.3GiB", ".5GiB", "1.GiB", "-1GiB", "abc"] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains("like 1.5GiB"), "{bad:?}: {e}");
        }
        assert!(
            parse_bytes("5 parsecs")
                .unwrap_err()
                .contains("unknown unit `parsecs`")
        );
        assert!(
            parse_bytes("99999999999999999999")
                .unwrap_err()
                .contains("too large")
        );
        assert!(
            parse_bytes("20000000TiB")
                .unwrap_err()
                .contains("too large")
        );
        assert!(parse_budget("0GiB").unwrap_err().contains("holds nothing"));
    }

    #[test]
    fn units_are_blocks_and_the_rest_alone() {
        assert_eq!(
            crate::sync::unit_of("layers.12.attention.query_proj.weight"),
            "layers.12"
        );
        assert_eq!(crate::sync::unit_of("norm.weight"), "norm.weight");
        assert!(is_tensor_parallel_cut("layers.0.linear3.weight"));
        assert!(!is_tensor_parallel_cut("layers.0.norm1.weight"));
        assert!(!is_tensor_parallel_cut("out_proj.weight"));
    }
}
