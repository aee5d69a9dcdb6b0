//! The on-disk layout of a token store, written down in one place.
//!
//! ```text
//! offset 0     header (4096 bytes, little endian)
//!   0  magic  b"MLXTOKS1"          8  version u32        12 dtype width u32 (2 or 4)
//!   16 n_tokens u64                24 n_docs u64          32 eos u32
//!   36 vocab_size u32              40 tokens_offset u64   48 index_offset u64
//!   56 file_len u64                64 data_checksum u64 (xxh3-64 of bytes 4096..file_len)
//!   72 meta_len u32                76 meta JSON (source, tokenizer hash, split)
//!   4088 header_checksum u64 (xxh3-64 of bytes 0..4088)
//! 4096         tokens: n_tokens values of the dtype; each document followed by EOS
//! index_offset n_docs + 1 u64 token offsets (8-byte aligned); document i is
//!              tokens[index[i] .. index[i+1] - 1], the EOS at index[i+1] - 1
//! ```

use crate::error::{DataError, Result};
use std::path::Path;

/// File magic (also encodes the major layout).
pub const MAGIC: [u8; 8] = *b"MLXTOKS1";
/// Layout version.
pub const VERSION: u32 = 1;
/// Header size; tokens start here, page aligned.
pub const HEADER_LEN: usize = 4096;
const META_AT: usize = 76;
const HEADER_SUM_AT: usize = HEADER_LEN - 8;

/// Width of stored token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum TokenDtype {
    /// Two bytes per token (vocabularies up to 65,536).
    U16,
    /// Four bytes per token.
    U32,
}

impl TokenDtype {
    /// The narrowest dtype that holds every id below `vocab_size`.
    pub fn for_vocab(vocab_size: usize) -> TokenDtype {
        if vocab_size <= 1 << 16 {
            TokenDtype::U16
        } else {
            TokenDtype::U32
        }
    }

    /// Bytes per token.
    pub fn width(self) -> usize {
        match self {
            TokenDtype::U16 => 2,
            TokenDtype::U32 => 4,
        }
    }
}

/// Provenance recorded in the header; a store is reused only when it matches.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreMeta {
    /// Identity of the text source (path and size, Hub commit, offline grammar...).
    pub source: String,
    /// Hash of the tokenizer's full definition.
    pub tokenizer_hash: String,
    /// `train` or `validation`.
    pub split: String,
}

/// The decoded header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Token width.
    pub dtype: TokenDtype,
    /// Tokens stored (documents plus one EOS each).
    pub n_tokens: u64,
    /// Documents stored.
    pub n_docs: u64,
    /// The end-of-sequence id separating documents.
    pub eos: u32,
    /// The tokenizer's vocabulary size.
    pub vocab_size: u32,
    /// Byte offset of the index.
    pub index_offset: u64,
    /// Total file length.
    pub file_len: u64,
    /// xxh3-64 of everything after the header.
    pub data_checksum: u64,
    /// Provenance.
    pub meta: StoreMeta,
}

/// Byte offset of the 8-byte aligned index after `n_tokens` tokens.
pub fn index_offset(dtype: TokenDtype, n_tokens: u64) -> u64 {
    (HEADER_LEN as u64 + n_tokens * dtype.width() as u64).next_multiple_of(8)
}

