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

/// The mean over the ranks of `group` of a gradient that is zero outside
/// some of its rows, like an embedding's, which is zero outside the rows of
/// the tokens of this rank's batch: each rank sends only its rows, instead
/// of the whole table (PyTorch's sparse embedding gradients under DDP).
///
/// `rows` lists this rank's rows that may be nonzero (indices along axis 0
/// of `grad`, in any order, repeats allowed: the tokens of its batch);
/// every rank must pass the same `capacity`, at least its number of
/// distinct rows (the number of tokens of a batch is enough). Each rank
/// sends its distinct rows, padded with zero rows to `capacity`, and their
/// indices; every rank adds the rows of all ranks into zeros in rank order
/// and divides by the group size. With two ranks this is bit for bit what
/// [`average_gradients`] gives for the whole gradient (each element is one
/// sum of two values either way); with more it rounds like any other order
/// of the same sums. `communication_dtype` (e.g. bf16) is the dtype the
/// rows travel in; they are added in `grad`'s dtype. The identity on a group
/// of one. Lazy, like [`average_gradients`].
///
/// ```
/// use mlx_array::{Array, Dtype};
/// let world = mlx_dist::init(mlx_dist::Backend::Any).unwrap();
/// let grad = Array::from_slice(&[0.0f32, 0.0, 1.0, 2.0, 0.0, 0.0], &[3, 2]).unwrap();
/// let avg = mlx_nn::average_sparse_rows(&grad, &[1, 1], 2, &world, None).unwrap();
/// assert_eq!(avg.to_vec::<f32>().unwrap(), grad.to_vec::<f32>().unwrap());
/// ```
pub fn average_sparse_rows(
    grad: &Array,
    rows: &[u32],
    capacity: usize,
    group: &Group,
    communication_dtype: Option<Dtype>,
) -> Result<Array> {
    let n = group.size();
    if n == 1 {
        return Ok(grad.clone());
    }
    let invalid = |message: String| mlx_array::Error::Invalid {
        op: "average_sparse_rows",
        message,
    };
    let Some(&table_rows) = grad.shape().first() else {
        return Err(invalid("the gradient must have at least one axis".into()));
    };
    let mut distinct = rows.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if let Some(&bad) = distinct.iter().find(|&&r| r as usize >= table_rows) {
        return Err(invalid(format!(
            "row {bad} is outside the gradient's {table_rows} rows"
        )));
    }
    if distinct.len() > capacity {
        return Err(invalid(format!(
            "{} distinct rows do not fit the capacity of {capacity}",
            distinct.len()
        )));
    }
    let used = distinct.len();
    // Padding repeats the last index (or row 0) with zero rows: adding
    // zeros changes no sum.
    let pad = distinct.last().copied().unwrap_or(0);
    let ids: Vec<u32> = distinct
        .iter()
        .copied()
        .chain(std::iter::repeat_n(pad, capacity - used))
        .collect();
    let picked = grad.take(&Array::from_slice(&distinct, &[used])?, 0)?;
    let mut row_shape = grad.shape().to_vec();
    row_shape[0] = capacity - used;
    let mine = if used < capacity {
        concatenate(&[picked, Array::zeros(&row_shape, grad.dtype())], 0)?
    } else {
        picked
    };
    let wire = match communication_dtype {
        Some(d) if grad.dtype().is_float() && d != grad.dtype() => Some(d),
        _ => None,
    };
    let mine = match wire {
        Some(d) => mine.astype(d)?,
        None => mine,
    };
    let all_ids = mlx_dist::all_gather(&Array::from_slice(&ids, &[capacity])?, group)?;
    let all_rows = mlx_dist::all_gather(&mine, group)?;
    let all_rows = match wire {
        Some(_) => all_rows.astype(grad.dtype())?,
        None => all_rows,
    };
    // The gradient of a `take` of these rows: each row added, in order,
    // into a zero table.
    let sum = Array::from_primitive(
        mlx_array::primitives::indexing::ScatterAdd {
            axis: 0,
            along_axis: false,
        },
        vec![all_rows, all_ids],
        grad.shape().to_vec(),
        grad.dtype(),
    );
    sum.div_scalar(n as f64)
}

