//! The loss: its gradients over a step's micro-batches, and the validation
//! loss over the world.

use anyhow::Result;
use mlx_array::{Array, Dtype, Tree, eval};
use mlx_data::DataLoader;
use mlx_dist::Group;
use mlx_nn::{value_and_grad, value_and_grad_in};

use super::batch::{Micro, micro};
use crate::Llama;
use crate::sync::GradSync;
use mlx_nn::ModuleExt;

/// A micro-batch's loss and gradients (scaled by the `f64`).
type LossAndGrads<'a> =
    Box<dyn Fn(&mut Llama, &(Micro, f64)) -> mlx_array::Result<(Array, Tree)> + 'a>;

/// The summed loss of `micros` and this rank's own gradients of it, summed
/// over the micro-batches. A micro-batch's loss is its masked token losses
/// times `scale` (and times `loss_scale`, a 0-d array on the device, when
/// given), summed; the fused loss computes its gradient in the same
/// pass. With `compute` the model runs in that dtype, its gradients coming
/// back in float32 ([`mlx_nn::value_and_grad_in`]). With `dropout` (a
/// key), the adapters' dropout draws from a split of it per micro-batch.
///
/// Every micro-batch but the last is evaluated as soon as it is added to
/// the running sums, so a step holds one micro-batch's activations at a
/// time (and the sums of those before it), whatever `--grad-accumulation`
/// says: as one graph, every forward pass ran before the first backward
/// pass. The sums are the same, added in the same order. The last
/// micro-batch's gradients stay lazy (the returned sums), so that the
/// collectives that average them still overlap its backward pass. Under
/// ZeRO-3 each micro-batch's gradients come back through its gathers'
/// reduce-scatters, so the running sums are shards and each micro-batch
/// sends its own (as FSDP2 does by default); otherwise they are this
/// rank's whole gradients, averaged once per step (as DDP's `no_sync`).
pub(super) fn loss_and_grads(
    model: &mut Llama,
    sync: &dyn GradSync,
    micros: Vec<Micro>,
    scale: f64,
    loss_scale: Option<&Array>,
    compute: Option<Dtype>,
    dropout: Option<Array>,
) -> Result<(Array, Tree)> {
    let loss_scale = loss_scale.cloned();
    let f = move |m: &Llama, (micro, scale): &(Micro, f64)| {
        let mask = micro.mask.mul_scalar(*scale)?;
        let mask = match &loss_scale {
            Some(s) => mask.mul(&s.astype(mask.dtype())?)?,
            None => mask,
        };
        m.loss_in(&micro.x, &micro.y, &mask, micro.segments.as_ref())
    };
    let vg: LossAndGrads = match (sync.differentiated(), compute) {
        (Some(trained), _) => Box::new(move |model: &mut Llama, args: &(Micro, f64)| {
            value_and_grad_bound(model, args, trained, sync, compute, &f)
        }),
        (None, Some(d)) => Box::new(value_and_grad_in(d, f)),
        (None, None) => Box::new(value_and_grad(f)),
    };
    let mut loss = Array::zeros(&[], Dtype::F32);
    // Each stage of the gradients replaces the previous one, which is
    // dropped here so that the graph holds the only references to it:
    // the evaluator can then free every buffer once its last reader ran.
    let mut grads: Option<Tree> = None;
    let keys = match &dropout {
        Some(k) => Some(mlx_array::random::split_keys(k, micros.len().max(1))?),
        None => None,
    };
    let count = micros.len();
    for (i, m) in micros.into_iter().enumerate() {
        if let Some(keys) = &keys {
            model.set_adapter_dropout(Some(&keys[i]))?;
        }
        let (l, g) = vg(model, &(m, scale))?;
        loss = loss.add(&l)?;
        let sums = match grads {
            // Held across the next micro-batch, the sums start as arrays
            // of their own: some gradients are views into a larger buffer
            // (a norm's weight gradient shares one with its input's), which
            // a held view would keep whole. -0.0 is the sum's identity,
            // signed zeros included.
            None if count > 1 => g.map(|_, a| mlx_array::full_like(a, -0.0).add(a))?,
            None => g,
            Some(acc) => acc.zip_map(&g, |_, a, b| a.add(b))?,
        };
        if i + 1 < count {
            eval((&loss, &sums))?;
        }
        grads = Some(sums);
    }
    if dropout.is_some() {
        model.set_adapter_dropout(None)?;
    }
    let grads = grads.ok_or_else(|| anyhow::anyhow!("a step needs at least one micro-batch"))?;
    Ok((loss, grads))
}

/// `f`'s loss and its gradients with respect to `trained`, which `sync`
/// puts into `model` for the forward pass ([`GradSync::bind`]: this rank's
/// shards of fully sharded parameters, gathered), the model computing in
/// `compute` when given; the loss comes back in float32. The model's
/// parameters are as they were afterwards.
fn value_and_grad_bound<A>(
    model: &mut Llama,
    args: &A,
    trained: &Tree,
    sync: &dyn GradSync,
    compute: Option<Dtype>,
    f: &impl Fn(&Llama, &A) -> mlx_array::Result<Array>,
) -> mlx_array::Result<(Array, Tree)> {
    let before = model.parameters();
    let result = mlx_array::value_and_grad_tree(
        |t| {
            sync.bind(model, t, compute)
                .map_err(|e| mlx_array::Error::Invalid {
                    op: "bind",
                    message: e.to_string(),
                })?;
            f(model, args)?.astype(Dtype::F32)
        },
        trained,
    );
    model.update(&before)?;
    result
}

/// Mean validation loss over every rank's shard (`batches` batches each),
/// the model computing in `compute` when given.
/// A model whose parameters `model` gives lazily (gathered from shards) is
/// built again for each batch, so that no batch keeps them whole; one
/// whose parameters are at hand is built (and cast) once.
pub(super) fn evaluate(
    model: &dyn Fn() -> Result<Llama>,
    val: &mut DataLoader,
    batches: usize,
    group: &Group,
    compute: Option<Dtype>,
) -> Result<f32> {
    let in_compute = |mut m: Llama| -> Result<Llama> {
        if let Some(d) = compute {
            m.update(&m.parameters().map(|_, p| {
                if p.dtype().is_float() {
                    p.astype(d)
                } else {
                    Ok(p.clone())
                }
            })?)?;
        }
        Ok(m)
    };
    let first = model()?;
    let held = first.parameters().leaves().iter().all(Array::is_evaluated);
    let once = if held { Some(in_compute(first)?) } else { None };
    let mut sum = Array::zeros(&[], Dtype::F32);
    let mut count = Array::zeros(&[], Dtype::F32);
    for _ in 0..batches {
        let m = micro(&val.next_batch()?)?;
        // The model is dropped before the loss is evaluated: weights made
        // lazily (gathered from the ranks' shards, one unit after another)
        // are then freed as soon as their unit has run, so validating never
        // holds the whole model.
        let loss = {
            let model = match &once {
                Some(m) => m.clone(),
                None => in_compute(model()?)?,
            };
            model.loss_in(&m.x, &m.y, &m.mask, m.segments.as_ref())?
        };
        sum = sum.add(&loss.astype(Dtype::F32)?)?;
        count = count.add(&m.mask.sum_all()?)?;
        eval((&sum, &count))?;
    }
    let both = mlx_dist::all_sum(&mlx_array::stack(&[sum, count], 0)?, group)?.to_vec::<f32>()?;
    Ok(both[0] / both[1].max(1.0))
}
