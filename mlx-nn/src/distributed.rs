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
    // Group by the dtype they travel in, keeping the tree order inside a group.
    let mut by_dtype: BTreeMap<Dtype, Vec<usize>> = BTreeMap::new();
    for (i, (_, g)) in flat.iter().enumerate() {
        let wire = if g.dtype().is_float() {
            opts.communication_dtype.unwrap_or(g.dtype())
        } else {
            g.dtype()
        };
        by_dtype.entry(wire).or_default().push(i);
    }
    for (wire, idx) in by_dtype {
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0;
        let flush = |bucket: &mut Vec<usize>, out: &mut Vec<Option<Array>>| -> Result<()> {
            if bucket.is_empty() {
                return Ok(());
            }
            let parts = bucket
                .iter()
                .map(|&i| flat[i].1.astype(wire)?.reshape(&[-1]))
                .collect::<Result<Vec<_>>>()?;
            let summed = mlx_dist::all_sum(&concatenate(&parts, 0)?, group)?;
            let mut at = 0i64;
            for &i in bucket.iter() {
                let g = &flat[i].1;
                let len = g.size() as i64;
                let piece = summed.slice_axis(0, at, at + len)?;
                at += len;
                let mean = if g.dtype().is_float() {
                    piece.astype(g.dtype())?.div_scalar(n as f64)?
                } else {
                    piece
                        .astype(Dtype::F32)?
                        .div_scalar(n as f64)?
                        .astype(g.dtype())?
                };
                out[i] = Some(mlx_array::reshape_to(&mean, g.shape())?);
            }
            bucket.clear();
            Ok(())
        };
        for i in idx {
            let size = flat[i].1.size() * wire.size_of();
            if !bucket.is_empty() && bytes + size > opts.all_reduce_size {
                flush(&mut bucket, &mut out)?;
                bytes = 0;
            }
            bucket.push(i);
            bytes += size;
        }
        flush(&mut bucket, &mut out)?;
    }
    let averaged = flat
        .iter()
        .zip(out)
        .map(|((name, _), a)| (name.clone(), a.expect("every gradient is in a bucket")));
    let averaged: BTreeMap<String, Array> = averaged.collect();
    grads.map(|path, _| Ok(averaged[path].clone()))
}
