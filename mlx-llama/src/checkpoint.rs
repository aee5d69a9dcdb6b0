//! Checkpoints: model and optimizer state in safetensors plus a JSON
//! manifest, written into a temporary folder and renamed into place.
//!
//! Durability: every file is fsynced by whoever writes it, the temporary
//! folder before it is renamed, and `checkpoints/` after each rename (the
//! folder's and the `latest` pointer's). The manifest lists every other file
//! of the folder with its size and sha256, checked before a resume; a
//! checkpoint that fails the check is passed over for the next newest.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The manifest format written: 2 adds `files` (format 1 had no
/// checksums), 3 adds `layout` (what resuming on another number of ranks
/// needs).
pub const FORMAT: u32 = 3;

pub(crate) const MANIFEST: &str = "manifest.json";

/// The largest manifest read (a real one is a few KiB): a bigger file is
/// refused before it is read whole.
const MAX_MANIFEST_BYTES: u64 = 16 << 20;

/// The largest `latest` pointer read (it holds `step_` and digits).
const MAX_POINTER_BYTES: u64 = 64;

/// The flag that lets a command read a checkpoint of format 1, whose
/// manifest records no checksums (and so no list of its files).
pub const ALLOW_OLD_FORMAT_FLAG: &str = "--allow-old-checkpoint-format";

/// Whether this process reads checkpoints of format 1 ([`ALLOW_OLD_FORMAT_FLAG`]).
static OLD_FORMAT_ALLOWED: AtomicBool = AtomicBool::new(false);

/// Lets [`verify`] (and so every command that reads a checkpoint) accept
/// checkpoints of format 1, unverified and with a warning, for the rest of
/// this process: what [`ALLOW_OLD_FORMAT_FLAG`] sets. Off by default, when
/// a format-1 manifest is refused (one edited to say format 1 would
/// otherwise turn the checksums off).
pub fn allow_old_format(allow: bool) {
    OLD_FORMAT_ALLOWED.store(allow, Ordering::Relaxed);
}

/// Whether `name` is a plain file name inside a checkpoint folder: not
/// empty, not `.` or `..`, no path separator, no NUL, and not absolute.
/// Names from a manifest or the `latest` pointer are untrusted: joined to
/// the folder unchecked, `..`, `/etc/passwd` or `/dev/zero` would reach
/// outside it.
pub fn is_plain_name(name: &str) -> bool {
    !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains(['/', '\\', '\0'])
        && !Path::new(name).is_absolute()
}

/// Reads at most `limit` bytes of `path`; an error when it holds more.
pub(crate) fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let f = File::open(path).with_context(|| format!("reading {}", path.display()))?;
    let mut bytes = Vec::new();
    f.take(limit + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading {}", path.display()))?;
    if bytes.len() as u64 > limit {
        bail!("{} is larger than {limit} bytes", path.display());
    }
    Ok(bytes)
}

/// The checkpoint folder name a `latest` pointer holds: `step_` and at
/// least 8 digits (surrounding white space allowed), else an error saying
/// what it holds.
pub fn parse_pointer(bytes: &[u8]) -> Result<String> {
    let text = std::str::from_utf8(bytes).context("the pointer is not UTF-8")?;
    let name = text.trim();
    if step_of(name).is_none() {
        bail!("the pointer holds {name:?}, not a checkpoint folder name (step_ and 8 digits)");
    }
    Ok(name.to_string())
}

/// The folder the `latest` pointer at `pointer` names, read bounded and
/// checked with [`parse_pointer`].
fn read_pointer(pointer: &Path) -> Result<PathBuf> {
    let bytes = read_bounded(pointer, MAX_POINTER_BYTES)?;
    let name = parse_pointer(&bytes).with_context(|| format!("{}", pointer.display()))?;
    Ok(pointer.with_file_name(name))
}

/// One file of a checkpoint folder, as its manifest records it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// File name inside the checkpoint folder.
    pub name: String,
    /// Size in bytes.
    pub bytes: u64,
    /// SHA-256 of the contents, lowercase hex.
    pub sha256: String,
}

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
    /// Every other file of the folder, by name (empty in format 1).
    #[serde(default)]
    pub files: Vec<FileEntry>,
    /// How the optimizer state and the data position are laid out, so that
    /// the checkpoint resumes on any number of ranks (format 3 on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<Layout>,
}

