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

pub use crate::split::Split;

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
    /// Validation data (file or folder); `None`: a held-out fraction of the
    /// training data ([`LocalOptions::valid_fraction_ppm`]), which is then
    /// not trained on.
    pub validation: Option<PathBuf>,
    /// How to read them.
    pub format: LocalFormat,
    /// How to read instruction data, and the held-out fraction.
    #[serde(default)]
    pub options: LocalOptions,
}

/// How JSON Lines rows become examples, and how much training data is held
/// out when there is no validation file.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LocalOptions {
    /// The chat template that renders `messages` rows and `prompt` /
    /// `completion` rows (as a user and an assistant message). Without one,
    /// `messages` rows are an error and a prompt/completion row is the prompt
    /// followed by the completion.
    pub chat_template: Option<crate::ChatTemplate>,
    /// Only the assistant turns (the completion) count in the loss.
    pub mask_prompt: bool,
    /// JSON Lines `text` rows are split into documents on this separator
    /// (see [`corpus::BLANK_LINE`]); `None`: one document per row.
    pub jsonl_separator: Option<String>,
    /// Without a validation file: the held-out share of the training
    /// documents, in parts per million (50,000: 5%). Document `i` is held
    /// out when `ceil((i + 1) * f) > ceil(i * f)`: the first document, then
    /// one in every `1 / f`.
    pub valid_fraction_ppm: u32,
}

impl Default for LocalOptions {
    fn default() -> Self {
        LocalOptions {
            chat_template: None,
            mask_prompt: false,
            jsonl_separator: None,
            valid_fraction_ppm: 50_000,
        }
    }
}

/// Whether document `i` is held out for validation at `ppm` parts per
/// million: `ceil((i + 1) * ppm / 1e6) > ceil(i * ppm / 1e6)`, so document 0
/// always is and exactly `ceil(n * ppm / 1e6)` of the first `n` are.
pub fn held_out(i: u64, ppm: u32) -> bool {
    let ceil = |k: u64| (k as u128 * ppm as u128).div_ceil(1_000_000);
    ceil(i + 1) > ceil(i)
}

/// A document with, for instruction data, the byte ranges of its text that
/// count in the loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// The text (a rendered conversation for instruction data).
    pub text: String,
    /// `None` for plain text (every token counts, no segments when packed);
    /// for instruction data the counted byte ranges (the whole text without
    /// prompt masking).
    pub counted: Option<Vec<std::ops::Range<usize>>>,
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
    /// The file or folder `split` is read from (the training data for a
    /// held-out validation split).
    pub fn path(&self, split: Split) -> &Path {
        match (split, &self.validation) {
            (Split::Validation, Some(v)) => v,
            _ => &self.train,
        }
    }

    /// Whether `split` is a part of the training data: the held-out part
    /// (validation) or the rest (train), when there is no validation file.
    fn holds_out(&self) -> bool {
        self.validation.is_none()
    }
}

