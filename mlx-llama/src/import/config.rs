//! One mapping from a transformers or mlx-lm `config.json` to our
//! [`LlamaConfig`]: every field `LlamaForCausalLM` reads is honoured or
//! refused by name with its value, in both spellings transformers has used
//! (4's `rope_theta` + `rope_scaling`, 5's `rope_parameters`). Fields that
//! nothing reads (`transformers_version`, token ids, `torch_dtype`, ...)
//! change no arithmetic and pass.

use anyhow::{Context, Result, bail};
use mlx_nn::RopeScaling;
use serde_json::{Map, Value};

use super::{ImportedConfig, MAX_LAYERS, MAX_SIZE};
use crate::LlamaConfig;

/// transformers' `LlamaConfig` defaults for what a file may leave out.
const DEFAULT_THETA: f64 = 10_000.0;
const DEFAULT_EPS: f64 = 1e-6;
const DEFAULT_MAX_POSITIONS: usize = 2048;

type Object = Map<String, Value>;

fn field<'a>(c: &'a Object, name: &str) -> Option<&'a Value> {
    c.get(name).filter(|v| !v.is_null())
}

fn size(c: &Object, name: &str, max: usize) -> Result<usize> {
    let v = field(c, name).with_context(|| format!("config.json has no `{name}`"))?;
    whole(v, name, max)
}

fn whole(v: &Value, name: &str, max: usize) -> Result<usize> {
    match v.as_u64() {
        Some(n) if n >= 1 && n as u128 <= max as u128 => Ok(n as usize),
        _ => bail!("config.json: `{name}` must be a whole number from 1 to {max}, got {v}"),
    }
}

fn optional_size(c: &Object, name: &str, max: usize) -> Result<Option<usize>> {
    field(c, name).map(|v| whole(v, name, max)).transpose()
}

fn number(c: &Object, name: &str, default: f64) -> Result<f64> {
    match field(c, name) {
        None => Ok(default),
        Some(v) => positive(v, name),
    }
}

fn positive(v: &Value, name: &str) -> Result<f64> {
    match v.as_f64() {
        Some(x) if x.is_finite() && x > 0.0 => Ok(x),
        _ => bail!("config.json: `{name}` must be a positive number, got {v}"),
    }
}

fn flag(c: &Object, name: &str, default: bool) -> Result<bool> {
    match field(c, name) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => bail!("config.json: `{name}` must be true or false, got {v}"),
    }
}

/// Refuses `name` unless it is absent or `ok` says its value changes
/// nothing; `why` ends the message.
fn refuse_unless(c: &Object, name: &str, ok: impl Fn(&Value) -> bool, why: &str) -> Result<()> {
    match field(c, name) {
        Some(v) if !ok(v) => bail!("config.json: `{name}` is {v}; {why}"),
        _ => Ok(()),
    }
}