/// What a checkpoint records so that it resumes on a different number of
/// ranks than wrote it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layout {
    /// The optimizer state's files, in rank order: one holding the whole
    /// state, or one per rank of a state sharded over that many ranks (each
    /// parameter cut flat into `ceil(N / ranks)` elements per rank, see
    /// [`mlx_optim::read_whole_state`]).
    pub optimizer_files: Vec<String>,
    /// Where the training data stands: rank 0's loader state. The position
    /// (epoch, batches done) is the same on every rank and, for a given
    /// global batch, means the same samples at any world size (see
    /// [`mlx_data::DataLoader::restore`]).
    pub data: mlx_data::LoaderState,
}

/// The parts of the resume key that may differ when resuming on another
/// number of ranks: the batch (checked as rows across the world instead)
/// and whether the optimizer state is sharded (re-sharded on load).
const RESHARDABLE: [&str; 3] = ["global_batch", "per_rank_batch", "shard_optimizer"];

/// A checkpoint that passed [`verify`], found by [`latest_good`].
#[derive(Clone, Debug)]
pub struct Found {
    /// The checkpoint folder.
    pub dir: PathBuf,
    /// Its manifest.
    pub manifest: Manifest,
    /// Newer checkpoints passed over, each with what was wrong with it.
    pub rejected: Vec<String>,
}

/// The folder of the checkpoint after `step` steps.
pub fn step_dir(out: &Path, step: u64) -> PathBuf {
    out.join("checkpoints").join(format!("step_{step:08}"))
}

/// The step of a checkpoint folder name (`step_00000012`), if it is one:
/// only the name [`step_dir`] gives that step (`step_000000012` is not a
/// checkpoint), so that a step names exactly one folder.
pub fn step_of(name: &str) -> Option<u64> {
    let digits = name.strip_prefix("step_")?;
    if digits.len() < 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let step: u64 = digits.parse().ok()?;
    (format!("{step:08}") == digits).then_some(step)
}

/// The step of the checkpoint folder `dir` by its name, if it is one.
pub fn step_of_dir(dir: &Path) -> Option<u64> {
    dir.file_name().and_then(|n| n.to_str()).and_then(step_of)
}

/// The checkpoint `latest` points to under `out`, if any (unverified).
pub fn latest(out: &Path) -> Result<Option<PathBuf>> {
    let pointer = out.join("checkpoints").join("latest");
    if !pointer.exists() {
        return Ok(None);
    }
    let dir = read_pointer(&pointer)?;
    if !dir.join(MANIFEST).exists() {
        bail!(
            "{} names {}, which is not a complete checkpoint",
            pointer.display(),
            dir.display()
        );
    }
    Ok(Some(dir))
}

/// Every complete checkpoint under `out` (a `step_N` folder with a
/// manifest), oldest first. Other folders are not checkpoints.
pub fn list(out: &Path) -> Result<Vec<(u64, PathBuf)>> {
    let root = out.join("checkpoints");
    if !root.exists() {
        return Ok(vec![]);
    }
    let mut found = vec![];
    for entry in std::fs::read_dir(&root).with_context(|| format!("listing {}", root.display()))? {
        let path = entry?.path();
        let step = path.file_name().and_then(|n| n.to_str()).and_then(step_of);
        if let Some(step) = step.filter(|_| path.join(MANIFEST).is_file()) {
            found.push((step, path));
        }
    }
    found.sort();
    Ok(found)
}

/// Flushes a file or a folder (opened read-only; works on Linux and macOS) to disk.
pub fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .with_context(|| format!("syncing {}", path.display()))
}

/// Writes `bytes` to `path` and flushes it to disk.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Size and SHA-256 (lowercase hex) of a file, reading at most `limit`
/// bytes and one more (so a longer file shows as longer without being read
/// whole: `/dev/zero` has no end).
fn hash_file(path: &Path, limit: u64) -> std::io::Result<(u64, String)> {
    let mut f = File::open(path)?.take(limit.saturating_add(1));
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        bytes += n as u64;
    }
    let hex = hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    Ok((bytes, hex))
}

