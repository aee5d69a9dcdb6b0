//! Text sources: TinyStories on the Hub, local files, and the built-in offline corpus.

pub mod corpus;

pub use corpus::Corpus;

use crate::corpus::OfflineCorpus;
use crate::error::{DataError, IoContext, Result};
use crate::hub::{HubClient, RepoKind};
use std::path::{Path, PathBuf};

/// Training or validation data.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Split {
    /// The training split.
    Train,
    /// The validation split.
    Validation,
}

impl Split {
    /// `train` or `validation`.
    pub fn name(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
        }
    }
}

/// A text dataset on the Hub: one text file per split, documents separated by a marker.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HubDataset {
    /// Repository id.
    pub repo: String,
    /// Branch, tag or commit.
    pub revision: String,
    /// File of the training split.
    pub train_file: String,
    /// File of the validation split.
    pub validation_file: String,
    /// Document separator.
    pub separator: String,
    /// Use only the documents within the first this-many bytes of each file.
    pub max_bytes: Option<u64>,
}

impl Default for HubDataset {
    /// `roneneldan/TinyStories`, stories separated by `<|endoftext|>`.
    fn default() -> Self {
        HubDataset {
            repo: "roneneldan/TinyStories".into(),
            revision: "main".into(),
            train_file: "TinyStories-train.txt".into(),
            validation_file: "TinyStories-valid.txt".into(),
            separator: crate::tokenizer::ENDOFTEXT.into(),
            max_bytes: None,
        }
    }
}

/// How local files are laid out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LocalFormat {
    /// Plain text (a file, or a folder of `*.txt` files) split on a separator.
    Text {
        /// The document separator.
        separator: String,
    },
    /// JSON Lines, one object with a `text` field per line.
    JsonLines,
}

/// Local files, one per split.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct LocalSource {
    /// Training data (file or folder).
    pub train: PathBuf,
    /// Validation data (file or folder).
    pub validation: PathBuf,
    /// How to read them.
    pub format: LocalFormat,
}

/// Which text to train on.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum SourceSpec {
    /// TinyStories from the Hub, or the offline corpus when the Hub is unreachable
    /// or offline mode is on.
    Auto {
        /// The Hub dataset to try first.
        hub: HubDataset,
        /// The fallback.
        offline: OfflineCorpus,
    },
    /// The Hub only (an error if unreachable and not cached).
    Hub(HubDataset),
    /// Local files.
    Local(LocalSource),
    /// The built-in offline corpus.
    Offline(OfflineCorpus),
}

impl Default for SourceSpec {
    fn default() -> Self {
        SourceSpec::Auto {
            hub: HubDataset::default(),
            offline: OfflineCorpus::default(),
        }
    }
}

/// A source pinned down to concrete data, with a stable identity for store headers.
#[derive(Debug, Clone)]
pub enum Resolved {
    /// A downloaded (or cached) Hub file.
    HubFile {
        /// The dataset.
        dataset: HubDataset,
        /// Local path of the split's file.
        path: PathBuf,
    },
    /// Local files.
    Local(LocalSource),
    /// The offline corpus.
    Offline(OfflineCorpus),
}

fn file_identity(path: &Path) -> Result<String> {
    let canon = path.canonicalize().at(path)?;
    let mut parts = vec![];
    let files = if canon.is_dir() {
        corpus::text_files(&canon)?
    } else {
        vec![canon.clone()]
    };
    for f in files {
        let m = std::fs::metadata(&f).at(&f)?;
        let mtime = m
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        parts.push(format!("{}:{}:{mtime}", f.display(), m.len()));
    }
    Ok(parts.join(","))
}

impl Resolved {
    /// A stable description of exactly which text this is, for one split.
    pub fn identity(&self, split: Split) -> Result<String> {
        Ok(match self {
            Resolved::HubFile { dataset, path } => {
                // Snapshot paths contain the commit, and blobs are content addressed.
                let target = std::fs::canonicalize(path).at(path)?;
                format!(
                    "hub:{}:{}:{}:max_bytes={:?}",
                    dataset.repo,
                    split.name(),
                    target.file_name().unwrap_or_default().to_string_lossy(),
                    dataset.max_bytes
                )
            }
            Resolved::Local(l) => {
                let p = match split {
                    Split::Train => &l.train,
                    Split::Validation => &l.validation,
                };
                format!("local:{:?}:{}", l.format, file_identity(p)?)
            }
            Resolved::Offline(o) => o.identity(split),
        })
    }

    /// Loads the documents of `split`.
    pub fn load(&self, split: Split) -> Result<Corpus> {
        match self {
            Resolved::HubFile { dataset, path } => {
                Corpus::from_text_file(path, &dataset.separator, dataset.max_bytes)
            }
            Resolved::Local(l) => {
                let p = match split {
                    Split::Train => &l.train,
                    Split::Validation => &l.validation,
                };
                match &l.format {
                    LocalFormat::JsonLines => Corpus::from_json_lines(p),
                    LocalFormat::Text { separator } if p.is_dir() => {
                        Corpus::from_text_dir(p, separator)
                    }
                    LocalFormat::Text { separator } => Corpus::from_text_file(p, separator, None),
                }
            }
            Resolved::Offline(o) => Ok(Corpus::from_docs(&o.split(split))),
        }
    }

    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Resolved::HubFile { .. } => "hub",
            Resolved::Local(_) => "local",
            Resolved::Offline(_) => "offline",
        }
    }
}

fn fetch_hub(d: &HubDataset, split: Split, hub: &HubClient) -> Result<Resolved> {
    let file = match split {
        Split::Train => &d.train_file,
        Split::Validation => &d.validation_file,
    };
    let path = hub.fetch(RepoKind::Dataset, &d.repo, &d.revision, file)?;
    Ok(Resolved::HubFile {
        dataset: d.clone(),
        path,
    })
}

impl SourceSpec {
    /// Pins the source down for one split, downloading if needed. `Auto` falls
    /// back to the offline corpus when the Hub cannot be used, and logs which.
    pub fn resolve(&self, split: Split, hub: &HubClient) -> Result<Resolved> {
        let r = match self {
            SourceSpec::Auto { hub: d, offline } => match fetch_hub(d, split, hub) {
                Ok(r) => r,
                Err(e @ DataError::NotCached { .. }) => {
                    tracing::warn!(error = %e, "Hub dataset unavailable; using the built-in offline corpus");
                    Resolved::Offline(offline.clone())
                }
                Err(e) => return Err(e),
            },
            SourceSpec::Hub(d) => fetch_hub(d, split, hub)?,
            SourceSpec::Local(l) => Resolved::Local(l.clone()),
            SourceSpec::Offline(o) => Resolved::Offline(o.clone()),
        };
        tracing::info!(split = split.name(), source = r.kind(), "data source");
        Ok(r)
    }
}
