//! Tokenizers through the `tokenizers` crate: GPT-2 (embedded, Hub or local
//! files), any `tokenizer.json`, or a byte-level BPE trained on the corpus.

pub mod gpt2;
mod hf_files;

use crate::error::{DataError, Result};
use rayon::prelude::*;
use std::path::Path;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

/// The end-of-text token GPT-2 uses between documents.
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// Candidate EOS tokens, in order of preference.
const EOS_CANDIDATES: &[&str] = &[ENDOFTEXT, "</s>", "<eos>", "<|end_of_text|>"];

/// A loaded tokenizer plus what the data pipeline needs to know about it.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    eos: u32,
    vocab_size: usize,
    hash: String,
    description: String,
}

impl std::fmt::Debug for TextTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TextTokenizer")
            .field("description", &self.description)
            .field("vocab_size", &self.vocab_size)
            .field("eos", &self.eos)
            .field("hash", &self.hash)
            .finish()
    }
}

fn tok_err(context: impl std::fmt::Display, e: impl std::fmt::Display) -> DataError {
    DataError::Tokenizer {
        context: context.to_string(),
        message: e.to_string(),
    }
}

/// Runs a `tokenizers` loader on an untrusted file, a panic in it becoming
/// an error: tokenizers 0.22 still panics on some malformed
/// `tokenizer.json` files (a decoder it cannot read: `expect("Helper")`,
/// found by the fuzz target `tokenizer_json`). The panic's message is
/// printed, as every panic's is.
fn load_guarded<T>(
    context: impl std::fmt::Display,
    load: impl FnOnce() -> tokenizers::Result<T>,
) -> Result<T> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(load)) {
        Ok(loaded) => loaded.map_err(|e| tok_err(&context, e)),
        Err(panic) => {
            let why = crate::error::panic_message(&*panic);
            Err(tok_err(
                context,
                format!("malformed: the tokenizers crate failed reading it ({why})"),
            ))
        }
    }
}

/// GPT-2's pipeline around a BPE model: byte-level pre-tokenizer (no prefix
/// space), byte-level decoder and `<|endoftext|>` as a special token.
fn byte_level_bpe(bpe: BPE) -> Tokenizer {
    let mut inner = Tokenizer::new(bpe);
    inner.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
    inner.with_decoder(Some(ByteLevel::default()));
    inner.with_post_processor(Some(ByteLevel::default().trim_offsets(false)));
    inner.add_special_tokens(&[AddedToken::from(ENDOFTEXT, true)]);
    inner
}

impl TextTokenizer {
    /// Wraps a `tokenizers::Tokenizer`, finding (or adding) its EOS token.
    pub fn new(mut inner: Tokenizer, description: impl Into<String>) -> Result<TextTokenizer> {
        let description = description.into();
        let eos = match EOS_CANDIDATES.iter().find_map(|t| inner.token_to_id(t)) {
            Some(id) => id,
            None => {
                inner.add_special_tokens(&[AddedToken::from(ENDOFTEXT, true)]);
                inner
                    .token_to_id(ENDOFTEXT)
                    .ok_or_else(|| tok_err(&description, "cannot add an EOS token"))?
            }
        };
        let json = inner
            .to_string(false)
            .map_err(|e| tok_err(&description, e))?;
        let hash = format!("{:016x}", xxhash_rust::xxh3::xxh3_64(json.as_bytes()));
        let vocab_size = inner.get_vocab_size(true).max(eos as usize + 1);
        Ok(TextTokenizer {
            inner,
            eos,
            vocab_size,
            hash,
            description,
        })
    }

    /// Loads a `tokenizer.json`.
    pub fn from_file(path: &Path) -> Result<TextTokenizer> {
        let inner = load_guarded(path.display(), || Tokenizer::from_file(path))?;
        Self::new(inner, format!("tokenizer.json {}", path.display()))
    }

    /// GPT-2's byte-level BPE from `vocab.json` and `merges.txt`.
    pub fn from_vocab_merges(vocab: &Path, merges: &Path) -> Result<TextTokenizer> {
        let ctx = format!("{} + {}", vocab.display(), merges.display());
        let bpe = load_guarded(&ctx, || {
            BPE::from_file(&vocab.to_string_lossy(), &merges.to_string_lossy()).build()
        })?;
        Self::new(byte_level_bpe(bpe), format!("byte-level BPE {ctx}"))
    }