/// Size and SHA-256 of every file of `dir` but the manifest, by name. Call
/// it once every rank has written its files.
pub fn file_entries(dir: &Path) -> Result<Vec<FileEntry>> {
    let mut files = vec![];
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let path = entry?.path();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if name == MANIFEST || !path.is_file() {
            continue;
        }
        let (bytes, sha256) =
            hash_file(&path, u64::MAX).with_context(|| format!("hashing {}", path.display()))?;
        files.push(FileEntry {
            name,
            bytes,
            sha256,
        });
    }
    files.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(files)
}

/// Writes `manifest` into `dir`, flushed to disk.
pub fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<()> {
    write_synced(
        &dir.join(MANIFEST),
        serde_json::to_string_pretty(manifest)?.as_bytes(),
    )
}

/// Reads a manifest (bounded), checked by [`Manifest::from_bytes`]; in a
/// checkpoint folder (named `step_` and its step) the manifest must record
/// that step: one that says another is corrupt (resuming it would count
/// the steps from one checkpoint and load the files of another).
fn parse_manifest(dir: &Path) -> Result<Manifest> {
    let path = dir.join(MANIFEST);
    let bytes = read_bounded(&path, MAX_MANIFEST_BYTES)?;
    let m = Manifest::from_bytes(&bytes).with_context(|| format!("{}", path.display()))?;
    if let Some(step) = step_of_dir(dir)
        && step != m.step
    {
        bail!(
            "{}: the manifest says step {}, but it is the folder of step {step}: a checkpoint whose manifest names another step is corrupt",
            path.display(),
            m.step
        );
    }
    Ok(m)
}

impl Manifest {
    /// A manifest from the bytes of `manifest.json`, refused (with what is
    /// wrong) when it is not JSON of the layout, of a format this version
    /// does not read, lists no files (format 2 on), or names a file that is
    /// not a plain name inside the folder ([`is_plain_name`]), twice, or the
    /// manifest itself; the layout's optimizer files must be listed files.
    pub fn from_bytes(bytes: &[u8]) -> Result<Manifest> {
        let m: Manifest =
            serde_json::from_slice(bytes).context("not a valid checkpoint manifest")?;
        if m.format == 0 || m.format > FORMAT {
            bail!(
                "checkpoint format {} is not supported (this version reads 1 to {FORMAT})",
                m.format
            );
        }
        if m.format >= 2 && m.files.is_empty() {
            bail!("the manifest lists no files");
        }
        let mut seen = std::collections::HashSet::new();
        for f in &m.files {
            if !is_plain_name(&f.name) || f.name == MANIFEST {
                bail!(
                    "the manifest lists {:?}, which is not a file name inside the checkpoint folder",
                    f.name
                );
            }
            if !seen.insert(f.name.as_str()) {
                bail!("the manifest lists {:?} twice", f.name);
            }
            if f.sha256.len() != 64 || !f.sha256.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("the manifest's sha256 of {:?} is not 64 hex digits", f.name);
            }
        }
        if let Some(l) = &m.layout {
            if l.optimizer_files.is_empty() {
                bail!("the manifest's layout lists no optimizer files");
            }
            // Format 1 lists no files: the names are checked alone.
            let unlisted = |f: &&String| {
                !is_plain_name(f) || (!m.files.is_empty() && !seen.contains(f.as_str()))
            };
            if let Some(bad) = l.optimizer_files.iter().find(unlisted) {
                bail!("the layout's optimizer file {bad:?} is not a file the manifest lists");
            }
        }
        Ok(m)
    }
}

/// Reads a checkpoint's manifest and checks every file it lists (size, then
/// sha256), and that it lists every file of the folder (so that nothing
/// unverified is read from it); the error names the file and what is
/// wrong. A format-1 checkpoint has no checksums: refused unless this
/// process allows it ([`allow_old_format`]), then accepted unverified with
/// a warning.
pub fn verify(dir: &Path) -> Result<Manifest> {
    verify_allowing(dir, OLD_FORMAT_ALLOWED.load(Ordering::Relaxed))
}

