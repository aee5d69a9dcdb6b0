//! Adapter files in PEFT's layout ([`super::peft`]) and mlx-lm's
//! ([`super::mlx_lm`]): what both share. [`save`] writes a model's adapter
//! tensors (our names, `layers.3.attention.query_proj.lora_a`) with their
//! [`AdapterSpec`]; [`load`] finds the layout by its files and gives the
//! spec and the tensors back under our names and in our shapes.
//!
//! Both layouts name a block's projections as Hugging Face's Llama does
//! and rotate RoPE by halves (transformers, PEFT, and mlx-lm's Llama built
//! from a Hugging Face model), while ours rotates interleaved pairs. So the
//! output rows of a query or key adapter (`B`'s rows, DoRA's magnitude) are
//! reordered within each head as `export --format hf` reorders the
//! projections' weights ([`crate::weights::hf::halves_row_order`]), and back
//! when read; `A` (rank by input) is unaffected. [`Rows::Interleaved`]
//! leaves them as ours, for a base exported with `--format mlx`
//! (`rope_traditional`).
//!
//! The files are untrusted: the configuration's every field that changes
//! the arithmetic is honoured or refused by name, and every tensor is
//! checked against the configuration and the model (its block, its rank,
//! its shape) before it is used.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, anyhow, bail};
use mlx_array::{Array, Dtype};

use super::{AdapterKind, AdapterSpec, Target, mlx_lm, peft};
use crate::LlamaConfig;
use crate::import::Tensor;

/// The configuration file of both layouts.
pub const CONFIG: &str = "adapter_config.json";

/// The most bytes an `adapter_config.json` may hold.
pub const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// Whose adapter layout.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Layout {
    /// PEFT's (`adapter_model.safetensors`, `PeftModel.from_pretrained`).
    #[default]
    Peft,
    /// mlx-lm's (`adapters.safetensors`, `mlx_lm.load(adapter_path=...)`).
    MlxLm,
}

impl Layout {
    /// The layout's weights file.
    pub fn weights_file(self) -> &'static str {
        match self {
            Layout::Peft => peft::WEIGHTS,
            Layout::MlxLm => mlx_lm::WEIGHTS,
        }
    }

    /// The layout of the adapter in `dir`, by its weights file; an error
    /// when it has neither or both.
    pub fn detect(dir: &Path) -> Result<Layout> {
        let has = |l: Layout| dir.join(l.weights_file()).is_file();
        match (has(Layout::Peft), has(Layout::MlxLm)) {
            (true, false) => Ok(Layout::Peft),
            (false, true) => Ok(Layout::MlxLm),
            (true, true) => bail!(
                "{} holds both {} (PEFT) and {} (mlx-lm): which adapter {CONFIG} describes is unclear; move one away",
                dir.display(),
                peft::WEIGHTS,
                mlx_lm::WEIGHTS
            ),
            (false, false) if dir.join(peft::PICKLE_WEIGHTS).is_file() => bail!(
                "{} holds PEFT's pickled {}, which is not read here: save the adapter with safe_serialization=True ({})",
                dir.display(),
                peft::PICKLE_WEIGHTS,
                peft::WEIGHTS
            ),
            (false, false) => bail!(
                "{} holds no adapter: expected {} (PEFT) or {} (mlx-lm) beside {CONFIG}",
                dir.display(),
                peft::WEIGHTS,
                mlx_lm::WEIGHTS
            ),
        }
    }
}

/// How the base model the adapter goes with orders its query and key
/// rows within each head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Rows {
    /// RoPE by halves: a Hugging Face model, and `export --format hf`
    /// (what PEFT and mlx-lm load a Hugging Face Llama as).
    #[default]
    Halves,
    /// RoPE on interleaved pairs, as ours: `export --format mlx`
    /// (`rope_traditional`).
    Interleaved,
}

/// How [`save`] writes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SaveOptions {
    /// Whose layout.
    pub layout: Layout,
    /// The base model's name or path the configuration records (PEFT's
    /// `base_model_name_or_path`, mlx-lm's `model`); `null` when empty.
    pub base_model: String,
    /// The base's query and key row order.
    pub rows: Rows,
    /// Replace an adapter of different contents in the folder.
    pub overwrite: bool,
}

