//! Opens, validates and memory-maps a token store.

use super::format::{HEADER_LEN, Header, StoreMeta, TokenDtype};
use crate::error::{DataError, IoContext, Result};
use memmap2::Mmap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

/// How much of a store to check when opening it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Verify {
    /// Header, sizes, the checksum of every data byte and every token id
    /// below the vocabulary size (read, not mapped, so checking does not
    /// add to resident memory).
    #[default]
    Full,
    /// Header and sizes only (for a store this process just wrote: its
    /// writer refused ids outside the vocabulary).
    HeaderOnly,
}

/// Checks the token ids of a store's data as it streams past (in chunks
/// of any length) against its vocabulary: the first id out of range.
struct IdCheck {
    width: usize,
    vocab_size: u32,
    /// Token bytes still to come.
    left: u64,
    /// The index of the next whole token.
    next: u64,
    /// The bytes of a token split between two chunks.
    partial: Vec<u8>,
    /// The first token whose id is not below the vocabulary size, with the id.
    first_bad: Option<(u64, u32)>,
}

impl IdCheck {
    fn new(header: &Header) -> IdCheck {
        let width = header.dtype.width();
        IdCheck {
            width,
            vocab_size: header.vocab_size,
            // The header's checks keep this inside the file (no overflow).
            left: header.n_tokens.saturating_mul(width as u64),
            next: 0,
            partial: Vec::with_capacity(4),
            first_bad: None,
        }
    }

    fn id(&self, b: &[u8]) -> u32 {
        match self.width {
            2 => u16::from_le_bytes([b[0], b[1]]) as u32,
            _ => u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    }

    /// The next bytes of the data region (tokens first, then padding and
    /// the index, which are ignored).
    fn feed(&mut self, chunk: &[u8]) {
        let take = (self.left.min(chunk.len() as u64)) as usize;
        self.left -= take as u64;
        let mut bytes = &chunk[..take];
        if self.first_bad.is_some() {
            return;
        }
        if !self.partial.is_empty() {
            let need = (self.width - self.partial.len()).min(bytes.len());
            self.partial.extend_from_slice(&bytes[..need]);
            bytes = &bytes[need..];
            if self.partial.len() < self.width {
                return;
            }
            let whole = std::mem::take(&mut self.partial);
            self.check(&whole);
        }
        let whole = bytes.len() / self.width * self.width;
        for t in bytes[..whole].chunks_exact(self.width) {
            if self.first_bad.is_some() {
                return;
            }
            self.check(t);
        }
        self.partial.extend_from_slice(&bytes[whole..]);
    }

    fn check(&mut self, token: &[u8]) {
        let id = self.id(token);
        if id >= self.vocab_size && self.first_bad.is_none() {
            self.first_bad = Some((self.next, id));
        }
        self.next += 1;
    }
}

/// A read-only, memory-mapped token store.
#[derive(Debug)]
pub struct TokenStore {
    map: Mmap,
    header: Header,
    path: PathBuf,
}

/// A borrowed run of tokens in the store's own width.
#[derive(Debug, Clone, Copy)]
pub enum Tokens<'a> {
    /// Two-byte ids.
    U16(&'a [u16]),
    /// Four-byte ids.
    U32(&'a [u32]),
}

impl Tokens<'_> {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Tokens::U16(s) => s.len(),
            Tokens::U32(s) => s.len(),
        }
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The id at `i`.
    pub fn get(&self, i: usize) -> Option<u32> {
        match self {
            Tokens::U16(s) => s.get(i).map(|&t| t as u32),
            Tokens::U32(s) => s.get(i).copied(),
        }
    }

    /// Copies the first `out.len()` ids (at most `len()`) into `out`; returns how many.
    pub fn copy_to(&self, out: &mut [u32]) -> usize {
        let n = out.len().min(self.len());
        match self {
            Tokens::U16(s) => out[..n]
                .iter_mut()
                .zip(*s)
                .for_each(|(o, &t)| *o = t as u32),
            Tokens::U32(s) => out[..n].copy_from_slice(&s[..n]),
        }
        n
    }

    /// The ids as a vector.
    pub fn to_vec(&self) -> Vec<u32> {
        let mut v = vec![0; self.len()];
        self.copy_to(&mut v);
        v
    }
}

