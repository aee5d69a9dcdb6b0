//! The pre-tokenized, memory-mapped token store: format, writer, reader and the
//! one-builder-many-readers protocol.

pub mod format;
pub mod reader;
pub mod writer;

pub use format::{Header, StoreMeta, TokenDtype};
pub use reader::{TokenStore, Tokens, Verify};
pub use writer::StoreWriter;

use crate::error::{DataError, Result};
use crate::lockfile::{FileLock, publish, sibling, temp_sibling};
use std::path::Path;
use std::time::Duration;

/// What [`open_or_build`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A valid store with matching provenance was already there.
    Reused,
    /// No store existed; this process built it.
    Built,
    /// A store existed but was corrupt or stale; this process rebuilt it.
    Rebuilt(String),
}

/// Parameters of a build.
#[derive(Debug, Clone)]
pub struct BuildSpec {
    /// Provenance the store must carry.
    pub meta: StoreMeta,
    /// Vocabulary size of the tokenizer.
    pub vocab_size: usize,
    /// End-of-sequence id.
    pub eos: u32,
    /// How long to wait for another process that is building the same store.
    pub lock_deadline: Duration,
}

fn check_meta(store: &TokenStore, spec: &BuildSpec) -> Result<()> {
    let m = store.meta();
    let mismatch = |field, expected: &str, found: &str| DataError::StaleStore {
        path: store.path().to_path_buf(),
        field,
        expected: expected.to_string(),
        found: found.to_string(),
    };
    if m.source != spec.meta.source {
        return Err(mismatch("source", &spec.meta.source, &m.source));
    }
    if m.tokenizer_hash != spec.meta.tokenizer_hash {
        return Err(mismatch(
            "tokenizer_hash",
            &spec.meta.tokenizer_hash,
            &m.tokenizer_hash,
        ));
    }
    if m.split != spec.meta.split {
        return Err(mismatch("split", &spec.meta.split, &m.split));
    }
    Ok(())
}

fn try_open(path: &Path, spec: &BuildSpec) -> Result<Option<TokenStore>> {
    if !path.exists() {
        return Ok(None);
    }
    let store = TokenStore::open(path, Verify::Full)?;
    check_meta(&store, spec)?;
    Ok(Some(store))
}

/// Opens the store at `path` if it is intact and matches `spec`; otherwise builds it
/// with `fill` under an inter-process lock, into a temporary file that is renamed
/// into place. When N processes call this together exactly one builds; the others
/// wait (up to `spec.lock_deadline`) and then open the published file.
pub fn open_or_build<F>(path: &Path, spec: &BuildSpec, fill: F) -> Result<(TokenStore, Outcome)>
where
    F: FnOnce(&mut StoreWriter) -> Result<()>,
{
    let mut reason = None;
    match try_open(path, spec) {
        Ok(Some(store)) => return Ok((store, Outcome::Reused)),
        Ok(None) => {}
        Err(e @ (DataError::CorruptStore { .. } | DataError::StaleStore { .. })) => {
            reason = Some(e.to_string());
        }
        Err(e) => return Err(e),
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| DataError::io(dir, e))?;
    }
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let doing = format!("building the token store {name}");
    let _lock = FileLock::acquire_while(&sibling(path, ".lock"), spec.lock_deadline, &doing)?;
    // Another process may have published while we waited for the lock.
    match try_open(path, spec) {
        Ok(Some(store)) => return Ok((store, Outcome::Reused)),
        Ok(None) => {}
        Err(e @ (DataError::CorruptStore { .. } | DataError::StaleStore { .. })) => {
            tracing::warn!(path = %path.display(), error = %e, "rebuilding token store");
            reason = Some(e.to_string());
        }
        Err(e) => return Err(e),
    }
    tracing::info!(path = %path.display(), source = %spec.meta.source, "building token store");
    let tmp = temp_sibling(path);
    let result = (|| {
        let mut writer = StoreWriter::create(&tmp, spec.vocab_size, spec.eos)?;
        fill(&mut writer)?;
        let header = writer.finish(spec.meta.clone())?;
        publish(&tmp, path)?;
        Ok(header)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let header = result?;
    tracing::info!(
        path = %path.display(),
        docs = header.n_docs,
        tokens = header.n_tokens,
        "token store published"
    );
    let store = TokenStore::open(path, Verify::HeaderOnly)?;
    Ok((
        store,
        match reason {
            Some(r) => Outcome::Rebuilt(r),
            None => Outcome::Built,
        },
    ))
}