/// Parses a `config.json`, refusing what our Llama cannot honour with an
/// error naming the field and its value: another architecture or model
/// type, a RoPE type other than default, linear, dynamic and llama3 (or
/// one of their parameters we do not know), partial rotary embeddings,
/// biases, another activation, dropout in attention, sliding windows,
/// quantized weights, key/value heads that do not divide the query
/// heads, sizes out of range.
pub fn parse_config(bytes: &[u8]) -> Result<ImportedConfig> {
    let v: Value = serde_json::from_slice(bytes).context("config.json is not JSON")?;
    let c = v.as_object().context("config.json is not a JSON object")?;
    if let Some(a) = field(c, "architectures") {
        let ok = a
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x == "LlamaForCausalLM"));
        if !ok {
            bail!("config.json: `architectures` is {a}; only LlamaForCausalLM can be imported");
        }
    }
    refuse_unless(
        c,
        "model_type",
        |t| t == "llama",
        "only llama can be imported",
    )?;
    for name in ["attention_bias", "mlp_bias"] {
        if flag(c, name, false)? {
            bail!("config.json: `{name}` is true; our Llama has no biases");
        }
    }
    for name in ["hidden_act", "hidden_activation"] {
        refuse_unless(c, name, |a| a == "silu", "our MLP is SwiGLU (silu)")?;
    }
    refuse_unless(
        c,
        "attention_dropout",
        |d| d.as_f64() == Some(0.0),
        "our attention has no dropout",
    )?;
    refuse_unless(
        c,
        "sliding_window",
        |_| false,
        "our attention sees every earlier position (no sliding window)",
    )?;
    refuse_unless(
        c,
        "use_sliding_window",
        |u| u == false,
        "our attention sees every earlier position (no sliding window)",
    )?;
    for name in ["quantization", "quantization_config"] {
        refuse_unless(
            c,
            name,
            |_| false,
            "quantized weights cannot be imported: use the unquantized model",
        )?;
    }
    refuse_unless(
        c,
        "pretraining_tp",
        |t| t.as_u64().is_some_and(|t| t >= 1),
        "it must be a whole number of at least 1",
    )?;
    let dims = size(c, "hidden_size", MAX_SIZE)?;
    let heads = size(c, "num_attention_heads", MAX_SIZE)?;
    let kv_heads = optional_size(c, "num_key_value_heads", MAX_SIZE)?.unwrap_or(heads);
    if !heads.is_multiple_of(kv_heads) {
        bail!(
            "config.json: `num_key_value_heads` {kv_heads} does not divide `num_attention_heads` {heads}: each key/value head must serve a whole group of query heads"
        );
    }
    let head_dim = match optional_size(c, "head_dim", MAX_SIZE)? {
        Some(d) => d,
        None if dims.is_multiple_of(heads) => dims / heads,
        None => bail!(
            "config.json: `hidden_size` {dims} does not split into `num_attention_heads` {heads} heads, and there is no `head_dim`"
        ),
    };
    if !head_dim.is_multiple_of(2) {
        bail!("config.json: `head_dim` is {head_dim}; RoPE needs an even head width");
    }
    if (heads as u128) * (head_dim as u128) > MAX_SIZE as u128 {
        bail!(
            "config.json: {heads} heads of `head_dim` {head_dim} are wider than {MAX_SIZE} features"
        );
    }
    let max_positions =
        optional_size(c, "max_position_embeddings", MAX_SIZE)?.unwrap_or(DEFAULT_MAX_POSITIONS);
    let (rope_base, rope_scaling) = rope(c, max_positions)?;
    let model = LlamaConfig {
        num_layers: size(c, "num_hidden_layers", MAX_LAYERS)?,
        vocab_size: size(c, "vocab_size", MAX_SIZE)?,
        dims,
        mlp_dims: size(c, "intermediate_size", MAX_SIZE)?,
        num_heads: heads,
        // 0 where they are what the model derives (its own configurations'
        // spelling, so that one model has one configuration).
        num_kv_heads: if kv_heads == heads { 0 } else { kv_heads },
        head_dim: if dims == heads * head_dim {
            0
        } else {
            head_dim
        },
        tie_embeddings: flag(c, "tie_word_embeddings", false)?,
        norm_eps: number(c, "rms_norm_eps", DEFAULT_EPS)?,
        rope_base,
        rope_scaling,
        max_position_embeddings: max_positions,
    };
    Ok(ImportedConfig {
        model,
        rope_traditional: flag(c, "rope_traditional", false)?,
    })
}

