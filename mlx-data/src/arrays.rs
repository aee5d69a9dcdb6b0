//! Turning a [`Batch`] into `mlx_array::Array`s for the model.

use crate::batch::Batch;
use crate::error::{DataError, Result};
use mlx_array::Array;

/// A batch as arrays: `tokens` is `(B, block_size + 1)`; `inputs`, `targets`
/// (`tokens[:, :-1]`, `tokens[:, 1:]`) and `loss_mask` are `(B, block_size)`.
#[derive(Debug, Clone)]
pub struct BatchArrays {
    /// All token ids, `u32`.
    pub tokens: Array,
    /// Model inputs, `u32`.
    pub inputs: Array,
    /// Next-token targets, `u32`.
    pub targets: Array,
    /// 1.0 where the target counts in the loss, else 0.0 (`f32`): 0 on
    /// padding and on prompt tokens of masked examples.
    pub loss_mask: Array,
    /// `(B, block_size)` `u32` for packed examples: the example each input
    /// token belongs to within its row (see [`Batch::segments`]).
    pub segments: Option<Array>,
}

fn arr<T: mlx_array::Element>(v: &[T], shape: &[usize]) -> Result<Array> {
    Array::from_slice(v, shape).map_err(|e| DataError::Array(e.to_string()))
}

impl Batch {
    /// `(inputs, targets)` as `(B, block_size)` `u32` arrays.
    pub fn inputs_targets(&self) -> Result<(Array, Array)> {
        let a = self.to_arrays()?;
        Ok((a.inputs, a.targets))
    }

    /// The loss mask as a `(B, block_size)` `f32` array.
    pub fn loss_mask_array(&self) -> Result<Array> {
        let m: Vec<f32> = self.loss_mask.iter().map(|&m| m as f32).collect();
        arr(&m, &[self.batch_size, self.block_size])
    }

    /// All arrays of the batch.
    pub fn to_arrays(&self) -> Result<BatchArrays> {
        let (b, t) = (self.batch_size, self.block_size);
        let mut inputs = Vec::with_capacity(b * t);
        let mut targets = Vec::with_capacity(b * t);
        for r in 0..b {
            inputs.extend_from_slice(self.inputs(r));
            targets.extend_from_slice(self.targets(r));
        }
        Ok(BatchArrays {
            tokens: arr(&self.tokens, &[b, t + 1])?,
            inputs: arr(&inputs, &[b, t])?,
            targets: arr(&targets, &[b, t])?,
            loss_mask: self.loss_mask_array()?,
            segments: match &self.segments {
                Some(s) => Some(arr(s, &[b, t])?),
                None => None,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arrays_have_the_right_shapes_and_values() {
        let batch = Batch {
            tokens: vec![1, 2, 3, 0, 4, 5, 6, 7],
            loss_mask: vec![1, 1, 0, 1, 1, 1],
            batch_size: 2,
            block_size: 3,
            samples: vec![0, 1],
            epoch: 0,
            segments: Some(vec![0, 0, 1, 0, 1, 1]),
        };
        let a = batch.to_arrays().unwrap();
        assert_eq!(a.tokens.shape(), [2, 4]);
        assert_eq!(a.inputs.shape(), [2, 3]);
        assert_eq!(a.inputs.to_vec::<u32>().unwrap(), [1, 2, 3, 4, 5, 6]);
        assert_eq!(a.targets.to_vec::<u32>().unwrap(), [2, 3, 0, 5, 6, 7]);
        assert_eq!(
            a.loss_mask.to_vec::<f32>().unwrap(),
            [1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
        );
        assert_eq!(a.tokens.dtype(), mlx_array::Dtype::U32);
        let seg = a.segments.unwrap();
        assert_eq!(seg.shape(), [2, 3]);
        assert_eq!(seg.to_vec::<u32>().unwrap(), [0, 0, 1, 0, 1, 1]);
    }
}
