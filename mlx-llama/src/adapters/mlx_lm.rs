//! mlx-lm's adapter layout (what `mlx_lm.lora` writes and
//! `mlx_lm.tuner.utils.load_adapters` reads, mlx-lm 0.32): a folder with
//! `adapters.safetensors` and `adapter_config.json`.
//!
//! | ours | mlx-lm |
//! |------|--------|
//! | `layers.3.attention.query_proj.lora_a` `[r, in]` | `model.layers.3.self_attn.q_proj.lora_a` `[in, r]` |
//! | `layers.3.attention.query_proj.lora_b` `[out, r]` | `model.layers.3.self_attn.q_proj.lora_b` `[r, out]` |
//! | `layers.3.linear1.magnitude` `[out]` (DoRA) | `model.layers.3.mlp.gate_proj.m` `[out]` |
//!
//! The configuration's `fine_tune_type` (`lora` or `dora`), `num_layers`
//! (the adapted blocks are the last `num_layers`; 0 or less for all), and
//! `lora_parameters`: `rank`, `scale` (`alpha / rank` here), `dropout`, and
//! `keys`, the module paths inside a block (`self_attn.q_proj`, ...;
//! absent for every linear layer of a block). A spec whose blocks are not
//! the last ones cannot be written here. The other keys `mlx_lm.lora`
//! writes (its training options) are written with mlx-lm's defaults.

use std::collections::BTreeMap;

use anyhow::{Result, anyhow, bail};
use serde_json::{Value, json};

use super::files::{Adapters, Fields, Leaf, block_index, insert, transpose};
use super::{AdapterKind, AdapterSpec, Target};
use crate::LlamaConfig;
use crate::import::Tensor;

/// mlx-lm's weights file.
pub const WEIGHTS: &str = "adapters.safetensors";

/// The prefix of every tensor name (`Model.model.layers`).
pub const PREFIX: &str = "model.layers.";

/// mlx-lm's name of an adapter tensor.
pub fn name(layer: usize, target: Target, leaf: Leaf) -> String {
    let leaf = match leaf {
        Leaf::A => "lora_a",
        Leaf::B => "lora_b",
        Leaf::Magnitude => "m",
    };
    format!("{PREFIX}{layer}.{}.{leaf}", target.hf())
}

/// (block, projection, tensor) of an mlx-lm adapter tensor name.
fn parse_name(name: &str) -> Option<(usize, Target, Leaf)> {
    let rest = name.strip_prefix(PREFIX)?;
    let (index, rest) = rest.split_once('.')?;
    let layer = block_index(index)?;
    Target::ALL.into_iter().find_map(|t| {
        let leaf = match rest.strip_prefix(t.hf())?.strip_prefix('.')? {
            "lora_a" => Leaf::A,
            "lora_b" => Leaf::B,
            "m" => Leaf::Magnitude,
            _ => return None,
        };
        Some((layer, t, leaf))
    })
}

/// `adapter_config.json` and the tensors under mlx-lm's names and shapes
/// for `adapters` (checked, rows already in the base's order); an error
/// when the spec's blocks are not the model's last ones.
pub(crate) fn encode(
    spec: &AdapterSpec,
    config: &LlamaConfig,
    adapters: &Adapters,
    base_model: &str,
) -> Result<(Value, Vec<(String, Tensor)>)> {
    let n = spec.layers.len();
    if spec.layers != AdapterSpec::last_layers(n, config.num_layers) || n == 0 {
        bail!(
            "mlx-lm adapts the last `num_layers` blocks of a model, but these adapters are on blocks {:?} of {}: write them in PEFT's layout (layers_to_transform), or train the last blocks",
            spec.layers,
            config.num_layers
        );
    }
    let mut tensors = vec![];
    for (&(l, t), pair) in adapters {
        for (leaf, x) in [
            (Leaf::A, &pair.a),
            (Leaf::B, &pair.b),
            (Leaf::Magnitude, &pair.m),
        ] {
            if let Some(x) = x {
                let name = name(l, t, leaf);
                let x = match leaf {
                    Leaf::Magnitude => x.clone(),
                    _ => transpose(x, &name)?,
                };
                tensors.push((name, x));
            }
        }
    }
    let keys: Vec<&str> = spec.targets.iter().map(|t| t.hf()).collect();
    let base = if base_model.is_empty() {
        Value::Null
    } else {
        json!(base_model)
    };
    let kind = match spec.kind {
        AdapterKind::Lora => "lora",
        AdapterKind::Dora => "dora",
    };
    // Every key `mlx_lm.lora` 0.32.2 writes (its arguments); the training
    // options are its defaults: the adapter did not come from it.
    let config = json!({
        "adapter_path": "adapters",
        "batch_size": 4,
        "clear_cache_threshold": 0,
        "config": null,
        "data": "mlx-community/WikiSQL",
        "fine_tune_type": kind,
        "grad_accumulation_steps": 1,
        "grad_checkpoint": false,
        "iters": 1000,
        "learning_rate": 1e-5,
        "lora_parameters": {
            "rank": spec.rank,
            "scale": spec.scale(),
            "dropout": spec.dropout,
            "keys": keys,
        },
        "lr_schedule": null,
        "mask_prompt": false,
        "max_seq_length": 2048,
        "model": base,
        "num_layers": n,
        "optimizer": "adam",
        "optimizer_config": {"adam": {}, "adamw": {}, "muon": {}, "sgd": {}, "adafactor": {}},
        "project_name": null,
        "report_to": null,
        "resume_adapter_file": null,
        "save_every": 100,
        "seed": 0,
        "steps_per_eval": 200,
        "steps_per_report": 10,
        "test": false,
        "test_batches": 500,
        "train": true,
        "trust_remote_code": false,
        "val_batches": 25,
    });
    Ok((config, tensors))
}