    /// GPT-2's tokenizer (50,257 tokens, `<|endoftext|>` = 50256) with no network
    /// and no files: its vocabulary and merges are derived from the byte-level BPE
    /// ranks that the `tiktoken-rs` crate embeds (`r50k_base`), see [`gpt2`].
    pub fn gpt2() -> Result<TextTokenizer> {
        let gpt2::VocabMerges { vocab, merges } = gpt2::vocab_merges()?;
        let vocab: Vocab = vocab
            .into_iter()
            .enumerate()
            .map(|(id, token)| (token, id as u32))
            .collect();
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(|e| tok_err("GPT-2 from tiktoken-rs's ranks", e))?;
        Self::new(
            byte_level_bpe(bpe),
            "GPT-2 (r50k_base ranks embedded in tiktoken-rs)",
        )
    }

    /// Trains a byte-level BPE with `vocab_size` entries (EOS included) on `docs`.
    pub fn train_byte_level<S: AsRef<str> + Send + Sync>(
        docs: &[S],
        vocab_size: usize,
    ) -> Result<TextTokenizer> {
        let alphabet = ByteLevel::alphabet();
        if vocab_size < alphabet.len() + 1 {
            return Err(DataError::Config(format!(
                "a byte-level BPE needs at least {} tokens, asked for {vocab_size}",
                alphabet.len() + 1
            )));
        }
        let trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .initial_alphabet(alphabet.into_iter().collect())
            .special_tokens(vec![AddedToken::from(ENDOFTEXT, true)])
            .build();
        let mut inner = Tokenizer::new(BPE::default());
        inner.with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)));
        inner.with_decoder(Some(ByteLevel::default()));
        let mut trainer: tokenizers::models::TrainerWrapper = trainer.into();
        inner
            .train(&mut trainer, docs.iter().map(|d| d.as_ref()))
            .map_err(|e| tok_err("training a byte-level BPE", e))?;
        Self::new(
            inner,
            format!("byte-level BPE trained on the corpus ({vocab_size} tokens)"),
        )
    }

    /// Writes the tokenizer as `tokenizer.json`.
    pub fn save(&self, path: &Path) -> Result<()> {
        self.inner
            .save(path, false)
            .map_err(|e| tok_err(path.display(), e))
    }

    /// Token ids of `text` (special tokens written in the text are recognised).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| tok_err(&self.description, e))
    }

    /// Token ids of `text` (no special tokens added; those written in the
    /// text are recognised, as transformers' `apply_chat_template` tokenizes
    /// its rendering) and a flag per token: 1 when the token starts inside
    /// one of the byte ranges `spans`, else 0.
    pub fn encode_spans(
        &self,
        text: &str,
        spans: &[std::ops::Range<usize>],
    ) -> Result<(Vec<u32>, Vec<u8>)> {
        // `encode` reports byte offsets into `text`.
        let enc = self
            .inner
            .encode(text, false)
            .map_err(|e| tok_err(&self.description, e))?;
        let flags = enc
            .get_offsets()
            .iter()
            .map(|&(start, _)| u8::from(spans.iter().any(|r| r.contains(&start))))
            .collect();
        Ok((enc.get_ids().to_vec(), flags))
    }

    /// Encodes many documents in parallel on the rayon pool.
    pub fn encode_docs<S: AsRef<str> + Sync>(&self, docs: &[S]) -> Result<Vec<Vec<u32>>> {
        docs.par_iter().map(|d| self.encode(d.as_ref())).collect()
    }

    /// Text of `ids`.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, false)
            .map_err(|e| tok_err(&self.description, e))
    }

    /// The end-of-sequence id used to separate and pad documents.
    pub fn eos_id(&self) -> u32 {
        self.eos
    }

    /// Vocabulary size including added tokens (the model's embedding rows).
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// Hash of the tokenizer's full JSON definition.
    pub fn hash(&self) -> &str {
        &self.hash
    }

    /// Where the tokenizer came from, for logs.
    pub fn description(&self) -> &str {
        &self.description
    }

    /// The wrapped `tokenizers::Tokenizer`.
    pub fn inner(&self) -> &Tokenizer {
        &self.inner
    }
}
