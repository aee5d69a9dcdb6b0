//! `average_gradients`: the one line data-parallel training adds.

use std::collections::BTreeMap;

use mlx_array::{Array, Dtype, Result, Tree, concatenate};
use mlx_dist::Group;

/// Options of [`average_gradients`].
#[derive(Clone, Debug)]
pub struct AverageOptions {
    /// Gradients are packed into buckets of about this many bytes, one
    /// `all_sum` each (MLX's `all_reduce_size`, 32 MiB by default); 0 sends
    /// every tensor on its own.
    pub all_reduce_size: usize,
    /// Cast to this dtype for communication (e.g. bf16) and back afterwards.
    pub communication_dtype: Option<Dtype>,
}

impl Default for AverageOptions {
    fn default() -> Self {
        AverageOptions {
            all_reduce_size: 32 << 20,
            communication_dtype: None,
        }
    }
}

/// The mean of `grads` over the ranks of `group`, as a tree of the same
/// structure (MLX's `nn.average_gradients`). The identity on a group of one.
///
/// Tensors are flattened and packed, per dtype, into buckets of about
/// `all_reduce_size` bytes; each bucket is summed with one `all_sum`, divided
/// by the group size, split and reshaped back. Everything is lazy: the
/// communication runs when the result is evaluated.
///
/// ```
/// use mlx_array::{Array, Dtype, Tree};
/// use mlx_nn::{average_gradients, AverageOptions};
/// let world = mlx_dist::init(mlx_dist::Backend::Any).unwrap();
/// let grads = Tree::unflatten(vec![("w".to_string(), Array::ones(&[3], Dtype::F32))]).unwrap();
/// let avg = average_gradients(&grads, &world, &AverageOptions::default()).unwrap();
/// assert_eq!(avg.get_array("w").unwrap().to_vec::<f32>().unwrap(), vec![1.0; 3]);
/// ```
pub fn average_gradients(grads: &Tree, group: &Group, opts: &AverageOptions) -> Result<Tree> {
    let n = group.size();
    if n == 1 {
        return Ok(grads.clone());
    }
    let flat = grads.flatten();
    let mut out: Vec<Option<Array>> = vec![None; flat.len()];
    let wire_of = |g: &Array| {
        if g.dtype().is_float() {
            opts.communication_dtype.unwrap_or(g.dtype())
        } else {
            g.dtype()
        }
    };
    let items: Vec<(Dtype, usize)> = flat.iter().map(|(_, g)| (wire_of(g), g.size())).collect();
    for (wire, bucket) in gradient_buckets(&items, opts.all_reduce_size) {
        let parts = bucket
            .iter()
            .map(|&i| flat[i].1.astype(wire)?.reshape(&[-1]))
            .collect::<Result<Vec<_>>>()?;
        let summed = mlx_dist::all_sum(&concatenate(&parts, 0)?, group)?;
        // When every tensor travels in its own float dtype, divide the
        // whole bucket (in its buffer) and hand out views of it: the
        // averaged gradients then take no memory beyond the bucket.
        let divide_bucket = bucket.iter().all(|&i| {
            let d = flat[i].1.dtype();
            d.is_float() && d == wire
        });
        let summed = if divide_bucket {
            summed.div_scalar(n as f64)?
        } else {
            summed
        };
        let mut at = 0i64;
        for &i in bucket.iter() {
            let g = &flat[i].1;
            let len = g.size() as i64;
            let piece = summed.slice_axis(0, at, at + len)?;
            at += len;
            let mean = if divide_bucket {
                piece
            } else if g.dtype().is_float() {
                piece.astype(g.dtype())?.div_scalar(n as f64)?
            } else {
                piece
                    .astype(Dtype::F32)?
                    .div_scalar(n as f64)?
                    .astype(g.dtype())?
            };
            out[i] = Some(mlx_array::reshape_to(&mean, g.shape())?);
        }
    }
    let averaged = flat
        .iter()
        .zip(out)
        .map(|((name, _), a)| (name.clone(), a.expect("every gradient is in a bucket")));
    let averaged: BTreeMap<String, Array> = averaged.collect();
    grads.map(|path, _| Ok(averaged[path].clone()))
}

/// Groups tensors into communication buckets: `items` are `(dtype, elements)`
/// in order; the result lists, per dtype (in dtype order), runs of indices
/// whose bytes add up to about `limit` (a tensor larger than `limit` gets a
/// bucket of its own; `limit` 0 puts every tensor alone). Order is kept
/// inside a dtype. Used by [`average_gradients`] and by optimizers that
/// shard their state (mlx-optim's `Sharded`), so both cut the same buckets.
///
/// ```
/// use mlx_array::Dtype;
/// let b = mlx_nn::gradient_buckets(&[(Dtype::F32, 4), (Dtype::F32, 4), (Dtype::F32, 4)], 32);
/// assert_eq!(b, vec![(Dtype::F32, vec![0, 1]), (Dtype::F32, vec![2])]);
/// ```
pub fn gradient_buckets(items: &[(Dtype, usize)], limit: usize) -> Vec<(Dtype, Vec<usize>)> {
    let mut by_dtype: BTreeMap<Dtype, Vec<usize>> = BTreeMap::new();
    for (i, (d, _)) in items.iter().enumerate() {
        by_dtype.entry(*d).or_default().push(i);
    }
    let mut out = Vec::new();
    for (dtype, idx) in by_dtype {
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0;
        for i in idx {
            let size = items[i].1 * dtype.size_of();
            if !bucket.is_empty() && bytes + size > limit {
                out.push((dtype, std::mem::take(&mut bucket)));
                bytes = 0;
            }
            bucket.push(i);
            bytes += size;
        }
        if !bucket.is_empty() {
            out.push((dtype, bucket));
        }
    }
    out
}
