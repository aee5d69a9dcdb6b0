//! Tensor-parallel linear layers, as MLX's `mlx.nn.layers.distributed`:
//! [`AllToShardedLinear`] (column-parallel: every rank has the whole input
//! and computes its slice of the output features) and [`ShardedToAllLinear`]
//! (row-parallel: every rank has its slice of the input features, and the
//! partial products are summed so every rank gets the whole output), with
//! [`shard_linear`] and [`shard_inplace`] to cut an existing layer or
//! module for a group.
//!
//! A pair of them is the usual tensor-parallel block: an MLP whose hidden
//! features are split over the ranks communicates once forward (the sum in
//! the second layer) and once backward (the gradient of the first layer's
//! input).
//!
//! ```
//! use mlx_array::{random, Array};
//! use mlx_nn::{AllToShardedLinear, Linear, ShardedToAllLinear};
//! let outs = mlx_dist::run_local(2, |group| {
//!     let k = random::key(0);
//!     let up = Linear::new(4, 8, true, &k).unwrap();
//!     let down = Linear::new(8, 4, true, &random::key(1)).unwrap();
//!     let up = AllToShardedLinear::from_linear(&up, 1, &group).unwrap();     // [4, 4] here
//!     let down = ShardedToAllLinear::from_linear(&down, 1, &group).unwrap(); // [4, 4] here
//!     let x = Array::ones(&[1, 4], mlx_array::Dtype::F32);
//!     down.forward(&up.forward(&x).unwrap()).unwrap().to_vec::<f32>().unwrap()
//! })
//! .unwrap();
//! assert_eq!(outs[0], outs[1]); // every rank has the whole output
//! ```

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::Path;
use std::str::FromStr;

use mlx_array::{
    Array, ArrayData, Dtype, Error, Part, Result, Tree, concatenate, load_safetensors_parts, split,
};
use mlx_dist::{Group, all_gather, sum_gradients, sum_partials};

use crate::layers::linear::affine;
use crate::module::{Module, ModuleExt, Param};
use crate::{DoRALinear, Linear, LoRALinear, impl_module};

/// How a layer's parameters are cut over a group (MLX's `sharding` strings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sharding {
    /// `"all-to-sharded"`: output features split; every rank takes the
    /// whole input and gives its slice of the output.
    AllToSharded,
    /// `"sharded-to-all"`: input features split; every rank takes its slice
    /// of the input and gets the whole output.
    ShardedToAll,
}

impl FromStr for Sharding {
    type Err = Error;
    fn from_str(s: &str) -> Result<Sharding> {
        match s {
            "all-to-sharded" => Ok(Sharding::AllToSharded),
            "sharded-to-all" => Ok(Sharding::ShardedToAll),
            _ => Err(Error::Invalid {
                op: "sharding",
                message: format!("`{s}` is not a sharding: all-to-sharded or sharded-to-all"),
            }),
        }
    }
}

/// A linear layer whose output features are split over a group: the weight
/// is `[output_dims / N, input_dims]` (this rank's rows), the bias this
/// rank's `[output_dims / N]`. The input is whole on every rank, and its
/// gradient is summed over the group ([`mlx_dist::sum_gradients`]).
#[derive(Clone, Debug)]
pub struct AllToShardedLinear {
    /// This rank's rows of the weight, `[output_dims / N, input_dims]`.
    pub weight: Param,
    /// This rank's part of the bias, `[output_dims / N]`, if present.
    pub bias: Option<Param>,
    /// The ranks the features are split over.
    pub group: Group,
}

impl_module!(AllToShardedLinear { weight, bias });

impl AllToShardedLinear {
    /// This rank's shard of the layer `Linear::new(input_dims, output_dims,
    /// bias, key)` would make: the same seed gives the same model on one
    /// rank or many. `output_dims` must divide by the group's size.
    pub fn new(
        input_dims: usize,
        output_dims: usize,
        bias: bool,
        group: &Group,
        key: &Array,
    ) -> Result<AllToShardedLinear> {
        check_divides("AllToShardedLinear", "output", output_dims, group.size())?;
        Self::from_linear(&Linear::new(input_dims, output_dims, bias, key)?, 1, group)
    }

