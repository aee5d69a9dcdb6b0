//! A corpus: one text buffer (owned or memory-mapped) cut into documents.

use crate::error::{DataError, IoContext, Result};
use memmap2::Mmap;
use std::path::Path;

enum Text {
    Owned(String),
    Mapped(Mmap),
}

/// Documents of one split, held as byte ranges into a single buffer.
pub struct Corpus {
    text: Text,
    spans: Vec<(usize, usize)>,
}

impl std::fmt::Debug for Corpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Corpus")
            .field("docs", &self.spans.len())
            .field("bytes", &self.as_str().len())
            .finish()
    }
}

/// The separator that stands for blank lines: documents are separated by one or
/// more lines holding only whitespace (`--separator blank-line`).
pub const BLANK_LINE: &str = "\n\n";

/// Byte ranges where `text` has a separator: each literal occurrence, or for
/// [`BLANK_LINE`] each run of lines holding only whitespace, with the line
/// breaks around it.
fn separator_ranges<'a>(
    text: &'a str,
    separator: &'a str,
) -> Box<dyn Iterator<Item = (usize, usize)> + 'a> {
    if separator != BLANK_LINE {
        return Box::new(
            text.match_indices(separator)
                .map(|(at, m)| (at, at + m.len())),
        );
    }
    // A blank run starts at a line break followed by a whitespace-only line
    // ended by another line break.
    let bytes = text.as_bytes();
    let mut at = 0;
    Box::new(std::iter::from_fn(move || {
        while let Some(i) = bytes[at..].iter().position(|&b| b == b'\n').map(|i| at + i) {
            let mut end = i + 1;
            let mut blank = false;
            // Swallow every following whitespace-only line.
            loop {
                let rest = &bytes[end..];
                let line_end = rest.iter().position(|&b| b == b'\n');
                match line_end {
                    Some(k) if rest[..k].iter().all(u8::is_ascii_whitespace) => {
                        end += k + 1;
                        blank = true;
                    }
                    _ => break,
                }
            }
            at = end;
            if blank {
                return Some((i, end));
            }
        }
        None
    }))
}

/// Byte ranges of the trimmed, non-empty pieces of `text` between `separator`s
/// (see [`BLANK_LINE`]).
pub fn split_spans(text: &str, separator: &str, limit: Option<u64>) -> Vec<(usize, usize)> {
    let mut spans = Vec::new();
    let mut push = |start: usize, piece: &str| {
        let trimmed = piece.trim();
        if !trimmed.is_empty() {
            let s = start + (trimmed.as_ptr() as usize - piece.as_ptr() as usize);
            spans.push((s, s + trimmed.len()));
        }
    };
    let mut start = 0;
    if separator.is_empty() {
        push(0, text);
        return spans;
    }
    for (at, end) in separator_ranges(text, separator) {
        if limit.is_some_and(|l| at as u64 > l) {
            return spans;
        }
        push(start, &text[start..at]);
        start = end;
    }
    if limit.is_none_or(|l| text.len() as u64 <= l) {
        push(start, &text[start..]);
    }
    spans
}

fn utf8<'a>(bytes: &'a [u8], path: &Path) -> Result<&'a str> {
    std::str::from_utf8(bytes).map_err(|e| DataError::Source {
        path: path.to_path_buf(),
        offset: e.valid_up_to() as u64,
        message: "expected UTF-8 text".into(),
    })
}

impl Corpus {
    /// A corpus of the given documents.
    pub fn from_docs<S: AsRef<str>>(docs: &[S]) -> Corpus {
        let mut text = String::with_capacity(docs.iter().map(|d| d.as_ref().len() + 1).sum());
        let mut spans = Vec::with_capacity(docs.len());
        for d in docs {
            let s = text.len();
            text.push_str(d.as_ref());
            spans.push((s, text.len()));
            text.push('\n');
        }
        Corpus {
            text: Text::Owned(text),
            spans,
        }
    }

    /// A text file of documents separated by `separator` (memory-mapped; only
    /// documents that end within the first `limit` bytes when a limit is given).
    pub fn from_text_file(path: &Path, separator: &str, limit: Option<u64>) -> Result<Corpus> {
        let file = std::fs::File::open(path).at(path)?;
        // SAFETY: read-only mapping of a file we do not modify.
        let map = unsafe { Mmap::map(&file) }.at(path)?;
        let spans = split_spans(utf8(&map, path)?, separator, limit);
        Ok(Corpus {
            text: Text::Mapped(map),
            spans,
        })
    }

    /// Every `*.txt` file of a folder, in name order, each split by `separator`.
    pub fn from_text_dir(dir: &Path, separator: &str) -> Result<Corpus> {
        let mut docs = Vec::new();
        for path in text_files(dir)? {
            let c = Corpus::from_text_file(&path, separator, None)?;
            docs.extend(c.docs().map(str::to_owned));
        }
        Ok(Corpus::from_docs(&docs))
    }

    /// JSON Lines with a string `text` field on every non-blank line, read line by
    /// line (documents trimmed, blank ones skipped).
    pub fn from_json_lines(path: &Path) -> Result<Corpus> {
        let mut docs = Vec::new();
        super::jsonl::read_json_lines(path, &mut |t| {
            if !t.trim().is_empty() {
                docs.push(t.trim().to_owned());
            }
            Ok(())
        })?;
        Ok(Corpus::from_docs(&docs))
    }

    fn as_str(&self) -> &str {
        match &self.text {
            Text::Owned(s) => s,
            // Validated as UTF-8 when the corpus was made.
            Text::Mapped(m) => std::str::from_utf8(m).unwrap_or_default(),
        }
    }

    /// Number of documents.
    pub fn len(&self) -> usize {
        self.spans.len()
    }

    /// True when there are no documents.
    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    /// Document `i`.
    pub fn doc(&self, i: usize) -> &str {
        let (s, e) = self.spans[i];
        &self.as_str()[s..e]
    }

    /// All documents in order.
    pub fn docs(&self) -> impl Iterator<Item = &str> {
        let text = self.as_str();
        self.spans.iter().map(move |&(s, e)| &text[s..e])
    }

    /// Total bytes of document text.
    pub fn text_bytes(&self) -> u64 {
        self.spans.iter().map(|(s, e)| (e - s) as u64).sum()
    }
}

/// The `*.txt` files directly inside `dir`, sorted by name.
pub fn text_files(dir: &Path) -> Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .at(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "txt") && p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_on_separator_and_trims() {
        let t = "one story.\n<|endoftext|>\n two <|endoftext|><|endoftext|>three";
        let spans = split_spans(t, "<|endoftext|>", None);
        let docs: Vec<&str> = spans.iter().map(|&(s, e)| &t[s..e]).collect();
        assert_eq!(docs, ["one story.", "two", "three"]);
        let limited = split_spans(t, "<|endoftext|>", Some(20));
        assert_eq!(limited.len(), 1);
    }
}
