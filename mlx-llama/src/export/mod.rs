//! `mlx-llama export`: a checkpoint as a folder others load, in Hugging
//! Face's layout (`LlamaForCausalLM.from_pretrained`) or mlx-lm's
//! (`mlx_lm.load`): `config.json`, `generation_config.json`,
//! `model.safetensors` under Hugging Face's tensor names, and the
//! tokenizer's files.
//!
//! The two differ in RoPE: ours rotates interleaved pairs, as MLX's
//! `traditional` RoPE, which mlx-lm's Llama does when the configuration says
//! `rope_traditional`; Hugging Face's rotates halves, so the `hf` export
//! reorders the rows of every query and key projection within each head
//! (see [`hf::halves_row_order`]), which leaves the logits unchanged.

pub mod mlx;
// The names and layouts import reads too (`crate::weights`), here where
// exporters have always found them.
pub use crate::weights::{WEIGHTS, hf, names};

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_array::{Array, Dtype};
use mlx_data::TextTokenizer;
use mlx_nn::ModuleExt;

use crate::Llama;

/// Whose layout to write.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// Hugging Face transformers' `LlamaForCausalLM` (RoPE by halves).
    Hf,
    /// mlx-lm's `llama` (RoPE on interleaved pairs, `rope_traditional`).
    Mlx,
}

impl Format {
    /// The `format` the safetensors header's `__metadata__` names.
    pub fn metadata_format(self) -> &'static str {
        match self {
            Format::Hf => "pt",
            Format::Mlx => "mlx",
        }
    }
}

/// Exports the newest intact checkpoint of a run folder, or a checkpoint
/// folder, to `out` (created if missing; files of the same names are
/// replaced). Returns the checkpoint folder read.
pub fn export(checkpoint_or_run: &Path, out: &Path, format: Format) -> Result<PathBuf> {
    export_with(checkpoint_or_run, out, format, &Merge::default())
}

/// Adapters an export merges into the model it writes.
#[derive(Clone, Debug, Default)]
pub struct Merge {
    /// Merge the checkpoint's own adapters (an adapter run's), and those
    /// of `adapter`: `W + scale B A`, DoRA's magnitude applied.
    pub fuse: bool,
    /// A folder of adapters in PEFT's or mlx-lm's layout to put on the
    /// model first (only with `fuse`).
    pub adapter: Option<PathBuf>,
    /// The tokenizer to write instead of the checkpoint's own
    /// ([`crate::checkpoint::tokenizer_of`]).
    pub tokenizer: Option<crate::TokenizerChoice>,
}

/// [`export`], merging adapters as `merge` says. A model with adapters is
/// written only merged: transformers' and mlx-lm's Llamas have no place
/// for them.
pub fn export_with(
    checkpoint_or_run: &Path,
    out: &Path,
    format: Format,
    merge: &Merge,
) -> Result<PathBuf> {
    let mut trained = crate::checkpoint::load_trained(checkpoint_or_run)?;
    if let Some(dir) = &merge.adapter {
        if !merge.fuse {
            bail!(
                "--adapter {} is merged into the export: pass --fuse",
                dir.display()
            );
        }
        if trained.model.has_adapters() {
            bail!(
                "{} holds adapters already: merge them first (export --fuse) and put {} on the merged export",
                trained.dir.display(),
                dir.display()
            );
        }
        crate::adapters::apply_from(dir, &mut trained.model)
            .with_context(|| format!("--adapter {}", dir.display()))?;
    }
    if trained.model.has_adapters() {
        if !merge.fuse {
            bail!(
                "{} holds adapters on a frozen base: pass --fuse to write the base with them merged, or use the adapters as they are (PEFT's layout in {}, mlx-lm's in {})",
                trained.dir.display(),
                trained.dir.display(),
                trained.dir.join(crate::adapters::MLX_LM_DIR).display()
            );
        }
        trained.model.fuse_adapters()?;
    }
    // The checkpoint's own tokenizer, never a path its manifest names
    // outside the run folder.
    let config = crate::TrainConfig {
        tokenizer: match &merge.tokenizer {
            Some(t) => t.clone(),
            None => crate::checkpoint::tokenizer_of(&trained.dir)?,
        },
        ..trained.config.clone()
    };
    let tokenizer = crate::trainer::tokenizer_for(&config)
        .with_context(|| format!("loading the tokenizer of {}", trained.dir.display()))?;
    write(
        &trained.model,
        &tokenizer,
        trained.config.block_size,
        out,
        format,
    )?;
    Ok(trained.dir)
}