    /// This rank's shard of `linear` (MLX's `from_linear`). With more than
    /// one of `segments` the output features are that many equal blocks (a
    /// fused query-key-value weight, say) and each block is split over the
    /// ranks.
    pub fn from_linear(linear: &Linear, segments: usize, group: &Group) -> Result<Self> {
        Ok(AllToShardedLinear {
            weight: Param::new(shard_axis(linear.weight.value(), 0, segments, group)?),
            bias: match &linear.bias {
                Some(b) => Some(Param::new(shard_axis(b.value(), 0, segments, group)?)),
                None => None,
            },
            group: group.clone(),
        })
    }

    /// This rank's slice of `x W^T + b` over the last axis of `x` (whole on
    /// every rank): `[..., output_dims / N]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        self.forward_summed(&sum_gradients(x, &self.group)?)
    }

    /// [`forward`](Self::forward) of an input on which the caller has
    /// applied [`mlx_dist::sum_gradients`] itself: when several sharded
    /// layers read one input (queries, keys and values), its gradient is
    /// then summed over the group once rather than once per layer.
    pub fn forward_summed(&self, x: &Array) -> Result<Array> {
        affine(x, &self.weight, &self.bias)
    }
}

/// A linear layer whose input features are split over a group: the weight
/// is `[output_dims, input_dims / N]` (this rank's columns) and the bias
/// whole. Each rank multiplies its slice of the input; the partial products
/// are summed over the group ([`mlx_dist::sum_partials`]) and the bias added,
/// so every rank gets the whole output.
#[derive(Clone, Debug)]
pub struct ShardedToAllLinear {
    /// This rank's columns of the weight, `[output_dims, input_dims / N]`.
    pub weight: Param,
    /// The whole bias, `[output_dims]`, if present.
    pub bias: Option<Param>,
    /// The ranks the features are split over.
    pub group: Group,
}

impl_module!(ShardedToAllLinear { weight, bias });

impl ShardedToAllLinear {
    /// This rank's shard of the layer `Linear::new(input_dims, output_dims,
    /// bias, key)` would make. `input_dims` must divide by the group's size.
    pub fn new(
        input_dims: usize,
        output_dims: usize,
        bias: bool,
        group: &Group,
        key: &Array,
    ) -> Result<ShardedToAllLinear> {
        check_divides("ShardedToAllLinear", "input", input_dims, group.size())?;
        Self::from_linear(&Linear::new(input_dims, output_dims, bias, key)?, 1, group)
    }

    /// This rank's shard of `linear` (MLX's `from_linear`); with more than
    /// one of `segments` the input features are that many equal blocks,
    /// each split over the ranks.
    pub fn from_linear(linear: &Linear, segments: usize, group: &Group) -> Result<Self> {
        Ok(ShardedToAllLinear {
            weight: Param::new(shard_axis(linear.weight.value(), -1, segments, group)?),
            bias: linear.bias.clone(),
            group: group.clone(),
        })
    }

    /// `x W^T + b` of this rank's slice `x` (`[..., input_dims / N]`),
    /// whole on every rank: `[..., output_dims]`.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        let y = sum_partials(&x.matmul(&self.weight.value().t()?)?, &self.group)?;
        match &self.bias {
            Some(b) => y.add(b.value()),
            None => Ok(y),
        }
    }
}

/// A linear layer, whole or sharded: what a model's field holds when the
/// layer may be replaced by its sharded form in place (as MLX's models
/// assign `shard_linear`'s result to the attribute), or whole with a LoRA
/// or DoRA adapter (as mlx-lm's `linear_to_lora_layers` replaces it). Its
/// parameters keep their names (`weight`, `bias`) in the whole and sharded
/// forms; with an adapter they are the adapter's (`base.weight`, `lora_a`,
/// ...).
#[derive(Clone, Debug)]
pub enum AnyLinear {
    /// The whole layer.
    Linear(Linear),
    /// Output features split over a group.
    AllToSharded(AllToShardedLinear),
    /// Input features split over a group.
    ShardedToAll(ShardedToAllLinear),
    /// A whole layer, frozen, with a LoRA adapter.
    Lora(LoRALinear),
    /// A whole layer, frozen, with a DoRA adapter.
    Dora(DoRALinear),
}

impl AnyLinear {
    /// The layer's forward pass, whichever its form.
    pub fn forward(&self, x: &Array) -> Result<Array> {
        match self {
            AnyLinear::Linear(l) => l.forward(x),
            AnyLinear::AllToSharded(l) => l.forward(x),
            AnyLinear::ShardedToAll(l) => l.forward(x),
            AnyLinear::Lora(l) => l.forward_train(x, l.train_key.as_ref()),
            AnyLinear::Dora(l) => l.forward_train(x, l.train_key.as_ref()),
        }
    }

