//! Parameter initializers with MLX's defaults, all keyed and reproducible.

use mlx_array::{Array, Dtype, Result, random};

/// Uniform in `[-scale, scale)`.
pub fn uniform(key: &Array, scale: f64, shape: &[usize]) -> Result<Array> {
    random::uniform(key, -scale, scale, shape, Dtype::F32)
}

/// Normal with mean 0 and the given standard deviation.
pub fn normal(key: &Array, std: f64, shape: &[usize]) -> Result<Array> {
    random::normal_with(key, shape, Dtype::F32, 0.0, std)
}

/// Glorot (Xavier) uniform for a `[fan_out, fan_in]` weight.
pub fn glorot_uniform(key: &Array, shape: &[usize]) -> Result<Array> {
    let (fan_out, fan_in) = (shape[0] as f64, shape[shape.len() - 1] as f64);
    uniform(key, (6.0 / (fan_in + fan_out)).sqrt(), shape)
}
