//! Checkpoints: model and optimizer state in safetensors plus a JSON
//! manifest, written into a temporary folder and renamed into place.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

/// What a checkpoint folder's `manifest.json` holds.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version of the checkpoint layout.
    pub format: u32,
    /// Optimizer steps completed.
    pub step: u64,
    /// World size that wrote it.
    pub world: usize,
    /// The configuration parts that must match to resume.
    pub resume_key: serde_json::Value,
    /// The full configuration, for reference.
    pub config: serde_json::Value,
    /// Vocabulary size of the model (after growing to the tokenizer's).
    pub vocab_size: usize,
}

/// The folder of the checkpoint after `step` steps.
pub fn step_dir(out: &Path, step: u64) -> PathBuf {
    out.join("checkpoints").join(format!("step_{step:08}"))
}

/// The most recent complete checkpoint under `out`, if any.
pub fn latest(out: &Path) -> Result<Option<PathBuf>> {
    let pointer = out.join("checkpoints").join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let name = std::fs::read_to_string(&pointer)
        .with_context(|| format!("reading {}", pointer.display()))?;
    let dir = out.join("checkpoints").join(name.trim());
    if !dir.join("manifest.json").exists() {
        bail!(
            "{} names {}, which is not a complete checkpoint",
            pointer.display(),
            dir.display()
        );
    }
    Ok(Some(dir))
}

/// Reads and checks a checkpoint's manifest against the run's resume key.
pub fn read_manifest(dir: &Path, resume_key: &serde_json::Value, world: usize) -> Result<Manifest> {
    let path = dir.join("manifest.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let m: Manifest = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a valid checkpoint manifest", path.display()))?;
    if m.format != 1 {
        bail!(
            "{}: checkpoint format {} is not supported (expected 1)",
            path.display(),
            m.format
        );
    }
    if &m.resume_key != resume_key {
        let diff: Vec<String> = resume_key
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, v)| m.resume_key.get(k.as_str()) != Some(*v))
            .map(|(k, v)| {
                format!(
                    "{k}: checkpoint has {}, this run has {v}",
                    m.resume_key
                        .get(k.as_str())
                        .map_or("nothing".into(), |x| x.to_string())
                )
            })
            .collect();
        bail!(
            "checkpoint {} was written by a different configuration ({})",
            dir.display(),
            diff.join("; ")
        );
    }
    if m.world != world {
        bail!(
            "checkpoint {} was written by {} ranks; this run has {world} (the data position is per rank)",
            dir.display(),
            m.world
        );
    }
    Ok(m)
}

/// Makes `tmp` the checkpoint for `step` (atomically, by rename) and points `latest` at it.
pub fn publish(out: &Path, tmp: &Path, step: u64) -> Result<PathBuf> {
    let dir = step_dir(out, step);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("replacing {}", dir.display()))?;
    }
    std::fs::rename(tmp, &dir).with_context(|| format!("publishing {}", dir.display()))?;
    let pointer = out.join("checkpoints").join("latest");
    let tmp_pointer = pointer.with_extension("tmp");
    std::fs::write(
        &tmp_pointer,
        dir.file_name().expect("named").to_string_lossy().as_bytes(),
    )?;
    std::fs::rename(&tmp_pointer, &pointer)?;
    Ok(dir)
}
