//! What mlx-lm's `llama` model reads beyond Hugging Face's configuration.

use serde_json::Value;

/// `config` (Hugging Face's, from [`super::hf::config`]) with what mlx-lm
/// needs to rotate like we do: `rope_traditional`, the interleaved pairs
/// (MLX's `nn.RoPE(traditional=True)`), so no rows are reordered.
pub fn config(mut config: Value) -> Value {
    config["rope_traditional"] = Value::Bool(true);
    config
}