    /// The forward pass of an input whose gradient the caller sums over
    /// the group itself ([`AllToShardedLinear::forward_summed`]); the
    /// plain forward pass for the other forms.
    pub fn forward_summed(&self, x: &Array) -> Result<Array> {
        match self {
            AnyLinear::AllToSharded(l) => l.forward_summed(x),
            other => other.forward(x),
        }
    }

    /// `x` ready for [`forward_summed`](Self::forward_summed): for an
    /// all-to-sharded layer, `x` with its gradient summed over the group
    /// ([`mlx_dist::sum_gradients`]); `x` itself otherwise. Apply it once to
    /// an input that several layers read.
    pub fn sum_input_gradients(&self, x: &Array) -> Result<Array> {
        match self {
            AnyLinear::AllToSharded(l) => sum_gradients(x, &l.group),
            _ => Ok(x.clone()),
        }
    }

    /// The whole layer, put together from every rank's shard (an
    /// all_gather over the group; every rank must call it). Lazy. The
    /// inverse of [`shard_linear`] with one segment.
    pub fn unshard(&self) -> Result<Linear> {
        Ok(match self {
            AnyLinear::Linear(l) => l.clone(),
            AnyLinear::AllToSharded(l) => Linear {
                weight: Param::new(gather_axis(l.weight.value(), 0, &l.group)?),
                bias: match &l.bias {
                    Some(b) => Some(Param::new(gather_axis(b.value(), 0, &l.group)?)),
                    None => None,
                },
            },
            AnyLinear::ShardedToAll(l) => Linear {
                weight: Param::new(gather_axis(l.weight.value(), -1, &l.group)?),
                bias: l.bias.clone(),
            },
            AnyLinear::Lora(_) | AnyLinear::Dora(_) => {
                return Err(Error::Invalid {
                    op: "unshard",
                    message: "a layer with an adapter is never sharded: fuse it first".into(),
                });
            }
        })
    }

    /// The weight (this rank's shard of it, when sharded).
    pub fn weight(&self) -> &Param {
        match self {
            AnyLinear::Linear(l) => &l.weight,
            AnyLinear::AllToSharded(l) => &l.weight,
            AnyLinear::ShardedToAll(l) => &l.weight,
            AnyLinear::Lora(l) => &l.base.weight,
            AnyLinear::Dora(l) => &l.base.weight,
        }
    }

    /// The whole layer, if it is not sharded.
    pub fn as_linear(&self) -> Option<&Linear> {
        match self {
            AnyLinear::Linear(l) => Some(l),
            _ => None,
        }
    }

    /// How the layer is sharded, if it is.
    pub fn sharding(&self) -> Option<Sharding> {
        match self {
            AnyLinear::Linear(_) | AnyLinear::Lora(_) | AnyLinear::Dora(_) => None,
            AnyLinear::AllToSharded(_) => Some(Sharding::AllToSharded),
            AnyLinear::ShardedToAll(_) => Some(Sharding::ShardedToAll),
        }
    }
}

impl From<Linear> for AnyLinear {
    fn from(l: Linear) -> AnyLinear {
        AnyLinear::Linear(l)
    }
}

impl Module for AnyLinear {
    fn visit(&self, prefix: &str, f: &mut dyn FnMut(&str, &Param)) {
        match self {
            AnyLinear::Linear(l) => l.visit(prefix, f),
            AnyLinear::AllToSharded(l) => l.visit(prefix, f),
            AnyLinear::ShardedToAll(l) => l.visit(prefix, f),
            AnyLinear::Lora(l) => l.visit(prefix, f),
            AnyLinear::Dora(l) => l.visit(prefix, f),
        }
    }
    fn visit_mut(&mut self, prefix: &str, f: &mut dyn FnMut(&str, &mut Param)) {
        match self {
            AnyLinear::Linear(l) => l.visit_mut(prefix, f),
            AnyLinear::AllToSharded(l) => l.visit_mut(prefix, f),
            AnyLinear::ShardedToAll(l) => l.visit_mut(prefix, f),
            AnyLinear::Lora(l) => l.visit_mut(prefix, f),
            AnyLinear::Dora(l) => l.visit_mut(prefix, f),
        }
    }
}

