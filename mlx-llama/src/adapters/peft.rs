//! PEFT's adapter layout (`PeftModel.save_pretrained` of a LoRA on
//! `LlamaForCausalLM`, as PEFT 0.21 writes it): a folder with
//! `adapter_model.safetensors` and `adapter_config.json`.
//!
//! | ours | PEFT |
//! |------|------|
//! | `layers.3.attention.query_proj.lora_a` `[r, in]` | `base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight` `[r, in]` |
//! | `layers.3.attention.query_proj.lora_b` `[out, r]` | `base_model.model.model.layers.3.self_attn.q_proj.lora_B.weight` `[out, r]` |
//! | `layers.3.linear1.magnitude` `[out]` (DoRA) | `base_model.model.model.layers.3.mlp.gate_proj.lora_magnitude_vector` `[out]` |
//!
//! The configuration is PEFT's `LoraConfig`: `peft_type` `LORA`, `r`,
//! `lora_alpha` (the scale is `lora_alpha / r`, or `lora_alpha / sqrt(r)`
//! with `use_rslora`, read as the same scale), `lora_dropout`,
//! `target_modules` (`q_proj`, ..., or `all-linear`), `layers_to_transform`
//! (null for every block), `use_dora`. What would change the arithmetic
//! and has no counterpart here is refused by name: a `bias` other than
//! `none`, `fan_in_fan_out`, per-module ranks or alphas, `modules_to_save`,
//! initialisations that change the base weights (PiSSA, OLoRA, CorDA,
//! LoftQ), and the like.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};

use super::files::{Adapters, Fields, Leaf, block_index, insert, number};
use super::{AdapterKind, AdapterSpec, Target};
use crate::LlamaConfig;
use crate::import::Tensor;

/// PEFT's weights file.
pub const WEIGHTS: &str = "adapter_model.safetensors";

/// PEFT's pickled weights file, which is not read.
pub const PICKLE_WEIGHTS: &str = "adapter_model.bin";

/// The PEFT version whose layout this writes (its `peft_version`).
pub const PEFT_VERSION: &str = "0.21.2";

/// The prefix of every tensor name: `PeftModelForCausalLM.base_model`
/// (`LoraModel`) `.model` (`LlamaForCausalLM`) `.model` (`LlamaModel`).
pub const PREFIX: &str = "base_model.model.model.layers.";

/// The module name PEFT's `target_modules` uses: `q_proj`, ..., `down_proj`.
pub fn module(target: Target) -> &'static str {
    let hf = target.hf();
    hf.rsplit_once('.').map_or(hf, |(_, m)| m)
}

/// PEFT's name of an adapter tensor.
pub fn name(layer: usize, target: Target, leaf: Leaf) -> String {
    let leaf = match leaf {
        Leaf::A => "lora_A.weight",
        Leaf::B => "lora_B.weight",
        Leaf::Magnitude => "lora_magnitude_vector",
    };
    format!("{PREFIX}{layer}.{}.{leaf}", target.hf())
}

/// (block, projection, tensor) of a PEFT adapter tensor name.
fn parse_name(name: &str) -> Option<(usize, Target, Leaf)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (index, rest) = rest.split_once('.')?;
    let layer = block_index(index)?;
    Target::ALL.into_iter().find_map(|t| {
        let leaf = rest.strip_prefix(t.hf())?.strip_prefix('.')?;
        let leaf = match leaf {
            "lora_A.weight" => Leaf::A,
            "lora_B.weight" => Leaf::B,
            "lora_magnitude_vector" => Leaf::Magnitude,
            _ => return None,
        };
        Some((layer, t, leaf))
    })
}

