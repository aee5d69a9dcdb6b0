//! Writing a run's checkpoints and resuming from the newest intact one.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use mlx_data::{DataLoader, LoaderState, Prefetcher};
use mlx_dist::Group;
use mlx_nn::ModuleExt;

use crate::Llama;
use crate::checkpoint::{self, Manifest};
use crate::config::TrainConfig;
use crate::sync::GradSync;

/// Restores the model, the optimizer state and this rank's loader from the
/// checkpoint to resume from, if any; returns the steps it had done (0
/// without one).
pub(super) fn resume(
    cfg: &TrainConfig,
    group: &Group,
    model: &mut Llama,
    sync: &mut dyn GradSync,
    loader: &mut DataLoader,
) -> Result<u64> {
    let Some(dir) = resume_from(cfg, group)? else {
        return Ok(0);
    };
    let rank = group.rank();
    let m = checkpoint::read_manifest(&dir, &cfg.resume_key(), group.size())?;
    model
        .load_weights(dir.join("model.safetensors"))
        .with_context(|| format!("loading the model from {}", dir.display()))?;
    sync.load(&dir, &model.trainable_parameters())?;
    let state_path = dir.join(format!("loader_rank{rank}.json"));
    let state = LoaderState::from_json(
        &std::fs::read_to_string(&state_path)
            .with_context(|| format!("reading {}", state_path.display()))?,
    )?;
    loader.restore(&state)?;
    if rank == 0 {
        println!("resuming from {} at step {}", dir.display(), m.step);
    }
    Ok(m.step)
}

/// The checkpoint to resume from: rank 0 picks the newest intact one
/// ([`checkpoint::latest_good`]) and tells the others its step.
fn resume_from(cfg: &TrainConfig, group: &Group) -> Result<Option<PathBuf>> {
    let found = match group.rank() {
        0 => checkpoint::latest_good(&cfg.out_dir),
        _ => Ok(None),
    };
    // The step chosen, 0 for none, -1 when rank 0 failed (every rank must
    // take part in the collective before any returns an error).
    let mut code = [match &found {
        Ok(Some(f)) => i64::try_from(f.manifest.step).unwrap_or(i64::MAX),
        Ok(None) => 0,
        Err(_) => -1,
    }];
    group.all_sum(&mut code)?;
    if let Some(f) = found? {
        return Ok(Some(f.dir));
    }
    match code[0] {
        0 => Ok(None),
        step if step > 0 => Ok(Some(checkpoint::step_dir(&cfg.out_dir, step as u64))),
        _ => bail!("rank 0 found no intact checkpoint to resume from (see its error)"),
    }
}

/// What a checkpoint holds.
pub(super) struct Parts<'a> {
    /// The weights (rank 0 writes them).
    pub model: &'a Llama,
    /// The optimizer state (each strategy writes its own files).
    pub sync: &'a dyn GradSync,
    /// Where each rank's loader is (every rank writes its own).
    pub batches: &'a Prefetcher,
}

/// Writes the checkpoint after `step` steps (every rank calls it) and
/// returns its folder. Each rank syncs the files it writes; once all are
/// written (the barriers), rank 0 hashes every one into the manifest,
/// publishes the folder and prunes old checkpoints.
pub(super) fn save(cfg: &TrainConfig, group: &Group, parts: Parts, step: u64) -> Result<PathBuf> {
    let out = &cfg.out_dir;
    let tmp = out.join("checkpoints").join(format!(".step_{step:08}.tmp"));
    if group.rank() == 0 {
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp)?;
        }
        std::fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    }
    group.barrier()?;
    let state_path = tmp.join(format!("loader_rank{}.json", group.rank()));
    checkpoint::write_synced(&state_path, parts.batches.state().to_json().as_bytes())?;
    group.barrier()?;
    parts.sync.save(&tmp)?;
    if group.rank() == 0 {
        publish(cfg, group, parts.model, &tmp, step)?;
    }
    group.barrier()?;
    Ok(checkpoint::step_dir(out, step))
}

/// Rank 0's part: the weights, the manifest, publishing and pruning.
fn publish(cfg: &TrainConfig, group: &Group, model: &Llama, tmp: &Path, step: u64) -> Result<()> {
    let out = &cfg.out_dir;
    let weights = tmp.join("model.safetensors");
    model.save_weights(&weights)?;
    checkpoint::sync_path(&weights)?;
    let manifest = Manifest {
        format: checkpoint::FORMAT,
        step,
        world: group.size(),
        resume_key: cfg.resume_key(),
        config: serde_json::to_value(cfg)?,
        vocab_size: model.config.vocab_size,
        files: checkpoint::file_entries(tmp)?,
    };
    checkpoint::write_manifest(tmp, &manifest)?;
    checkpoint::publish(out, tmp, step)?;
    for old in checkpoint::prune(out, cfg.keep_checkpoints)? {
        tracing::info!(rank = 0, checkpoint = %old.display(), "deleted an old checkpoint");
    }
    Ok(())
}
