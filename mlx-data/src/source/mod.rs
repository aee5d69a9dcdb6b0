//! Text sources: TinyStories on the Hub (parquet shards, or its text files), local
//! files (text, JSON Lines, parquet), and the built-in offline corpus. Parquet and
//! JSON Lines stream: [`Resolved::for_each_batch`] hands their documents over in
//! bounded batches, never the whole file.

pub mod batches;
pub mod corpus;
pub mod hub;
pub mod jsonl;
pub mod parquet;

pub use corpus::Corpus;
pub use hub::{HubDataset, HubFiles, HubShard};

use crate::corpus::OfflineCorpus;
use crate::error::{DataError, IoContext, Result};
use crate::hub::HubClient;
use batches::DocBatcher;
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

/// How local files are laid out.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum LocalFormat {
    /// Plain text (a file, or a folder of `*.txt` files) split on a separator.
    Text {
        /// The document separator.
        separator: String,
    },
    /// JSON Lines, one object with a `text` field per line (one file per split).
    JsonLines,
    /// Parquet (a file, or a folder of `*.parquet` files read in name order) with
    /// documents in a string column.
    Parquet {
        /// The column holding the documents (`text`).
        column: String,
    },
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
    /// A downloaded (or cached) Hub text file.
    HubFile {
        /// Repository id.
        repo: String,
        /// Local path of the split's file.
        path: PathBuf,
        /// Document separator.
        separator: String,
        /// Use only the documents within the first this-many bytes.
        max_bytes: Option<u64>,
    },
    /// Downloaded (or cached) parquet shards of one split of a Hub dataset.
    HubParquet {
        /// Repository id.
        repo: String,
        /// The commit the shards were listed and downloaded at.
        commit: String,
        /// The string column holding the documents.
        column: String,
        /// The split's shards, in order.
        shards: Vec<HubShard>,
    },
    /// Local files.
    Local(LocalSource),
    /// The offline corpus.
    Offline(OfflineCorpus),
}

/// Documents per batch when a whole streaming source is gathered by [`Resolved::load`].
const LOAD_BATCH_DOCS: usize = 4096;

