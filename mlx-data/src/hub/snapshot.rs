//! A repository's files made local, as huggingface_hub's `snapshot_download`
//! with `allow_patterns` does: [`snapshot`] lists the files at a revision,
//! fetches those a [`SnapshotFilter`] selects (each checked against its
//! checksum, with the client's progress reports) and returns the snapshot
//! folder `models--org--name/snapshots/<commit>`.
//!
//! Offline (`HF_HUB_OFFLINE`), or with the Hub out of reach, the listing comes
//! from the cache: ours (`mlx-data/listings/<commit>.json`), or else the files
//! of the snapshot folder the revision points to, so a cache that Python's
//! huggingface_hub wrote (`refs/main` holding the commit, `snapshots/<commit>/`
//! files as links to `blobs/`) serves as it is.

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use super::cache::{CachedRepo, RepoKind, check_relative};
use super::client::HubClient;
use super::listing::RepoListing;
use crate::error::{DataError, IoContext, Result};

/// Whole safetensors weights.
pub const SAFETENSORS: &str = "model.safetensors";

/// The index of sharded safetensors weights (its `weight_map` names the shards).
pub const SAFETENSORS_INDEX: &str = "model.safetensors.index.json";

/// The largest index read (a real one is well under a megabyte).
const MAX_INDEX_BYTES: u64 = 64 << 20;

/// Folders deeper than this in a cached snapshot are not listed.
const MAX_DEPTH: usize = 16;

/// Which files of a repository [`snapshot`] makes local.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotFilter {
    /// Files that must be there.
    pub required: Vec<String>,
    /// Files fetched when the repository has them.
    pub optional: Vec<String>,
    /// Whether safetensors weights are required: `model.safetensors`, or
    /// `model.safetensors.index.json` and every shard its `weight_map` names.
    pub safetensors_weights: bool,
}

impl SnapshotFilter {
    /// What a transformers or mlx-lm model needs: `config.json`, its
    /// safetensors weights (whole or sharded), and the generation and
    /// tokenizer files where the repository has them; never `*.bin`,
    /// `*.pth`, ONNX or other formats.
    pub fn model() -> SnapshotFilter {
        SnapshotFilter {
            required: vec!["config.json".into()],
            optional: [
                "generation_config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "special_tokens_map.json",
            ]
            .map(String::from)
            .to_vec(),
            safetensors_weights: true,
        }
    }
}

/// The shard files a `model.safetensors.index.json` names in its
/// `weight_map`, each a relative path inside the repository (no `..`, no
/// leading `/`, no `\`); an error saying what is wrong otherwise.
pub fn safetensors_index_files(bytes: &[u8]) -> std::result::Result<BTreeSet<String>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| format!("not JSON: {e}"))?;
    let map = v
        .get("weight_map")
        .and_then(|m| m.as_object())
        .ok_or("no `weight_map` object")?;
    let mut files = BTreeSet::new();
    for (tensor, file) in map {
        let f = file
            .as_str()
            .ok_or_else(|| format!("`weight_map`: `{tensor}` maps to {file}, not a file name"))?;
        check_relative("file name", f).map_err(|_| {
            format!("`weight_map`: `{tensor}` maps to {f:?}, not a file inside the repository")
        })?;
        files.insert(f.to_owned());
    }
    if files.is_empty() {
        return Err("`weight_map` names no files".into());
    }
    Ok(files)
}

impl CachedRepo {
    /// `snapshots/<commit>`.
    pub fn snapshot_dir(&self, commit: &str) -> PathBuf {
        self.dir().join("snapshots").join(commit)
    }