/// Writes `model` with `tokenizer` to `out` in `format`;
/// `max_positions` is the longest sequence it was trained on, the
/// configuration's `max_position_embeddings` unless the model keeps its
/// own (an imported one; dynamic RoPE scaling's original length).
pub fn write(
    model: &Llama,
    tokenizer: &TextTokenizer,
    max_positions: usize,
    out: &Path,
    format: Format,
) -> Result<()> {
    let c = &model.config;
    if tokenizer.vocab_size() > c.vocab_size {
        bail!(
            "the tokenizer has {} tokens but the model only {} rows of embedding",
            tokenizer.vocab_size(),
            c.vocab_size
        );
    }
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let metadata = HashMap::from([("format".to_string(), format.metadata_format().to_string())]);
    let weights = out.join(WEIGHTS);
    mlx_array::save_safetensors(&weights, &tensors(model, format)?, Some(metadata))
        .with_context(|| format!("writing {}", weights.display()))?;
    let special = tokenizer.eos_id();
    let max_positions = match c.rope_scaling {
        mlx_nn::RopeScaling::Dynamic {
            original_max_position_embeddings,
            ..
        } => original_max_position_embeddings,
        _ if c.max_position_embeddings > 0 => c.max_position_embeddings,
        _ => max_positions,
    };
    let config = hf::config(c, max_positions, special);
    let config = match format {
        Format::Hf => config,
        Format::Mlx => mlx::config(config),
    };
    write_json(&out.join("config.json"), &config)?;
    write_json(
        &out.join("generation_config.json"),
        &hf::generation_config(special),
    )?;
    tokenizer
        .write_hf_files(out)
        .with_context(|| format!("writing the tokenizer's files to {}", out.display()))?;
    Ok(())
}

/// The model's parameters under Hugging Face's names, as float32, the query
/// and key rows reordered for `hf` (within each query head and each
/// key/value head). A tied model has no `lm_head.weight`.
pub fn tensors(model: &Llama, format: Format) -> Result<Vec<(String, Array)>> {
    let c = &model.config;
    let d = c.head_dim();
    let queries = hf::halves_row_order(c.num_heads, d);
    let keys = hf::halves_row_order(c.kv_heads(), d);
    let mut out = vec![];
    for (name, a) in model.named_parameters() {
        let theirs = names::hf_name(&name)
            .with_context(|| format!("no Hugging Face name for our parameter `{name}`"))?;
        let mut values = a.astype(Dtype::F32)?.to_vec::<f32>()?;
        let order = match names::rotated_heads(&theirs) {
            Some(names::Rotated::Queries) => Some(&queries),
            Some(names::Rotated::Keys) => Some(&keys),
            None => None,
        };
        if format == Format::Hf
            && let Some(order) = order
        {
            if a.shape() != [order.len(), c.dims] {
                bail!(
                    "`{name}` has shape {:?}, expected [{}, {}]",
                    a.shape(),
                    order.len(),
                    c.dims
                );
            }
            values = hf::reorder_rows(&values, c.dims, order);
        }
        out.push((theirs, Array::from_slice(&values, a.shape())?));
    }
    Ok(out)
}

fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", path.display()))
}

