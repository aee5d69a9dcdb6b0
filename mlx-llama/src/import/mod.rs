//! Pretrained weights in: a Hugging Face or mlx-lm Llama folder
//! (`config.json`, and `model.safetensors` or shards listed by
//! `model.safetensors.index.json`) as our [`Llama`], the inverse of
//! [`crate::export`]. Hugging Face's layout rotates RoPE by halves, so the
//! rows of every query and key projection are put back in interleaved
//! order; a configuration with `rope_traditional` (mlx-lm's, as our `mlx`
//! export writes) already rotates interleaved pairs and is read as it is.
//!
//! The configuration maps to our [`LlamaConfig`] in one place
//! ([`parse_config`]): grouped-query attention, an explicit head width,
//! transformers' RoPE types and tied embeddings are honoured, and anything
//! else that changes the arithmetic is refused by name with its value.
//!
//! Files are untrusted: the configuration is checked field by field, the
//! safetensors headers by the `safetensors` crate (offsets inside the
//! file), and every tensor's shape against the configuration before any
//! weight is built.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_array::Array;
use mlx_nn::Module;
use serde_json::Value;

use crate::weights::{WEIGHTS, hf, names};
use crate::{Llama, LlamaConfig};

/// The index of a sharded safetensors checkpoint.
pub const INDEX: &str = "model.safetensors.index.json";

/// Largest width, MLP width, vocabulary or head count we accept; more
/// layers than [`MAX_LAYERS`] are refused too. Far above any Llama, they
/// keep a hostile configuration from asking for unbounded memory.
const MAX_SIZE: usize = 1 << 22;
const MAX_LAYERS: usize = 1 << 12;

/// What a folder's `config.json` says, as far as our model honours it.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportedConfig {
    /// The model.
    pub model: LlamaConfig,
    /// Whether the query and key rows rotate interleaved pairs (ours and
    /// mlx-lm's `rope_traditional`) rather than halves (Hugging Face's).
    pub rope_traditional: bool,
}

mod config;
pub use config::parse_config;

/// Whether `dir` looks like a Hugging Face or mlx-lm model folder.
pub fn is_model_folder(dir: &Path) -> bool {
    dir.join("config.json").is_file() && (dir.join(WEIGHTS).is_file() || dir.join(INDEX).is_file())
}

/// Reads `dir/config.json`.
pub fn read_config(dir: &Path) -> Result<ImportedConfig> {
    let path = dir.join("config.json");
    let bytes = std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    parse_config(&bytes).with_context(|| format!("in {}", dir.display()))
}

/// One tensor of a safetensors file, as float32.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub values: Vec<f32>,
}

/// The tensors of a safetensors file's bytes, as float32 (from F32, F16
/// or BF16), by name. The header is checked by the `safetensors` crate
/// (its length, JSON, and every tensor's offsets within the file), so bad
/// bytes give an error, and no tensor is bigger than the file.
pub fn parse_safetensors(bytes: &[u8]) -> Result<BTreeMap<String, Tensor>> {
    use safetensors::Dtype as D;
    let st = safetensors::SafeTensors::deserialize(bytes)
        .map_err(|e| anyhow::anyhow!("not a safetensors file: {e}"))?;
    let mut out = BTreeMap::new();
    for (name, view) in st.tensors() {
        let data = view.data();
        let values: Vec<f32> = match view.dtype() {
            D::F32 => data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            D::F16 => data
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            D::BF16 => data
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            d => bail!("tensor `{name}` is {d:?}: only F32, F16 and BF16 weights can be imported"),
        };
        let count = view
            .shape()
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d));
        if count != Some(values.len()) {
            bail!(
                "tensor `{name}`: shape {:?} does not match its data",
                view.shape()
            );
        }
        out.insert(
            name,
            Tensor {
                shape: view.shape().to_vec(),
                values,
            },
        );
    }
    Ok(out)
}