/// `adapter_config.json` and the tensors under PEFT's names for
/// `adapters` (checked, rows already in the base's order).
pub(crate) fn encode(
    spec: &AdapterSpec,
    config: &LlamaConfig,
    adapters: &Adapters,
    base_model: &str,
) -> Result<(Value, Vec<(String, Tensor)>)> {
    let mut tensors = vec![];
    for (&(l, t), pair) in adapters {
        for (leaf, x) in [
            (Leaf::A, &pair.a),
            (Leaf::B, &pair.b),
            (Leaf::Magnitude, &pair.m),
        ] {
            if let Some(x) = x {
                tensors.push((name(l, t, leaf), x.clone()));
            }
        }
    }
    let all = spec.layers == (0..config.num_layers).collect::<Vec<_>>();
    let layers = if all { Value::Null } else { json!(spec.layers) };
    let targets: Vec<&str> = spec.targets.iter().map(|&t| module(t)).collect();
    let base = if base_model.is_empty() {
        Value::Null
    } else {
        json!(base_model)
    };
    // Every key PEFT 0.21.2 writes, its defaults where nothing here
    // corresponds.
    let config = json!({
        "alora_invocation_tokens": null,
        "alpha_pattern": {},
        "arrow_config": null,
        "auto_mapping": null,
        "base_model_name_or_path": base,
        "bias": "none",
        "corda_config": null,
        "ensure_weight_tying": false,
        "eva_config": null,
        "exclude_modules": null,
        "fan_in_fan_out": false,
        "inference_mode": true,
        "init_lora_weights": true,
        "kasa_config": null,
        "layer_replication": null,
        "layers_pattern": null,
        "layers_to_transform": layers,
        "loftq_config": {},
        "lora_alpha": number(spec.alpha),
        "lora_bias": false,
        "lora_dropout": spec.dropout,
        "lora_ga_config": null,
        "megatron_config": null,
        "megatron_core": "megatron.core",
        "modules_to_save": null,
        "monteclora_config": null,
        "peft_type": "LORA",
        "peft_version": PEFT_VERSION,
        "qalora_group_size": 16,
        "r": spec.rank,
        "rank_pattern": {},
        "revision": null,
        "target_modules": targets,
        "target_parameters": null,
        "task_type": "CAUSAL_LM",
        "trainable_token_indices": null,
        "use_bdlora": null,
        "use_dora": spec.kind == AdapterKind::Dora,
        "use_qalora": false,
        "use_rslora": false,
        "velora_config": null,
    });
    Ok((config, tensors))
}

