//! One call from configuration to ready token stores: resolve the source, get a
//! tokenizer, and open or build the train and validation stores.

use crate::error::{IoContext, Result};
use crate::hub::{HubClient, HubConfig, RepoKind};
use crate::lockfile::{FileLock, publish, sibling, temp_sibling};
use crate::source::{Resolved, SourceSpec, Split};
use crate::store::{BuildSpec, Outcome, StoreMeta, TokenStore};
use crate::tokenizer::TextTokenizer;
use mlx_progress::{Task, Unit};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Which tokenizer to use.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TokenizerSpec {
    /// GPT-2, built from the ranks embedded in the crate (no network, no files);
    /// see [`TextTokenizer::gpt2`]. The default.
    #[default]
    Gpt2,
    /// GPT-2's `tokenizer.json` from the Hub (an error if unavailable).
    Gpt2Hub,
    /// A local `tokenizer.json`.
    File(PathBuf),
    /// Local GPT-2 style `vocab.json` + `merges.txt` (byte-level BPE).
    VocabMerges {
        /// `vocab.json`.
        vocab: PathBuf,
        /// `merges.txt`.
        merges: PathBuf,
    },
    /// A byte-level BPE trained on the training split and cached.
    TrainByteLevel {
        /// Vocabulary size, EOS included.
        vocab_size: usize,
    },
}

/// Everything [`prepare`] needs.
#[derive(Debug, Clone)]
pub struct DataConfig {
    /// Text source.
    pub source: SourceSpec,
    /// Tokenizer.
    pub tokenizer: TokenizerSpec,
    /// Where token stores and trained tokenizers live (`MLX_DATA_CACHE`, else
    /// `~/.cache/mlx-data`).
    pub cache_dir: PathBuf,
    /// Hub settings.
    pub hub: HubConfig,
    /// How long a rank waits for another rank that is building a store.
    pub lock_deadline: Duration,
}

impl Default for DataConfig {
    fn default() -> Self {
        let cache_dir = std::env::var_os("MLX_DATA_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                let home = std::env::var_os("HOME")
                    .or_else(|| std::env::var_os("USERPROFILE"))
                    .unwrap_or_else(|| ".".into());
                PathBuf::from(home).join(".cache").join("mlx-data")
            });
        DataConfig {
            source: SourceSpec::default(),
            tokenizer: TokenizerSpec::default(),
            cache_dir,
            hub: HubConfig::from_env(),
            lock_deadline: Duration::from_secs(3600),
        }
    }
}

/// Ready-to-load data: the tokenizer and both splits' stores.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The tokenizer the stores were built with.
    pub tokenizer: TextTokenizer,
    /// Training tokens.
    pub train: Arc<TokenStore>,
    /// Validation tokens.
    pub validation: Arc<TokenStore>,
    /// `hub`, `local` or `offline`.
    pub source_kind: &'static str,
}

/// Resolves the source, loads or trains the tokenizer, then opens or builds the
/// train and validation token stores (one builder across processes).
pub fn prepare(cfg: &DataConfig) -> Result<Prepared> {
    let hub = HubClient::new(cfg.hub.clone());
    let train_src = cfg.source.resolve(Split::Train, &hub)?;
    let valid_src = match &train_src {
        // Keep both splits from the same place even if the Hub drops out in between.
        Resolved::Offline(o) => Resolved::Offline(o.clone()),
        _ => cfg.source.resolve(Split::Validation, &hub)?,
    };
    let tokenizer = load_tokenizer(cfg, &hub, &train_src)?;
    tracing::info!(
        tokenizer = tokenizer.description(),
        vocab = tokenizer.vocab_size(),
        "tokenizer"
    );
    let (train, _) = open_or_build_split(
        &cfg.cache_dir,
        &train_src,
        Split::Train,
        &tokenizer,
        cfg.lock_deadline,
    )?;
    let (validation, _) = open_or_build_split(
        &cfg.cache_dir,
        &valid_src,
        Split::Validation,
        &tokenizer,
        cfg.lock_deadline,
    )?;
    Ok(Prepared {
        tokenizer,
        train: Arc::new(train),
        validation: Arc::new(validation),
        source_kind: train_src.kind(),
    })
}