/// `linear` cut for `group` as `sharding` says (MLX's `shard_linear`):
/// this rank's [`AllToShardedLinear`] or [`ShardedToAllLinear`] of it.
pub fn shard_linear(
    linear: &Linear,
    sharding: Sharding,
    segments: usize,
    group: &Group,
) -> Result<AnyLinear> {
    Ok(match sharding {
        Sharding::AllToSharded => {
            AnyLinear::AllToSharded(AllToShardedLinear::from_linear(linear, segments, group)?)
        }
        Sharding::ShardedToAll => {
            AnyLinear::ShardedToAll(ShardedToAllLinear::from_linear(linear, segments, group)?)
        }
    })
}

/// Replaces every parameter of `module` by this rank's shard of it (MLX's
/// `shard_inplace`), leaving the forward pass as it is: the caller adds the
/// communication ([`mlx_dist::sum_gradients`] before an all-to-sharded
/// layer, [`mlx_dist::sum_partials`] after a sharded-to-all one).
/// All-to-sharded cuts axis `max(ndim - 2, 0)` of every parameter
/// (a weight's output rows, a bias); sharded-to-all cuts the last axis and
/// leaves parameters named `bias` whole. An axis that does not split is an
/// error naming the parameter, and then nothing is changed.
pub fn shard_inplace(
    module: &mut dyn Module,
    sharding: Sharding,
    segments: usize,
    group: &Group,
) -> Result<()> {
    let mut cut: Vec<Result<Option<Array>>> = Vec::new();
    module.visit("", &mut |name, p| {
        let x = p.value();
        let axis = match sharding {
            Sharding::AllToSharded => Some(x.ndim().saturating_sub(2) as i32),
            Sharding::ShardedToAll if name == "bias" || name.ends_with(".bias") => None,
            Sharding::ShardedToAll => Some(-1),
        };
        cut.push(match axis {
            Some(axis) => {
                shard_axis(x, axis, segments, group)
                    .map(Some)
                    .map_err(|e| Error::Shape {
                        op: "shard_inplace",
                        message: format!("parameter `{name}`: {e}"),
                    })
            }
            None => Ok(None),
        });
    });
    let mut cut = cut.into_iter().collect::<Result<Vec<_>>>()?.into_iter();
    module.visit_mut("", &mut |_, p| {
        if let Some(Some(a)) = cut.next() {
            p.set(a);
        }
    });
    Ok(())
}

/// This rank's part of `x` along `axis`: of each of `segments` equal
/// blocks, the `rank`-th of `size` equal parts, in a buffer of its own (so
/// the whole array is freed once the caller drops it).
pub fn shard_axis(x: &Array, axis: i32, segments: usize, group: &Group) -> Result<Array> {
    let (n, r) = (group.size(), group.rank());
    let a = if axis < 0 {
        x.ndim() as i32 + axis
    } else {
        axis
    };
    if x.ndim() == 0 || a < 0 || a as usize >= x.ndim() {
        return Err(Error::Shape {
            op: "shard",
            message: format!("shape {:?} has no axis {axis}", x.shape()),
        });
    }
    let len = x.shape()[a as usize];
    if segments == 0 || !len.is_multiple_of(segments * n) {
        return Err(Error::Shape {
            op: "shard",
            message: format!(
                "axis {axis} of shape {:?} does not split into {segments} segment(s) over {n} ranks",
                x.shape()
            ),
        });
    }
    if n == 1 {
        return Ok(x.clone());
    }
    let parts = split(x, segments, a)?
        .iter()
        .map(|s| Ok(split(s, n, a)?.swap_remove(r)))
        .collect::<Result<Vec<_>>>()?;
    let mine = if parts.len() == 1 {
        parts.into_iter().next().expect("one part")
    } else {
        concatenate(&parts, a)?
    };
    owned(&mine)
}

/// Reads weights saved whole (by [`ModuleExt::save_weights`] or MLX) into a
/// module sharded over `group` (with [`shard_linear`] of one segment, or
/// [`shard_inplace`]): a parameter whose shape is the file's with one axis
/// divided by the group's size reads only this rank's block of it from the
/// memory-mapped file, so no rank ever holds a whole sharded tensor; the
/// others are read whole. Checked as [`ModuleExt::load_weights`] checks
/// (every parameter present, no extra tensor, the same dtype), each error
/// naming the tensor; on error nothing is changed.
pub fn load_sharded_weights(
    module: &mut dyn Module,
    path: impl AsRef<Path>,
    group: &Group,
) -> Result<()> {
    load_sharded_weights_except(module, path, group, |_| false)
}

