//! The Hugging Face cache layout shared with Python:
//! `<cache>/<kind>s--<owner>--<name>/{blobs/<etag>, snapshots/<commit>/<file>, refs/<revision>}`
//! plus `<cache>/.locks/<folder>/<etag>.lock`.

use crate::error::{IoContext, Result};
use std::path::{Path, PathBuf};

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

/// True for a full 40-hex-digit commit hash.
pub fn is_commit(rev: &str) -> bool {
    rev.len() == 40 && rev.bytes().all(|b| b.is_ascii_hexdigit())
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
        Some(c.trim().to_owned()).filter(|c| !c.is_empty())
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
