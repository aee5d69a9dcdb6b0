//! `optimizer.update(&mut model, &grads)`: optimizers applied to `mlx-nn` modules.

use mlx_array::Tree;
use mlx_nn::{Module, ModuleExt};

use crate::{Optimizer, Result};

/// Updates a model in place from its gradients, as MLX's
/// `optimizer.update(model, grads)`. Implemented for every [`Optimizer`].
///
/// ```
/// use mlx_array::{eval, random, Array, Dtype};
/// use mlx_nn::{losses, value_and_grad, Linear, ModuleExt};
/// use mlx_optim::{AdamW, ModuleOptimizer, Optimizer};
/// let mut model = Linear::new(3, 1, true, &random::key(0)).unwrap();
/// let mut opt = AdamW::new(1e-2);
/// let step = value_and_grad(|m: &Linear, x: &Array| m.forward(x)?.square()?.mean_all());
/// let (loss, grads) = step(&mut model, &Array::ones(&[4, 3], Dtype::F32)).unwrap();
/// opt.update(&mut model, &grads).unwrap();
/// eval((&loss, &model.parameters(), opt.state())).unwrap();
/// ```
pub trait ModuleOptimizer {
    /// Applies one step to `model`'s trainable parameters from `grads` (a tree
    /// shaped like them); lazy until evaluated.
    fn update<M: Module + ?Sized>(&mut self, model: &mut M, grads: &Tree) -> Result<()>;
}

impl<O: Optimizer + ?Sized> ModuleOptimizer for O {
    fn update<M: Module + ?Sized>(&mut self, model: &mut M, grads: &Tree) -> Result<()> {
        let new = self.apply_gradients(grads, &model.trainable_parameters())?;
        model.update(&new)?;
        Ok(())
    }
}