/// [`load_sharded_weights`] of a module that holds part of the saved model
/// (a pipeline stage's blocks): tensors for which `elsewhere` is true are
/// not read, and not refused.
pub fn load_sharded_weights_except(
    module: &mut dyn Module,
    path: impl AsRef<Path>,
    group: &Group,
    elsewhere: impl Fn(&str) -> bool,
) -> Result<()> {
    let path = path.as_ref();
    let fmt = |message: String| Error::Format {
        path: path.display().to_string(),
        message,
    };
    let mut mine: BTreeMap<String, (Vec<usize>, Dtype)> = BTreeMap::new();
    module.visit("", &mut |name, p| {
        mine.insert(
            name.to_string(),
            (p.value().shape().to_vec(), p.value().dtype()),
        );
    });
    let (n, r) = (group.size(), group.rank());
    let problem: RefCell<Option<String>> = RefCell::new(None);
    let (loaded, _) = load_safetensors_parts(path, |name, file| {
        if elsewhere(name) {
            return Part::Skip;
        }
        let Some((want, _)) = mine.get(name) else {
            problem.borrow_mut().get_or_insert(format!(
                "unexpected tensor `{name}`: the model has no such parameter"
            ));
            return Part::Skip;
        };
        if want == file {
            return Part::Whole;
        }
        let differ: Vec<usize> = (0..file.len().min(want.len()))
            .filter(|&a| file[a] != want[a])
            .collect();
        match differ[..] {
            [axis] if file.len() == want.len() && file[axis] == want[axis] * n => Part::Block {
                axis,
                index: r,
                parts: n,
            },
            _ => {
                problem.borrow_mut().get_or_insert(format!(
                    "tensor `{name}` has shape {file:?}, which this rank's parameter of shape {want:?} is not a block of over {n} ranks"
                ));
                Part::Skip
            }
        }
    })?;
    if let Some(p) = problem.into_inner() {
        return Err(fmt(p));
    }
    for (name, (shape, dtype)) in &mine {
        match loaded.get(name) {
            None => {
                return Err(fmt(format!("missing tensor `{name}` (shape {shape:?})")));
            }
            Some(a) if a.dtype() != *dtype => {
                return Err(fmt(format!(
                    "tensor `{name}` has dtype {}, the model expects {dtype}",
                    a.dtype()
                )));
            }
            _ => {}
        }
    }
    module.update(&Tree::unflatten(loaded)?)
}

/// Every rank's `x` concatenated along `axis` in rank order (an all_gather;
/// every rank must call it; lazy): the inverse of [`shard_axis`] with one
/// segment.
pub fn gather_axis(x: &Array, axis: i32, group: &Group) -> Result<Array> {
    let a = if axis < 0 {
        x.ndim() as i32 + axis
    } else {
        axis
    };
    if a == 0 || group.size() == 1 {
        return all_gather(x, group);
    }
    // Along another axis: gathered as axis 0 of the array with it moved first.
    let moved = x.swapaxes(0, a)?.contiguous()?;
    all_gather(&moved, group)?.swapaxes(0, a)?.contiguous()
}

/// `x` in a buffer of its own: a slice is a view that would keep the whole
/// array's buffer alive. Arrays on the GPU become a dense copy there.
fn owned(x: &Array) -> Result<Array> {
    x.eval()?;
    let data = x.data()?;
    if data.storage().is_device() {
        return x.contiguous();
    }
    let dense = x.dense_data()?;
    let mut own = ArrayData::alloc(x.shape(), x.dtype());
    own.as_mut_slice::<u8>(x.nbytes())
        .copy_from_slice(dense.as_bytes(x.dtype(), x.size()));
    Ok(Array::from_data(own, x.shape().to_vec(), x.dtype()))
}

fn check_divides(op: &'static str, what: &str, dims: usize, n: usize) -> Result<()> {
    if !dims.is_multiple_of(n) {
        return Err(Error::Shape {
            op,
            message: format!("cannot shard the {what} of size {dims} across {n} ranks"),
        });
    }
    Ok(())
}