impl SaveOptions {
    /// Sets the layout.
    pub fn layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }
    /// Sets the base model's name.
    pub fn base_model(mut self, name: impl Into<String>) -> Self {
        self.base_model = name.into();
        self
    }
    /// Sets the base's row order.
    pub fn rows(mut self, rows: Rows) -> Self {
        self.rows = rows;
        self
    }
    /// Allows replacing a different adapter.
    pub fn overwrite(mut self, overwrite: bool) -> Self {
        self.overwrite = overwrite;
        self
    }
}

/// One of an adapter's tensors.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Leaf {
    /// `A`, ours `[r, in]`.
    A,
    /// `B`, ours `[out, r]`.
    B,
    /// DoRA's magnitude `[out]`.
    Magnitude,
}

impl Leaf {
    /// Our name's last part.
    pub fn ours(self) -> &'static str {
        match self {
            Leaf::A => "lora_a",
            Leaf::B => "lora_b",
            Leaf::Magnitude => "magnitude",
        }
    }
}

/// One projection's adapter tensors, in our shapes.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Pair {
    pub a: Option<Tensor>,
    pub b: Option<Tensor>,
    pub m: Option<Tensor>,
}

impl Pair {
    fn slot(&mut self, leaf: Leaf) -> &mut Option<Tensor> {
        match leaf {
            Leaf::A => &mut self.a,
            Leaf::B => &mut self.b,
            Leaf::Magnitude => &mut self.m,
        }
    }
}

/// Every adapter by block and projection.
pub(crate) type Adapters = BTreeMap<(usize, Target), Pair>;

/// Adds `t` under (`layer`, `target`, `leaf`); a second one is an error
/// naming `name`.
pub(crate) fn insert(
    adapters: &mut Adapters,
    layer: usize,
    target: Target,
    leaf: Leaf,
    t: Tensor,
    name: &str,
) -> Result<()> {
    let slot = adapters.entry((layer, target)).or_default().slot(leaf);
    if slot.is_some() {
        bail!("tensor `{name}` is there twice");
    }
    *slot = Some(t);
    Ok(())
}

/// A block index as written in a tensor name: decimal digits, no sign,
/// no leading zero.
pub(crate) fn block_index(s: &str) -> Option<usize> {
    let plain =
        !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    if plain { s.parse().ok() } else { None }
}

/// Our name of an adapter tensor.
pub fn our_name(layer: usize, target: Target, leaf: Leaf) -> String {
    format!("layers.{layer}.{}.{}", target.ours(), leaf.ours())
}

/// (block, projection, tensor) of one of our adapter tensor names.
pub fn parse_our_name(name: &str) -> Option<(usize, Target, Leaf)> {
    let rest = name.strip_prefix("layers.")?;
    let (index, rest) = rest.split_once('.')?;
    let layer = block_index(index)?;
    let (path, leaf) = rest.rsplit_once('.')?;
    let leaf = [Leaf::A, Leaf::B, Leaf::Magnitude]
        .into_iter()
        .find(|l| l.ours() == leaf)?;
    let target = Target::ALL.into_iter().find(|t| t.ours() == path)?;
    Some((layer, target, leaf))
}

/// The projection's `[out, in]` in `config`'s model.
pub fn projection_shape(config: &LlamaConfig, target: Target) -> [usize; 2] {
    let q = config.num_heads * config.head_dim();
    let kv = config.kv_heads() * config.head_dim();
    match target {
        Target::Q => [q, config.dims],
        Target::K | Target::V => [kv, config.dims],
        Target::O => [config.dims, q],
        Target::Gate | Target::Up => [config.mlp_dims, config.dims],
        Target::Down => [config.dims, config.mlp_dims],
    }
}