fn load_tokenizer(cfg: &DataConfig, hub: &HubClient, train: &Resolved) -> Result<TextTokenizer> {
    match &cfg.tokenizer {
        TokenizerSpec::Gpt2 => TextTokenizer::gpt2(),
        TokenizerSpec::Gpt2Hub => {
            let path = hub.fetch(RepoKind::Model, "gpt2", "main", "tokenizer.json")?;
            TextTokenizer::from_file(&path)
        }
        TokenizerSpec::File(p) => TextTokenizer::from_file(p),
        TokenizerSpec::VocabMerges { vocab, merges } => {
            TextTokenizer::from_vocab_merges(vocab, merges)
        }
        TokenizerSpec::TrainByteLevel { vocab_size } => {
            trained_tokenizer(&cfg.cache_dir, train, *vocab_size, cfg.lock_deadline)
        }
    }
}

/// A byte-level BPE trained on `train`'s training split, cached under `cache_dir`.
pub fn trained_tokenizer(
    cache_dir: &Path,
    train: &Resolved,
    vocab_size: usize,
    deadline: Duration,
) -> Result<TextTokenizer> {
    let id = format!("{}:bpe{vocab_size}", train.identity(Split::Train)?);
    let path = cache_dir.join("tokenizers").join(format!(
        "bpe-{:016x}.json",
        xxhash_rust::xxh3::xxh3_64(id.as_bytes())
    ));
    if let Ok(t) = TextTokenizer::from_file(&path) {
        return Ok(t);
    }
    let doing = format!("training the tokenizer {}", path.display());
    let _lock = FileLock::acquire_while(&sibling(&path, ".lock"), deadline, &doing)?;
    if let Ok(t) = TextTokenizer::from_file(&path) {
        return Ok(t);
    }
    tracing::info!(vocab_size, path = %path.display(), "training a byte-level BPE tokenizer on the corpus");
    let task = Task::spinner(format!(
        "training a byte-level BPE tokenizer ({vocab_size} tokens)"
    ));
    task.set_message("loading the corpus");
    let corpus = train.load(Split::Train)?;
    let docs: Vec<&str> = corpus.docs().collect();
    task.set_message(format!("on {} documents", docs.len()));
    let t = TextTokenizer::train_byte_level(&docs, vocab_size)?;
    task.finish();
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).at(dir)?;
    let tmp = temp_sibling(&path);
    t.save(&tmp)?;
    publish(&tmp, &path)?;
    // Reload so the hash is that of the file every other rank will load.
    TextTokenizer::from_file(&path)
}

/// Opens or builds the token store of one split of a resolved source.
pub fn open_or_build_split(
    cache_dir: &Path,
    source: &Resolved,
    split: Split,
    tokenizer: &TextTokenizer,
    deadline: Duration,
) -> Result<(TokenStore, Outcome)> {
    let meta = StoreMeta {
        source: source.identity(split)?,
        tokenizer_hash: tokenizer.hash().to_owned(),
        split: split.name().to_owned(),
    };
    let key =
        xxhash_rust::xxh3::xxh3_64(format!("{}|{}", meta.source, meta.tokenizer_hash).as_bytes());
    let path = cache_dir.join("stores").join(format!(
        "{}-{}-{key:016x}.tokens",
        source.kind(),
        split.name()
    ));
    let spec = BuildSpec {
        meta,
        vocab_size: tokenizer.vocab_size(),
        eos: tokenizer.eos_id(),
        lock_deadline: deadline,
    };
    // Streaming sources (parquet, JSON Lines) hand over bounded batches; each batch
    // is tokenized in parallel and appended in order, so stores are identical run
    // to run.
    crate::store::open_or_build(&path, &spec, |w| {
        // The total is an estimate (file sizes, parquet footers) for the ETA; the
        // bar ends at the bytes actually tokenized.
        let hint = source.text_bytes_hint(split);
        let mut progress = Tokenizing::start(format!("tokenizing {}", split.name()), hint);
        source.for_each_example_batch(split, TOKENIZE_BATCH_DOCS, |examples| {
            progress.examples(tokenizer, examples, w)
        })?;
        progress.finish();
        Ok(())
    })
}

