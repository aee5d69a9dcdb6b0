//! Losses: cross-entropy (fused over large vocabularies) and mean squared error.

use mlx_array::{Array, Dtype, Error, Result};

/// How per-element losses are combined.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Reduction {
    /// Keep one loss per element.
    None,
    /// Average over the counted elements.
    #[default]
    Mean,
    /// Sum over the counted elements.
    Sum,
}

/// Options of [`cross_entropy`].
#[derive(Clone, Debug, Default)]
pub struct CrossEntropyOptions {
    /// How to combine the per-position losses.
    pub reduction: Reduction,
    /// Positions whose target equals this are ignored.
    pub ignore_index: Option<i64>,
    /// A `[...]` mask (1 counts, 0 ignored) or per-position weights.
    pub weights: Option<Array>,
    /// Label smoothing in `[0, 1)`.
    pub label_smoothing: f64,
}

/// Softmax cross-entropy of `logits [..., V]` against integer `targets [...]`.
///
/// The loss and its gradient use a fused primitive, so a 50,257-way
/// vocabulary costs no log-softmax buffer in the forward pass and a single
/// logits-sized buffer (the gradient) in the backward pass. With `Mean`,
/// the average is over the counted (unmasked, non-ignored) positions.
///
/// ```
/// use mlx_array::Array;
/// use mlx_nn::losses::{cross_entropy, CrossEntropyOptions};
/// let logits = Array::from_slice(&[2.0f32, 0.0, 0.0, 2.0], &[2, 2]).unwrap();
/// let targets = Array::from_slice(&[0i32, 1], &[2]).unwrap();
/// let loss = cross_entropy(&logits, &targets, &CrossEntropyOptions::default()).unwrap();
/// assert!((loss.item::<f32>().unwrap() - (1.0 + (-2f32).exp()).ln()).abs() < 1e-6);
/// ```
pub fn cross_entropy(logits: &Array, targets: &Array, opts: &CrossEntropyOptions) -> Result<Array> {
    if !(0.0..1.0).contains(&opts.label_smoothing) {
        return Err(Error::Invalid {
            op: "cross_entropy",
            message: format!(
                "label_smoothing must be in [0, 1), got {}",
                opts.label_smoothing
            ),
        });
    }
    let mut per = mlx_array::cross_entropy(logits, targets)?.astype(Dtype::F32)?;
    if opts.label_smoothing > 0.0 {
        let ls = opts.label_smoothing;
        let lse = logits.logsumexp(&[-1], false)?.astype(Dtype::F32)?;
        let mean_logit = logits.mean(&[-1], false)?.astype(Dtype::F32)?;
        per = per
            .mul_scalar(1.0 - ls)?
            .add(&lse.subtract(&mean_logit)?.mul_scalar(ls)?)?;
    }
    reduce(per, targets, opts)
}

/// Applies the ignore index, the weights and the reduction of `opts` to
/// per-position f32 losses.
fn reduce(mut per: Array, targets: &Array, opts: &CrossEntropyOptions) -> Result<Array> {
    let mut weight: Option<Array> = None;
    if let Some(i) = opts.ignore_index {
        weight = Some(targets.not_equal(&Array::scalar(i))?.astype(Dtype::F32)?);
    }
    if let Some(w) = &opts.weights {
        if w.shape() != targets.shape() {
            return Err(Error::Shape {
                op: "cross_entropy",
                message: format!(
                    "weights of shape {:?} do not match targets {:?}",
                    w.shape(),
                    targets.shape()
                ),
            });
        }
        let w = w.astype(Dtype::F32)?;
        weight = Some(match weight {
            Some(m) => m.multiply(&w)?,
            None => w,
        });
    }
    if let Some(w) = &weight {
        per = per.multiply(w)?;
    }
    match opts.reduction {
        Reduction::None => Ok(per),
        Reduction::Sum => per.sum_all(),
        Reduction::Mean => match &weight {
            Some(w) => per
                .sum_all()?
                .divide(&w.sum_all()?.maximum(&Array::scalar(1e-12f32))?),
            None => per.mean_all(),
        },
    }
}

/// Softmax cross-entropy of the logits `hidden @ weight^T` against integer
/// `targets [...]`, fused with that output projection: `hidden [..., D]`,
/// `weight [V, D]` as a bias-free [`Linear`](crate::Linear) stores it. Same
/// options and result as [`cross_entropy`] on `linear.forward(hidden)`, but
/// neither the loss nor its gradient ever holds the `[..., V]` logits, only
/// one chunk of classes at a time (about 16 MiB). The gradient computes the
/// logits once more, so it costs one extra projection-sized GEMM.
///
/// ```
/// use mlx_array::Array;
/// use mlx_nn::losses::{cross_entropy, linear_cross_entropy, CrossEntropyOptions};
/// let h = Array::from_slice(&[1.0f32, 0.5, -0.5, 1.0], &[2, 2]).unwrap();
/// let w = Array::from_slice(&[2.0f32, 0.0, 0.0, 2.0, 1.0, 1.0], &[3, 2]).unwrap();
/// let t = Array::from_slice(&[0i32, 2], &[2]).unwrap();
/// let opts = CrossEntropyOptions::default();
/// let fused = linear_cross_entropy(&h, &w, &t, &opts).unwrap().item::<f32>().unwrap();
/// let plain = cross_entropy(&h.matmul(&w.t().unwrap()).unwrap(), &t, &opts)
///     .unwrap()
///     .item::<f32>()
///     .unwrap();
/// assert!((fused - plain).abs() < 1e-6);
/// ```
pub fn linear_cross_entropy(
    hidden: &Array,
    weight: &Array,
    targets: &Array,
    opts: &CrossEntropyOptions,
) -> Result<Array> {
    if !(0.0..1.0).contains(&opts.label_smoothing) {
        return Err(Error::Invalid {
            op: "linear_cross_entropy",
            message: format!(
                "label_smoothing must be in [0, 1), got {}",
                opts.label_smoothing
            ),
        });
    }
    let fused = mlx_array::primitives::loss::LinearCrossEntropyOptions {
        ignore_index: opts.ignore_index,
        label_smoothing: opts.label_smoothing as f32,
        chunk: 0,
        block_rows: 0,
    };
    let per = mlx_array::linear_cross_entropy(hidden, weight, targets, &fused)?;
    reduce(per, targets, opts)
}

/// Mean squared error (or its sum, or per element).
pub fn mse_loss(predictions: &Array, targets: &Array, reduction: Reduction) -> Result<Array> {
    if predictions.shape() != targets.shape() {
        return Err(Error::Shape {
            op: "mse_loss",
            message: format!(
                "predictions {:?} and targets {:?} differ in shape",
                predictions.shape(),
                targets.shape()
            ),
        });
    }
    let sq = predictions.subtract(targets)?.square()?;
    match reduction {
        Reduction::None => Ok(sq),
        Reduction::Mean => sq.mean_all(),
        Reduction::Sum => sq.sum_all(),
    }
}
