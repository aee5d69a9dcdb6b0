//! Writing a run's checkpoints and resuming from the newest intact one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_data::{DataLoader, LoaderState, Prefetcher};
use mlx_dist::Group;
use mlx_nn::ModuleExt;

use crate::Llama;
use crate::checkpoint::{self, Layout, Manifest};
use crate::config::TrainConfig;
use crate::sync::{SavedState, Weights};

use super::precision::Precision;

/// Restores the model, the optimizer state and this rank's loader from the
/// checkpoint to resume from, if any; returns the steps it had done (0
/// without one). A checkpoint written by another number of ranks, or with
/// the optimizer state sharded when this run keeps it whole or the other
/// way round, is re-sharded: see [`resume_resharded`].
pub(super) fn resume(
    cfg: &TrainConfig,
    group: &Group,
    model: &mut Llama,
    state: &mut dyn SavedState,
    loader: &mut DataLoader,
    precision: &mut Precision,
) -> Result<u64> {
    let Some(dir) = resume_from(cfg, group)? else {
        return Ok(0);
    };
    precision.load(&dir)?;
    let rank = group.rank();
    let m = checkpoint::read_manifest(&dir, &cfg.resume_key())?;
    if model.has_adapters() {
        // An adapter run's checkpoint holds its adapters alone (PEFT's
        // layout); the base came from --init-from again.
        let (_, tensors) = crate::adapters::load(&dir, &model.config)
            .with_context(|| format!("loading the adapters from {}", dir.display()))?;
        model.load_adapter_tensors(tensors)?;
    } else {
        model
            .load_weights(dir.join("model.safetensors"))
            .with_context(|| format!("loading the model from {}", dir.display()))?;
    }
    let params = model.trainable_parameters();
    if !same_layout(&m, cfg, group.size(), &state.state_files()) {
        return resume_resharded(&dir, &m, group, state, &params, loader);
    }
    state.load(&dir, &params)?;
    let state_path = dir.join(format!("loader_rank{rank}.json"));
    let state = LoaderState::from_json(
        &std::fs::read_to_string(&state_path)
            .with_context(|| format!("reading {}", state_path.display()))?,
    )?;
    check_global_batch(&dir, &state, loader, group.size())?;
    loader.restore(&state)?;
    if rank == 0 {
        crate::console::line(&format!(
            "resuming from {} at step {}",
            dir.display(),
            m.step
        ));
    }
    Ok(m.step)
}

/// Whether this run lays out the optimizer state as the checkpoint does:
/// the same world size and the same state files (a checkpoint from before
/// format 3, which records no files: the same `shard_optimizer`).
fn same_layout(m: &Manifest, cfg: &TrainConfig, world: usize, mine: &[String]) -> bool {
    m.world == world
        && match &m.layout {
            Some(l) => l.optimizer_files == mine,
            None => m.resume_key.get("shard_optimizer") == Some(&cfg.shards_optimizer().into()),
        }
}

/// Resumes from a checkpoint laid out for another world size or strategy:
/// the optimizer state is put together whole from its files and cut again
/// for this world ([`SavedState::load_resharded`]), and every rank's loader
/// continues from the recorded position, which for the same global batch
/// means the same samples at any world size.
fn resume_resharded(
    dir: &Path,
    m: &Manifest,
    group: &Group,
    state: &mut dyn SavedState,
    params: &mlx_array::Tree,
    loader: &mut DataLoader,
) -> Result<u64> {
    let sharding = |files: usize| match files {
        1 => "whole optimizer state".to_string(),
        n => format!("optimizer state in {n} shards"),
    };
    let Some(layout) = &m.layout else {
        let then = m
            .resume_key
            .get("shard_optimizer")
            .and_then(|v| v.as_bool());
        bail!(
            "checkpoint {} (format {}) was written by {} rank(s) with shard_optimizer {}, and records no layout of its optimizer state and data position, so it cannot be re-sharded for {} rank(s) with shard_optimizer {}: resume it as it was written, or start afresh (--fresh); checkpoints of format 3 on resume on any number of ranks",
            dir.display(),
            m.format,
            m.world,
            then.map_or("unknown".into(), |b| b.to_string()),
            group.size(),
            state.state_files().len() > 1,
        );
    };
    check_global_batch(dir, &layout.data, loader, group.size())?;
    let files: Vec<PathBuf> = layout.optimizer_files.iter().map(|f| dir.join(f)).collect();
    state
        .load_resharded(&files, params)
        .with_context(|| format!("resuming from {}", dir.display()))?;
    loader.restore(&layout.data)?;
    if group.rank() == 0 {
        crate::console::line(&format!(
            "resuming from {} at step {}, re-sharded from {} rank(s) ({}) to {} ({})",
            dir.display(),
            m.step,
            m.world,
            sharding(layout.optimizer_files.len()),
            group.size(),
            sharding(state.state_files().len())
        ));
    }
    Ok(m.step)
}

