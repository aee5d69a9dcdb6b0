//! Our tensor names (MLX's Llama example) and Hugging Face's Llama names.

/// Hugging Face's name of one of our parameters, `None` for a name our
/// model does not have. The MLP's `linear1` is the gate (the SiLU'd half of
/// SwiGLU), `linear2` the up projection and `linear3` the down projection.
pub fn hf_name(ours: &str) -> Option<String> {
    match ours {
        "embedding.weight" => return Some("model.embed_tokens.weight".into()),
        "norm.weight" => return Some("model.norm.weight".into()),
        "out_proj.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = ours.strip_prefix("layers.")?;
    let (index, part) = rest.split_once('.')?;
    index.parse::<usize>().ok()?;
    let theirs = match part {
        "attention.query_proj.weight" => "self_attn.q_proj.weight",
        "attention.key_proj.weight" => "self_attn.k_proj.weight",
        "attention.value_proj.weight" => "self_attn.v_proj.weight",
        "attention.out_proj.weight" => "self_attn.o_proj.weight",
        "linear1.weight" => "mlp.gate_proj.weight",
        "linear2.weight" => "mlp.up_proj.weight",
        "linear3.weight" => "mlp.down_proj.weight",
        "norm1.weight" => "input_layernorm.weight",
        "norm2.weight" => "post_attention_layernorm.weight",
        _ => return None,
    };
    Some(format!("model.layers.{index}.{theirs}"))
}

/// A projection whose output rows RoPE rotates, head by head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Rotated {
    /// A query projection: rows of the query heads.
    Queries,
    /// A key projection: rows of the key/value heads.
    Keys,
}

/// Whether a Hugging Face name is a query or key projection, whose rows
/// RoPE rotates (and which the `hf` format reorders within each head).
pub fn rotated_heads(hf: &str) -> Option<Rotated> {
    if hf.ends_with(".self_attn.q_proj.weight") {
        Some(Rotated::Queries)
    } else if hf.ends_with(".self_attn.k_proj.weight") {
        Some(Rotated::Keys)
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_of_name_maps() {
        assert_eq!(
            hf_name("layers.3.linear1.weight").as_deref(),
            Some("model.layers.3.mlp.gate_proj.weight")
        );
        assert_eq!(
            hf_name("layers.0.attention.key_proj.weight").as_deref(),
            Some("model.layers.0.self_attn.k_proj.weight")
        );
        assert_eq!(
            hf_name("out_proj.weight").as_deref(),
            Some("lm_head.weight")
        );
        assert_eq!(hf_name("layers.x.linear1.weight"), None);
        assert_eq!(hf_name("layers.0.linear4.weight"), None);
        assert_eq!(
            rotated_heads("model.layers.1.self_attn.q_proj.weight"),
            Some(Rotated::Queries)
        );
        assert_eq!(
            rotated_heads("model.layers.1.self_attn.k_proj.weight"),
            Some(Rotated::Keys)
        );
        assert_eq!(
            rotated_heads("model.layers.1.self_attn.v_proj.weight"),
            None
        );
    }
}
