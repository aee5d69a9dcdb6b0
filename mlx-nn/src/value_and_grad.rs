//! Gradients with respect to a model's trainable parameters.

use mlx_array::{Array, Result, Tree};

use crate::{Module, ModuleExt};

/// Turns `f(model, args) -> scalar loss` into a function returning the loss
/// and its gradient with respect to the model's trainable parameters, as a
/// tree with their structure (MLX's `nn.value_and_grad(model, fn)`).
///
/// The model is traced with stand-ins for its parameters during the call and
/// restored afterwards; the loss and gradients are lazy, so evaluate them
/// together with the optimizer update.
///
/// ```
/// use mlx_array::{Array, Dtype, random};
/// use mlx_nn::{value_and_grad, Linear, ModuleExt};
/// let mut model = Linear::new(3, 1, true, &random::key(0)).unwrap();
/// let loss_fn = |m: &Linear, (x, y): &(Array, Array)| m.forward(x)?.subtract(y)?.square()?.mean_all();
/// let loss_and_grad = value_and_grad(loss_fn);
/// let x = Array::ones(&[4, 3], Dtype::F32);
/// let y = Array::zeros(&[4, 1], Dtype::F32);
/// let (loss, grads) = loss_and_grad(&mut model, &(x, y)).unwrap();
/// assert_eq!(grads.get_array("weight").unwrap().shape(), &[1, 3]);
/// # let _ = loss;
/// ```
pub fn value_and_grad<M, A, F>(f: F) -> impl Fn(&mut M, &A) -> Result<(Array, Tree)>
where
    M: Module,
    F: Fn(&M, &A) -> Result<Array>,
{
    move |model: &mut M, args: &A| {
        let trainable = model.trainable_parameters();
        let result = mlx_array::value_and_grad_tree(
            |params| {
                model.update(params)?;
                f(model, args)
            },
            &trainable,
        );
        model.update(&trainable)?;
        result
    }
}