/// The weight files of `dir`: `model.safetensors`, or the shards that
/// `model.safetensors.index.json` names (plain file names in `dir`).
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX);
    if !index.exists() {
        return Ok(vec![dir.join(WEIGHTS)]);
    }
    let text = std::fs::read(&index).with_context(|| format!("reading {}", index.display()))?;
    let files = parse_index(&text).with_context(|| format!("in {}", index.display()))?;
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// The shard files a `model.safetensors.index.json` lists, each a plain
/// file name (no folder, no `..`).
pub fn parse_index(bytes: &[u8]) -> Result<BTreeSet<String>> {
    let v: Value = serde_json::from_slice(bytes).context("not JSON")?;
    let map = v
        .get("weight_map")
        .and_then(Value::as_object)
        .context("no `weight_map` object")?;
    let mut files = BTreeSet::new();
    for (name, file) in map {
        let f = file
            .as_str()
            .with_context(|| format!("`weight_map`: `{name}` maps to {file}, not a file name"))?;
        if f.is_empty() || f.contains(['/', '\\']) || f == "." || f == ".." {
            bail!("`weight_map`: `{name}` maps to `{f}`, not a file of the folder");
        }
        files.insert(f.to_string());
    }
    Ok(files)
}

/// Loads a Hugging Face or mlx-lm Llama folder as our model (float32).
pub fn load(dir: &Path) -> Result<Llama> {
    let c = read_config(dir)?;
    let mut tensors = BTreeMap::new();
    for f in weight_files(dir)? {
        let bytes = std::fs::read(&f).with_context(|| format!("reading {}", f.display()))?;
        tensors.extend(parse_safetensors(&bytes).with_context(|| format!("in {}", f.display()))?);
    }
    to_model(&c, tensors).with_context(|| format!("loading {}", dir.display()))
}