impl Header {
    /// Serialises the header into its 4096 bytes.
    pub fn encode(&self) -> Result<Vec<u8>> {
        let meta = serde_json::to_vec(&self.meta).map_err(|e| DataError::Config(e.to_string()))?;
        if META_AT + meta.len() > HEADER_SUM_AT {
            return Err(DataError::Config(format!(
                "store metadata is {} bytes, at most {} fit in the header",
                meta.len(),
                HEADER_SUM_AT - META_AT
            )));
        }
        let mut b = vec![0u8; HEADER_LEN];
        b[0..8].copy_from_slice(&MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(self.dtype.width() as u32).to_le_bytes());
        b[16..24].copy_from_slice(&self.n_tokens.to_le_bytes());
        b[24..32].copy_from_slice(&self.n_docs.to_le_bytes());
        b[32..36].copy_from_slice(&self.eos.to_le_bytes());
        b[36..40].copy_from_slice(&self.vocab_size.to_le_bytes());
        b[40..48].copy_from_slice(&(HEADER_LEN as u64).to_le_bytes());
        b[48..56].copy_from_slice(&self.index_offset.to_le_bytes());
        b[56..64].copy_from_slice(&self.file_len.to_le_bytes());
        b[64..72].copy_from_slice(&self.data_checksum.to_le_bytes());
        b[72..76].copy_from_slice(&(meta.len() as u32).to_le_bytes());
        b[META_AT..META_AT + meta.len()].copy_from_slice(&meta);
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..HEADER_SUM_AT]);
        b[HEADER_SUM_AT..].copy_from_slice(&sum.to_le_bytes());
        Ok(b)
    }

    /// Parses and validates a header read from `path` (`b` may be short if the file is).
    pub fn decode(b: &[u8], path: &Path) -> Result<Header> {
        let corrupt = |offset: usize, expected: String, found: String| DataError::CorruptStore {
            path: path.to_path_buf(),
            offset: offset as u64,
            expected,
            found,
        };
        if b.len() < HEADER_LEN {
            return Err(corrupt(
                b.len(),
                format!("a {HEADER_LEN}-byte header"),
                format!("end of file after {} bytes", b.len()),
            ));
        }
        if b[0..8] != MAGIC {
            return Err(corrupt(
                0,
                format!("magic {MAGIC:?}"),
                format!("{:?}", &b[0..8]),
            ));
        }
        let u32_at = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
        let u64_at = |o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
        let version = u32_at(8);
        if version != VERSION {
            return Err(corrupt(
                8,
                format!("version {VERSION}"),
                version.to_string(),
            ));
        }
        let sum = xxhash_rust::xxh3::xxh3_64(&b[..HEADER_SUM_AT]);
        if sum != u64_at(HEADER_SUM_AT) {
            return Err(corrupt(
                HEADER_SUM_AT,
                format!("header checksum {sum:#018x}"),
                format!("{:#018x}", u64_at(HEADER_SUM_AT)),
            ));
        }
        let dtype = match u32_at(12) {
            2 => TokenDtype::U16,
            4 => TokenDtype::U32,
            w => return Err(corrupt(12, "token width 2 or 4".into(), w.to_string())),
        };
        let n_tokens = u64_at(16);
        let n_docs = u64_at(24);
        let index_at = u64_at(48);
        if u64_at(40) != HEADER_LEN as u64 || index_at != index_offset(dtype, n_tokens) {
            return Err(corrupt(
                40,
                format!(
                    "tokens at {HEADER_LEN}, index at {}",
                    index_offset(dtype, n_tokens)
                ),
                format!("tokens at {}, index at {index_at}", u64_at(40)),
            ));
        }
        let file_len = u64_at(56);
        if file_len != index_at + (n_docs + 1) * 8 {
            return Err(corrupt(
                56,
                format!("file length {}", index_at + (n_docs + 1) * 8),
                file_len.to_string(),
            ));
        }
        let meta_len = u32_at(72) as usize;
        if META_AT + meta_len > HEADER_SUM_AT {
            return Err(corrupt(
                72,
                "metadata inside the header".into(),
                meta_len.to_string(),
            ));
        }
        let meta: StoreMeta = serde_json::from_slice(&b[META_AT..META_AT + meta_len])
            .map_err(|e| corrupt(META_AT, "metadata JSON".into(), e.to_string()))?;
        Ok(Header {
            dtype,
            n_tokens,
            n_docs,
            eos: u32_at(32),
            vocab_size: u32_at(36),
            index_offset: index_at,
            file_len,
            data_checksum: u64_at(64),
            meta,
        })
    }
}
