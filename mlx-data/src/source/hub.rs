//! Datasets on the Hub: parquet shards named by Hugging Face's convention (the
//! default), or one text file per split; resolved to cached local files.

use super::{Resolved, Split};
use crate::error::{DataError, Result};
use crate::hub::{HubClient, RepoKind};
use std::path::PathBuf;

/// Which files of a Hub dataset hold each split.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum HubFiles {
    /// Parquet shards `{dir}/{split}-NNNNN-of-NNNNN*.parquet` (Hugging Face's
    /// naming), found by listing the repository, read in shard order.
    Parquet {
        /// Folder of the shards inside the repository (`data`).
        dir: String,
        /// The string column holding the documents (`text`).
        column: String,
    },
    /// One text file per split, documents separated by a marker.
    Text {
        /// File of the training split.
        train_file: String,
        /// File of the validation split.
        validation_file: String,
        /// Document separator.
        separator: String,
        /// Use only the documents within the first this-many bytes of each file.
        max_bytes: Option<u64>,
    },
}

/// A dataset on the Hub at one revision.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HubDataset {
    /// Repository id.
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
    /// Which files hold the splits.
    pub files: HubFiles,
}

impl Default for HubDataset {
    /// `roneneldan/TinyStories`'s parquet shards (`data/*.parquet`, column `text`).
    fn default() -> Self {
        HubDataset {
            repo: "roneneldan/TinyStories".into(),
            revision: "main".into(),
            files: HubFiles::Parquet {
                dir: "data".into(),
                column: "text".into(),
            },
        }
    }
}

impl HubDataset {
    /// `roneneldan/TinyStories`'s two big text files, stories separated by
    /// `<|endoftext|>`.
    pub fn tinystories_text() -> Self {
        HubDataset {
            files: HubFiles::Text {
                train_file: "TinyStories-train.txt".into(),
                validation_file: "TinyStories-valid.txt".into(),
                separator: crate::tokenizer::ENDOFTEXT.into(),
                max_bytes: None,
            },
            ..HubDataset::default()
        }
    }
}

/// One downloaded parquet shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubShard {
    /// Its path in the repository (`data/train-00000-of-00004-....parquet`).
    pub file: String,
    /// Its path in the local Hub cache.
    pub path: PathBuf,
}

/// Parses `{split}-{index}-of-{count}{suffix}.parquet`, `suffix` empty or `-...`.
fn shard_index(name: &str, split: &str) -> Option<(u64, u64)> {
    let rest = name.strip_prefix(split)?.strip_prefix('-')?;
    let rest = rest.strip_suffix(".parquet")?;
    let (index, rest) = rest.split_once("-of-")?;
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (count, suffix) = rest.split_at(digits);
    let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !numeric(index) || !numeric(count) || !(suffix.is_empty() || suffix.starts_with('-')) {
        return None;
    }
    Some((index.parse().ok()?, count.parse().ok()?))
}

/// The shards of `split` directly under `dir` among a repository's `files`, in
/// shard order: `{dir}/{split}-NNNNN-of-MMMMM*.parquet`. Every index from 0 to
/// MMMMM-1 must be there exactly once, all with the same MMMMM.
pub fn select_shards(files: &[String], dir: &str, split: &str) -> Result<Vec<String>> {
    let prefix = if dir.is_empty() {
        String::new()
    } else {
        format!("{}/", dir.trim_end_matches('/'))
    };
    let mut shards: Vec<(u64, u64, &String)> = files
        .iter()
        .filter_map(|f| {
            let name = f.strip_prefix(&prefix)?;
            if name.contains('/') {
                return None;
            }
            let (i, n) = shard_index(name, split)?;
            Some((i, n, f))
        })
        .collect();
    let pattern = format!("{prefix}{split}-NNNNN-of-NNNNN*.parquet");
    if shards.is_empty() {
        return Err(DataError::Config(format!(
            "no parquet shards named {pattern} among the repository's {} files",
            files.len()
        )));
    }
    shards.sort();
    let count = shards[0].1;
    let indices: Vec<u64> = shards.iter().map(|s| s.0).collect();
    if shards.iter().any(|s| s.1 != count) || indices != (0..count).collect::<Vec<_>>() {
        let found: Vec<&str> = shards.iter().map(|s| s.2.as_str()).collect();
        return Err(DataError::Config(format!(
            "the parquet shards {pattern} do not form one complete set of {count}: found {found:?}"
        )));
    }
    Ok(shards.into_iter().map(|s| s.2.clone()).collect())
}

/// Lists the repository, picks `split`'s shards and downloads each (or finds it in
/// the cache), all at the commit the listing pinned.
fn fetch_parquet(
    d: &HubDataset,
    dir: &str,
    column: &str,
    split: Split,
    hub: &HubClient,
) -> Result<Resolved> {
    let listing = hub.list_files(RepoKind::Dataset, &d.repo, &d.revision)?;
    let names = select_shards(&listing.files, dir, split.name()).map_err(|e| match e {
        DataError::Config(m) => DataError::Config(format!(
            "Hub dataset {} at {} (commit {}): {m}",
            d.repo, d.revision, listing.commit
        )),
        e => e,
    })?;
    let mut shards = Vec::with_capacity(names.len());
    for file in names {
        let path = hub.fetch(RepoKind::Dataset, &d.repo, &listing.commit, &file)?;
        shards.push(HubShard { file, path });
    }
    Ok(Resolved::HubParquet {
        repo: d.repo.clone(),
        commit: listing.commit,
        column: column.to_owned(),
        shards,
    })
}

/// Downloads (or finds in the cache) the files of `split`.
pub(super) fn fetch_hub(d: &HubDataset, split: Split, hub: &HubClient) -> Result<Resolved> {
    match &d.files {
        HubFiles::Parquet { dir, column } => fetch_parquet(d, dir, column, split, hub),
        HubFiles::Text {
            train_file,
            validation_file,
            separator,
            max_bytes,
        } => {
            let file = match split {
                Split::Train => train_file,
                Split::Validation => validation_file,
            };
            let path = hub.fetch(RepoKind::Dataset, &d.repo, &d.revision, file)?;
            Ok(Resolved::HubFile {
                repo: d.repo.clone(),
                path,
                separator: separator.clone(),
                max_bytes: *max_bytes,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_follow_the_hugging_face_convention() {
        assert_eq!(
            shard_index("train-00001-of-00004-2d5a1467fff1081b.parquet", "train"),
            Some((1, 4))
        );
        assert_eq!(
            shard_index("validation-00000-of-00001.parquet", "validation"),
            Some((0, 1))
        );
        for bad in [
            "train-00001-of-00004x.parquet",
            "train-0000a-of-00004.parquet",
            "train-00001-of-.parquet",
            "train-00001-of-00004.json",
            "trainer-00001-of-00004.parquet",
            "validation-00000-of-00001.parquet",
        ] {
            assert_eq!(shard_index(bad, "train"), None, "{bad}");
        }
    }
}