/// The spec an `adapter_config.json` of mlx-lm's describes, for a model of
/// `num_layers` blocks.
pub fn parse_config(bytes: &[u8], num_layers: usize) -> Result<AdapterSpec> {
    let v = Fields::parse(bytes)?;
    let f = Fields(v.as_object().expect("checked by Fields::parse"));
    let kind = match f.str("fine_tune_type")?.unwrap_or("lora") {
        "lora" => AdapterKind::Lora,
        "dora" => AdapterKind::Dora,
        "full" => bail!(
            "`fine_tune_type` is \"full\": that folder holds fully trained blocks, not adapters"
        ),
        other => bail!("`fine_tune_type` is {other:?}: expected \"lora\" or \"dora\""),
    };
    let n = match f.get("num_layers") {
        None => bail!("`num_layers` is missing: how many of the last blocks carry adapters"),
        Some(v) => v
            .as_i64()
            .ok_or_else(|| anyhow!("`num_layers` must be an integer, found {v}"))?,
    };
    if n > num_layers as i64 {
        bail!("`num_layers` is {n}, but the model has {num_layers} blocks");
    }
    let layers = AdapterSpec::last_layers(n.max(0) as usize, num_layers);
    let p = match f.get("lora_parameters") {
        Some(Value::Object(p)) => Fields(p),
        None => bail!("`lora_parameters` is missing: the adapters' rank, scale and keys"),
        Some(v) => bail!("`lora_parameters` is {v}: expected an object"),
    };
    let rank = p
        .usize("rank")
        .map_err(|e| anyhow!("in `lora_parameters`: {e}"))?
        .ok_or_else(|| anyhow!("`lora_parameters.rank` is missing"))?;
    if rank == 0 {
        bail!("`lora_parameters.rank` is 0: the rank must be at least 1");
    }
    let scale = p
        .f64("scale")
        .map_err(|e| anyhow!("in `lora_parameters`: {e}"))?
        .ok_or_else(|| anyhow!("`lora_parameters.scale` is missing"))?;
    let dropout = p
        .f64("dropout")
        .map_err(|e| anyhow!("in `lora_parameters`: {e}"))?
        .unwrap_or(0.0);
    let targets = match p.get("keys") {
        // mlx-lm adapts every linear layer of the blocks.
        None => Target::ALL.to_vec(),
        Some(Value::Array(keys)) => {
            let mut targets = vec![];
            for k in keys {
                let k = k.as_str().ok_or_else(|| {
                    anyhow!("`lora_parameters.keys` holds {k}, not a module path")
                })?;
                let t = Target::ALL.into_iter().find(|t| t.hf() == k).ok_or_else(|| {
                    anyhow!(
                        "`lora_parameters.keys` names {k:?}: not a projection of a Llama block ({})",
                        Target::ALL.map(|t| t.hf()).join(", ")
                    )
                })?;
                if !targets.contains(&t) {
                    targets.push(t);
                }
            }
            targets.sort();
            targets
        }
        Some(v) => bail!("`lora_parameters.keys` is {v}: expected a list of module paths"),
    };
    let spec = AdapterSpec {
        kind,
        rank,
        alpha: scale * rank as f64,
        dropout,
        layers,
        targets,
    };
    spec.check(num_layers).map_err(|e| anyhow!(e))?;
    Ok(spec)
}

/// mlx-lm's tensors as adapters in our shapes (`A` and `B` transposed,
/// rows still in the file's order), each name checked.
pub(crate) fn decode(tensors: BTreeMap<String, Tensor>) -> Result<Adapters> {
    let mut adapters = Adapters::new();
    for (n, t) in tensors {
        let (l, target, leaf) = parse_name(&n).ok_or_else(|| {
            anyhow!(
                "tensor `{n}` is not an adapter tensor of a Llama block's projection ({PREFIX}N.self_attn.q_proj.lora_a, lora_b, m)"
            )
        })?;
        let t = match leaf {
            Leaf::Magnitude => t,
            _ => transpose(&t, &n)?,
        };
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
                assert_eq!(parse_name(&name(7, t, leaf)), Some((7, t, leaf)));
            }
        }
        assert_eq!(
            name(0, Target::Down, Leaf::Magnitude),
            "model.layers.0.mlp.down_proj.m"
        );
        assert_eq!(parse_name("model.layers.+1.mlp.down_proj.m"), None);
        assert_eq!(
            parse_name("model.layers.1.mlp.down_proj.linear.weight"),
            None
        );
    }
}
