//! JSON Lines read line by line; memory holds one line at a time. A row is
//! one of three formats, as mlx-lm's `tuner/datasets.py` reads them:
//! `{"messages": [{"role", "content"}, ...]}` (chat), `{"prompt",
//! "completion"}` (strings), or `{"text"}` (a string). Every row of a file
//! must be in the format of its first row (mlx-lm, too, picks one format per
//! file); other fields are ignored.

use crate::error::{DataError, IoContext, Result};
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::path::Path;

/// One row of a JSON Lines file.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// `{"text": ...}`: a document.
    Text(String),
    /// `{"messages": [...]}`: a conversation, each message an object with a
    /// string `role`.
    Chat(Vec<Value>),
    /// `{"prompt": ..., "completion": ...}`.
    Completion {
        /// The prompt.
        prompt: String,
        /// What the model should answer.
        completion: String,
    },
}

impl Row {
    /// The format's name, for errors.
    pub fn format(&self) -> &'static str {
        match self {
            Row::Text(_) => "a {\"text\"} row",
            Row::Chat(_) => "a {\"messages\"} row",
            Row::Completion { .. } => "a {\"prompt\", \"completion\"} row",
        }
    }
}

/// What a row must look like.
const EXPECTED: &str = "expected an object with \"messages\" (a list of {\"role\", \"content\"} objects), \"prompt\" and \"completion\" strings, or a \"text\" string";

/// Reads one row's JSON value in the first format it matches (prompt and
/// completion, then messages, then text, as mlx-lm), or says what is wrong.
pub fn parse_row(v: &Value) -> std::result::Result<Row, String> {
    let Some(o) = v.as_object() else {
        return Err(format!("{EXPECTED}, found {}", kind(v)));
    };
    let string = |k: &str| -> std::result::Result<Option<String>, String> {
        match o.get(k) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(other) => Err(format!(
                "expected \"{k}\" to be a string, found {}",
                kind(other)
            )),
        }
    };
    if o.contains_key("prompt") && o.contains_key("completion") {
        return Ok(Row::Completion {
            prompt: string("prompt")?.unwrap_or_default(),
            completion: string("completion")?.unwrap_or_default(),
        });
    }
    if let Some(m) = o.get("messages") {
        let Some(list) = m.as_array() else {
            return Err(format!(
                "expected \"messages\" to be a list, found {}",
                kind(m)
            ));
        };
        for (i, msg) in list.iter().enumerate() {
            if msg.get("role").and_then(Value::as_str).is_none() {
                return Err(format!(
                    "expected message {i} to be an object with a string \"role\", found {}",
                    kind(msg)
                ));
            }
        }
        if list.is_empty() {
            return Err("expected at least one message in \"messages\"".into());
        }
        return Ok(Row::Chat(list.clone()));
    }
    if let Some(t) = string("text")? {
        return Ok(Row::Text(t));
    }
    let keys: Vec<&str> = o.keys().map(String::as_str).collect();
    Err(format!("{EXPECTED}, found the fields {keys:?}"))
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Where a row is: its 1-based line number and byte offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowAt {
    /// 1-based line number.
    pub line: u64,
    /// Byte offset of the line.
    pub offset: u64,
}

/// An error about the row at `at` of `path`.
pub fn row_error(path: &Path, at: RowAt, message: impl std::fmt::Display) -> DataError {
    DataError::Source {
        path: path.to_path_buf(),
        offset: at.offset,
        message: format!("line {}: {message}", at.line),
    }
}

/// Reads rows from `reader` (named `path` in errors) and calls `row` with
/// every non-blank line's row, in order. Errors name the file, the line and
/// its byte offset, and what was expected; a row in another format than the
/// first row's is an error.
pub fn read_rows_from(
    reader: impl std::io::Read,
    path: &Path,
    row: &mut dyn FnMut(Row, RowAt) -> Result<()>,
) -> Result<()> {
    let mut reader = BufReader::with_capacity(1 << 20, reader);
    let mut line = Vec::new();
    let mut offset = 0u64;
    let mut first: Option<(&'static str, u64)> = None;
    for n in 1u64.. {
        line.clear();
        let read = reader.read_until(b'\n', &mut line).at(path)?;
        if read == 0 {
            return Ok(());
        }
        let at = RowAt { line: n, offset };
        offset += read as u64;
        let text = std::str::from_utf8(&line).map_err(|e| DataError::Source {
            path: path.to_path_buf(),
            offset: at.offset + e.valid_up_to() as u64,
            message: format!("line {n}: expected UTF-8 text"),
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let v: Value = serde_json::from_str(text)
            .map_err(|e| row_error(path, at, format!("expected a JSON object: {e}")))?;
        let r = parse_row(&v).map_err(|m| row_error(path, at, m))?;
        match first {
            None => first = Some((r.format(), n)),
            Some((f, line)) if f != r.format() => {
                return Err(row_error(
                    path,
                    at,
                    format!(
                        "expected {f} like line {line} (a file holds one format), found {}",
                        r.format()
                    ),
                ));
            }
            Some(_) => {}
        }
        row(r, at)?;
    }
    Ok(())
}

/// [`read_rows_from`] on the file `path`.
pub fn read_rows(path: &Path, row: &mut dyn FnMut(Row, RowAt) -> Result<()>) -> Result<()> {
    let file = std::fs::File::open(path).at(path)?;
    read_rows_from(file, path, row)
}

/// Calls `doc` with the `text` field of every non-blank line of `path`, in order:
/// text rows only (a chat or prompt/completion row is an error).
/// Errors name the file, the line number and the line's byte offset.
pub fn read_json_lines(path: &Path, doc: &mut dyn FnMut(&str) -> Result<()>) -> Result<()> {
    read_rows(path, &mut |r, at| match r {
        Row::Text(t) => doc(&t),
        other => Err(row_error(
            path,
            at,
            format!("expected a string field \"text\", found {}", other.format()),
        )),
    })
}