/// [`verify`], with format 1 accepted (unverified, with a warning) when
/// `old_format` holds, whatever [`allow_old_format`] said.
pub fn verify_allowing(dir: &Path, old_format: bool) -> Result<Manifest> {
    let m = parse_manifest(dir)?;
    if m.format == 1 && m.files.is_empty() {
        if !old_format {
            bail!(
                "{}: checkpoint format 1 records no checksums, so its files cannot be verified; to read it anyway, unverified, pass {ALLOW_OLD_FORMAT_FLAG}",
                dir.join(MANIFEST).display()
            );
        }
        tracing::warn!(
            checkpoint = %dir.display(),
            "checkpoint format 1 has no checksums: its files are not verified ({ALLOW_OLD_FORMAT_FLAG})"
        );
        return Ok(m);
    }
    for f in &m.files {
        let path = dir.join(&f.name);
        // A plain file of the folder, not a link to one elsewhere, nor a device.
        let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
        if !is_file {
            bail!(
                "{}: listed in the manifest but not a regular file",
                path.display()
            );
        }
        let (bytes, sha256) = hash_file(&path, f.bytes).with_context(|| {
            format!("{}: listed in the manifest but unreadable", path.display())
        })?;
        if bytes != f.bytes {
            bail!(
                "{}: {bytes} bytes, the manifest says {}",
                path.display(),
                f.bytes
            );
        }
        if sha256 != f.sha256 {
            bail!(
                "{}: sha256 {sha256}, the manifest says {}",
                path.display(),
                f.sha256
            );
        }
    }
    check_nothing_unlisted(dir, &m)?;
    Ok(m)
}

/// Refuses a checkpoint folder holding an entry its manifest does not list
/// (but the manifest, folders, and hidden names such as `.DS_Store`, none
/// of which is ever read from a checkpoint): files are read from a
/// checkpoint by name, and one that is not listed has not been verified.
fn check_nothing_unlisted(dir: &Path, m: &Manifest) -> Result<()> {
    let listed: std::collections::HashSet<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    for entry in std::fs::read_dir(dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name == MANIFEST || name.starts_with('.') || listed.contains(name.as_ref()) {
            continue;
        }
        // A link is not followed: a link to a folder is an entry like a file.
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        bail!(
            "{}: not listed in the manifest, so not verified (a checkpoint's manifest lists every file of its folder)",
            dir.join(name.as_ref()).display()
        );
    }
    Ok(())
}

/// The newest intact checkpoint under `out`: the one `latest` points to,
/// else the others by step, newest first, each passed over with a warning
/// saying what was wrong. `None` when there is no checkpoint at all; an
/// error listing every problem when none is intact.
pub fn latest_good(out: &Path) -> Result<Option<Found>> {
    let pointer = out.join("checkpoints").join("latest");
    let mut rejected = vec![];
    let mut candidates = vec![];
    if pointer.exists() {
        match read_pointer(&pointer) {
            Ok(dir) => candidates.push(dir),
            Err(e) => rejected.push(format!("{e:#}")),
        }
    }
    for (_, dir) in list(out)?.into_iter().rev() {
        if !candidates.contains(&dir) {
            candidates.push(dir);
        }
    }
    for dir in candidates {
        match verify(&dir) {
            Ok(manifest) => {
                return Ok(Some(Found {
                    dir,
                    manifest,
                    rejected,
                }));
            }
            Err(e) => {
                tracing::warn!(
                    checkpoint = %dir.display(),
                    "passing over a corrupt checkpoint: {e:#}"
                );
                rejected.push(format!("{}: {e:#}", dir.display()));
            }
        }
    }
    if rejected.is_empty() {
        return Ok(None);
    }
    bail!(
        "no intact checkpoint under {}:\n  {}",
        out.join("checkpoints").display(),
        rejected.join("\n  ")
    )
}