/// The spec an `adapter_config.json` of PEFT's describes, for a model of
/// `num_layers` blocks.
pub fn parse_config(bytes: &[u8], num_layers: usize) -> Result<AdapterSpec> {
    let v = Fields::parse(bytes)?;
    let f = Fields(v.as_object().expect("checked by Fields::parse"));
    match f.str("peft_type")? {
        Some("LORA") => {}
        Some(other) => {
            bail!("`peft_type` is {other:?}: only LORA adapters (LoRA and DoRA) are read")
        }
        None => bail!("`peft_type` is missing: expected \"LORA\""),
    }
    match f.str("task_type")? {
        None | Some("CAUSAL_LM") => {}
        Some(other) => bail!(
            "`task_type` is {other:?}: only CAUSAL_LM adapters (on LlamaForCausalLM) fit this model"
        ),
    }
    let bias = f.str("bias")?.unwrap_or("none");
    if bias != "none" {
        bail!(
            "`bias` is {bias:?}: only \"none\" is read (the adapted layers here have no trained biases)"
        );
    }
    if f.bool("fan_in_fan_out")?.unwrap_or(false) {
        bail!(
            "`fan_in_fan_out` is true: that is for GPT-2's Conv1D weights ([in, out]), not a Llama's linear layers"
        );
    }
    f.refuse_set(&[
        (
            "rank_pattern",
            "per-module ranks are not supported; one `r` for every adapter",
        ),
        (
            "alpha_pattern",
            "per-module alphas are not supported; one `lora_alpha` for every adapter",
        ),
        (
            "modules_to_save",
            "fully trained modules beside the adapters are not read",
        ),
        (
            "exclude_modules",
            "excluded modules are not supported; list the targets in `target_modules`",
        ),
        (
            "lora_bias",
            "adapters with a trained bias are not supported",
        ),
        ("layer_replication", "replicated blocks are not supported"),
        (
            "trainable_token_indices",
            "trained embedding rows are not read",
        ),
        (
            "target_parameters",
            "adapters on parameters (not modules) are not supported",
        ),
        ("use_qalora", "QA-LoRA's pooled inputs are not supported"),
        ("use_bdlora", "block-diagonal LoRA is not supported"),
        (
            "alora_invocation_tokens",
            "activated LoRA (adapting only after its invocation tokens) is not supported",
        ),
        (
            "arrow_config",
            "Arrow routing between adapters is not supported",
        ),
        (
            "megatron_config",
            "Megatron-parallel layers are not supported",
        ),
    ])?;
    match f.get("init_lora_weights") {
        None | Some(Value::Bool(_)) => {}
        Some(Value::String(s)) if s == "gaussian" => {}
        Some(v) => bail!(
            "`init_lora_weights` is {v}: an initialisation that changes the base weights (PiSSA, OLoRA, CorDA, LoftQ) needs the base it changed; convert the adapter to plain LoRA (PEFT's path_initial_model_for_weight_conversion) to use it here"
        ),
    }
    match f.get("layers_pattern") {
        None => {}
        Some(Value::String(s)) if s == "layers" => {}
        Some(Value::Array(a)) if a.iter().all(|p| p == "layers") => {}
        Some(v) => bail!("`layers_pattern` is {v}: a Llama's blocks are `layers`"),
    }
    let rank = f
        .usize("r")?
        .ok_or_else(|| anyhow!("`r` is missing: the adapters' rank"))?;
    if rank == 0 {
        bail!("`r` is 0: the rank must be at least 1");
    }
    let mut alpha = f.f64("lora_alpha")?.unwrap_or(8.0);
    if f.bool("use_rslora")?.unwrap_or(false) {
        // rsLoRA scales by alpha / sqrt(r); ours by alpha / r.
        alpha *= (rank as f64).sqrt();
    }
    let dropout = f.f64("lora_dropout")?.unwrap_or(0.0);
    let kind = if f.bool("use_dora")?.unwrap_or(false) {
        AdapterKind::Dora
    } else {
        AdapterKind::Lora
    };
    let targets = match f.get("target_modules") {
        None => bail!("`target_modules` is missing: the projections that carry adapters"),
        Some(Value::String(s)) if s == "all-linear" => Target::ALL.to_vec(),
        Some(Value::String(s)) => bail!(
            "`target_modules` is the pattern {s:?}: only a list of module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj) or \"all-linear\" is read"
        ),
        Some(Value::Array(names)) => {
            let mut targets = vec![];
            for n in names {
                let n = n
                    .as_str()
                    .ok_or_else(|| anyhow!("`target_modules` holds {n}, not a module name"))?;
                let t = Target::ALL
                    .into_iter()
                    .find(|&t| n == module(t) || n == t.hf())
                    .ok_or_else(|| match n {
                        "embed_tokens" | "lm_head" | "model.embed_tokens" => anyhow!(
                            "`target_modules` names {n:?}: adapters on the embedding or the output layer are not supported, only on a block's projections"
                        ),
                        _ => anyhow!(
                            "`target_modules` names {n:?}: not a projection of a Llama block (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
                        ),
                    })?;
                if !targets.contains(&t) {
                    targets.push(t);
                }
            }
            targets.sort();
            targets
        }
        Some(v) => bail!("`target_modules` is {v}: expected a list of module names"),
    };
    let layers =
        match f.get("layers_to_transform") {
            None => (0..num_layers).collect(),
            Some(Value::Array(a)) => {
                let mut layers = a
                    .iter()
                    .map(|l| {
                        l.as_u64()
                            .and_then(|l| usize::try_from(l).ok())
                            .ok_or_else(|| {
                                anyhow!("`layers_to_transform` holds {l}, not a block index")
                            })
                    })
                    .collect::<Result<Vec<usize>>>()?;
                layers.sort_unstable();
                layers.dedup();
                layers
            }
            Some(v) => {
                vec![v.as_u64().and_then(|l| usize::try_from(l).ok()).ok_or_else(|| {
            anyhow!("`layers_to_transform` is {v}: expected a block index or a list of them")
        })?]
            }
        };
    let spec = AdapterSpec {
        kind,
        rank,
        alpha,
        dropout,
        layers,
        targets,
    };
    spec.check(num_layers).map_err(|e| anyhow!(e))?;
    Ok(spec)
}

/// PEFT's tensors as adapters in our shapes (rows still in the file's
/// order), each name checked.
pub(crate) fn decode(tensors: BTreeMap<String, Tensor>) -> Result<Adapters> {
    let mut adapters = Adapters::new();
    for (n, t) in tensors {
        let (l, target, leaf) = parse_name(&n).ok_or_else(|| {
            anyhow!(
                "tensor `{n}` is not a LoRA tensor of a Llama block's projection ({PREFIX}N.self_attn.q_proj.lora_A.weight, lora_B.weight, lora_magnitude_vector)"
            )
        })?;
        insert(&mut adapters, l, target, leaf, t, &n)?;
    }
    Ok(adapters)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_go_both_ways() {
        for t in Target::ALL {
            for leaf in [Leaf::A, Leaf::B, Leaf::Magnitude] {
                assert_eq!(parse_name(&name(12, t, leaf)), Some((12, t, leaf)));
            }
        }
        assert_eq!(
            name(3, Target::Q, Leaf::A),
            "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight"
        );
        assert_eq!(
            parse_name("base_model.model.model.layers.03.self_attn.q_proj.lora_A.weight"),
            None
        );
        assert_eq!(
            parse_name("base_model.model.model.layers.3.self_attn.q_proj.lora_A.default.weight"),
            None
        );
        assert_eq!(module(Target::Gate), "gate_proj");
    }
}
