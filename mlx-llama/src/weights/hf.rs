//! What Hugging Face's `LlamaForCausalLM` reads: its `config.json` and
//! `generation_config.json`, and query and key rows in its RoPE layout.

use mlx_nn::RopeScaling;
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

/// Hugging Face's `LlamaConfig` for our model: its query and key/value
/// heads, head width, RoPE (in transformers 4's spelling, `rope_theta` and
/// `rope_scaling`, which transformers 5 reads too), tied or separate
/// output embedding, no biases, float32 weights; `special_id` is both the
/// BOS and the EOS (GPT-2's `<|endoftext|>` is both).
pub fn config(model: &LlamaConfig, max_positions: usize, special_id: u32) -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": model.dims,
        "intermediate_size": model.mlp_dims,
        "num_attention_heads": model.num_heads,
        "num_key_value_heads": model.kv_heads(),
        "num_hidden_layers": model.num_layers,
        "head_dim": model.head_dim(),
        "rms_norm_eps": model.norm_eps,
        "rope_theta": model.rope_base,
        "rope_scaling": rope_scaling(&model.rope_scaling),
        "vocab_size": model.vocab_size,
        "max_position_embeddings": max_positions,
        "tie_word_embeddings": model.tie_embeddings,
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

/// transformers' `rope_scaling` object for a scaling (`null` for none).
/// Dynamic scaling's original length is `max_position_embeddings`, which
/// it cannot name here: the export writes it there.
pub fn rope_scaling(scaling: &RopeScaling) -> Value {
    match *scaling {
        RopeScaling::Default => Value::Null,
        RopeScaling::Linear { factor } => json!({"rope_type": "linear", "factor": factor}),
        RopeScaling::Dynamic { factor, .. } => json!({"rope_type": "dynamic", "factor": factor}),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => json!({
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
    }
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