/// Reads a checkpoint's manifest and checks it against the run's resume
/// key, all but the parts resharding changes (the batch, whether the
/// optimizer state is sharded): those are the resume's to check.
pub fn read_manifest(dir: &Path, resume_key: &serde_json::Value) -> Result<Manifest> {
    let m = parse_manifest(dir)?;
    let differs = |k: &str, v: &serde_json::Value| {
        !RESHARDABLE.contains(&k) && m.resume_key.get(k) != Some(v)
    };
    let diff: Vec<String> = resume_key
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| differs(k, v))
        .map(|(k, v)| {
            format!(
                "{k}: checkpoint has {}, this run has {v}",
                m.resume_key
                    .get(k.as_str())
                    .map_or("nothing".into(), |x| x.to_string())
            )
        })
        .collect();
    if !diff.is_empty() {
        bail!(
            "checkpoint {} was written by a different configuration ({})",
            dir.display(),
            diff.join("; ")
        );
    }
    Ok(m)
}

/// Makes `tmp` (every file in it already synced) the checkpoint for `step`:
/// syncs the folder, renames it into place, points `latest` at it (a synced
/// temporary file renamed over the old pointer) and syncs `checkpoints/`
/// after each rename.
pub fn publish(out: &Path, tmp: &Path, step: u64) -> Result<PathBuf> {
    let dir = publish_folder(out, tmp, step)?;
    point_latest_at(out, step)?;
    Ok(dir)
}

/// [`publish`]'s first half: `tmp` synced and renamed to the checkpoint
/// folder of `step`, `checkpoints/` synced; `latest` still points to the
/// previous checkpoint.
pub fn publish_folder(out: &Path, tmp: &Path, step: u64) -> Result<PathBuf> {
    let root = out.join("checkpoints");
    let dir = step_dir(out, step);
    sync_path(tmp)?;
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("replacing {}", dir.display()))?;
    }
    std::fs::rename(tmp, &dir).with_context(|| format!("publishing {}", dir.display()))?;
    sync_path(&root)?;
    Ok(dir)
}

/// [`publish`]'s second half: `latest` pointed at the checkpoint of `step`
/// (a synced temporary file renamed over the old pointer), `checkpoints/`
/// synced.
pub fn point_latest_at(out: &Path, step: u64) -> Result<()> {
    let root = out.join("checkpoints");
    let pointer = root.join("latest");
    let tmp_pointer = pointer.with_extension("tmp");
    write_synced(&tmp_pointer, format!("step_{step:08}").as_bytes())?;
    std::fs::rename(&tmp_pointer, &pointer)
        .with_context(|| format!("replacing {}", pointer.display()))?;
    sync_path(&root)
}

/// Deletes the oldest complete checkpoints beyond the `keep` newest (0 keeps
/// all), never the one `latest` points to; returns the folders deleted.
pub fn prune(out: &Path, keep: usize) -> Result<Vec<PathBuf>> {
    let all = list(out)?;
    if keep == 0 || all.len() <= keep {
        return Ok(vec![]);
    }
    let current = latest(out).ok().flatten();
    let mut deleted = vec![];
    for (_, dir) in &all[..all.len() - keep] {
        if Some(dir) == current.as_ref() {
            continue;
        }
        // Without its manifest the folder is no longer a checkpoint, so an
        // interrupted deletion leaves nothing that looks like one.
        std::fs::remove_file(dir.join(MANIFEST))
            .and_then(|()| std::fs::remove_dir_all(dir))
            .with_context(|| format!("deleting {}", dir.display()))?;
        deleted.push(dir.clone());
    }
    sync_path(&out.join("checkpoints"))?;
    Ok(deleted)
}

/// The name of the copy of a run's `tokenizer.json` in its checkpoints.
pub const TOKENIZER_FILE: &str = "tokenizer.json";

/// The files beside a `tokenizer.json` that its chat template comes from,
/// copied with it when they exist.
const TOKENIZER_SIDE_FILES: [&str; 2] = ["tokenizer_config.json", "chat_template.jinja"];

/// GPT-2's two files (`--tokenizer` of a folder holding them).
const GPT2_FILES: [&str; 2] = ["vocab.json", "merges.txt"];

/// The largest tokenizer file read (real ones are tens of MiB at most).
const MAX_TOKENIZER_BYTES: u64 = 1 << 30;