/// A resume keeps the global batch (the rows of a micro-batch across the
/// world): the data position counts in it. The error says what to pass.
fn check_global_batch(
    dir: &Path,
    saved: &LoaderState,
    loader: &DataLoader,
    world: usize,
) -> Result<()> {
    let mine = loader.per_rank_batch() * world;
    if saved.global_batch() != mine {
        bail!(
            "checkpoint {} trained on batches of {} sequences ({} on each of {} ranks); this run's have {mine} ({} on each of {world}): a resume keeps the global batch, where the data position counts, so pass --global-batch {} (it must split evenly over the {world} ranks)",
            dir.display(),
            saved.global_batch(),
            saved.per_rank_batch,
            saved.world,
            loader.per_rank_batch(),
            saved.global_batch()
        );
    }
    Ok(())
}

/// The checkpoint to resume from: rank 0 picks the newest intact one
/// ([`checkpoint::latest_good`]) and tells the others the step of its
/// folder, which names that folder alone ([`checkpoint::step_of`]): every
/// rank opens the folder rank 0 verified, whose manifest records that step
/// (checked by [`checkpoint::verify`], and by every rank's read of it).
fn resume_from(cfg: &TrainConfig, group: &Group) -> Result<Option<PathBuf>> {
    let found = match group.rank() {
        0 => checkpoint::latest_good(&cfg.out_dir).and_then(|f| match f {
            Some(f) => {
                let step = checkpoint::step_of_dir(&f.dir).with_context(|| {
                    format!(
                        "{} is not a checkpoint folder (step_ and 8 digits)",
                        f.dir.display()
                    )
                })?;
                Ok(Some((f.dir, step)))
            }
            None => Ok(None),
        }),
        _ => Ok(None),
    };
    // The folder's step plus 1 (0 for none; step 0 is a checkpoint too),
    // -1 when rank 0 failed (every rank must take part in the collective
    // before any returns an error).
    let mut code = [match &found {
        Ok(Some((_, step))) => i64::try_from(*step).map_or(i64::MAX, |s| s.saturating_add(1)),
        Ok(None) => 0,
        Err(_) => -1,
    }];
    group.all_sum(&mut code)?;
    if let Some((dir, _)) = found? {
        return Ok(Some(dir));
    }
    match code[0] {
        0 => Ok(None),
        code if code > 0 => Ok(Some(checkpoint::step_dir(&cfg.out_dir, code as u64 - 1))),
        _ => bail!("rank 0 found no intact checkpoint to resume from (see its error)"),
    }
}

/// What a checkpoint holds.
pub(super) struct Parts<'a> {
    /// The weights (rank 0 writes them; gathered ones, every rank takes
    /// part).
    pub weights: &'a Weights<'a>,
    /// The optimizer state (each strategy writes its own files).
    pub state: &'a dyn SavedState,
    /// Where each rank's loader is (every rank writes its own).
    pub batches: &'a Prefetcher,
    /// The loss scale of a float16 run (rank 0 writes it).
    pub precision: &'a Precision,
}

/// Writes the checkpoint after `step` steps (every rank calls it) and
/// returns its folder. Each rank syncs the files it writes; once all are
/// written (the barriers), rank 0 hashes every one into the manifest,
/// publishes the folder and prunes old checkpoints.
pub(super) fn save(cfg: &TrainConfig, group: &Group, parts: Parts, step: u64) -> Result<PathBuf> {
    let tmp = cfg
        .out_dir
        .join("checkpoints")
        .join(format!(".step_{step:08}.tmp"));
    save_via(cfg, group, parts, step, &tmp).map_err(|e| {
        // A full disk: free what this checkpoint took; the previous one,
        // and `latest`, are untouched.
        if group.rank() == 0 {
            let _ = std::fs::remove_dir_all(&tmp);
        }
        e.context(format!(
            "writing the checkpoint of step {step} (the previous checkpoint, if any, is intact)"
        ))
    })
}