    /// The files present in the snapshot folder of the commit this revision
    /// points to (`refs/<revision>`, or the revision itself when it is a
    /// commit): what a cache written by huggingface_hub, which keeps no
    /// listing, offers. A link whose blob is missing does not count; linked
    /// folders are not followed.
    pub fn snapshot_listing(&self) -> Option<RepoListing> {
        let commit = self.cached_commit()?;
        let root = self.snapshot_dir(&commit);
        if !root.is_dir() {
            return None;
        }
        let mut files = vec![];
        let mut todo = vec![(root.clone(), 0usize)];
        while let Some((dir, depth)) = todo.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let path = e.path();
                let Ok(kind) = e.file_type() else { continue };
                if kind.is_dir() {
                    if depth < MAX_DEPTH {
                        todo.push((path, depth + 1));
                    }
                } else if path.is_file()
                    && let Ok(rel) = path.strip_prefix(&root)
                {
                    let parts: Option<Vec<&str>> =
                        rel.components().map(|c| c.as_os_str().to_str()).collect();
                    if let Some(parts) = parts {
                        files.push(parts.join("/"));
                    }
                }
            }
        }
        files.sort();
        Some(RepoListing { commit, files })
    }
}

/// Reads at most `limit` bytes of `path`; an error when it holds more.
fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>> {
    let mut bytes = vec![];
    std::fs::File::open(path)
        .and_then(|f| f.take(limit + 1).read_to_end(&mut bytes))
        .at(path)?;
    if bytes.len() as u64 > limit {
        return Err(DataError::Config(format!(
            "{} is larger than {limit} bytes",
            path.display()
        )));
    }
    Ok(bytes)
}