/// The RoPE base and scaling, from transformers 5's `rope_parameters` or
/// 4's `rope_scaling` (which transformers prefers where both are given; we
/// refuse two that disagree) with the top-level `rope_theta`.
/// `max_positions` is `max_position_embeddings`: dynamic scaling's
/// original length, and llama3's unless it names its own.
fn rope(c: &Object, max_positions: usize) -> Result<(f64, RopeScaling)> {
    let (name, params) = match (field(c, "rope_scaling"), field(c, "rope_parameters")) {
        (Some(s), Some(p)) if s != p => bail!(
            "config.json: `rope_scaling` ({s}) and `rope_parameters` ({p}) disagree; give one"
        ),
        (Some(s), _) => ("rope_scaling", Some(s)),
        (None, Some(p)) => ("rope_parameters", Some(p)),
        (None, None) => ("rope_parameters", None),
    };
    let empty = Object::new();
    let p = match params {
        None => &empty,
        Some(p) => p
            .as_object()
            .with_context(|| format!("config.json: `{name}` must be an object, got {p}"))?,
    };
    let at = |key: &str| format!("{name}.{key}");
    let theta = match field(p, "rope_theta") {
        Some(t) => positive(t, &at("rope_theta"))?,
        None => number(c, "rope_theta", DEFAULT_THETA)?,
    };
    for (key, v) in [
        ("partial_rotary_factor", field(p, "partial_rotary_factor")),
        ("partial_rotary_factor", field(c, "partial_rotary_factor")),
    ] {
        if let Some(v) = v
            && v.as_f64() != Some(1.0)
        {
            bail!("config.json: `{key}` is {v}; our RoPE rotates the whole head");
        }
    }
    let kind = match (field(p, "rope_type"), field(p, "type")) {
        (Some(a), Some(b)) if a != b => bail!(
            "config.json: `{}` ({a}) and `{}` ({b}) disagree",
            at("rope_type"),
            at("type")
        ),
        (Some(t), _) | (None, Some(t)) => t.as_str().with_context(|| {
            format!(
                "config.json: `{}` must be a string, got {t}",
                at("rope_type")
            )
        })?,
        (None, None) => "default",
    };
    let known: &[&str] = match kind {
        "default" => &[],
        "linear" | "dynamic" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => bail!(
            "config.json: `{}` is \"{other}\"; only default, linear, dynamic and llama3 RoPE can be imported",
            at("rope_type")
        ),
    };
    let common = ["rope_type", "type", "rope_theta", "partial_rotary_factor"];
    if let Some((key, v)) = p.iter().find(|(k, v)| {
        !v.is_null() && !common.contains(&k.as_str()) && !known.contains(&k.as_str())
    }) {
        bail!(
            "config.json: `{}` is {v}, which {kind} RoPE does not have; we cannot tell how it changes the rotation",
            at(key)
        );
    }
    let need = |key: &str| -> Result<f64> {
        let v = field(p, key)
            .with_context(|| format!("config.json: {kind} RoPE needs `{}`", at(key)))?;
        positive(v, &at(key))
    };
    let scaling = match kind {
        "default" => RopeScaling::Default,
        "linear" => RopeScaling::Linear {
            factor: need("factor")?,
        },
        "dynamic" => RopeScaling::Dynamic {
            factor: need("factor")?,
            original_max_position_embeddings: max_positions,
        },
        _ => {
            let (low, high) = (need("low_freq_factor")?, need("high_freq_factor")?);
            if low >= high {
                bail!(
                    "config.json: `{}` {low} must be below `{}` {high}",
                    at("low_freq_factor"),
                    at("high_freq_factor")
                );
            }
            let original = match field(p, "original_max_position_embeddings") {
                Some(v) => whole(v, &at("original_max_position_embeddings"), MAX_SIZE)?,
                None => max_positions,
            };
            RopeScaling::Llama3 {
                factor: need("factor")?,
                low_freq_factor: low,
                high_freq_factor: high,
                original_max_position_embeddings: original,
            }
        }
    };
    Ok((theta, scaling))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use super::super::tests::config;

    fn parse(v: &Value) -> Result<ImportedConfig> {
        parse_config(v.to_string().as_bytes())
    }

    fn with(edit: impl Fn(&mut Value)) -> Value {
        let mut v = config();
        edit(&mut v);
        v
    }

    #[test]
    fn export_s_config_reads_back() {
        let c = parse(&config()).unwrap();
        assert_eq!(c.model.dims, 8);
        assert_eq!(c.model.norm_eps, 1e-5);
        assert_eq!(c.model.max_position_embeddings, 32);
        assert!(!c.rope_traditional && !c.model.tie_embeddings);
        assert_eq!(c.model.rope_scaling, RopeScaling::Default);
    }

    #[test]
    fn what_changes_the_arithmetic_is_honoured() {
        let c = parse(&with(|v| {
            v["num_attention_heads"] = json!(4);
            v["num_key_value_heads"] = json!(2);
            v["head_dim"] = json!(6);
            v["tie_word_embeddings"] = json!(true);
        }))
        .unwrap()
        .model;
        assert_eq!((c.num_heads, c.kv_heads(), c.head_dim()), (4, 2, 6));
        assert!(c.tie_embeddings);
        // transformers 5's spelling: the base lives in `rope_parameters`.
        let c = parse(&with(|v| {
            v.as_object_mut().unwrap().remove("rope_theta");
            v["rope_parameters"] = json!({"rope_type": "default", "rope_theta": 500000.0});
        }))
        .unwrap()
        .model;
        assert_eq!(c.rope_base, 500_000.0);
        for (scaling, want) in [
            (
                json!({"rope_type": "linear", "factor": 2.0}),
                RopeScaling::Linear { factor: 2.0 },
            ),
            (
                json!({"type": "dynamic", "factor": 4.0}),
                RopeScaling::Dynamic {
                    factor: 4.0,
                    original_max_position_embeddings: 32,
                },
            ),
            (
                json!({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                       "high_freq_factor": 4.0}),
                RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 32,
                },
            ),
        ] {
            for key in ["rope_scaling", "rope_parameters"] {
                let c = parse(&with(|v| v[key] = scaling.clone())).unwrap().model;
                assert_eq!(c.rope_scaling, want, "{key}: {scaling}");
                assert_eq!(c.rope_base, 10_000.0);
            }
        }
    }

    #[test]
    fn what_we_cannot_honour_is_refused_by_name_with_its_value() {
        let refused = |edit: &dyn Fn(&mut Value), names: &[&str]| {
            let v = with(edit);
            let e = format!("{:#}", parse(&v).unwrap_err());
            for n in names {
                assert!(e.contains(n), "{n}: {e}");
            }
        };
        refused(
            &|v| v["architectures"] = json!(["MistralForCausalLM"]),
            &["`architectures`", "MistralForCausalLM"],
        );
        refused(
            &|v| v["model_type"] = json!("gemma"),
            &["`model_type`", "gemma"],
        );
        for key in ["rope_scaling", "rope_parameters"] {
            refused(
                &|v| v[key] = json!({"rope_type": "yarn", "factor": 2.0}),
                &[&format!("`{key}.rope_type`"), "yarn"],
            );
            refused(
                &|v| {
                    v[key] = json!({"rope_type": "linear", "factor": 2.0, "attention_factor": 0.5})
                },
                &[&format!("`{key}.attention_factor`"), "0.5"],
            );
            refused(
                &|v| v[key] = json!({"rope_type": "linear"}),
                &[&format!("`{key}.factor`")],
            );
            refused(
                &|v| v[key] = json!({"rope_type": "default", "partial_rotary_factor": 0.5}),
                &["`partial_rotary_factor`", "0.5"],
            );
        }
        refused(
            &|v| {
                v["rope_scaling"] = json!({"rope_type": "linear", "factor": 2.0});
                v["rope_parameters"] = json!({"rope_type": "linear", "factor": 4.0});
            },
            &["`rope_scaling`", "`rope_parameters`"],
        );
        refused(
            &|v| v["partial_rotary_factor"] = json!(0.25),
            &["`partial_rotary_factor`", "0.25"],
        );
        refused(
            &|v| v["num_key_value_heads"] = json!(3),
            &["`num_key_value_heads` 3", "`num_attention_heads` 2"],
        );
        refused(&|v| v["head_dim"] = json!(5), &["`head_dim`", "5"]);
        refused(
            &|v| {
                v["hidden_size"] = json!(9);
                v.as_object_mut().unwrap().remove("head_dim");
            },
            &["`hidden_size` 9"],
        );
        for key in ["attention_bias", "mlp_bias"] {
            refused(&|v| v[key] = json!(true), &[&format!("`{key}`")]);
        }
        refused(
            &|v| v["hidden_act"] = json!("gelu"),
            &["`hidden_act`", "gelu"],
        );
        refused(
            &|v| v["attention_dropout"] = json!(0.1),
            &["`attention_dropout`", "0.1"],
        );
        refused(
            &|v| v["sliding_window"] = json!(4096),
            &["`sliding_window`", "4096"],
        );
        refused(
            &|v| v["use_sliding_window"] = json!(true),
            &["`use_sliding_window`"],
        );
        refused(
            &|v| v["quantization"] = json!({"group_size": 64, "bits": 4}),
            &["`quantization`"],
        );
        refused(
            &|v| v["quantization_config"] = json!({"quant_method": "gptq"}),
            &["`quantization_config`", "gptq"],
        );
        refused(&|v| v["vocab_size"] = json!(-3), &["`vocab_size`"]);
        refused(
            &|v| v["num_hidden_layers"] = json!(1u64 << 40),
            &["`num_hidden_layers`"],
        );
        refused(
            &|v| v["rms_norm_eps"] = json!("small"),
            &["`rms_norm_eps`", "small"],
        );
        refused(&|v| v["rope_theta"] = json!(-1.0), &["`rope_theta`"]);
    }
}
