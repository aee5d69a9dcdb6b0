//! GPT-2's byte-level BPE built offline from the ranks the `tiktoken-rs` crate
//! embeds (`r50k_base`), so the GPT-2 tokenizer needs no network and no files.
//!
//! The ranks are GPT-2's token ids: rank `r` is the byte string of token `r`
//! (0..50256), and `<|endoftext|>` is 50256. From them we derive what GPT-2's
//! `vocab.json` and `merges.txt` hold, the way Hugging Face's tiktoken converter
//! does: each token is written with GPT-2's bytes-to-unicode map, and the merge
//! that makes a multi-byte token of rank `r` is found by running BPE on its bytes
//! with only the ranks below `r`, which must end in exactly two parts.

use crate::error::{DataError, Result};
use std::collections::HashMap;

/// GPT-2's vocabulary size: 50,256 byte strings plus `<|endoftext|>`.
pub const VOCAB_SIZE: usize = 50257;

/// GPT-2's `<|endoftext|>` id.
pub const ENDOFTEXT_ID: u32 = 50256;

/// GPT-2's `vocab.json` (token string of each id) and `merges.txt` (pairs in order).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VocabMerges {
    /// Token strings indexed by id, `<|endoftext|>` last.
    pub vocab: Vec<String>,
    /// Merges in priority order: merge `i` makes token `256 + i`.
    pub merges: Vec<(String, String)>,
}

fn err(message: impl std::fmt::Display) -> DataError {
    DataError::Tokenizer {
        context: "GPT-2 from tiktoken-rs's r50k_base ranks".into(),
        message: message.to_string(),
    }
}

/// GPT-2's map from bytes to printable characters, the alphabet of `vocab.json`
/// (`bytes_to_unicode` in openai/gpt-2's encoder.py).
pub fn bytes_to_unicode() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut map = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        map[b as usize] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).expect("256..512 are characters");
            next += 1;
            c
        };
    }
    map
}

/// The byte strings of ranks 0..50256 (index = rank), read from tiktoken-rs.
pub fn ranks() -> Result<Vec<Vec<u8>>> {
    let bpe = tiktoken_rs::r50k_base().map_err(err)?;
    (0..ENDOFTEXT_ID)
        .map(|r| bpe.decode_bytes(&[r]).map_err(err))
        .collect()
}

/// Runs BPE on `token` using only ranks below `max_rank`; returns the part boundaries.
fn split_below(token: &[u8], ranks: &HashMap<&[u8], u32>, max_rank: u32) -> Vec<usize> {
    let mut bounds: Vec<usize> = (0..=token.len()).collect();
    while bounds.len() > 2 {
        // The lowest-ranked adjacent pair, leftmost on a tie (a tie needs equal bytes).
        let best = (0..bounds.len() - 2)
            .filter_map(|i| {
                let rank = *ranks.get(&token[bounds[i]..bounds[i + 2]])?;
                Some((rank, i))
            })
            .min();
        match best {
            Some((rank, i)) if rank < max_rank => {
                bounds.remove(i + 1);
            }
            _ => break,
        }
    }
    bounds
}

/// Derives GPT-2's `vocab.json` and `merges.txt` from the byte strings of its ranks.
pub fn vocab_merges_from_ranks(ranks: &[Vec<u8>]) -> Result<VocabMerges> {
    let table = bytes_to_unicode();
    let text = |bytes: &[u8]| -> String { bytes.iter().map(|&b| table[b as usize]).collect() };
    let index: HashMap<&[u8], u32> = ranks
        .iter()
        .enumerate()
        .map(|(r, b)| (b.as_slice(), r as u32))
        .collect();
    if index.len() != ranks.len() {
        return Err(err(format!(
            "{} ranks hold only {} distinct byte strings",
            ranks.len(),
            index.len()
        )));
    }
    let singles = ranks.iter().filter(|b| b.len() == 1).count();
    if singles != 256 {
        return Err(err(format!(
            "expected 256 single-byte ranks, found {singles}"
        )));
    }
    let mut merges = Vec::with_capacity(ranks.len() - 256);
    for (r, token) in ranks.iter().enumerate() {
        if token.len() < 2 {
            continue;
        }
        let bounds = split_below(token, &index, r as u32);
        if bounds.len() != 3 {
            return Err(err(format!(
                "rank {r} ({:?}) splits into {} parts under the lower ranks, not 2",
                text(token),
                bounds.len() - 1
            )));
        }
        merges.push((text(&token[..bounds[1]]), text(&token[bounds[1]..])));
    }
    let mut vocab: Vec<String> = ranks.iter().map(|b| text(b)).collect();
    vocab.push(super::ENDOFTEXT.to_owned());
    Ok(VocabMerges { vocab, merges })
}

/// GPT-2's `vocab.json` and `merges.txt`, derived from tiktoken-rs's embedded ranks.
pub fn vocab_merges() -> Result<VocabMerges> {
    vocab_merges_from_ranks(&ranks()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_to_unicode_is_gpt2s_alphabet() {
        let map = bytes_to_unicode();
        assert_eq!(map[b'A' as usize], 'A');
        assert_eq!(map[b' ' as usize], 'Ġ');
        assert_eq!(map[b'\n' as usize], 'Ċ');
        assert_eq!(map[0], 'Ā');
        assert_eq!(map[0xAD], 'Ń');
        let distinct: std::collections::HashSet<char> = map.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    #[test]
    fn merges_follow_bpe_with_lower_ranks() {
        // A toy rank table: "ab" then "abc" then "bc" (which must not win for "abc").
        let ranks: Vec<Vec<u8>> = (0..=255u8)
            .map(|b| vec![b])
            .chain([b"ab".to_vec(), b"abc".to_vec(), b"bc".to_vec()])
            .collect();
        let vm = vocab_merges_from_ranks(&ranks).unwrap();
        assert_eq!(vm.vocab.len(), 260);
        assert_eq!(vm.vocab[257], "abc");
        assert_eq!(
            vm.merges,
            [("a", "b"), ("ab", "c"), ("b", "c")].map(|(a, b)| (a.to_owned(), b.to_owned()))
        );
    }

    #[test]
    fn a_token_unreachable_from_lower_ranks_is_an_error() {
        // "abc" before any pair inside it exists: BPE leaves three parts.
        let ranks: Vec<Vec<u8>> = (0..=255u8)
            .map(|b| vec![b])
            .chain([b"abc".to_vec(), b"ab".to_vec()])
            .collect();
        let e = vocab_merges_from_ranks(&ranks).unwrap_err().to_string();
        assert!(e.contains("rank 256") && e.contains("3 parts"), "{e}");
    }
}
