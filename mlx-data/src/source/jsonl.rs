//! JSON Lines read line by line: one object with a string `text` field per
//! non-blank line; memory holds one line at a time.

use crate::error::{DataError, IoContext, Result};
use std::io::{BufRead, BufReader};
use std::path::Path;

/// Calls `doc` with the `text` field of every non-blank line of `path`, in order.
/// Errors name the file, the line number and the line's byte offset.
pub fn read_json_lines(path: &Path, doc: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
    let file = std::fs::File::open(path).at(path)?;
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut line = Vec::new();
    let mut offset = 0u64;
    for n in 1u64.. {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).at(path)?;
        if read == 0 {
            return Ok(());
        }
        let at = offset;
        offset += read as u64;
        let text = std::str::from_utf8(&line).map_err(|e| DataError::Source {
            path: path.to_path_buf(),
            offset: at + e.valid_up_to() as u64,
            message: format!("line {n}: expected UTF-8 text"),
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let bad = |message: String| DataError::Source {
            path: path.to_path_buf(),
            offset: at,
            message: format!("line {n}: {message}"),
        };
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| bad(format!("expected a JSON object: {e}")))?;
        let t = v
            .get("text")
            .and_then(|t| t.as_str())
            .ok_or_else(|| bad("expected a string field \"text\"".into()))?;
        doc(t)?;
    }
    Ok(())
}
