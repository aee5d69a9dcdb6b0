//! Reductions and the composites built from them (mean, var, logsumexp, softmax).

use crate::primitives::reduce::{ArgReduce, CumSum, Reduce, ReduceOp};
use crate::shape::{normalize_axes, normalize_axis};
use crate::{Array, Dtype, Result};

fn reduce(
    op: ReduceOp,
    x: &Array,
    axes: &[i32],
    keepdims: bool,
    name: &'static str,
) -> Result<Array> {
    let axes = normalize_axes(name, axes, x.ndim())?;
    let kept: Vec<usize> = (0..x.ndim())
        .filter(|a| !axes.contains(a))
        .map(|a| x.shape()[a])
        .collect();
    let dtype = match (op, x.dtype()) {
        (ReduceOp::Sum | ReduceOp::Prod, Dtype::Bool) => Dtype::I32,
        (_, d) => d,
    };
    let out = if axes.is_empty() {
        x.astype(dtype)?
    } else {
        Array::from_primitive(
            Reduce {
                op,
                axes: axes.clone(),
            },
            vec![x.clone()],
            kept,
            dtype,
        )
    };
    if keepdims {
        keep(&out, x.shape(), &axes)
    } else {
        Ok(out)
    }
}

/// Reinserts reduced axes as size 1.
fn keep(out: &Array, in_shape: &[usize], axes: &[usize]) -> Result<Array> {
    let shape: Vec<usize> = (0..in_shape.len())
        .map(|a| if axes.contains(&a) { 1 } else { in_shape[a] })
        .collect();
    out.reshape(&shape.iter().map(|&d| d as i64).collect::<Vec<_>>())
}

fn all_axes(x: &Array) -> Vec<i32> {
    (0..x.ndim() as i32).collect()
}

