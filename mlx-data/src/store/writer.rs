//! Streams documents into a new token store file (normally a temporary sibling).

use super::format::{HEADER_LEN, Header, StoreMeta, TokenDtype, index_offset};
use crate::error::{DataError, IoContext, Result};
use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use xxhash_rust::xxh3::Xxh3;

/// Writes tokens document by document, then the index and the header.
pub struct StoreWriter {
    out: BufWriter<File>,
    hasher: Xxh3,
    path: PathBuf,
    dtype: TokenDtype,
    eos: u32,
    vocab_size: u32,
    offsets: Vec<u64>,
    n_tokens: u64,
    scratch: Vec<u8>,
    /// Loss flags of every token so far, once an example was pushed.
    flags: Option<Vec<u8>>,
}

impl StoreWriter {
    /// Creates `path` (truncating it) for a store of the given vocabulary.
    pub fn create(path: &Path, vocab_size: usize, eos: u32) -> Result<StoreWriter> {
        if eos as usize >= vocab_size {
            return Err(DataError::Config(format!(
                "EOS id {eos} is outside the vocabulary of {vocab_size}"
            )));
        }
        let vocab = u32::try_from(vocab_size).map_err(|_| {
            DataError::Config(format!(
                "vocabulary of {vocab_size} does not fit in 32 bits"
            ))
        })?;
        let file = File::create(path).at(path)?;
        let mut out = BufWriter::with_capacity(1 << 20, file);
        out.write_all(&[0u8; HEADER_LEN]).at(path)?;
        Ok(StoreWriter {
            out,
            hasher: Xxh3::new(),
            path: path.to_path_buf(),
            dtype: TokenDtype::for_vocab(vocab_size),
            eos,
            vocab_size: vocab,
            offsets: vec![0],
            n_tokens: 0,
            scratch: Vec::new(),
            flags: None,
        })
    }

    fn put(&mut self, bytes_from: usize) -> Result<()> {
        let bytes = &self.scratch[bytes_from..];
        self.hasher.update(bytes);
        self.out.write_all(bytes).at(&self.path)
    }

    /// Appends one document (its tokens then EOS). Ids must be below the vocabulary size.
    pub fn push_doc(&mut self, tokens: &[u32]) -> Result<()> {
        self.scratch.clear();
        for &t in tokens.iter().chain(std::iter::once(&self.eos)) {
            if t >= self.vocab_size {
                return Err(DataError::Tokenizer {
                    context: format!("writing {}", self.path.display()),
                    message: format!("token id {t} >= vocabulary size {}", self.vocab_size),
                });
            }
            match self.dtype {
                TokenDtype::U16 => self.scratch.extend_from_slice(&(t as u16).to_le_bytes()),
                TokenDtype::U32 => self.scratch.extend_from_slice(&t.to_le_bytes()),
            }
        }
        self.put(0)?;
        self.n_tokens += tokens.len() as u64 + 1;
        self.offsets.push(self.n_tokens);
        if let Some(flags) = &mut self.flags {
            flags.resize(self.n_tokens as usize, 1);
        }
        Ok(())
    }

    /// Appends one example: its tokens then EOS, with a loss flag per token
    /// (`flags[i]` nonzero: token `i` counts as a target). The EOS counts
    /// when the example's last token does. The store becomes an example
    /// store (version 2); documents pushed before count whole.
    pub fn push_example(&mut self, tokens: &[u32], flags: &[u8]) -> Result<()> {
        if flags.len() != tokens.len() {
            return Err(DataError::Config(format!(
                "{} loss flags for {} tokens",
                flags.len(),
                tokens.len()
            )));
        }
        let before = self.n_tokens as usize;
        self.push_doc(tokens)?;
        let all = self.flags.get_or_insert_with(|| vec![1; before]);
        all.truncate(before);
        all.extend(flags.iter().map(|&f| u8::from(f != 0)));
        all.push(flags.last().map_or(1, |&f| u8::from(f != 0)));
        Ok(())
    }
    /// Writes the index and header, syncs, and returns the header written.
    pub fn finish(mut self, meta: StoreMeta) -> Result<Header> {
        let too_big = || DataError::Config(format!("{} tokens overflow the store", self.n_tokens));
        let index_at = index_offset(self.dtype, self.n_tokens).ok_or_else(too_big)?;
        let tokens_end = HEADER_LEN as u64 + self.n_tokens * self.dtype.width() as u64;
        self.scratch.clear();
        self.scratch.resize((index_at - tokens_end) as usize, 0);
        for o in &self.offsets {
            self.scratch.extend_from_slice(&o.to_le_bytes());
        }
        if let Some(flags) = &self.flags {
            self.scratch.extend_from_slice(flags);
        }
        self.put(0)?;
        let header = Header {
            dtype: self.dtype,
            n_tokens: self.n_tokens,
            n_docs: self.offsets.len() as u64 - 1,
            eos: self.eos,
            vocab_size: self.vocab_size,
            index_offset: index_at,
            file_len: index_at
                + self.offsets.len() as u64 * 8
                + self.flags.as_ref().map_or(0, |f| f.len() as u64),
            data_checksum: self.hasher.digest(),
            meta,
            examples: self.flags.is_some(),
        };
        let bytes = header.encode()?;
        let path = self.path.clone();
        let mut file = self
            .out
            .into_inner()
            .map_err(|e| DataError::io(&path, e.into_error()))?;
        file.seek(SeekFrom::Start(0)).at(&path)?;
        file.write_all(&bytes).at(&path)?;
        file.sync_all().at(&path)?;
        Ok(header)
    }
}