/// Copies the files of the run's tokenizer `choice` (a `tokenizer.json`
/// and the chat template files beside it, or GPT-2's two files) into the
/// checkpoint folder being written, `into`, each read bounded and synced:
/// the manifest then lists them with their sizes and checksums, and
/// [`tokenizer_of`] reads them from the checkpoint instead of a path the
/// manifest names. Other tokenizers have no file to copy. Each file is
/// written under a name of this process's and renamed into place, so ranks
/// copying the same files into one folder never read a half-written one.
pub fn copy_tokenizer(choice: &crate::TokenizerChoice, into: &Path) -> Result<()> {
    let copy = |from: &Path, name: &str| -> Result<()> {
        let bytes = read_bounded(from, MAX_TOKENIZER_BYTES)
            .with_context(|| format!("copying the tokenizer into {}", into.display()))?;
        let to = into.join(name);
        let tmp = into.join(format!(".{name}.{}.tmp", std::process::id()));
        write_synced(&tmp, &bytes)?;
        std::fs::rename(&tmp, &to).with_context(|| format!("writing {}", to.display()))
    };
    match choice {
        crate::TokenizerChoice::File(p) => {
            copy(p, TOKENIZER_FILE)?;
            let beside = p.parent().unwrap_or(Path::new("."));
            for name in TOKENIZER_SIDE_FILES {
                if beside.join(name).is_file() {
                    copy(&beside.join(name), name)?;
                }
            }
        }
        crate::TokenizerChoice::Gpt2Files(d) => {
            for name in GPT2_FILES {
                copy(&d.join(name), name)?;
            }
        }
        crate::TokenizerChoice::Auto | crate::TokenizerChoice::Train(_) => {}
    }
    Ok(())
}

/// Checks the file `name` the manifest `m` of `dir` lists: a regular file
/// (not a link) of the recorded size and sha256, read no further than that
/// size; an error when it is not listed or differs.
fn check_listed(dir: &Path, m: &Manifest, name: &str) -> Result<PathBuf> {
    let f = m
        .files
        .iter()
        .find(|f| f.name == name)
        .with_context(|| format!("{}: the manifest does not list {name}", dir.display()))?;
    let path = dir.join(name);
    let is_file = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_file());
    if !is_file {
        bail!(
            "{}: listed in the manifest but not a regular file",
            path.display()
        );
    }
    let (bytes, sha256) = hash_file(&path, f.bytes)
        .with_context(|| format!("{}: listed in the manifest but unreadable", path.display()))?;
    if bytes != f.bytes || sha256 != f.sha256 {
        bail!(
            "{}: {bytes} bytes with sha256 {sha256}, the manifest says {} bytes with sha256 {}",
            path.display(),
            f.bytes,
            f.sha256
        );
    }
    Ok(path)
}

/// The folder that paths from the manifest of checkpoint `dir` must stay
/// in: its run folder (`dir` is `RUN/checkpoints/step_N`), or the
/// checkpoint folder itself when it lies elsewhere; resolved (links, `..`).
fn run_folder_of(dir: &Path) -> Result<PathBuf> {
    let dir = dir
        .canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))?;
    let parent = dir
        .parent()
        .filter(|p| p.file_name().is_some_and(|n| n == "checkpoints"));
    Ok(match parent.and_then(Path::parent) {
        Some(run) => run.to_path_buf(),
        None => dir,
    })
}

/// `path`, resolved (links, `..`), when it lies inside `run` and is a
/// regular file of at most [`MAX_TOKENIZER_BYTES`]; else an error naming
/// it, the manifest and the folder it must stay in.
fn inside_run(manifest: &Path, run: &Path, path: &Path) -> Result<PathBuf> {
    let outside = || {
        anyhow::anyhow!(
            "{}: the run's tokenizer {} is outside its run folder {}, and the checkpoint keeps no copy of it: refused (paths from a manifest stay inside the run folder); pass the tokenizer with --tokenizer",
            manifest.display(),
            path.display(),
            run.display()
        )
    };
    let resolved = path.canonicalize().map_err(|_| outside())?;
    if !resolved.starts_with(run) {
        return Err(outside());
    }
    let meta = std::fs::metadata(&resolved)
        .with_context(|| format!("{}: reading {}", manifest.display(), resolved.display()))?;
    if !meta.is_file() || meta.len() > MAX_TOKENIZER_BYTES {
        bail!(
            "{}: the run's tokenizer {} is not a regular file of at most {MAX_TOKENIZER_BYTES} bytes",
            manifest.display(),
            resolved.display()
        );
    }
    Ok(resolved)
}