fn file_identity(files: &[PathBuf]) -> Result<String> {
    let mut parts = vec![];
    for f in files {
        let f = f.canonicalize().at(f)?;
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

/// Hands every document of a parquet file (non-null, trimmed, non-blank) to `batcher`.
fn parquet_docs(path: &Path, column: &str, batcher: &mut DocBatcher<'_>) -> Result<()> {
    parquet::read_parquet_column(
        path,
        column,
        parquet::READ_BATCH_ROWS,
        &mut |_, _| {},
        &mut |v| match v {
            Some(doc) => batcher.push(doc),
            None => Ok(()),
        },
    )
}

impl LocalSource {
    /// The file or folder of `split`.
    pub fn path(&self, split: Split) -> &Path {
        match split {
            Split::Train => &self.train,
            Split::Validation => &self.validation,
        }
    }
}

impl Resolved {
    /// A stable description of exactly which text this is, for one split.
    pub fn identity(&self, split: Split) -> Result<String> {
        Ok(match self {
            Resolved::HubFile {
                repo,
                path,
                max_bytes,
                ..
            } => {
                // Snapshot paths contain the commit, and blobs are content addressed.
                let target = std::fs::canonicalize(path).at(path)?;
                format!(
                    "hub:{repo}:{}:{}:max_bytes={max_bytes:?}",
                    split.name(),
                    target.file_name().unwrap_or_default().to_string_lossy(),
                )
            }
            Resolved::HubParquet {
                repo,
                commit,
                column,
                shards,
            } => {
                let names: Vec<&str> = shards.iter().map(|s| s.file.as_str()).collect();
                format!(
                    "hub-parquet:{repo}@{commit}:{}:column={column}:{}",
                    split.name(),
                    names.join(",")
                )
            }
            Resolved::Local(l) => {
                let p = l.path(split);
                let files = match &l.format {
                    LocalFormat::Parquet { .. } => parquet::parquet_files(p)?,
                    _ if p.is_dir() => corpus::text_files(p)?,
                    _ => vec![p.to_path_buf()],
                };
                format!("local:{:?}:{}", l.format, file_identity(&files)?)
            }
            Resolved::Offline(o) => o.identity(split),
        })
    }

    /// About how many bytes of document text `split` holds, for a progress bar's
    /// total and ETA before the documents are read: file sizes for text and JSON
    /// Lines, parquet footers' column sizes, the offline corpus's size. `None`
    /// when it cannot be told cheaply.
    pub fn text_bytes_hint(&self, split: Split) -> Option<u64> {
        let file_len = |p: &Path| std::fs::metadata(p).ok().map(|m| m.len());
        let parquet = |files: &[PathBuf], column: &str| -> Option<u64> {
            files
                .iter()
                .map(|f| parquet::parquet_text_bytes(f, column).ok())
                .sum()
        };
        match self {
            Resolved::HubFile {
                path, max_bytes, ..
            } => file_len(path).map(|n| max_bytes.map_or(n, |m| n.min(m))),
            Resolved::HubParquet { column, shards, .. } => {
                let files: Vec<PathBuf> = shards.iter().map(|s| s.path.clone()).collect();
                parquet(&files, column)
            }
            Resolved::Local(l) => {
                let p = l.path(split);
                match &l.format {
                    LocalFormat::JsonLines => file_len(p),
                    LocalFormat::Parquet { column } => {
                        parquet(&parquet::parquet_files(p).ok()?, column)
                    }
                    LocalFormat::Text { .. } if p.is_dir() => corpus::text_files(p)
                        .ok()?
                        .iter()
                        .map(|f| file_len(f))
                        .sum(),
                    LocalFormat::Text { .. } => file_len(p),
                }
            }
            Resolved::Offline(o) => Some(match split {
                Split::Train => o.train_bytes,
                Split::Validation => o.validation_bytes,
            } as u64),
        }
    }

    /// Hands the documents of `split` to `f` in order, at most `batch_docs` at a
    /// time. Parquet and JSON Lines stream: memory holds one batch of documents plus
    /// what the reader decodes (a line, or part of one row group). Text files and the
    /// offline corpus are loaded (mapped) whole, then handed over in batches.
    pub fn for_each_batch(
        &self,
        split: Split,
        batch_docs: usize,
        mut f: impl FnMut(&[String]) -> Result<()>,
    ) -> Result<()> {
        let mut batcher = DocBatcher::new(batch_docs, &mut f);
        match self {
            Resolved::HubParquet { column, shards, .. } => {
                for s in shards {
                    parquet_docs(&s.path, column, &mut batcher)?;
                }
            }
            Resolved::Local(l) => match &l.format {
                LocalFormat::JsonLines => {
                    jsonl::read_json_lines(l.path(split), &mut |d| batcher.push(d))?
                }
                LocalFormat::Parquet { column } => {
                    for file in parquet::parquet_files(l.path(split))? {
                        parquet_docs(&file, column, &mut batcher)?;
                    }
                }
                LocalFormat::Text { .. } => {
                    for d in self.load(split)?.docs() {
                        batcher.push(d)?;
                    }
                }
            },
            Resolved::HubFile { .. } | Resolved::Offline(_) => {
                for d in self.load(split)?.docs() {
                    batcher.push(d)?;
                }
            }
        }
        batcher.finish()
    }

    /// Loads the documents of `split` (for parquet and JSON Lines all of them into
    /// memory: prefer [`Resolved::for_each_batch`] there).
    pub fn load(&self, split: Split) -> Result<Corpus> {
        match self {
            Resolved::HubFile {
                path,
                separator,
                max_bytes,
                ..
            } => Corpus::from_text_file(path, separator, *max_bytes),
            Resolved::Local(l) => {
                let p = l.path(split);
                match &l.format {
                    LocalFormat::Text { separator } if p.is_dir() => {
                        Corpus::from_text_dir(p, separator)
                    }
                    LocalFormat::Text { separator } => Corpus::from_text_file(p, separator, None),
                    LocalFormat::JsonLines | LocalFormat::Parquet { .. } => self.gather(split),
                }
            }
            Resolved::HubParquet { .. } => self.gather(split),
            Resolved::Offline(o) => Ok(Corpus::from_docs(&o.split(split))),
        }
    }

    /// Every document of a streaming source, gathered into one corpus.
    fn gather(&self, split: Split) -> Result<Corpus> {
        let mut docs = Vec::new();
        self.for_each_batch(split, LOAD_BATCH_DOCS, |batch| {
            docs.extend_from_slice(batch);
            Ok(())
        })?;
        Ok(Corpus::from_docs(&docs))
    }

    /// A short name for logs.
    pub fn kind(&self) -> &'static str {
        match self {
            Resolved::HubFile { .. } | Resolved::HubParquet { .. } => "hub",
            Resolved::Local(_) => "local",
            Resolved::Offline(_) => "offline",
        }
    }
}

impl SourceSpec {
    /// Pins the source down for one split, downloading if needed. `Auto` falls
    /// back to the offline corpus when the Hub cannot be used, and logs which.
    pub fn resolve(&self, split: Split, hub: &HubClient) -> Result<Resolved> {
        let r = match self {
            SourceSpec::Auto { hub: d, offline } => match hub::fetch_hub(d, split, hub) {
                Ok(r) => r,
                Err(e @ DataError::NotCached { .. }) => {
                    tracing::warn!(error = %e, "Hub dataset unavailable; using the built-in offline corpus");
                    Resolved::Offline(offline.clone())
                }
                Err(e) => return Err(e),
            },
            SourceSpec::Hub(d) => hub::fetch_hub(d, split, hub)?,
            SourceSpec::Local(l) => Resolved::Local(l.clone()),
            SourceSpec::Offline(o) => Resolved::Offline(o.clone()),
        };
        tracing::info!(split = split.name(), source = r.kind(), "data source");
        Ok(r)
    }
}
