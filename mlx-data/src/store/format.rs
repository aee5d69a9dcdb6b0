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
//! (version 2 only)
//! index_end    n_tokens u8 loss flags, one per token: 1 when the token counts
//!              as a target, 0 when it is prompt (not predicted in the loss)
//! ```
//!
//! Version 1 stores hold plain text documents. Version 2 stores hold
//! examples (instruction data: chat or prompt/completion rows): they carry
//! the loss flags, and a packed row of them is told where each example
//! starts (segment ids) so that examples do not attend to each other.

use crate::error::{DataError, Result};
use std::path::Path;

/// File magic (also encodes the major layout).
pub const MAGIC: [u8; 8] = *b"MLXTOKS1";
/// Layout version of text stores.
pub const VERSION: u32 = 1;
/// Layout version of example stores (with a loss flag per token).
pub const VERSION_EXAMPLES: u32 = 2;
/// Header size; tokens start here, page aligned.
pub const HEADER_LEN: usize = 4096;
const META_AT: usize = 76;
/// Byte offset of the header checksum (the last 8 header bytes).
pub const HEADER_SUM_AT: usize = HEADER_LEN - 8;

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
    /// Version 2: examples, with a loss flag per token after the index.
    pub examples: bool,
}

/// Byte offset of the 8-byte aligned index after `n_tokens` tokens, or `None` when
/// it does not fit in 64 bits.
pub fn index_offset(dtype: TokenDtype, n_tokens: u64) -> Option<u64> {
    n_tokens
        .checked_mul(dtype.width() as u64)?
        .checked_add(HEADER_LEN as u64)?
        .checked_next_multiple_of(8)
}

/// Length of a store whose index starts at `index_offset` and lists `n_docs`
/// documents (`n_docs + 1` offsets), or `None` when it does not fit in 64 bits.
pub fn store_len(index_offset: u64, n_docs: u64) -> Option<u64> {
    n_docs
        .checked_add(1)?
        .checked_mul(8)?
        .checked_add(index_offset)
}

/// Length of a store as [`store_len`], plus one loss flag byte per token for
/// an example store.
pub fn store_len_with_flags(
    index_offset: u64,
    n_docs: u64,
    n_tokens: u64,
    examples: bool,
) -> Option<u64> {
    let len = store_len(index_offset, n_docs)?;
    if examples {
        len.checked_add(n_tokens)
    } else {
        Some(len)
    }
}

/// The header checksum: xxh3-64 of the first 4088 bytes (stored in the last 8).
pub fn header_checksum(header: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(header.get(..HEADER_SUM_AT).unwrap_or(header))
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
        let version = if self.examples {
            VERSION_EXAMPLES
        } else {
            VERSION
        };
        b[8..12].copy_from_slice(&version.to_le_bytes());
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
        let sum = header_checksum(&b);
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
        if version != VERSION && version != VERSION_EXAMPLES {
            return Err(corrupt(
                8,
                format!("version {VERSION} or {VERSION_EXAMPLES}"),
                version.to_string(),
            ));
        }
        let sum = header_checksum(b);
        if sum != u64_at(HEADER_SUM_AT) {
            return Err(corrupt(
                HEADER_SUM_AT,
                format!("header checksum {sum:#018x}"),
                format!("{:#018x}", u64_at(HEADER_SUM_AT)),
            ));
        }
        // Past the checksum every field may still be hostile (a crafted file can carry
        // a correct checksum): each is checked against the others with checked
        // arithmetic, and the reader checks `file_len` against the real file size.
        let dtype = match u32_at(12) {
            2 => TokenDtype::U16,
            4 => TokenDtype::U32,
            w => return Err(corrupt(12, "token width 2 or 4".into(), w.to_string())),
        };
        let vocab_size = u32_at(36);
        if vocab_size == 0 || TokenDtype::for_vocab(vocab_size as usize) != dtype {
            let range = match dtype {
                TokenDtype::U16 => "1..=65536",
                TokenDtype::U32 => "65537 and up",
            };
            return Err(corrupt(
                36,
                format!("vocab_size {range} for token width {}", dtype.width()),
                format!("vocab_size {vocab_size}"),
            ));
        }
        let eos = u32_at(32);
        if eos >= vocab_size {
            return Err(corrupt(
                32,
                format!("eos below vocab_size {vocab_size}"),
                format!("eos {eos}"),
            ));
        }
        let n_tokens = u64_at(16);
        let Some(expected_index) = index_offset(dtype, n_tokens) else {
            return Err(corrupt(
                16,
                "n_tokens whose byte size fits in 64 bits".into(),
                format!("n_tokens {n_tokens}"),
            ));
        };
        let index_at = u64_at(48);
        if u64_at(40) != HEADER_LEN as u64 || index_at != expected_index {
            return Err(corrupt(
                40,
                format!("tokens_offset {HEADER_LEN}, index_offset {expected_index}"),
                format!("tokens_offset {}, index_offset {index_at}", u64_at(40)),
            ));
        }
        // Every document holds at least its EOS.
        let n_docs = u64_at(24);
        if n_docs > n_tokens || (n_docs == 0) != (n_tokens == 0) {
            return Err(corrupt(
                24,
                format!("n_docs from 1 to n_tokens {n_tokens} (0 only when empty)"),
                format!("n_docs {n_docs}"),
            ));
        }
        let file_len = u64_at(56);
        let examples = version == VERSION_EXAMPLES;
        let expected_len = store_len_with_flags(index_at, n_docs, n_tokens, examples);
        if expected_len != Some(file_len) || usize::try_from(file_len).is_err() {
            return Err(corrupt(
                56,
                match expected_len {
                    Some(l) => format!("file_len {l} addressable in memory"),
                    None => format!("n_docs {n_docs} whose index fits in 64 bits"),
                },
                format!("file_len {file_len}"),
            ));
        }
        let meta_len = u32_at(72);
        let Some(meta) = b
            .get(META_AT..HEADER_SUM_AT)
            .and_then(|m| m.get(..meta_len as usize))
        else {
            return Err(corrupt(
                72,
                format!("meta_len at most {}", HEADER_SUM_AT - META_AT),
                format!("meta_len {meta_len}"),
            ));
        };
        let meta: StoreMeta = serde_json::from_slice(meta)
            .map_err(|e| corrupt(META_AT, "metadata JSON".into(), e.to_string()))?;
        Ok(Header {
            dtype,
            n_tokens,
            n_docs,
            eos,
            vocab_size,
            index_offset: index_at,
            file_len,
            data_checksum: u64_at(64),
            meta,
            examples,
        })
    }
}
