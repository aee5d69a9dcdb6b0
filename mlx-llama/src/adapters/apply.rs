//! Adapters put into a [`Llama`], read out of it, and merged back.

use mlx_array::{Array, Dtype, Error, Result, random};
use mlx_nn::{AnyLinear, DoRALinear, LoRALinear, ModuleExt};

use super::{AdapterKind, AdapterSpec, Target};
use crate::Llama;
use crate::model::LlamaEncoderLayer;

/// The last part of an adapter tensor's name: what an adapter run trains
/// and saves.
pub const ADAPTER_LEAVES: [&str; 3] = ["lora_a", "lora_b", "magnitude"];

/// Whether `name` (ours) is an adapter's tensor.
pub fn is_adapter_tensor(name: &str) -> bool {
    name.rsplit('.')
        .next()
        .is_some_and(|leaf| ADAPTER_LEAVES.contains(&leaf))
}

/// The projection `target` of `layer`.
fn projection_mut(layer: &mut LlamaEncoderLayer, target: Target) -> &mut AnyLinear {
    match target {
        Target::Q => &mut layer.attention.query_proj,
        Target::K => &mut layer.attention.key_proj,
        Target::V => &mut layer.attention.value_proj,
        Target::O => &mut layer.attention.out_proj,
        Target::Gate => &mut layer.linear1,
        Target::Up => &mut layer.linear2,
        Target::Down => &mut layer.linear3,
    }
}

fn invalid(message: String) -> Error {
    Error::Invalid {
        op: "adapters",
        message,
    }
}

impl Llama {
    /// Freezes the whole model and puts a LoRA or DoRA adapter on each
    /// projection `spec` names (mlx-lm's `linear_to_lora_layers`, PEFT's
    /// `get_peft_model`): afterwards only the adapters train. `A` is drawn
    /// from `seed` (the same on every rank), `B` is zero, so the model's
    /// outputs are unchanged until a step trains it.
    pub fn add_adapters(&mut self, spec: &AdapterSpec, seed: u64) -> Result<()> {
        spec.check(self.layers.len()).map_err(invalid)?;
        if self.has_adapters() {
            return Err(invalid("the model has adapters already".into()));
        }
        let count = spec.layers.len() * spec.targets.len();
        let keys = random::split_keys(&random::key(seed), count.max(1))?;
        let config = spec.lora_config();
        self.freeze();
        let mut keys = keys.into_iter();
        for &l in &spec.layers {
            for &t in &spec.targets {
                let key = keys.next().expect("one key per adapter");
                let slot = projection_mut(&mut self.layers[l], t);
                let Some(base) = slot.as_linear() else {
                    return Err(invalid(format!(
                        "block {l}'s {t} projection is sharded: adapters go on whole layers (tensor parallelism does not train adapters)"
                    )));
                };
                let base = base.clone();
                *slot = match spec.kind {
                    AdapterKind::Lora => {
                        AnyLinear::Lora(LoRALinear::from_linear(base, &config, &key)?)
                    }
                    AdapterKind::Dora => {
                        AnyLinear::Dora(DoRALinear::from_linear(base, &config, &key)?)
                    }
                };
            }
        }
        Ok(())
    }

    /// Whether any projection carries an adapter.
    pub fn has_adapters(&self) -> bool {
        self.named_parameters()
            .iter()
            .any(|(n, _)| is_adapter_tensor(n))
    }

    /// The adapters' tensors under our names (`layers.3.attention.query_proj.lora_a`, ...).
    pub fn adapter_parameters(&self) -> Vec<(String, Array)> {
        self.named_parameters()
            .into_iter()
            .filter(|(n, _)| is_adapter_tensor(n))
            .collect()
    }

    /// Merges every adapter into its layer (`W + scale B A`, DoRA's
    /// magnitude applied row by row), leaving plain whole layers in float32
    /// and every parameter trainable: the model an export writes.
    pub fn fuse_adapters(&mut self) -> Result<()> {
        for layer in &mut self.layers {
            for t in Target::ALL {
                let slot = projection_mut(layer, t);
                let fused = match slot {
                    AnyLinear::Lora(l) => l.fuse()?,
                    AnyLinear::Dora(l) => l.fuse()?,
                    _ => continue,
                };
                *slot = fused.into();
            }
        }
        self.unfreeze();
        Ok(())
    }

    /// Sets each adapter's dropout key for the next forward pass, each
    /// its own split of `key` (`None`: no dropout, as in evaluation).
    pub fn set_adapter_dropout(&mut self, key: Option<&Array>) -> Result<()> {
        // One key per projection of every block, whether adapted or not:
        // each adapter's key depends on its place alone.
        let per_block = Target::ALL.len();
        let keys = match key {
            Some(k) => Some(random::split_keys(k, self.layers.len() * per_block)?),
            None => None,
        };
        for (l, layer) in self.layers.iter_mut().enumerate() {
            for (j, t) in Target::ALL.into_iter().enumerate() {
                let k = keys.as_ref().map(|ks| ks[l * per_block + j].clone());
                match projection_mut(layer, t) {
                    AnyLinear::Lora(a) => a.train_key = k,
                    AnyLinear::Dora(a) => a.train_key = k,
                    _ => {}
                }
            }
        }
        Ok(())
    }