macro_rules! reductions {
    ($($(#[$m:meta])* $f:ident, $all:ident => $op:ident),+ $(,)?) => {
        $(
            $(#[$m])*
            pub fn $f(x: &Array, axes: &[i32], keepdims: bool) -> Result<Array> {
                reduce(ReduceOp::$op, x, axes, keepdims, stringify!($f))
            }
        )+
        impl Array {
            $(
                $(#[$m])*
                pub fn $f(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
                    $f(self, axes, keepdims)
                }
                /// The same over every axis, giving a scalar.
                pub fn $all(&self) -> Result<Array> {
                    $f(self, &all_axes(self), false)
                }
            )+
        }
    };
}

reductions! {
    /// Sum over `axes` (bools count as int32).
    sum, sum_all => Sum,
    /// Product over `axes`.
    prod, prod_all => Prod,
    /// Maximum over `axes` (NaN propagates).
    max, max_all => Max,
    /// Minimum over `axes` (NaN propagates).
    min, min_all => Min,
}

/// Mean over `axes` (integers give float32).
pub fn mean(x: &Array, axes: &[i32], keepdims: bool) -> Result<Array> {
    let ax = normalize_axes("mean", axes, x.ndim())?;
    let count: usize = ax.iter().map(|&a| x.shape()[a]).product();
    let xf = x.astype(x.dtype().to_float())?;
    sum(&xf, axes, keepdims)?.div_scalar(count as f64)
}

/// Variance over `axes` with `ddof` delta degrees of freedom.
pub fn var(x: &Array, axes: &[i32], keepdims: bool, ddof: usize) -> Result<Array> {
    let ax = normalize_axes("var", axes, x.ndim())?;
    let count: usize = ax.iter().map(|&a| x.shape()[a]).product();
    let xf = x.astype(x.dtype().to_float())?;
    let centered = xf.subtract(&mean(&xf, axes, true)?)?;
    let ss = sum(&centered.square()?, axes, keepdims)?;
    ss.div_scalar(count.saturating_sub(ddof) as f64)
}

/// `log(sum(exp(x)))` over `axes`, computed stably.
pub fn logsumexp(x: &Array, axes: &[i32], keepdims: bool) -> Result<Array> {
    let xf = x.astype(x.dtype().to_float())?;
    let m = max(&xf, axes, true)?.stop_gradient()?;
    // An all -inf (or +inf) slice would give inf - inf; shift by 0 there instead.
    let finite = m.abs()?.less(&m.scalar_like(f64::INFINITY))?;
    let m = finite.where_(&m, &m.scalar_like(0.0))?;
    let s = sum(&xf.subtract(&m)?.exp()?, axes, true)?.log()?.add(&m)?;
    if keepdims {
        Ok(s)
    } else {
        s.squeeze(
            &normalize_axes("logsumexp", axes, x.ndim())?
                .iter()
                .map(|&a| a as i32)
                .collect::<Vec<_>>(),
        )
    }
}

/// Softmax over `axes`: `exp(x - max) / sum(exp(x - max))`. Over the last
/// axis alone it is one primitive (one pass per row, and only its result
/// kept for the gradient); over other axes, the composite graph.
pub fn softmax(x: &Array, axes: &[i32]) -> Result<Array> {
    let xf = x.astype(x.dtype().to_float())?;
    if x.ndim() > 0 && normalize_axes("softmax", axes, x.ndim())? == [x.ndim() - 1] {
        return Ok(Array::from_primitive(
            crate::primitives::softmax::Softmax,
            vec![xf.clone()],
            xf.shape().to_vec(),
            xf.dtype(),
        ));
    }
    let m = max(&xf, axes, true)?.stop_gradient()?;
    let e = xf.subtract(&m)?.exp()?;
    e.divide(&sum(&e, axes, true)?)
}

/// Per-row softmax cross-entropy over the last axis: `logsumexp(logits) -
/// logits[target]`, fused so that neither the loss nor its gradient
/// materialises a log-softmax. `targets` has the logits' shape without the
/// last axis.
pub fn cross_entropy(logits: &Array, targets: &Array) -> Result<Array> {
    if !logits.dtype().is_float() {
        return Err(crate::Error::dtype(
            "cross_entropy",
            logits.dtype(),
            "logits must be floating point",
        ));
    }
    if !targets.dtype().is_integer() {
        return Err(crate::Error::dtype(
            "cross_entropy",
            targets.dtype(),
            "targets must be integers",
        ));
    }
    if logits.ndim() == 0 || targets.shape() != &logits.shape()[..logits.ndim() - 1] {
        return Err(crate::Error::shape(
            "cross_entropy",
            format!(
                "targets of shape {:?} do not match logits of shape {:?} without the class axis",
                targets.shape(),
                logits.shape()
            ),
        ));
    }
    Ok(Array::from_primitive(
        crate::primitives::loss::CrossEntropy,
        vec![logits.clone(), targets.clone()],
        targets.shape().to_vec(),
        logits.dtype(),
    ))
}

/// Per-row softmax cross-entropy of the logits `h @ weight^T` over the
/// last axis, fused with the output projection so that the `[..., V]` logits
/// are never materialised: the forward pass and its gradient each compute
/// them one chunk of classes at a time (`opts.chunk`). `h` is `[..., D]`,
/// `weight` is `[V, D]` (as a linear layer stores it, same float
/// dtype as `h`), `targets` are integers of shape `h.shape[..-1]`. The losses
/// are f32. The gradient recomputes the logits once more (one extra GEMM of
/// the projection's size) in exchange for memory that no longer grows with
/// `V` times the number of rows.
///
/// ```
/// use mlx_array::{Array, linear_cross_entropy, primitives::loss::LinearCrossEntropyOptions};
/// let h = Array::from_slice(&[1.0f32, 0.0, 0.0, 1.0], &[2, 2]).unwrap();
/// let w = Array::from_slice(&[2.0f32, 0.0, 0.0, 2.0], &[2, 2]).unwrap();
/// let t = Array::from_slice(&[0i32, 1], &[2]).unwrap();
/// let loss = linear_cross_entropy(&h, &w, &t, &LinearCrossEntropyOptions::default()).unwrap();
/// let want = (1.0 + (-2f32).exp()).ln();
/// assert!(loss.to_vec::<f32>().unwrap().iter().all(|l| (l - want).abs() < 1e-6));
/// ```
pub fn linear_cross_entropy(
    h: &Array,
    weight: &Array,
    targets: &Array,
    opts: &crate::primitives::loss::LinearCrossEntropyOptions,
) -> Result<Array> {
    check_linear_cross_entropy("linear_cross_entropy", h, weight, targets, opts)?;
    Ok(Array::from_primitive(
        crate::primitives::loss::LinearCrossEntropy(*opts),
        vec![h.clone(), weight.clone(), targets.clone()],
        targets.shape().to_vec(),
        Dtype::F32,
    ))
}

/// `sum(row_weights * linear_cross_entropy(h, weight, targets))`, a scalar,
/// computed together with its gradient: for a loss that is about to be
/// differentiated (a training step), where it saves a GEMM of the output
/// projection's size and a pass of exponentials over the logits against
/// [`linear_cross_entropy`]'s forward and backward. The gradient is ready
/// when the value is, so evaluating the value alone (say, for validation)
/// wastes two GEMMs: use [`linear_cross_entropy`] there. Rows are taken a
/// block at a time (equal blocks over the whole vocabulary, of at most 24
/// MiB of logits or a ninth of the rows, whichever is more).
/// `row_weights` (float, `targets`' shape; e.g. a loss mask times a scale)
/// are constants: no gradient flows to them.
///
/// ```
/// use mlx_array::{Array, linear_cross_entropy, linear_cross_entropy_sum, value_and_grad};
/// use mlx_array::primitives::loss::LinearCrossEntropyOptions;
/// let h = Array::from_slice(&[1.0f32, 0.5, -0.5, 1.0], &[2, 2]).unwrap();
/// let w = Array::from_slice(&[2.0f32, 0.0, 0.0, 2.0, 1.0, 1.0], &[3, 2]).unwrap();
/// let t = Array::from_slice(&[0i32, 2], &[2]).unwrap();
/// let rw = Array::from_slice(&[0.5f32, 2.0], &[2]).unwrap();
/// let o = LinearCrossEntropyOptions::default();
/// let fused = |x: &[Array]| linear_cross_entropy_sum(&x[0], &x[1], &t, &rw, &o);
/// let plain = |x: &[Array]| linear_cross_entropy(&x[0], &x[1], &t, &o)?.multiply(&rw)?.sum_all();
/// let (a, ga) = value_and_grad(fused, &[0, 1])(&[h.clone(), w.clone()]).unwrap();
/// let (b, gb) = value_and_grad(plain, &[0, 1])(&[h, w]).unwrap();
/// assert!((a.item::<f32>().unwrap() - b.item::<f32>().unwrap()).abs() < 1e-5);
/// for (x, y) in ga.iter().zip(&gb) {
///     for (p, q) in x.to_vec::<f32>().unwrap().iter().zip(y.to_vec::<f32>().unwrap()) {
///         assert!((p - q).abs() < 1e-5);
///     }
/// }
/// ```
pub fn linear_cross_entropy_sum(
    h: &Array,
    weight: &Array,
    targets: &Array,
    row_weights: &Array,
    opts: &crate::primitives::loss::LinearCrossEntropyOptions,
) -> Result<Array> {
    const OP: &str = "linear_cross_entropy_sum";
    check_linear_cross_entropy(OP, h, weight, targets, opts)?;
    if row_weights.shape() != targets.shape() || !row_weights.dtype().is_float() {
        return Err(crate::Error::shape(
            OP,
            format!(
                "row weights must be floats shaped like the targets {:?}; got {} {:?}",
                targets.shape(),
                row_weights.dtype(),
                row_weights.shape()
            ),
        ));
    }
    let row_weights = crate::stop_gradient(&row_weights.astype(Dtype::F32)?)?;
    if !crate::autodiff::is_tracing() {
        // Not about to be differentiated: the loss alone, without the
        // gradient GEMMs the fused pass would spend.
        return linear_cross_entropy(h, weight, targets, opts)?
            .multiply(&row_weights)?
            .sum_all();
    }
    let node = crate::primitives::loss::LinearCrossEntropyValueAndGrad(*opts);
    Ok(node.build(h, weight, targets, row_weights).swap_remove(0))
}

/// The argument checks shared by the fused output projection + loss ops.
fn check_linear_cross_entropy(
    op: &'static str,
    h: &Array,
    weight: &Array,
    targets: &Array,
    opts: &crate::primitives::loss::LinearCrossEntropyOptions,
) -> Result<()> {
    if !h.dtype().is_float() || weight.dtype() != h.dtype() {
        return Err(crate::Error::dtype(
            op,
            weight.dtype(),
            format!(
                "hidden states and weight must share one float dtype (hidden states are {})",
                h.dtype()
            ),
        ));
    }
    if !targets.dtype().is_integer() {
        return Err(crate::Error::dtype(
            op,
            targets.dtype(),
            "targets must be integers",
        ));
    }
    if h.ndim() == 0
        || weight.ndim() != 2
        || weight.shape()[0] == 0
        || weight.shape()[1] != h.shape()[h.ndim() - 1]
        || targets.shape() != &h.shape()[..h.ndim() - 1]
    {
        return Err(crate::Error::shape(
            op,
            format!(
                "expected hidden states [..., D], a weight [V >= 1, D] and targets [...]; got {:?}, {:?} and {:?}",
                h.shape(),
                weight.shape(),
                targets.shape()
            ),
        ));
    }
    if !(0.0..1.0).contains(&opts.label_smoothing) {
        return Err(crate::Error::invalid(
            op,
            format!(
                "label_smoothing must be in [0, 1), got {}",
                opts.label_smoothing
            ),
        ));
    }
    Ok(())
}

fn arg_reduce(is_max: bool, x: &Array, axis: i32, keepdims: bool) -> Result<Array> {
    let name = if is_max { "argmax" } else { "argmin" };
    let a = normalize_axis(name, axis, x.ndim())?;
    if x.shape()[a] == 0 {
        return Err(crate::Error::shape(
            name,
            format!("axis {a} of shape {:?} is empty", x.shape()),
        ));
    }
    let kept: Vec<usize> = (0..x.ndim())
        .filter(|&i| i != a)
        .map(|i| x.shape()[i])
        .collect();
    let out = Array::from_primitive(
        ArgReduce { is_max, axis: a },
        vec![x.clone()],
        kept,
        Dtype::U32,
    );
    if keepdims {
        keep(&out, x.shape(), &[a])
    } else {
        Ok(out)
    }
}

/// Index of the first maximum along `axis`, as uint32.
pub fn argmax(x: &Array, axis: i32, keepdims: bool) -> Result<Array> {
    arg_reduce(true, x, axis, keepdims)
}

/// Index of the first minimum along `axis`, as uint32.
pub fn argmin(x: &Array, axis: i32, keepdims: bool) -> Result<Array> {
    arg_reduce(false, x, axis, keepdims)
}

/// Cumulative sum along `axis`; `reverse` scans from the end, `inclusive`
/// includes the current element.
pub fn cumsum(x: &Array, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
    let a = normalize_axis("cumsum", axis, x.ndim())?;
    let dtype = if x.dtype() == Dtype::Bool {
        Dtype::I32
    } else {
        x.dtype()
    };
    Ok(Array::from_primitive(
        CumSum {
            axis: a,
            reverse,
            inclusive,
        },
        vec![x.clone()],
        x.shape().to_vec(),
        dtype,
    ))
}

impl Array {
    /// See [`mean`].
    pub fn mean(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        mean(self, axes, keepdims)
    }
    /// The mean of every element.
    pub fn mean_all(&self) -> Result<Array> {
        mean(self, &all_axes(self), false)
    }
    /// See [`var`].
    pub fn var(&self, axes: &[i32], keepdims: bool, ddof: usize) -> Result<Array> {
        var(self, axes, keepdims, ddof)
    }
    /// See [`logsumexp`].
    pub fn logsumexp(&self, axes: &[i32], keepdims: bool) -> Result<Array> {
        logsumexp(self, axes, keepdims)
    }
    /// See [`softmax`].
    pub fn softmax(&self, axes: &[i32]) -> Result<Array> {
        softmax(self, axes)
    }
    /// See [`argmax`].
    pub fn argmax(&self, axis: i32, keepdims: bool) -> Result<Array> {
        argmax(self, axis, keepdims)
    }
    /// See [`argmin`].
    pub fn argmin(&self, axis: i32, keepdims: bool) -> Result<Array> {
        argmin(self, axis, keepdims)
    }
    /// See [`cumsum`].
    pub fn cumsum(&self, axis: i32, reverse: bool, inclusive: bool) -> Result<Array> {
        cumsum(self, axis, reverse, inclusive)
    }
}
