//! The Hugging Face cache layout shared with Python:
//! `<cache>/<kind>s--<owner>--<name>/{blobs/<etag>, snapshots/<commit>/<file>, refs/<revision>}`
//! plus `<cache>/.locks/<folder>/<etag>.lock`.
//!
//! Commits and ETags come from the server and become path components, so they are
//! accepted only as hex ids ([`is_commit`], [`is_blob_id`]); names the caller gives
//! (repository, revision, file) must be plain relative paths ([`check_relative`]).

use crate::error::{DataError, IoContext, Result};
use std::path::{Component, Path, PathBuf};

/// Model or dataset repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum RepoKind {
    /// A model repository (`gpt2`).
    Model,
    /// A dataset repository (`roneneldan/TinyStories`).
    Dataset,
}

/// One repository at one revision, located in a cache folder.
#[derive(Debug, Clone)]
pub struct CachedRepo {
    /// The cache root (`.../huggingface/hub`).
    pub cache_dir: PathBuf,
    /// Model or dataset.
    pub kind: RepoKind,
    /// `owner/name`.
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// True for a full 40-hex-digit commit hash (the Hub's git commits are sha1).
pub fn is_commit(rev: &str) -> bool {
    is_hex(rev, 40)
}

/// True for a blob name the Hub uses: a sha256 (64 hex digits, LFS files) or a git
/// sha1 (40 hex digits, other files).
pub fn is_blob_id(etag: &str) -> bool {
    is_hex(etag, 40) || is_hex(etag, 64)
}

/// Checks a `/`-separated name given by the caller (repository id, revision or file):
/// relative, each component a plain name (not empty, `.`, `..` or a drive prefix),
/// no `\` and no NUL, so that it stays inside the cache folder when joined to it.
pub fn check_relative(what: &str, name: &str) -> Result<()> {
    let plain = |c: &str| {
        let mut parts = Path::new(c).components();
        matches!(
            (parts.next(), parts.next()),
            (Some(Component::Normal(_)), None)
        )
    };
    if name.contains(['\\', '\0']) || !name.split('/').all(plain) {
        return Err(DataError::Config(format!(
            "Hub {what} {name:?} must be a relative path of non-empty components \
             without '.', '..', '\\' or NUL"
        )));
    }
    Ok(())
}

/// Refuses a commit or ETag that is not a hex id before it becomes a path component.
fn check_id(what: &str, id: &str, valid: fn(&str) -> bool) -> Result<()> {
    if !valid(id) {
        return Err(DataError::Config(format!(
            "cache {what} {id:?} is not a hex id (40 digits, or 64 for an etag)"
        )));
    }
    Ok(())
}

impl CachedRepo {
    /// The repository's cache folder name, as hf-hub (and Python) spell it.
    pub fn folder_name(&self) -> String {
        let kind = match self.kind {
            RepoKind::Model => hf_hub::RepoType::Model,
            RepoKind::Dataset => hf_hub::RepoType::Dataset,
        };
        hf_hub::Repo::with_revision(self.repo.clone(), kind, self.revision.clone()).folder_name()
    }

    /// The repository folder.
    pub fn dir(&self) -> PathBuf {
        self.cache_dir.join(self.folder_name())
    }

    /// `blobs/<etag>`.
    pub fn blob(&self, etag: &str) -> PathBuf {
        self.dir().join("blobs").join(etag)
    }

    /// The lock guarding the download of one blob.
    pub fn blob_lock(&self, etag: &str) -> PathBuf {
        self.cache_dir
            .join(".locks")
            .join(self.folder_name())
            .join(format!("{etag}.lock"))
    }

    /// `snapshots/<commit>/<file>`.
    pub fn snapshot_file(&self, commit: &str, file: &str) -> PathBuf {
        let mut p = self.dir().join("snapshots").join(commit);
        p.extend(file.split('/'));
        p
    }

    /// `refs/<revision>`.
    pub fn ref_path(&self) -> PathBuf {
        let mut p = self.dir().join("refs");
        p.extend(self.revision.split('/'));
        p
    }

    /// The commit the cache maps this revision to, if any.
    pub fn cached_commit(&self) -> Option<String> {
        if is_commit(&self.revision) {
            return Some(self.revision.clone());
        }
        let c = std::fs::read_to_string(self.ref_path()).ok()?;
        // A ref file that does not hold a commit id is ignored, not followed.
        Some(c.trim().to_owned()).filter(|c| is_commit(c))
    }

    /// The cached copy of `file` at this revision, if complete.
    pub fn cached_file(&self, file: &str) -> Option<(String, PathBuf)> {
        let commit = self.cached_commit()?;
        let p = self.snapshot_file(&commit, file);
        p.is_file().then_some((commit, p))
    }

    /// Records `revision -> commit` (unless the revision is the commit itself).
    pub fn write_ref(&self, commit: &str) -> Result<()> {
        if self.revision == commit {
            return Ok(());
        }
        check_relative("revision", &self.revision)?;
        check_id("commit", commit, is_commit)?;
        let path = self.ref_path();
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).at(d)?;
        }
        let tmp = crate::lockfile::temp_sibling(&path);
        std::fs::write(&tmp, commit).at(&tmp)?;
        crate::lockfile::publish(&tmp, &path)
    }

    /// Points `snapshots/<commit>/<file>` at `blobs/<etag>` with a relative symlink
    /// (a copy where symlinks are unavailable).
    pub fn link_snapshot(&self, commit: &str, file: &str, etag: &str) -> Result<PathBuf> {
        check_id("commit", commit, is_commit)?;
        check_id("etag", etag, is_blob_id)?;
        check_relative("file name", file)?;
        let dest = self.snapshot_file(commit, file);
        let dir = dest.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).at(dir)?;
        let blob = self.blob(etag);
        if dest.is_file() {
            return Ok(dest);
        }
        let _ = std::fs::remove_file(&dest);
        #[cfg(unix)]
        {
            // From snapshots/<commit>/<a/b/file> up to the repository folder.
            let depth = 2 + file.split('/').count() - 1;
            let mut rel = PathBuf::new();
            for _ in 0..depth {
                rel.push("..");
            }
            rel.push("blobs");
            rel.push(etag);
            match std::os::unix::fs::symlink(&rel, &dest) {
                // Another process linked it first.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                r => r.at(&dest)?,
            }
        }
        #[cfg(not(unix))]
        std::fs::copy(&blob, &dest).at(&dest)?;
        let _ = blob;
        Ok(dest)
    }
}