/// Makes the files of `repo` at `revision` (a branch, tag or commit) that
/// `filter` selects local and returns the snapshot folder holding them,
/// `<cache>/<kind>s--<owner>--<name>/snapshots/<commit>`.
///
/// Online, the Hub lists the files at the revision, and each selected file
/// is downloaded unless the cache has it (resumed, checked against its
/// sha256, with the client's progress reports), all pinned to the listed
/// commit. Offline, or when the Hub cannot be reached, the cache serves: our
/// cached listing, else the files in the revision's snapshot folder (a cache
/// written by Python's huggingface_hub). Files the filter requires that are
/// neither listed nor cached fail with [`DataError::RepoIncomplete`] naming
/// the repository and each missing file; nothing cached at all, with
/// [`DataError::NotCached`].
pub fn snapshot(
    client: &HubClient,
    kind: RepoKind,
    repo: &str,
    revision: &str,
    filter: &SnapshotFilter,
) -> Result<PathBuf> {
    check_relative("repository id", repo)?;
    check_relative("revision", revision)?;
    let cfg = client.config();
    let cache = CachedRepo {
        cache_dir: cfg.cache_dir.clone(),
        kind,
        repo: repo.to_owned(),
        revision: revision.to_owned(),
    };
    let (listing, place) = match client.list_files(kind, repo, revision) {
        Ok(l) if cfg.offline => {
            let place = format!(
                "in the Hub cache {} (HF_HUB_OFFLINE is set)",
                cfg.cache_dir.display()
            );
            (l, place)
        }
        Ok(l) => {
            let place = format!("on the Hub at {} (commit {})", cfg.endpoint, l.commit);
            (l, place)
        }
        Err(DataError::NotCached { reason, .. }) => match cache.snapshot_listing() {
            Some(l) => {
                tracing::info!(repo, revision, commit = %l.commit, %reason, "using the cached snapshot");
                let place = format!(
                    "in the Hub cache's snapshot {} ({reason})",
                    cache.snapshot_dir(&l.commit).display()
                );
                (l, place)
            }
            None => {
                return Err(DataError::NotCached {
                    repo: repo.to_owned(),
                    file: format!("(any file at revision {revision})"),
                    cache: cfg.cache_dir.clone(),
                    reason,
                });
            }
        },
        Err(e) => return Err(e),
    };
    let commit = listing.commit.clone();
    let have: BTreeSet<&str> = listing.files.iter().map(String::as_str).collect();
    let mut wanted: Vec<String> = vec![];
    let mut missing: Vec<String> = vec![];
    for f in &filter.required {
        if have.contains(f.as_str()) {
            wanted.push(f.clone());
        } else {
            missing.push(f.clone());
        }
    }
    wanted.extend(
        filter
            .optional
            .iter()
            .filter(|f| have.contains(f.as_str()))
            .cloned(),
    );
    if filter.safetensors_weights {
        if have.contains(SAFETENSORS_INDEX) {
            let index = client.fetch(kind, repo, &commit, SAFETENSORS_INDEX)?;
            let shards =
                safetensors_index_files(&read_bounded(&index, MAX_INDEX_BYTES)?).map_err(|e| {
                    DataError::Config(format!("{SAFETENSORS_INDEX} of {repo} at {commit}: {e}"))
                })?;
            wanted.push(SAFETENSORS_INDEX.into());
            for s in shards {
                if have.contains(s.as_str()) {
                    wanted.push(s);
                } else {
                    missing.push(format!("{s} (a shard {SAFETENSORS_INDEX} names)"));
                }
            }
        } else if have.contains(SAFETENSORS) {
            wanted.push(SAFETENSORS.into());
        } else {
            let others: Vec<&str> = listing
                .files
                .iter()
                .map(String::as_str)
                .filter(|f| {
                    [".bin", ".pth", ".pt", ".onnx", ".gguf", ".h5", ".msgpack"]
                        .iter()
                        .any(|e| f.ends_with(e))
                })
                .take(4)
                .collect();
            let also = if others.is_empty() {
                String::new()
            } else {
                format!(
                    "; it has {} (only safetensors weights are read)",
                    others.join(", ")
                )
            };
            missing.push(format!(
                "{SAFETENSORS} (or {SAFETENSORS_INDEX} and its shards){also}"
            ));
        }
    }
    if !missing.is_empty() {
        return Err(DataError::RepoIncomplete {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            missing,
            place,
        });
    }
    let dir = cache.snapshot_dir(&commit);
    for f in &wanted {
        let p = client.fetch(kind, repo, &commit, f)?;
        // A server that answers another commit than it listed would put the
        // file in another snapshot folder.
        if !p.starts_with(&dir) {
            return Err(DataError::Hub {
                url: client.url(kind, repo, &commit, f),
                message: format!(
                    "the file came from another commit than the listing's {commit}: {}",
                    p.display()
                ),
            });
        }
    }
    Ok(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_index_names_its_shards_and_nothing_outside_the_repository() {
        let ok = br#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors", "c": "model-00001-of-00002.safetensors"}}"#;
        assert_eq!(
            safetensors_index_files(ok)
                .unwrap()
                .into_iter()
                .collect::<Vec<_>>(),
            [
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        for bad in [
            r#"{"weight_map": {"a": "../secret"}}"#,
            r#"{"weight_map": {"a": "/etc/passwd"}}"#,
            r#"{"weight_map": {"a": "a\\b"}}"#,
            r#"{"weight_map": {"a": 3}}"#,
            r#"{"weight_map": {}}"#,
            r#"{"weight_map": []}"#,
            "[]",
        ] {
            assert!(safetensors_index_files(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    mod arbitrary_bytes {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            #[test]
            fn index_bytes_give_an_error_or_names_inside_the_repository(
                bytes in proptest::collection::vec(any::<u8>(), 0..256),
            ) {
                if let Ok(files) = safetensors_index_files(&bytes) {
                    for f in files {
                        prop_assert!(check_relative("file name", &f).is_ok());
                    }
                }
            }

            #[test]
            fn index_maps_give_an_error_or_names_inside_the_repository(
                names in proptest::collection::vec("[a-z./\\\\-]{0,12}", 0..5),
            ) {
                let map: serde_json::Map<String, serde_json::Value> = names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| (format!("t{i}"), n.clone().into()))
                    .collect();
                let bytes = serde_json::json!({"weight_map": map}).to_string();
                match safetensors_index_files(bytes.as_bytes()) {
                    Ok(files) => {
                        for f in files {
                            prop_assert!(!f.split('/').any(|c| c.is_empty() || c == "." || c == ".."));
                            prop_assert!(!f.contains('\\'));
                        }
                    }
                    Err(e) => prop_assert!(!e.is_empty()),
                }
            }
        }
    }
}