/// The tokenizer of the checkpoint `dir`, never a path that leads outside
/// its run folder: the copy the checkpoint keeps ([`copy_tokenizer`]; its
/// files checked against the manifest, read no further than their recorded
/// sizes), else (a checkpoint written before copies were kept) the path
/// its run's configuration names when that lies inside the run folder (a
/// regular file, bounded), else an error saying to pass `--tokenizer`.
/// A tokenizer the run trained is its saved copy too (a checkpoint written
/// before copies were kept still finds it in the data cache); the
/// embedded GPT-2 names no file.
pub fn tokenizer_of(dir: &Path) -> Result<crate::TokenizerChoice> {
    use crate::TokenizerChoice;
    let m = parse_manifest(dir)?;
    let manifest = dir.join(MANIFEST);
    let config: crate::TrainConfig = serde_json::from_value(m.config.clone())
        .with_context(|| format!("the configuration in {}", manifest.display()))?;
    let listed = |name: &str| m.files.iter().any(|f| f.name == name);
    match config.tokenizer {
        TokenizerChoice::File(_) if listed(TOKENIZER_FILE) => {
            for name in TOKENIZER_SIDE_FILES.into_iter().filter(|n| listed(n)) {
                check_listed(dir, &m, name)?;
            }
            Ok(TokenizerChoice::File(check_listed(
                dir,
                &m,
                TOKENIZER_FILE,
            )?))
        }
        // A tokenizer the run trained, saved whole (never retrained from
        // the data, or looked up in the cache, the manifest names).
        TokenizerChoice::Train(_) if listed(TOKENIZER_FILE) => Ok(TokenizerChoice::File(
            check_listed(dir, &m, TOKENIZER_FILE)?,
        )),
        TokenizerChoice::Gpt2Files(_) if GPT2_FILES.iter().all(|n| listed(n)) => {
            for name in GPT2_FILES {
                check_listed(dir, &m, name)?;
            }
            Ok(TokenizerChoice::Gpt2Files(dir.to_path_buf()))
        }
        TokenizerChoice::File(p) => {
            let run = run_folder_of(dir)?;
            Ok(TokenizerChoice::File(inside_run(&manifest, &run, &p)?))
        }
        TokenizerChoice::Gpt2Files(d) => {
            let run = run_folder_of(dir)?;
            for name in GPT2_FILES {
                inside_run(&manifest, &run, &d.join(name))?;
            }
            let resolved = d
                .canonicalize()
                .with_context(|| format!("resolving {}", d.display()))?;
            Ok(TokenizerChoice::Gpt2Files(resolved))
        }
        other => Ok(other),
    }
}

/// A trained model read back from a checkpoint.
#[derive(Clone, Debug)]
pub struct Trained {
    /// The checkpoint folder it came from.
    pub dir: PathBuf,
    /// The run's configuration, as its manifest records it.
    pub config: crate::TrainConfig,
    /// The model, its vocabulary the manifest's.
    pub model: crate::Llama,
}

/// The folder of a checkpoint (verified), or of the newest intact
/// checkpoint of a run folder, with its training and model configurations.
pub(crate) fn locate(
    checkpoint_or_run: &Path,
) -> Result<(PathBuf, crate::TrainConfig, crate::LlamaConfig)> {
    let (dir, manifest) = if checkpoint_or_run.join(MANIFEST).exists() {
        (checkpoint_or_run.to_path_buf(), verify(checkpoint_or_run)?)
    } else {
        let f = latest_good(checkpoint_or_run)?
            .with_context(|| format!("{} holds no checkpoint", checkpoint_or_run.display()))?;
        (f.dir, f.manifest)
    };
    let config: crate::TrainConfig = serde_json::from_value(manifest.config.clone())
        .with_context(|| format!("the configuration in {}", dir.join(MANIFEST).display()))?;
    let model_config = crate::LlamaConfig {
        vocab_size: manifest.vocab_size,
        ..config.model.clone()
    };
    Ok((dir, config, model_config))
}

