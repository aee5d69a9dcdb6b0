//! Structured mutations of valid input for the parsers' property tests:
//! bytes set, cut or inserted at arbitrary places, so that a test reaches
//! the corners of a format that arbitrary bytes almost never hit.

use proptest::prelude::*;

/// One edit: a position (taken modulo the length + 1), a byte, and what
/// to do there (0: set the byte, 1: cut the input, else: insert the byte).
pub(crate) type Edit = (usize, u8, u8);

/// A list of edits, as many as `count` allows.
pub(crate) fn edits(count: std::ops::Range<usize>) -> impl Strategy<Value = Vec<Edit>> {
    proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..3), count)
}

/// Applies `edits` to `bytes`, in order.
pub(crate) fn apply(bytes: &mut Vec<u8>, edits: &[Edit]) {
    for &(at, byte, kind) in edits {
        let at = at % (bytes.len() + 1);
        match kind {
            0 if at < bytes.len() => bytes[at] = byte,
            1 => bytes.truncate(at),
            _ => bytes.insert(at, byte),
        }
    }
}
