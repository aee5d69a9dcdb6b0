//! Gradients with respect to a model's trainable parameters.

use mlx_array::{Array, Dtype, Result, Tree};

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

/// [`value_and_grad`] with the model run in `compute` (bfloat16 or float16)
/// while its parameters stay in their own dtype: mixed precision with
/// float32 master weights, as PyTorch's autocast or MLX's bfloat16 model
/// with a float32 copy.
///
/// Every floating-point parameter is cast to `compute` for the call (the
/// trainable ones inside the traced function), so the forward and backward
/// passes run in `compute`, and the gradients come back through the casts
/// in the parameters' own dtype, ready for a float32 optimizer. The loss is
/// returned in float32. With `compute` equal to the parameters' dtype this
/// is [`value_and_grad`].
///
/// ```
/// use mlx_array::{Array, Dtype, random};
/// use mlx_nn::{value_and_grad_in, Linear, ModuleExt};
/// let mut model = Linear::new(3, 1, true, &random::key(0)).unwrap();
/// let loss_fn = |m: &Linear, x: &Array| m.forward(x)?.square()?.mean_all();
/// let loss_and_grad = value_and_grad_in(Dtype::BF16, loss_fn);
/// let x = Array::ones(&[4, 3], Dtype::BF16);
/// let (loss, grads) = loss_and_grad(&mut model, &x).unwrap();
/// assert_eq!(loss.dtype(), Dtype::F32);
/// assert_eq!(grads.get_array("weight").unwrap().dtype(), Dtype::F32);
/// ```
pub fn value_and_grad_in<M, A, F>(
    compute: Dtype,
    f: F,
) -> impl Fn(&mut M, &A) -> Result<(Array, Tree)>
where
    M: Module,
    F: Fn(&M, &A) -> Result<Array>,
{
    let cast = move |t: &Tree| {
        t.map(|_, p| {
            if p.dtype().is_float() && p.dtype() != compute {
                p.astype(compute)
            } else {
                Ok(p.clone())
            }
        })
    };
    move |model: &mut M, args: &A| {
        let all = model.parameters();
        let trainable = model.trainable_parameters();
        // The frozen parameters in `compute` too, outside the trace.
        model.update(&cast(&all)?)?;
        let result = mlx_array::value_and_grad_tree(
            |params| {
                model.update(&cast(params)?)?;
                f(model, args)?.astype(Dtype::F32)
            },
            &trainable,
        );
        model.update(&all)?;
        result
    }
}