/// A checkpoint folder's training configuration and model configuration
/// (its vocabulary the manifest's), read from its manifest without
/// checking its files ([`load_trained`] checks them).
pub fn configs(dir: &Path) -> Result<(crate::TrainConfig, crate::LlamaConfig)> {
    let manifest = parse_manifest(dir)?;
    let config: crate::TrainConfig = serde_json::from_value(manifest.config.clone())
        .with_context(|| format!("the configuration in {}", dir.join(MANIFEST).display()))?;
    let model_config = crate::LlamaConfig {
        vocab_size: manifest.vocab_size,
        ..config.model.clone()
    };
    Ok((config, model_config))
}

/// Loads the model of a checkpoint folder (verified), or of the newest
/// intact checkpoint of a run folder.
pub fn load_trained(checkpoint_or_run: &Path) -> Result<Trained> {
    use mlx_nn::ModuleExt;
    let (dir, config, model_config) = locate(checkpoint_or_run)?;
    if config.adapters.fine_tune != crate::adapters::FineTune::Full {
        let model = load_adapted(&dir, &config)?;
        return Ok(Trained { dir, config, model });
    }
    let mut model = crate::Llama::new(&model_config, 0)?;
    let weights = dir.join("model.safetensors");
    model
        .load_weights(&weights)
        .with_context(|| format!("loading {}", weights.display()))?;
    Ok(Trained { dir, config, model })
}

/// An adapter run's model from its checkpoint `dir`: the base its
/// `--init-from` names, loaded again, with the checkpoint's adapters (not
/// merged; [`crate::Llama::fuse_adapters`] merges them).
fn load_adapted(dir: &Path, config: &crate::TrainConfig) -> Result<crate::Llama> {
    let base = config.init_from.as_ref().with_context(|| {
        format!(
            "checkpoint {} holds adapters but its run names no base model (--init-from)",
            dir.display()
        )
    })?;
    let resolved = crate::adapters::base_source(base)
        .and_then(|b| b.resolve(&mlx_data::HubConfig::from_env()))
        .with_context(|| format!("the base model of {}: {base}", dir.display()))?;
    let mut model = resolved.load()?;
    if model.has_adapters() {
        model.fuse_adapters()?;
    }
    crate::adapters::apply_from(dir, &mut model)
        .with_context(|| format!("the adapters of {}", dir.display()))?;
    Ok(model)
}

/// [`load_trained`] for tensor parallelism: this rank's shard of the model
/// over `group` ([`crate::Llama::shard`]), reading from the file only its
/// blocks of the sharded weights, so no rank holds the whole model. Every
/// rank of `group` calls it.
pub fn load_trained_shard(checkpoint_or_run: &Path, group: &mlx_dist::Group) -> Result<Trained> {
    let (dir, config, model_config) = locate(checkpoint_or_run)?;
    if config.adapters.fine_tune != crate::adapters::FineTune::Full {
        bail!(
            "checkpoint {} holds adapters, which are not split over ranks: merge them first (mlx-llama export --fuse) and split the merged model",
            dir.display()
        );
    }
    // The initial weights are never evaluated whole but one projection at a
    // time while it is cut; the cut ones give way to unevaluated zeros (no
    // memory) until the loaded shards replace them.
    let mut model = crate::Llama::new(&model_config, 0)?;
    model
        .shard(group)
        .with_context(|| format!("splitting the model over {} ranks", group.size()))?;
    mlx_nn::Module::visit_mut(&mut model, "", &mut |_, p| {
        let (shape, dtype) = (p.value().shape().to_vec(), p.value().dtype());
        p.set(mlx_array::Array::zeros(&shape, dtype));
    });
    let weights = dir.join("model.safetensors");
    mlx_nn::load_sharded_weights(&mut model, &weights, group)
        .with_context(|| format!("loading {}", weights.display()))?;
    Ok(Trained { dir, config, model })
}