    /// Holds every frozen floating-point parameter in `dtype` (the base
    /// weights of an adapter run, `--base-dtype`); what trains stays as it is.
    pub fn cast_frozen(&mut self, dtype: Dtype) -> Result<()> {
        let mut err = None;
        mlx_nn::Module::visit_mut(self, "", &mut |_, p| {
            if p.is_frozen() && p.value().dtype().is_float() && p.value().dtype() != dtype {
                match p.value().astype(dtype) {
                    Ok(v) => p.set(v),
                    Err(e) => err = err.take().or(Some(e)),
                }
            }
        });
        err.map_or(Ok(()), Err)
    }
}

/// The subfolder of a checkpoint that holds its adapters in mlx-lm's
/// layout (PEFT's is the checkpoint folder itself: both name their
/// configuration `adapter_config.json`).
pub const MLX_LM_DIR: &str = "mlx-lm";

/// Writes `model`'s adapters into `dir` in PEFT's layout and into
/// `dir/mlx-lm` in mlx-lm's, replacing what is there; `base` is the base
/// model's name or path the configurations record.
pub fn write_both_layouts(
    dir: &std::path::Path,
    spec: &AdapterSpec,
    model: &Llama,
    base: &str,
) -> anyhow::Result<()> {
    use super::{Layout, SaveOptions};
    let params = model.adapter_parameters();
    let options = SaveOptions::default()
        .base_model(base.to_string())
        .overwrite(true);
    super::save(dir, spec, &model.config, &params, &options)?;
    let mlx = dir.join(MLX_LM_DIR);
    std::fs::create_dir_all(&mlx)?;
    super::save(
        &mlx,
        spec,
        &model.config,
        &params,
        &options.layout(Layout::MlxLm),
    )?;
    Ok(())
}

/// Puts the adapters of the folder `dir` (PEFT's or mlx-lm's layout) into
/// `model`, which must have none yet; returns their spec.
pub fn apply_from(dir: &std::path::Path, model: &mut Llama) -> anyhow::Result<AdapterSpec> {
    let (spec, tensors) = super::load(dir, &model.config)?;
    model.add_adapters(&spec, 0)?;
    model.load_adapter_tensors(tensors)?;
    Ok(spec)
}

impl Llama {
    /// Sets the adapters' tensors from `(name, array)` pairs under our
    /// names (as [`super::load`] reads them), each cast to the dtype its
    /// parameter has.
    pub fn load_adapter_tensors(&mut self, tensors: Vec<(String, Array)>) -> Result<()> {
        let dtypes: std::collections::HashMap<String, Dtype> = self
            .named_parameters()
            .into_iter()
            .map(|(n, a)| (n, a.dtype()))
            .collect();
        let cast = tensors
            .into_iter()
            .map(|(n, a)| {
                let a = match dtypes.get(&n) {
                    Some(&d) if d != a.dtype() => a.astype(d)?,
                    _ => a,
                };
                Ok((n, a))
            })
            .collect::<Result<Vec<_>>>()?;
        self.update(&mlx_array::Tree::unflatten(cast)?)
    }
}

/// Whether `source` names a folder of adapters alone (PEFT's or mlx-lm's
/// layout: an `adapter_config.json` without a model's `config.json` or a
/// checkpoint's manifest).
pub fn is_adapter_folder(source: &crate::ModelSource) -> bool {
    let dir = std::path::Path::new(source.as_str());
    dir.join(super::files::CONFIG).is_file()
        && !dir.join("config.json").exists()
        && !dir.join(crate::checkpoint::MANIFEST).exists()
}

/// The model `source` starts from: itself, or for a folder of adapters the
/// base its configuration names (PEFT's `base_model_name_or_path`,
/// mlx-lm's `model`).
pub fn base_source(source: &crate::ModelSource) -> anyhow::Result<crate::ModelSource> {
    use anyhow::Context;
    if !is_adapter_folder(source) {
        return Ok(source.clone());
    }
    let path = std::path::Path::new(source.as_str()).join(super::files::CONFIG);
    let bytes = crate::checkpoint::read_bounded(&path, super::files::MAX_CONFIG_BYTES)?;
    let config: serde_json::Value = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not JSON", path.display()))?;
    let base = ["base_model_name_or_path", "model"]
        .iter()
        .find_map(|k| config.get(*k).and_then(|v| v.as_str()))
        .filter(|s| !s.is_empty())
        .with_context(|| {
            format!(
                "{} names no base model (base_model_name_or_path or model): the adapters cannot be trained without it",
                path.display()
            )
        })?;
    Ok(crate::ModelSource::from(base))
}