/// Checks `adapters` against `spec` and the model: an adapter for every
/// block and projection the spec names and for no other, `A` `[r, in]`,
/// `B` `[out, r]`, DoRA's magnitude `[out]` (and none for LoRA). `name`
/// gives a tensor's name in the file's layout, for the errors.
pub(crate) fn check(
    spec: &AdapterSpec,
    config: &LlamaConfig,
    adapters: &Adapters,
    name: &dyn Fn(usize, Target, Leaf) -> String,
) -> Result<()> {
    spec.check(config.num_layers).map_err(|e| anyhow!(e))?;
    for (&(l, t), p) in adapters {
        let leaf = match (&p.a, &p.b) {
            (Some(_), _) => Leaf::A,
            (None, Some(_)) => Leaf::B,
            (None, None) => Leaf::Magnitude,
        };
        if l >= config.num_layers {
            bail!(
                "`{}` is for block {l}, but the model has {} blocks",
                name(l, t, leaf),
                config.num_layers
            );
        }
        if !spec.layers.contains(&l) || !spec.targets.contains(&t) {
            bail!(
                "`{}` is for block {l}'s {t} projection, which the configuration does not adapt (blocks {:?}, projections {})",
                name(l, t, leaf),
                spec.layers,
                targets_list(&spec.targets)
            );
        }
    }
    let r = spec.rank;
    for &l in &spec.layers {
        for &t in &spec.targets {
            let [out, inp] = projection_shape(config, t);
            let pair = adapters.get(&(l, t));
            let get = |leaf: Leaf| -> Result<&Tensor> {
                let slot = pair.and_then(|p| match leaf {
                    Leaf::A => p.a.as_ref(),
                    Leaf::B => p.b.as_ref(),
                    Leaf::Magnitude => p.m.as_ref(),
                });
                slot.ok_or_else(|| {
                    anyhow!(
                        "`{}` is missing: the configuration adapts block {l}'s {t} projection",
                        name(l, t, leaf)
                    )
                })
            };
            let a = get(Leaf::A)?;
            let b = get(Leaf::B)?;
            for (leaf, t_, want) in [(Leaf::A, a, [r, inp]), (Leaf::B, b, [out, r])] {
                if t_.shape != want {
                    let rank = if leaf == Leaf::A {
                        t_.shape.first()
                    } else {
                        t_.shape.get(1)
                    };
                    let hint = match rank {
                        Some(&got) if t_.shape.len() == 2 && got != r => {
                            format!(" (rank {got}, but the configuration says {r})")
                        }
                        _ => String::new(),
                    };
                    bail!(
                        "`{}` has shape {:?}, expected {want:?} for the model's {t} projection ({out} by {inp}) at rank {r}{hint}",
                        name(l, t, leaf),
                        t_.shape
                    );
                }
            }
            match spec.kind {
                AdapterKind::Dora => {
                    let m = get(Leaf::Magnitude)?;
                    if m.shape != [out] {
                        bail!(
                            "`{}` has shape {:?}, expected [{out}]",
                            name(l, t, Leaf::Magnitude),
                            m.shape
                        );
                    }
                }
                AdapterKind::Lora => {
                    if pair.is_some_and(|p| p.m.is_some()) {
                        bail!(
                            "`{}` is a DoRA magnitude, but the configuration says LoRA",
                            name(l, t, Leaf::Magnitude)
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

/// `q, k, ...` for messages.
pub(crate) fn targets_list(targets: &[Target]) -> String {
    targets
        .iter()
        .map(|t| t.short())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Reorders the output rows of every query and key adapter (checked by
/// [`check`]) from ours to halves (`to_halves`) or back.
pub(crate) fn reorder(config: &LlamaConfig, adapters: &mut Adapters, to_halves: bool) {
    let d = config.head_dim();
    let mut orders = HashMap::new();
    for heads in [config.num_heads, config.kv_heads()] {
        let order = crate::weights::hf::halves_row_order(heads, d);
        let order = if to_halves {
            order
        } else {
            let mut inverse = vec![0; order.len()];
            for (j, &r) in order.iter().enumerate() {
                inverse[r] = j;
            }
            inverse
        };
        orders.insert(heads, order);
    }
    for (&(_, t), pair) in adapters.iter_mut() {
        let heads = match t {
            Target::Q => config.num_heads,
            Target::K => config.kv_heads(),
            _ => continue,
        };
        let order = &orders[&heads];
        for (slot, cols) in [(&mut pair.b, None), (&mut pair.m, Some(1))] {
            if let Some(x) = slot {
                let cols = cols.unwrap_or_else(|| x.shape.get(1).copied().unwrap_or(1));
                x.values = crate::weights::hf::reorder_rows(&x.values, cols, order);
            }
        }
    }
}

/// The 2-D `t` transposed; an error naming `name` when it is not 2-D.
pub(crate) fn transpose(t: &Tensor, name: &str) -> Result<Tensor> {
    let &[rows, cols] = t.shape.as_slice() else {
        bail!("`{name}` has shape {:?}, expected a matrix", t.shape);
    };
    let mut values = Vec::with_capacity(t.values.len());
    for c in 0..cols {
        values.extend((0..rows).map(|r| t.values[r * cols + c]));
    }
    Ok(Tensor {
        shape: vec![cols, rows],
        values,
    })
}

/// A JSON number to write: an integer when it is one (PEFT writes
/// `"lora_alpha": 16`), else the float.
pub(crate) fn number(x: f64) -> serde_json::Value {
    if x.fract() == 0.0 && x.abs() < 9.0e15 {
        serde_json::json!(x as i64)
    } else {
        serde_json::json!(x)
    }
}

/// The layout's configuration and tensors (their names, their shapes, as
/// float32) for `tensors` (ours), checked against `spec` and `config`.
pub fn encode(
    spec: &AdapterSpec,
    config: &LlamaConfig,
    tensors: &[(String, Tensor)],
    options: &SaveOptions,
) -> Result<(serde_json::Value, Vec<(String, Tensor)>)> {
    let mut adapters = Adapters::new();
    for (name, t) in tensors {
        let (l, target, leaf) = parse_our_name(name).ok_or_else(|| {
            anyhow!("`{name}` is not an adapter tensor (layers.N.<projection>.lora_a, lora_b or magnitude)")
        })?;
        if t.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) != Some(t.values.len()) {
            bail!(
                "`{name}` has shape {:?} but {} values",
                t.shape,
                t.values.len()
            );
        }
        insert(&mut adapters, l, target, leaf, t.clone(), name)?;
    }
    check(spec, config, &adapters, &our_name)?;
    if options.rows == Rows::Halves {
        reorder(config, &mut adapters, true);
    }
    match options.layout {
        Layout::Peft => peft::encode(spec, config, &adapters, &options.base_model),
        Layout::MlxLm => mlx_lm::encode(spec, config, &adapters, &options.base_model),
    }
}

/// The spec and tensors (our names and shapes, `rows` undone) of an
/// adapter in `layout` from its files' bytes, for a model of `config`.
pub fn parse(
    layout: Layout,
    config_json: &[u8],
    weights: &[u8],
    config: &LlamaConfig,
    rows: Rows,
) -> Result<(AdapterSpec, Vec<(String, Tensor)>)> {
    let spec = match layout {
        Layout::Peft => peft::parse_config(config_json, config.num_layers),
        Layout::MlxLm => mlx_lm::parse_config(config_json, config.num_layers),
    }
    .with_context(|| format!("in {CONFIG}"))?;
    let file = layout.weights_file();
    let tensors =
        crate::import::parse_safetensors(weights).with_context(|| format!("in {file}"))?;
    let mut adapters = match layout {
        Layout::Peft => peft::decode(tensors),
        Layout::MlxLm => mlx_lm::decode(tensors),
    }
    .with_context(|| format!("in {file}"))?;
    let name: &dyn Fn(usize, Target, Leaf) -> String = match layout {
        Layout::Peft => &peft::name,
        Layout::MlxLm => &mlx_lm::name,
    };
    check(&spec, config, &adapters, name)
        .with_context(|| format!("in {file} against {CONFIG} and the model"))?;
    if rows == Rows::Halves {
        reorder(config, &mut adapters, false);
    }
    let mut out = vec![];
    for ((l, t), pair) in adapters {
        for (leaf, x) in [
            (Leaf::A, pair.a),
            (Leaf::B, pair.b),
            (Leaf::Magnitude, pair.m),
        ] {
            if let Some(x) = x {
                out.push((our_name(l, t, leaf), x));
            }
        }
    }
    Ok((spec, out))
}

/// Writes `params` (our names: every adapter tensor of the model, as
/// [`crate::Llama::adapter_parameters`] gives them, and nothing else) with
/// `spec` to the folder `dir` (made if missing) in `options.layout`, as
/// float32. Each file is written under a temporary name in the folder and
/// renamed into place; an adapter of different contents already there is
/// an error unless `options.overwrite` (the same contents are left as they
/// are). `config` is the model's, for the shapes and the heads.
pub fn save(
    dir: &Path,
    spec: &AdapterSpec,
    config: &LlamaConfig,
    params: &[(String, Array)],
    options: &SaveOptions,
) -> Result<()> {
    let tensors = params
        .iter()
        .map(|(n, a)| {
            let values = a
                .astype(Dtype::F32)
                .and_then(|a| a.to_vec::<f32>())
                .with_context(|| format!("reading `{n}`"))?;
            Ok((
                n.clone(),
                Tensor {
                    shape: a.shape().to_vec(),
                    values,
                },
            ))
        })
        .collect::<Result<Vec<_>>>()?;
    let (json, theirs) = encode(spec, config, &tensors, options)?;
    let metadata = match options.layout {
        Layout::Peft => Some(HashMap::from([("format".to_string(), "pt".to_string())])),
        Layout::MlxLm => None,
    };
    let weights = safetensors_bytes(&theirs, metadata)?;
    let json = serde_json::to_string_pretty(&json)? + "\n";
    write_files(
        dir,
        options.layout,
        &[
            (options.layout.weights_file(), weights),
            (CONFIG, json.into_bytes()),
        ],
        options.overwrite,
    )
}

/// Reads the adapter in `dir` (PEFT's or mlx-lm's, by its files) for a
/// model of `config` whose query and key rows rotate by halves: its spec,
/// and its tensors under our names and in our shapes, to put into a model
/// that [`crate::Llama::add_adapters`] gave the spec.
pub fn load(dir: &Path, config: &LlamaConfig) -> Result<(AdapterSpec, Vec<(String, Array)>)> {
    load_rows(dir, config, Rows::Halves)
}

/// [`load`] for a base of the given row order.
pub fn load_rows(
    dir: &Path,
    config: &LlamaConfig,
    rows: Rows,
) -> Result<(AdapterSpec, Vec<(String, Array)>)> {
    let layout = Layout::detect(dir)?;
    let config_path = dir.join(CONFIG);
    let json = crate::checkpoint::read_bounded(&config_path, MAX_CONFIG_BYTES)?;
    let weights_path = dir.join(layout.weights_file());
    let weights = std::fs::read(&weights_path)
        .with_context(|| format!("reading {}", weights_path.display()))?;
    let (spec, tensors) = parse(layout, &json, &weights, config, rows)
        .with_context(|| format!("the adapter in {}", dir.display()))?;
    let arrays = tensors
        .into_iter()
        .map(|(n, t)| Ok((n, Array::from_slice(&t.values, &t.shape)?)))
        .collect::<Result<Vec<_>>>()?;
    Ok((spec, arrays))
}

/// The safetensors bytes of float32 `tensors`.
fn safetensors_bytes(
    tensors: &[(String, Tensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>> {
    struct F32<'a>(&'a Tensor);
    impl safetensors::View for F32<'_> {
        fn dtype(&self) -> safetensors::Dtype {
            safetensors::Dtype::F32
        }
        fn shape(&self) -> &[usize] {
            &self.0.shape
        }
        fn data(&self) -> std::borrow::Cow<'_, [u8]> {
            self.0.values.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
        fn data_len(&self) -> usize {
            self.0.values.len() * 4
        }
    }
    safetensors::serialize(tensors.iter().map(|(n, t)| (n.as_str(), F32(t))), metadata)
        .map_err(|e| anyhow!("encoding the adapter's tensors: {e}"))
}

/// Writes `files` into `dir`: each to a temporary name there, synced,
/// then renamed over its final name. Unless `overwrite`, a final name that
/// holds other bytes, or the other layout's weights file, is an error
/// (nothing is replaced); with it, the other layout's weights file is
/// removed, so that the folder holds one adapter.
fn write_files(
    dir: &Path,
    layout: Layout,
    files: &[(&str, Vec<u8>)],
    overwrite: bool,
) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let other = dir.join(match layout {
        Layout::Peft => Layout::MlxLm.weights_file(),
        Layout::MlxLm => Layout::Peft.weights_file(),
    });
    if !overwrite {
        if other.exists() {
            bail!(
                "{} holds another adapter ({}): pass overwrite (--force) to replace it, or write to another folder",
                dir.display(),
                other.display()
            );
        }
        for (name, bytes) in files {
            let path = dir.join(name);
            if path.exists() {
                let old =
                    std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
                if &old != bytes {
                    bail!(
                        "{} holds a different adapter ({} differs): pass overwrite (--force) to replace it, or write to another folder",
                        dir.display(),
                        path.display()
                    );
                }
            }
        }
    }
    let tmp = |name: &str| -> PathBuf { dir.join(format!(".{name}.tmp.{}", std::process::id())) };
    for (name, bytes) in files {
        if let Err(e) = crate::checkpoint::write_synced(&tmp(name), bytes) {
            for (n, _) in files {
                let _ = std::fs::remove_file(tmp(n));
            }
            return Err(e);
        }
    }
    // The weights before the configuration that describes them.
    for (name, _) in files {
        let path = dir.join(name);
        std::fs::rename(tmp(name), &path)
            .with_context(|| format!("renaming into {}", path.display()))?;
    }
    if overwrite && other.exists() {
        std::fs::remove_file(&other).with_context(|| format!("removing {}", other.display()))?;
    }
    crate::checkpoint::sync_path(dir)
}

/// A configuration's JSON object, read field by field with errors that
/// name the field and what it holds.
pub(crate) struct Fields<'a>(pub &'a serde_json::Map<String, serde_json::Value>);

impl<'a> Fields<'a> {
    /// The object in `bytes`.
    pub fn parse(bytes: &[u8]) -> Result<serde_json::Value> {
        let v: serde_json::Value =
            serde_json::from_slice(bytes).map_err(|e| anyhow!("not JSON: {e}"))?;
        if !v.is_object() {
            bail!("expected a JSON object, found {}", kind(&v));
        }
        Ok(v)
    }

    /// The field, `None` when absent or null.
    pub fn get(&self, key: &str) -> Option<&'a serde_json::Value> {
        self.0.get(key).filter(|v| !v.is_null())
    }

    /// A non-negative integer field.
    pub fn usize(&self, key: &str) -> Result<Option<usize>> {
        self.get(key)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| anyhow!("`{key}` must be a non-negative integer, found {v}"))
            })
            .transpose()
    }

    /// A number field.
    pub fn f64(&self, key: &str) -> Result<Option<f64>> {
        self.get(key)
            .map(|v| {
                v.as_f64()
                    .ok_or_else(|| anyhow!("`{key}` must be a number, found {v}"))
            })
            .transpose()
    }

    /// A true/false field.
    pub fn bool(&self, key: &str) -> Result<Option<bool>> {
        self.get(key)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| anyhow!("`{key}` must be true or false, found {v}"))
            })
            .transpose()
    }

    /// A string field.
    pub fn str(&self, key: &str) -> Result<Option<&'a str>> {
        self.get(key)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| anyhow!("`{key}` must be a string, found {v}"))
            })
            .transpose()
    }

    /// Whether the field is absent, null, false, or an empty list, object
    /// or string: not set.
    pub fn unset(&self, key: &str) -> bool {
        match self.get(key) {
            None => true,
            Some(serde_json::Value::Bool(b)) => !b,
            Some(serde_json::Value::Array(a)) => a.is_empty(),
            Some(serde_json::Value::Object(o)) => o.is_empty(),
            Some(serde_json::Value::String(s)) => s.is_empty(),
            Some(_) => false,
        }
    }

    /// An error unless each of `keys` is unset; `why` says what it would
    /// need.
    pub fn refuse_set(&self, keys: &[(&str, &str)]) -> Result<()> {
        for (key, why) in keys {
            if !self.unset(key) {
                bail!("`{key}` is {}: {why}", self.0[*key]);
            }
        }
        Ok(())
    }
}

/// What kind of JSON value `v` is, for messages.
pub(crate) fn kind(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "a list",
        serde_json::Value::Object(_) => "an object",
    }
}