impl TokenStore {
    /// Opens `path`, validating the header, the file length and (with
    /// [`Verify::Full`]) the data checksum. Never returns a damaged store.
    pub fn open(path: &Path, verify: Verify) -> Result<TokenStore> {
        if cfg!(target_endian = "big") {
            return Err(DataError::Config(
                "token stores are little endian only".into(),
            ));
        }
        let mut file = File::open(path).at(path)?;
        let mut head = Vec::with_capacity(HEADER_LEN);
        (&mut file)
            .take(HEADER_LEN as u64)
            .read_to_end(&mut head)
            .at(path)?;
        let header = Header::decode(&head, path)?;
        let actual = file.metadata().at(path)?.len();
        if actual != header.file_len {
            return Err(DataError::CorruptStore {
                path: path.to_path_buf(),
                offset: actual.min(header.file_len),
                expected: format!("file length {}", header.file_len),
                found: format!("file length {actual} (truncated or extended)"),
            });
        }
        if verify == Verify::Full {
            let mut hasher = xxhash_rust::xxh3::Xxh3::new();
            let mut ids = IdCheck::new(&header);
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = file.read(&mut buf).at(path)?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                ids.feed(&buf[..n]);
            }
            let sum = hasher.digest();
            if sum != header.data_checksum {
                return Err(DataError::CorruptStore {
                    path: path.to_path_buf(),
                    offset: HEADER_LEN as u64,
                    expected: format!("data checksum {:#018x}", header.data_checksum),
                    found: format!("{sum:#018x}"),
                });
            }
            // An id the vocabulary does not have would index past the
            // embedding later: refused here, where the data is read anyway.
            if let Some((token, id)) = ids.first_bad {
                return Err(DataError::CorruptStore {
                    path: path.to_path_buf(),
                    offset: HEADER_LEN as u64 + token * header.dtype.width() as u64,
                    expected: format!("token ids below vocab_size {}", header.vocab_size),
                    found: format!("token {token} is id {id}"),
                });
            }
        }
        // SAFETY: the file is only ever replaced by rename, never modified in place, so
        // the mapping stays consistent for as long as we hold it.
        let map = unsafe { Mmap::map(&file) }.at(path)?;
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        let store = TokenStore {
            map,
            header,
            path: path.to_path_buf(),
        };
        store.check_index_ends()?;
        Ok(store)
    }

    fn check_index_ends(&self) -> Result<()> {
        let idx = self.index();
        let (first, last) = (idx.first().copied(), idx.last().copied());
        if first != Some(0) || last != Some(self.header.n_tokens) {
            return Err(DataError::CorruptStore {
                path: self.path.clone(),
                offset: self.header.index_offset,
                expected: format!("index from 0 to {}", self.header.n_tokens),
                found: format!("index from {first:?} to {last:?}"),
            });
        }
        Ok(())
    }

    /// The store's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The decoded header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// Provenance recorded at build time.
    pub fn meta(&self) -> &StoreMeta {
        &self.header.meta
    }

    /// Number of documents.
    pub fn n_docs(&self) -> u64 {
        self.header.n_docs
    }

    /// Number of tokens, EOS separators included.
    pub fn n_tokens(&self) -> u64 {
        self.header.n_tokens
    }

    /// The end-of-sequence id.
    pub fn eos(&self) -> u32 {
        self.header.eos
    }

    /// The tokenizer vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.header.vocab_size as usize
    }

    /// The map's bytes `start..end`; empty if out of range (which `open`'s checks of
    /// the header against the file size rule out).
    fn bytes(&self, start: u64, end: u64) -> &[u8] {
        match (usize::try_from(start), usize::try_from(end)) {
            (Ok(s), Ok(e)) => self.map.get(s..e).unwrap_or_default(),
            _ => &[],
        }
    }

    fn index(&self) -> &[u64] {
        // The index offset is 8-aligned and the mapping is page aligned.
        let end = (self.header.n_docs + 1) * 8 + self.header.index_offset;
        let bytes = self.bytes(self.header.index_offset, end);
        bytemuck::try_cast_slice(bytes).unwrap_or_default()
    }

    /// Whether this is an example store (instruction data, version 2): it has
    /// a loss flag per token, and packed rows get segment ids.
    pub fn is_examples(&self) -> bool {
        self.header.examples
    }

    /// The loss flags of tokens `start..end` (1: the token counts as a
    /// target), or `None` for a text store, where every token counts.
    pub fn loss_flags(&self, start: u64, end: u64) -> Option<&[u8]> {
        if !self.header.examples {
            return None;
        }
        let end = end.min(self.header.n_tokens);
        let start = start.min(end);
        // `open` checked that the file ends n_tokens bytes after the index.
        let at = (self.header.n_docs + 1) * 8 + self.header.index_offset;
        Some(self.bytes(at + start, at + end))
    }

    /// The document that token `t` (of the whole stream) belongs to, its
    /// closing EOS included.
    pub fn doc_of(&self, t: u64) -> u64 {
        let idx = self.index();
        (idx.partition_point(|&o| o <= t) as u64)
            .saturating_sub(1)
            .min(self.header.n_docs.saturating_sub(1))
    }

    /// The token offset where document `d` starts (`n_tokens` past the last).
    pub fn doc_start(&self, d: u64) -> u64 {
        usize::try_from(d)
            .ok()
            .and_then(|d| self.index().get(d).copied())
            .unwrap_or(self.header.n_tokens)
    }

    /// Tokens `start..end` of the whole stream (documents joined by EOS).
    pub fn tokens(&self, start: u64, end: u64) -> Tokens<'_> {
        let end = end.min(self.header.n_tokens);
        let start = start.min(end);
        // In range: `open` checked that the n_tokens tokens end inside the file.
        let w = self.header.dtype.width() as u64;
        let at = |t: u64| HEADER_LEN as u64 + t * w;
        let bytes = self.bytes(at(start), at(end));
        match self.header.dtype {
            TokenDtype::U16 => Tokens::U16(bytemuck::try_cast_slice(bytes).unwrap_or_default()),
            TokenDtype::U32 => Tokens::U32(bytemuck::try_cast_slice(bytes).unwrap_or_default()),
        }
    }

    /// The token range of document `i` (without its EOS), or an error naming the
    /// index entry if the index is inconsistent.
    pub fn doc_range(&self, i: u64) -> Result<(u64, u64)> {
        let idx = usize::try_from(i)
            .ok()
            .and_then(|i| self.index().get(i..=i.checked_add(1)?));
        let Some(&[s, e]) = idx else {
            return Err(DataError::Config(format!(
                "document {i} out of range ({} documents in {})",
                self.n_docs(),
                self.path.display()
            )));
        };
        if e <= s || e > self.header.n_tokens {
            return Err(DataError::CorruptStore {
                path: self.path.clone(),
                offset: self.header.index_offset + 8 * i,
                expected: format!("increasing offsets up to {}", self.header.n_tokens),
                found: format!("{s}..{e}"),
            });
        }
        Ok((s, e - 1))
    }

    /// Document `i` without its trailing EOS.
    pub fn doc(&self, i: u64) -> Result<Tokens<'_>> {
        let (s, e) = self.doc_range(i)?;
        Ok(self.tokens(s, e))
    }

    /// Tells the OS this process is done with tokens `start..end`: their pages leave
    /// this process's resident set (they stay in the shared page cache).
    pub fn release(&self, start: u64, end: u64) {
        #[cfg(unix)]
        {
            let w = self.header.dtype.width() as u64;
            // Round outwards to 2 MiB: a read fault maps cached neighbours too
            // ("fault-around", up to a whole large folio: 512 KiB measured on Linux
            // 6.18/ext4, at most a 2 MiB huge page), so releasing single pages would
            // leave those behind. Dropping a neighbour costs only a minor fault later.
            let page: u64 = 2 << 20;
            let end = end.min(self.header.n_tokens);
            let start = start.min(end);
            let from = (HEADER_LEN as u64 + start * w) / page * page;
            let to =
                ((HEADER_LEN as u64 + end * w).div_ceil(page) * page).min(self.map.len() as u64);
            if to > from {
                // SAFETY: the mapping is read-only and file backed; dropping its pages
                // only means they are read again from the file on the next access.
                let _ = unsafe {
                    self.map.unchecked_advise_range(
                        memmap2::UncheckedAdvice::DontNeed,
                        from as usize,
                        (to - from) as usize,
                    )
                };
            }
        }
        #[cfg(not(unix))]
        let _ = (start, end);
    }
}