/// The progress of tokenizing one split: text bytes done, tokens made.
struct Tokenizing {
    task: Task,
    tokens: u64,
}

impl Tokenizing {
    /// Starts the task `name`, of `bytes` of text when known.
    fn start(name: String, bytes: Option<u64>) -> Tokenizing {
        let task = Task::new(name, bytes, Unit::Bytes);
        Tokenizing { task, tokens: 0 }
    }

    /// Tokenizes `docs` in parallel, appends them to `w` in order, and counts them.
    fn batch<S: AsRef<str> + Sync>(
        &mut self,
        tokenizer: &TextTokenizer,
        docs: &[S],
        w: &mut crate::store::StoreWriter,
    ) -> Result<()> {
        for ids in tokenizer.encode_docs(docs)? {
            w.push_doc(&ids)?;
            self.tokens += ids.len() as u64;
        }
        let tokens = mlx_progress::format::amount(Unit::Tokens, self.tokens);
        self.task.set_message(format!("{tokens} tokens"));
        self.task
            .inc(docs.iter().map(|d| d.as_ref().len() as u64).sum());
        Ok(())
    }

    /// Tokenizes `examples` in parallel (instruction data with a loss flag
    /// per token) and appends them to `w` in order.
    fn examples(
        &mut self,
        tokenizer: &TextTokenizer,
        examples: &[crate::source::Example],
        w: &mut crate::store::StoreWriter,
    ) -> Result<()> {
        use rayon::prelude::*;
        let encoded: Vec<(Vec<u32>, Option<Vec<u8>>)> = examples
            .par_iter()
            .map(|e| match &e.counted {
                None => tokenizer.encode(&e.text).map(|ids| (ids, None)),
                Some(spans) => tokenizer
                    .encode_spans(&e.text, spans)
                    .map(|(ids, flags)| (ids, Some(flags))),
            })
            .collect::<Result<_>>()?;
        for (ids, flags) in encoded {
            match flags {
                None => w.push_doc(&ids)?,
                Some(f) => w.push_example(&ids, &f)?,
            }
            self.tokens += ids.len() as u64;
        }
        let tokens = mlx_progress::format::amount(Unit::Tokens, self.tokens);
        self.task.set_message(format!("{tokens} tokens"));
        self.task
            .inc(examples.iter().map(|e| e.text.len() as u64).sum());
        Ok(())
    }

    /// Ends the task at the bytes actually tokenized (the total was an estimate).
    fn finish(self) {
        self.task.set_total(Some(self.task.position()));
        self.task.finish();
    }
}

/// Documents tokenized together (in parallel) while a store is built.
pub const TOKENIZE_BATCH_DOCS: usize = 4096;

/// Tokenizes every document of `corpus` in parallel chunks and appends them to `w`.
pub fn tokenize_into(
    corpus: &crate::source::Corpus,
    tokenizer: &TextTokenizer,
    w: &mut crate::store::StoreWriter,
) -> Result<()> {
    let docs: Vec<&str> = corpus.docs().collect();
    let bytes = docs.iter().map(|d| d.len() as u64).sum();
    let mut progress = Tokenizing::start("tokenizing".into(), Some(bytes));
    for chunk in docs.chunks(TOKENIZE_BATCH_DOCS) {
        progress.batch(tokenizer, chunk, w)?;
    }
    progress.finish();
    Ok(())
}
