//! The events a process in [`crate::Mode::Events`] writes: one JSON object
//! per line on stderr after [`MARKER`], which a launcher strips and renders
//! (see [`crate::render`]).

use serde::{Deserialize, Serialize};

use crate::Unit;

/// What starts an event line: an ASCII record separator and a name, which
/// ordinary output does not contain.
pub const MARKER: &str = "\u{1e}mlx-progress ";

/// What happened to a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The task began.
    Start,
    /// Its position, total or message changed.
    Update,
    /// It completed.
    Finish,
    /// It ended without completing (dropped unfinished, e.g. on an error).
    Abandon,
}

/// One event of one task.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The writing process (tasks of different processes can share a stream).
    pub pid: u32,
    /// The task, unique within its process.
    pub id: u64,
    /// What happened.
    pub kind: Kind,
    /// The task's name.
    pub name: String,
    /// What it counts.
    pub unit: Unit,
    /// How much is done.
    pub pos: u64,
    /// How much there is, when known.
    pub total: Option<u64>,
    /// The task's current message (empty for none).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub msg: String,
}

/// Why a marked line is not an event.
#[derive(Debug)]
pub struct DecodeError(serde_json::Error);

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "a progress event line that does not parse: {}", self.0)
    }
}

impl std::error::Error for DecodeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl Event {
    /// The line (without its newline) that carries this event.
    pub fn encode(&self) -> String {
        let json = serde_json::to_string(self).expect("an event always serializes");
        format!("{MARKER}{json}")
    }

    /// The event `line` carries (a trailing newline is allowed), `None`
    /// when it is not an event line at all.
    pub fn decode(line: &str) -> Option<Result<Event, DecodeError>> {
        let json = line.strip_prefix(MARKER)?;
        Some(serde_json::from_str(json.trim_end_matches(['\n', '\r'])).map_err(DecodeError))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(msg: &str, total: Option<u64>) -> Event {
        Event {
            pid: 42,
            id: 7,
            kind: Kind::Update,
            name: "tokenizing \"train\"\n".into(),
            unit: Unit::Bytes,
            pos: 12_345,
            total,
            msg: msg.into(),
        }
    }

    #[test]
    fn events_round_trip_through_one_marked_line() {
        for e in [event("1.2M tokens", Some(99_999)), event("", None)] {
            let line = e.encode();
            assert!(line.starts_with(MARKER));
            assert!(!line.contains('\n'), "{line:?}");
            assert_eq!(Event::decode(&line).unwrap().unwrap(), e);
            assert_eq!(Event::decode(&format!("{line}\n")).unwrap().unwrap(), e);
        }
        // The wire form names its fields as documented.
        let json = event("m", Some(5)).encode()[MARKER.len()..].to_string();
        let v: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["kind"], "update");
        assert_eq!(v["unit"], "bytes");
        assert_eq!(v["total"], 5);
    }

    #[test]
    fn other_lines_are_not_events_and_broken_ones_say_so() {
        assert!(Event::decode("progress task=\"x\" done=1").is_none());
        assert!(Event::decode("mlx-progress {}").is_none());
        let broken = format!("{MARKER}{{\"pid\":1");
        assert!(Event::decode(&broken).unwrap().is_err());
    }
}