/// The most bytes the first bucket of [`gradient_buckets`] holds (PyTorch
/// DDP's first bucket cap, 1 MiB).
pub const FIRST_BUCKET_BYTES: usize = 1 << 20;

/// Groups tensors into communication buckets: `items` are `(dtype, elements)`
/// in the model's order (its parameters' names, which for most models is
/// the order the forward pass uses them); the result lists, per dtype (in
/// dtype order), buckets of indices whose bytes add up to about `limit` (a
/// tensor larger than `limit` gets a bucket of its own; `limit` 0 puts
/// every tensor alone). As PyTorch's DDP, buckets are cut from the last
/// tensor to the first, the order in which a backward pass produces the
/// gradients, and the first bucket holds at most `FIRST_BUCKET_BYTES` (1 MiB):
/// the gradients that exist first are not held back until the later
/// tensors of a large bucket exist, so their collective starts while the
/// backward pass goes on. Indices inside a bucket are in ascending order.
/// Used by [`average_gradients`] and by optimizers that shard their state
/// (mlx-optim's `Sharded`), so both cut the same buckets.
///
/// ```
/// use mlx_array::Dtype;
/// let b = mlx_nn::gradient_buckets(&[(Dtype::F32, 4), (Dtype::F32, 4), (Dtype::F32, 4)], 32);
/// assert_eq!(b, vec![(Dtype::F32, vec![1, 2]), (Dtype::F32, vec![0])]);
/// // The first bucket (the last tensors) stops at 1 MiB, later ones at the limit.
/// let mib = 1 << 18; // f32 elements in a MiB
/// let b = mlx_nn::gradient_buckets(&[(Dtype::F32, mib), (Dtype::F32, mib), (Dtype::F32, mib)], 32 << 20);
/// assert_eq!(b, vec![(Dtype::F32, vec![2]), (Dtype::F32, vec![0, 1])]);
/// ```
pub fn gradient_buckets(items: &[(Dtype, usize)], limit: usize) -> Vec<(Dtype, Vec<usize>)> {
    let mut by_dtype: BTreeMap<Dtype, Vec<usize>> = BTreeMap::new();
    for (i, (d, _)) in items.iter().enumerate() {
        by_dtype.entry(*d).or_default().push(i);
    }
    let mut out = Vec::new();
    for (dtype, idx) in by_dtype {
        let mut cap = limit.min(FIRST_BUCKET_BYTES);
        let mut bucket: Vec<usize> = Vec::new();
        let mut bytes = 0;
        let mut close = |bucket: &mut Vec<usize>| {
            let mut b = std::mem::take(bucket);
            b.reverse();
            out.push((dtype, b));
        };
        for i in idx.into_iter().rev() {
            let size = items[i].1 * dtype.size_of();
            if !bucket.is_empty() && bytes + size > cap {
                close(&mut bucket);
                bytes = 0;
                cap = limit;
            }
            bucket.push(i);
            bytes += size;
        }
        if !bucket.is_empty() {
            close(&mut bucket);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use mlx_array::random;

    /// Rank `r`'s embedding-like gradient: zero except at `rows`, where it
    /// holds the rows' sums of random values (repeated rows add up).
    fn sparse_grad(r: usize, rows: &[u32], table: usize, dims: usize) -> Array {
        let k = random::key(100 + r as u64);
        let vals = random::normal(&k, &[rows.len(), dims], Dtype::F32).unwrap();
        let ids = Array::from_slice(rows, &[rows.len()]).unwrap();
        Array::from_primitive(
            mlx_array::primitives::indexing::ScatterAdd {
                axis: 0,
                along_axis: false,
            },
            vec![vals, ids],
            vec![table, dims],
            Dtype::F32,
        )
    }

    fn rows_of(r: usize) -> Vec<u32> {
        // Overlapping between ranks, with repeats, unsorted.
        (0..12u32).map(|i| (i * 7 + 3 * r as u32) % 17).collect()
    }

    #[test]
    fn sparse_rows_average_like_the_dense_gradient() {
        for world in [2usize, 3] {
            let outs = mlx_dist::run_local(world, |g| {
                let grad = sparse_grad(g.rank(), &rows_of(g.rank()), 20, 5);
                let tree = Tree::unflatten([("w".to_string(), grad.clone())]).unwrap();
                let dense = average_gradients(&tree, &g, &AverageOptions::default()).unwrap();
                let dense = dense.get_array("w").unwrap().to_vec::<f32>().unwrap();
                let sparse = average_sparse_rows(&grad, &rows_of(g.rank()), 12, &g, None)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let bf16 =
                    average_sparse_rows(&grad, &rows_of(g.rank()), 16, &g, Some(Dtype::BF16))
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                (dense, sparse, bf16)
            })
            .unwrap();
            for (dense, sparse, bf16) in &outs {
                if world == 2 {
                    // One sum of two values per element either way.
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(dense), bits(sparse));
                } else {
                    for (d, s) in dense.iter().zip(sparse) {
                        assert!((d - s).abs() <= 1e-6 * (1.0 + d.abs()), "{d} vs {s}");
                    }
                }
                for (d, b) in dense.iter().zip(bf16) {
                    assert!((d - b).abs() <= 1e-2 * (1.0 + d.abs()), "{d} vs {b}");
                }
                assert_eq!(&outs[0].1, sparse, "every rank has the same average");
            }
        }
    }

    #[test]
    fn sparse_rows_check_their_arguments() {
        let outs = mlx_dist::run_local(2, |g| {
            let grad = Array::zeros(&[4, 2], Dtype::F32);
            let out_of_range = average_sparse_rows(&grad, &[4], 1, &g, None).err();
            let too_many = average_sparse_rows(&grad, &[0, 1, 2], 2, &g, None).err();
            // No rows at all: zeros come back.
            let none = average_sparse_rows(&grad, &[], 3, &g, None)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            (
                out_of_range.map(|e| e.to_string()),
                too_many.map(|e| e.to_string()),
                none,
            )
        })
        .unwrap();
        for (range, many, none) in outs {
            assert!(range.unwrap().contains("outside"));
            assert!(many.unwrap().contains("capacity"));
            assert_eq!(none, vec![0.0; 8]);
        }
    }

    #[test]
    fn buckets_are_cut_from_the_last_tensor_with_a_small_first_one() {
        let f = Dtype::F32;
        // Every tensor alone with a limit of 0, last first.
        assert_eq!(
            gradient_buckets(&[(f, 1), (f, 1)], 0),
            vec![(f, vec![1]), (f, vec![0])]
        );
        // The reference Llama in bf16: the output projection (the first
        // gradient to exist) alone, the layers together.
        let mib = 1 << 20;
        let items = [
            (Dtype::BF16, mib),
            (Dtype::BF16, 4096),
            (Dtype::BF16, 12 * mib),
        ];
        assert_eq!(
            gradient_buckets(&items, 32 << 20),
            vec![(Dtype::BF16, vec![2]), (Dtype::BF16, vec![0, 1])]
        );
        // Small tensors share the first bucket up to 1 MiB; dtypes apart.
        let items = [(f, 1000), (Dtype::BF16, 10), (f, 1000), (f, 300_000)];
        assert_eq!(
            gradient_buckets(&items, 32 << 20),
            vec![(Dtype::BF16, vec![1]), (f, vec![3]), (f, vec![0, 2])]
        );
    }
}