/// [`save`] through the temporary folder `tmp`.
fn save_via(
    cfg: &TrainConfig,
    group: &Group,
    parts: Parts,
    step: u64,
    tmp: &Path,
) -> Result<PathBuf> {
    let out = &cfg.out_dir;
    if group.rank() == 0 {
        if tmp.exists() {
            std::fs::remove_dir_all(tmp)?;
        }
        std::fs::create_dir_all(tmp).with_context(|| format!("creating {}", tmp.display()))?;
    }
    group.barrier()?;
    let state_path = tmp.join(format!("loader_rank{}.json", group.rank()));
    checkpoint::write_synced(&state_path, parts.batches.state().to_json().as_bytes())?;
    group.barrier()?;
    parts.state.save(tmp)?;
    if group.rank() == 0 {
        parts.precision.save(tmp)?;
        let layout = Layout {
            optimizer_files: parts.state.state_files(),
            data: parts.batches.state(),
        };
        publish(cfg, group, parts.weights, layout, tmp, step)?;
    } else if parts.weights.is_gathered() {
        parts.weights.save(None)?;
    }
    group.barrier()?;
    Ok(checkpoint::step_dir(out, step))
}

/// Rank 0's part: the weights, the manifest, publishing and pruning.
fn publish(
    cfg: &TrainConfig,
    group: &Group,
    weights: &Weights,
    layout: Layout,
    tmp: &Path,
    step: u64,
) -> Result<()> {
    let out = &cfg.out_dir;
    let model = weights.model;
    match cfg.adapters.spec(model.config.num_layers) {
        // An adapter run keeps only its adapters, in PEFT's layout here and
        // mlx-lm's in a subfolder: the frozen base is --init-from's.
        Some(spec) => {
            let base = match &cfg.init_from {
                Some(s) => crate::adapters::base_source(s)?.to_string(),
                None => String::new(),
            };
            crate::adapters::write_both_layouts(tmp, &spec, model, &base)?;
        }
        None => {
            let path = tmp.join("model.safetensors");
            weights.save(Some(&path))?;
            checkpoint::sync_path(&path)?;
        }
    }
    match &cfg.tokenizer {
        crate::TokenizerChoice::Train(_) => save_trained_tokenizer(cfg, tmp)?,
        other => checkpoint::copy_tokenizer(other, tmp)?,
    }
    let manifest = Manifest {
        format: checkpoint::FORMAT,
        step,
        world: group.size(),
        resume_key: cfg.resume_key(),
        config: serde_json::to_value(cfg)?,
        vocab_size: model.config.vocab_size,
        files: checkpoint::file_entries(tmp)?,
        layout: Some(layout),
    };
    checkpoint::write_manifest(tmp, &manifest)?;
    checkpoint::publish_folder(out, tmp, step)?;
    #[cfg(feature = "test-hooks")]
    super::test_kill::die_in_publish_if_asked(group.rank(), step)?;
    checkpoint::point_latest_at(out, step)?;
    for old in checkpoint::prune(out, cfg.keep_checkpoints)? {
        tracing::info!(rank = 0, checkpoint = %old.display(), "deleted an old checkpoint");
    }
    Ok(())
}

/// Writes the tokenizer a run trained on its data into the checkpoint
/// folder being written, `tmp`, as `tokenizer.json` (listed in the manifest
/// like the other files): a checkpoint's readers then need neither the
/// data nor the cache its manifest names ([`checkpoint::tokenizer_of`]).
/// The tokenizer is loaded (from the data cache) once per process and
/// configuration; later checkpoints write the same bytes.
fn save_trained_tokenizer(cfg: &TrainConfig, tmp: &Path) -> Result<()> {
    static SAVED: std::sync::Mutex<std::collections::BTreeMap<String, Vec<u8>>> =
        std::sync::Mutex::new(std::collections::BTreeMap::new());
    let key = serde_json::json!({
        "data": cfg.data,
        "tokenizer": cfg.tokenizer,
        "cache": cfg.data_cache,
        "out": cfg.out_dir,
    })
    .to_string();
    let path = tmp.join(checkpoint::TOKENIZER_FILE);
    let known = SAVED
        .lock()
        .map_err(|_| anyhow::anyhow!("a poisoned lock"))?
        .get(&key)
        .cloned();
    match known {
        Some(bytes) => checkpoint::write_synced(&path, &bytes),
        None => {
            let tokenizer = super::setup::tokenizer_for(cfg)
                .context("the tokenizer the run trained, for its checkpoint")?;
            tokenizer.save(&path)?;
            checkpoint::sync_path(&path)?;
            let bytes =
                std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
            SAVED
                .lock()
                .map_err(|_| anyhow::anyhow!("a poisoned lock"))?
                .insert(key, bytes);
            Ok(())
        }
    }
}
