//! Documents handed to a callback in bounded batches, the way streaming sources
//! (parquet, JSON Lines) feed the token store builder.

use crate::error::Result;

/// Collects trimmed, non-blank documents and hands them to a callback every
/// `limit` documents, so a reader never holds more than one batch of text.
pub struct DocBatcher<'a> {
    docs: Vec<String>,
    limit: usize,
    sink: &'a mut dyn FnMut(&[String]) -> Result<()>,
}

impl<'a> DocBatcher<'a> {
    /// A batcher handing at most `limit` (at least 1) documents to `sink` at a time.
    pub fn new(limit: usize, sink: &'a mut dyn FnMut(&[String]) -> Result<()>) -> Self {
        let limit = limit.max(1);
        DocBatcher {
            docs: Vec::with_capacity(limit.min(1 << 16)),
            limit,
            sink,
        }
    }

    /// Adds one document, trimmed as the text reader trims; blank ones are skipped.
    pub fn push(&mut self, doc: &str) -> Result<()> {
        let doc = doc.trim();
        if doc.is_empty() {
            return Ok(());
        }
        self.docs.push(doc.to_owned());
        if self.docs.len() >= self.limit {
            self.flush()?;
        }
        Ok(())
    }

    /// Hands over the documents collected so far (nothing when there are none).
    pub fn flush(&mut self) -> Result<()> {
        if self.docs.is_empty() {
            return Ok(());
        }
        (self.sink)(&self.docs)?;
        self.docs.clear();
        Ok(())
    }

    /// Hands over the last, possibly short, batch.
    pub fn finish(mut self) -> Result<()> {
        self.flush()
    }
}