/// An [`Example`] of a JSON Lines row: a text row (split on `separator`
/// when given), or a conversation rendered with the template.
fn row_examples(
    row: jsonl::Row,
    at: jsonl::RowAt,
    path: &Path,
    options: &LocalOptions,
    renderer: Option<&crate::ChatRenderer>,
) -> Result<Vec<Example>> {
    use jsonl::Row;
    let err = |m: String| jsonl::row_error(path, at, m);
    let conversation = |messages: &[serde_json::Value], r: &crate::ChatRenderer| {
        let (text, counted) = if options.mask_prompt {
            r.assistant_spans(messages)
        } else {
            r.render(messages, false).map(|t| {
                let all = std::iter::once(0..t.len()).collect();
                (t, all)
            })
        }
        .map_err(|e| err(e.to_string()))?;
        Ok(vec![Example {
            text,
            counted: Some(counted),
        }])
    };
    match row {
        Row::Text(t) => {
            if options.mask_prompt {
                return Err(err(
                    "prompt masking needs {\"messages\"} or {\"prompt\", \"completion\"} rows, found a {\"text\"} row".into(),
                ));
            }
            let pieces: Vec<&str> = match &options.jsonl_separator {
                Some(sep) => corpus::split_spans(&t, sep, None)
                    .into_iter()
                    .map(|(a, b)| &t[a..b])
                    .collect(),
                None => vec![t.as_str()],
            };
            Ok(pieces
                .into_iter()
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| Example {
                    text: p.to_owned(),
                    counted: None,
                })
                .collect())
        }
        Row::Chat(messages) => match renderer {
            Some(r) => conversation(&messages, r),
            None => Err(err(
                "a {\"messages\"} row needs a chat template, and the tokenizer has none (give one with --chat-template)".into(),
            )),
        },
        Row::Completion { prompt, completion } => match renderer {
            Some(r) => {
                let messages = [
                    serde_json::json!({"role": "user", "content": prompt}),
                    serde_json::json!({"role": "assistant", "content": completion}),
                ];
                conversation(&messages, r)
            }
            None => {
                let start = if options.mask_prompt { prompt.len() } else { 0 };
                let text = prompt + &completion;
                let counted = Some(std::iter::once(start..text.len()).collect());
                Ok(vec![Example { text, counted }])
            }
        },
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
                let mut id = format!("local:{:?}:{}", l.format, file_identity(&files)?);
                // Suffixes only where they apply, so that stores built
                // before these options existed keep their keys.
                let o = &l.options;
                if l.format == LocalFormat::JsonLines {
                    if let Some(t) = &o.chat_template {
                        id += &format!(":template={}", t.hash());
                    }
                    if o.mask_prompt {
                        id += ":mask_prompt";
                    }
                    if let Some(sep) = &o.jsonl_separator {
                        id += &format!(":separator={sep:?}");
                    }
                }
                if l.holds_out() {
                    id += &format!(":held_out_ppm={}", o.valid_fraction_ppm);
                }
                id
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

    /// Hands the examples of `split` to `f` in order, at most `batch_docs` at
    /// a time: JSON Lines rows rendered (chat and prompt/completion rows are
    /// instruction data, see [`Example`]), every other source's documents as
    /// plain text. Without a validation file, the held-out documents
    /// ([`held_out`]) make the validation split and the rest the training
    /// split.
    pub fn for_each_example_batch(
        &self,
        split: Split,
        batch_docs: usize,
        mut f: impl FnMut(&[Example]) -> Result<()>,
    ) -> Result<()> {
        let limit = batch_docs.max(1);
        let mut batch: Vec<Example> = Vec::with_capacity(limit.min(1 << 16));
        let mut i = 0u64;
        let filter = match self {
            Resolved::Local(l) if l.holds_out() => Some(l.options.valid_fraction_ppm),
            _ => None,
        };
        let mut push = |e: Example, batch: &mut Vec<Example>| -> Result<()> {
            let keep = match filter {
                Some(ppm) => held_out(i, ppm) == (split == Split::Validation),
                None => true,
            };
            i += 1;
            if keep {
                batch.push(e);
                if batch.len() >= limit {
                    f(batch)?;
                    batch.clear();
                }
            }
            Ok(())
        };
        match self {
            Resolved::Local(l) if l.format == LocalFormat::JsonLines => {
                let path = l.path(split);
                let renderer = match &l.options.chat_template {
                    Some(t) => Some(t.renderer()?),
                    None => None,
                };
                jsonl::read_rows(path, &mut |row, at| {
                    for e in row_examples(row, at, path, &l.options, renderer.as_ref())? {
                        push(e, &mut batch)?;
                    }
                    Ok(())
                })?;
            }
            _ => {
                self.for_each_text_batch(split, batch_docs, |docs| {
                    for d in docs {
                        let e = Example {
                            text: d.clone(),
                            counted: None,
                        };
                        push(e, &mut batch)?;
                    }
                    Ok(())
                })?;
            }
        }
        if !batch.is_empty() {
            f(&batch)?;
        }
        Ok(())
    }

    /// Hands the documents of `split` to `f` in order, at most `batch_docs` at
    /// a time, as text (rendered conversations for instruction data); see
    /// [`Resolved::for_each_example_batch`].
    pub fn for_each_batch(
        &self,
        split: Split,
        batch_docs: usize,
        mut f: impl FnMut(&[String]) -> Result<()>,
    ) -> Result<()> {
        self.for_each_example_batch(split, batch_docs, |examples| {
            let docs: Vec<String> = examples.iter().map(|e| e.text.clone()).collect();
            f(&docs)
        })
    }

    /// Hands the documents of `split`'s file to `f` in order, at most `batch_docs` at a
    /// time. Parquet and JSON Lines stream: memory holds one batch of documents plus
    /// what the reader decodes (a line, or part of one row group). Text files and the
    /// offline corpus are loaded (mapped) whole, then handed over in batches.
    fn for_each_text_batch(
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
                LocalFormat::Text { separator } => {
                    let p = l.path(split);
                    let corpus = if p.is_dir() {
                        Corpus::from_text_dir(p, separator)?
                    } else {
                        Corpus::from_text_file(p, separator, None)?
                    };
                    for d in corpus.docs() {
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
            Resolved::Local(l) if l.holds_out() => self.gather(split),
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
