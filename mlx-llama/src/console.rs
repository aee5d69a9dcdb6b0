//! Rank 0's lines on standard output, which a closed pipe must not stop:
//! `mlx-llama train ... | head -2` closes the pipe after two lines, and
//! `println!` panics on the broken pipe (Rust ignores SIGPIPE). Here a line
//! that cannot be written is dropped, the first such failure is noted once
//! on standard error, and the run goes on (metrics.jsonl has every step).

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set once standard output failed: later lines are dropped unwritten.
static CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes `text` and a newline to standard output, or drops it when
/// standard output cannot be written (noted once on standard error).
pub fn line(text: &str) {
    if CLOSED.load(Ordering::Relaxed) {
        return;
    }
    let mut out = std::io::stdout().lock();
    let written = writeln!(out, "{text}").and_then(|()| out.flush());
    if let Err(e) = written
        && !CLOSED.swap(true, Ordering::Relaxed)
    {
        // Standard error may be closed too: then there is no one to tell.
        let _ = writeln!(
            std::io::stderr(),
            "note: standard output cannot be written ({e}); its lines are dropped from now on, training goes on (metrics.jsonl records every step)"
        );
    }
}

/// Whether a line to standard output has failed (and lines are dropped).
pub fn closed() -> bool {
    CLOSED.load(Ordering::Relaxed)
}
