//! What Hugging Face's `LlamaForCausalLM` reads: its `config.json` and
//! `generation_config.json`, and query and key rows in its RoPE layout.

use serde_json::{Value, json};

use crate::LlamaConfig;

/// The row order that turns a projection whose output pairs are rotated
/// interleaved (`x[2i]`, `x[2i+1]`: ours, MLX's `traditional` RoPE) into
/// one whose pairs are rotated by halves (`x[i]`, `x[i + d/2]`: Hugging
/// Face's `rotate_half`): within each head of `head_dim` rows, the even rows
/// then the odd ones. Entry `j` is the old row that becomes row `j`; this
/// is what transformers' `convert_llama_weights_to_hf.py` `permute` does.
pub fn halves_row_order(num_heads: usize, head_dim: usize) -> Vec<usize> {
    let mut order = Vec::with_capacity(num_heads * head_dim);
    for h in 0..num_heads {
        let base = h * head_dim;
        order.extend((0..head_dim).step_by(2).map(|r| base + r));
        order.extend((1..head_dim).step_by(2).map(|r| base + r));
    }
    order
}

/// `rows x cols` row-major `values` with its rows taken in `order`.
pub fn reorder_rows(values: &[f32], cols: usize, order: &[usize]) -> Vec<f32> {
    order
        .iter()
        .flat_map(|&r| &values[r * cols..(r + 1) * cols])
        .copied()
        .collect()
}

/// Hugging Face's `LlamaConfig` for our model: no grouped keys, no biases,
/// separate input and output embeddings, float32 weights; `special_id` is
/// both the BOS and the EOS (GPT-2's `<|endoftext|>` is both).
pub fn config(model: &LlamaConfig, max_positions: usize, special_id: u32) -> Value {
    let head_dim = model.dims / model.num_heads;
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model.dims,
        "intermediate_size": model.mlp_dims,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.num_heads,
        "num_hidden_layers": model.num_layers,
        "head_dim": head_dim,
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_base,
        "rope_scaling": null,
        "vocab_size": model.vocab_size,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": false,
        "hidden_act": "silu",
        "attention_bias": false,
        "attention_dropout": 0.0,
        "mlp_bias": false,
        "bos_token_id": special_id,
        "eos_token_id": special_id,
        "torch_dtype": "float32",
        "use_cache": true,
    })
}

/// `generation_config.json`: the special ids again (padding with EOS, as
/// GPT-2 has no pad token).
pub fn generation_config(special_id: u32) -> Value {
    json!({
        "bos_token_id": special_id,
        "eos_token_id": special_id,
        "pad_token_id": special_id,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evens_then_odds_within_each_head() {
        assert_eq!(halves_row_order(2, 4), vec![0, 2, 1, 3, 4, 6, 5, 7]);
        let rows = [0.0, 1.0, 10.0, 11.0, 20.0, 21.0, 30.0, 31.0];
        assert_eq!(
            reorder_rows(&rows, 2, &[0, 2, 1, 3]),
            vec![0.0, 1.0, 20.0, 21.0, 10.0, 11.0, 30.0, 31.0]
        );
    }
}