/// `mlx-llama export`'s arguments.
#[derive(clap::Args, Debug)]
pub struct ExportArgs {
    /// A run folder (its newest intact checkpoint) or a checkpoint folder.
    #[arg(long, default_value = "runs/latest")]
    pub checkpoint: PathBuf,
    /// The folder to write.
    #[arg(long)]
    pub out: PathBuf,
    /// hf: for transformers' LlamaForCausalLM; mlx: for mlx-lm.
    #[arg(long, value_enum, default_value_t = Format::Hf)]
    pub format: Format,
    /// Write into an --out folder that is not empty (files of the same
    /// names are replaced). Never inside a run's checkpoints.
    #[arg(long)]
    pub force: bool,
    /// Merge adapters into the weights written (an adapter run's, and
    /// --adapter's): W + scale B A, DoRA's magnitude applied; a plain model
    /// transformers and mlx-lm load.
    #[arg(long)]
    pub fuse: bool,
    /// Adapters in PEFT's or mlx-lm's layout (a folder with
    /// adapter_config.json) to merge into the checkpoint's model; needs --fuse.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
    /// The tokenizer to write, as train's --tokenizer; by default the
    /// checkpoint's own (the copy it keeps of its run's).
    #[arg(long)]
    pub tokenizer: Option<crate::TokenizerChoice>,
    /// Read a checkpoint of format 1, whose manifest records no checksums,
    /// without verifying its files (refused otherwise).
    #[arg(long)]
    pub allow_old_checkpoint_format: bool,
}

/// Refuses an export folder inside a run's checkpoints (a checkpoint
/// folder, or a `checkpoints` folder of a run, or below either: writing
/// there would corrupt a live checkpoint), and, without `force`, one that
/// exists and is not empty.
pub fn check_out(out: &Path, force: bool) -> Result<()> {
    // The nearest folder that exists, resolved (links, `..`), and the
    // names below it that do not exist yet.
    let mut existing = out.to_path_buf();
    while !existing.exists() {
        match existing.parent() {
            Some(p) if !p.as_os_str().is_empty() => existing = p.to_path_buf(),
            _ => {
                existing = PathBuf::from(".");
                break;
            }
        }
    }
    let resolved = existing
        .canonicalize()
        .with_context(|| format!("resolving {}", existing.display()))?;
    for dir in resolved.ancestors() {
        let checkpoint = dir.join("manifest.json").is_file();
        let checkpoints = dir.file_name().is_some_and(|n| n == "checkpoints")
            && (dir.join("latest").exists()
                || crate::checkpoint::list(dir.parent().unwrap_or(dir))
                    .is_ok_and(|l| !l.is_empty()));
        if checkpoint || checkpoints {
            bail!(
                "--out {} is inside a run's checkpoints ({}): an export there would overwrite or mix with a checkpoint; pass a folder outside the run's checkpoints folder",
                out.display(),
                dir.display()
            );
        }
    }
    let non_empty = out.is_dir()
        && std::fs::read_dir(out)
            .with_context(|| format!("listing {}", out.display()))?
            .next()
            .is_some();
    if out.exists() && !out.is_dir() {
        bail!("--out {} exists and is not a folder", out.display());
    }
    if non_empty && !force {
        bail!(
            "--out {} is not empty: pass --force to write into it (files of the same names are replaced), or an empty or new folder",
            out.display()
        );
    }
    Ok(())
}

/// Runs `mlx-llama export`, saying what it wrote.
pub fn run(args: ExportArgs) -> Result<()> {
    crate::checkpoint::allow_old_format(args.allow_old_checkpoint_format);
    check_out(&args.out, args.force)?;
    let merge = Merge {
        fuse: args.fuse,
        adapter: args.adapter.clone(),
        tokenizer: args.tokenizer.clone(),
    };
    let from = export_with(&args.checkpoint, &args.out, args.format, &merge)?;
    println!(
        "exported {} for {} to {}",
        from.display(),
        match args.format {
            Format::Hf => "transformers (hf)",
            Format::Mlx => "mlx-lm (mlx)",
        },
        args.out.display()
    );
    Ok(())
}