/// Our model from `tensors` under Hugging Face's names: each checked for
/// its shape, the query and key rows put back in interleaved order unless
/// `rope_traditional`. Missing tensors, and tensors we have no place for,
/// are errors (RoPE's cached `inv_freq`, which some checkpoints keep, is
/// ignored; so is an `lm_head.weight` beside tied embeddings, which
/// transformers ignores too).
pub fn to_model(c: &ImportedConfig, mut tensors: BTreeMap<String, Tensor>) -> Result<Llama> {
    let m = &c.model;
    m.check().map_err(|e| anyhow::anyhow!("config.json: {e}"))?;
    if m.tie_embeddings {
        tensors.remove("lm_head.weight");
    }
    tensors.retain(|n, _| !n.ends_with(".rotary_emb.inv_freq"));
    let head_dim = m.head_dim();
    // The inverse of export's order: row `i` of ours is row `inverse[i]`
    // of theirs (queries over the query heads, keys over the key heads).
    let inverse = |heads: usize| {
        let order = hf::halves_row_order(heads, head_dim);
        let mut inverse = vec![0; order.len()];
        for (j, &i) in order.iter().enumerate() {
            inverse[i] = j;
        }
        inverse
    };
    let (queries, keys) = (inverse(m.num_heads), inverse(m.kv_heads()));
    // The model is built lazily (nothing evaluated) and every parameter
    // replaced, so its random initialisation never runs.
    let mut model = Llama::new(m, 0)?;
    let mut error = None;
    model.visit_mut("", &mut |ours, p| {
        if error.is_some() {
            return;
        }
        let result = (|| -> Result<Array> {
            let theirs = names::hf_name(ours)
                .with_context(|| format!("no Hugging Face name for `{ours}`"))?;
            let t = tensors
                .remove(&theirs)
                .with_context(|| format!("no tensor `{theirs}`"))?;
            if t.shape != p.value().shape() {
                bail!(
                    "tensor `{theirs}` has shape {:?}; config.json asks for {:?}",
                    t.shape,
                    p.value().shape()
                );
            }
            let values = match names::rotated_heads(&theirs) {
                Some(names::Rotated::Queries) if !c.rope_traditional => {
                    hf::reorder_rows(&t.values, m.dims, &queries)
                }
                Some(names::Rotated::Keys) if !c.rope_traditional => {
                    hf::reorder_rows(&t.values, m.dims, &keys)
                }
                _ => t.values,
            };
            Ok(Array::from_slice(&values, &t.shape)?)
        })();
        match result {
            Ok(a) => p.set(a),
            Err(e) => error = Some(e),
        }
    });
    if let Some(e) = error {
        return Err(e);
    }
    if let Some(extra) = tensors.keys().next() {
        bail!(
            "tensor `{extra}` has no place in our Llama ({} such)",
            tensors.len()
        );
    }
    Ok(model)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A small model's `config.json`, as our export writes it.
    pub(super) fn config() -> serde_json::Value {
        hf::config(
            &LlamaConfig {
                num_layers: 1,
                vocab_size: 16,
                dims: 8,
                mlp_dims: 16,
                num_heads: 2,
                ..LlamaConfig::default()
            },
            32,
            15,
        )
    }

    #[test]
    fn an_index_naming_a_file_outside_the_folder_is_refused() {
        let ok = br#"{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#;
        assert_eq!(parse_index(ok).unwrap().len(), 2);
        for bad in [
            r#"{"weight_map": {"a": "../secret"}}"#,
            r#"{"weight_map": {"a": "/etc/passwd"}}"#,
            r#"{"weight_map": {"a": 3}}"#,
            r#"{"weight_map": []}"#,
        ] {
            assert!(parse_index(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    mod arbitrary_bytes {
        use super::*;
        use proptest::prelude::*;

        fn valid_safetensors() -> Vec<u8> {
            let a = Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
            let b = Array::from_slice(&[7.0f32, 8.0], &[2]).unwrap();
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("w.safetensors");
            mlx_array::save_safetensors(&p, &[("a".into(), a), ("b".into(), b)], None).unwrap();
            std::fs::read(p).unwrap()
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn safetensors_bytes_give_an_error_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = parse_safetensors(&bytes);
            }

            #[test]
            fn mutated_safetensors_give_an_error_or_what_the_header_says(
                edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
                cut in any::<prop::sample::Index>(),
                truncate in any::<bool>(),
            ) {
                let mut bytes = valid_safetensors();
                for (at, b) in edits {
                    let i = at.index(bytes.len());
                    bytes[i] = b;
                }
                if truncate {
                    bytes.truncate(cut.index(bytes.len()));
                }
                if let Ok(t) = parse_safetensors(&bytes) {
                    for v in t.values() {
                        prop_assert_eq!(v.shape.iter().product::<usize>(), v.values.len());
                    }
                }
            }

            #[test]
            fn config_bytes_give_an_error_never_a_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
                let _ = parse_config(&bytes);
                let _ = parse_index(&bytes);
            }

            #[test]
            fn mutated_configs_give_an_error_or_a_model_we_can_build(
                key in prop::sample::select(vec![
                    "hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                    "intermediate_size", "head_dim", "num_key_value_heads", "rms_norm_eps",
                    "rope_theta", "tie_word_embeddings", "rope_traditional",
                    "rope_scaling", "rope_parameters", "max_position_embeddings",
                ]),
                value in prop_oneof![
                    any::<i64>().prop_map(serde_json::Value::from),
                    any::<f64>().prop_map(|f| serde_json::json!(f)),
                    any::<bool>().prop_map(serde_json::Value::from),
                    ".*".prop_map(serde_json::Value::from),
                    Just(serde_json::Value::Null),
                ],
            ) {
                let mut v = config();
                v[key] = value;
                if let Ok(c) = parse_config(v.to_string().as_bytes()) {
                    let m = &c.model;
                    prop_assert!(m.dims <= MAX_SIZE && m.vocab_size <= MAX_SIZE);
                    prop_assert!(m.num_layers <= MAX_LAYERS && m.mlp_dims <= MAX_SIZE);
                    prop_assert!(m.check().is_ok(), "{:?}", m);
                    prop_assert!(m.num_heads * m.head_dim() <= MAX_SIZE);
                }
            }
        }
    }
}
