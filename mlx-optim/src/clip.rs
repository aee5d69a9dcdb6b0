//! Gradient clipping by global norm.

use mlx_array::{Array, Dtype, Tree};

use crate::Result;

/// Scales `grads` so that their global L2 norm is at most `max_norm`
/// (MLX's `clip_grad_norm`) and returns the clipped tree with the norm
/// before clipping.
///
/// The norm is `sqrt(sum over leaves of sum(g^2))`, computed in float32 (or
/// wider); when it is not below `max_norm` every gradient is multiplied by
/// `max_norm / (norm + 1e-6)`. Gradients keep their dtype. Lazy, like every op.
///
/// ```
/// use mlx_array::{Array, Tree};
/// let grads = Tree::unflatten([
///     ("w1".to_string(), Array::from_slice(&[3.0f32, 0.0], &[2]).unwrap()),
///     ("w2".to_string(), Array::from_slice(&[4.0f32], &[1]).unwrap()),
/// ]).unwrap();
/// let (clipped, norm) = mlx_optim::clip_grad_norm(&grads, 1.0).unwrap();
/// assert_eq!(norm.item::<f32>().unwrap(), 5.0);
/// let w2 = clipped.get_array("w2").unwrap().item::<f32>().unwrap();
/// assert!((w2 - 0.8).abs() < 1e-6);
/// ```
pub fn clip_grad_norm(grads: &Tree, max_norm: f64) -> Result<(Tree, Array)> {
    clip_by_norm_squared(grads, max_norm, Ok)
}

/// [`clip_grad_norm`] where `total` turns the squared norm of `grads` into
/// the squared norm the clipping goes by (for shards: its sum over ranks;
/// for tensor-parallel shards, the sharded parameters' squares summed over
/// the ranks plus the whole ones').
pub fn clip_by_norm_squared(
    grads: &Tree,
    max_norm: f64,
    total: impl FnOnce(Array) -> Result<Array>,
) -> Result<(Tree, Array)> {
    let mut norm_sq = Array::scalar(0.0f32);
    for g in grads.leaves() {
        let g = g.astype(Dtype::F32)?;
        norm_sq = norm_sq.add(&g.square()?.sum_all()?)?;
    }
    let total = total(norm_sq)?.sqrt()?;
    let normalizer = total.scalar_like(max_norm).div(&total.add_scalar(1e-6)?)?;
    let keep = total.less(&total.scalar_like(max_norm))?;
    let clipped = grads.map(|_, g| {
        let scaled = g.mul(&normalizer.astype(g.dtype())?)?;
        keep.where_(g, &scaled)
    })?;
    Ok((clipped, total))
}
