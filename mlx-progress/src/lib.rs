//! Progress a person can see, wherever the process runs.
//!
//! A [`Task`] reports how far something long has got (a download, a
//! tokenization, a training run); how it shows is the process's [`Mode`],
//! chosen once from `MLX_PROGRESS` (`bar`, `plain`, `events`, `off`), else
//! bars when stderr is a terminal and plain lines otherwise:
//!
//! - `bar`: indicatif bars on stderr, with rate and ETA.
//! - `plain`: logfmt lines on stderr without ANSI, at most one per task
//!   every `MLX_PROGRESS_INTERVAL` seconds (default 5) plus one at the start
//!   and one at the end:
//!   `progress task="tokenizing train" unit=bytes done=12.3MiB total=45.6MiB pct=26 rate=4.1MiB/s eta=8s msg="3.1M tokens"`.
//! - `events`: one JSON [`Event`] per line on stderr after [`MARKER`], about
//!   five a second per task plus start and end; a launcher turns the
//!   events of its ranks into bars with a [`render::Renderer`].
//!
//! ```
//! use mlx_progress::{Task, Unit};
//!
//! let task = Task::new("tokenizing train", Some(3 << 20), Unit::Bytes);
//! for _ in 0..3 {
//!     task.inc(1 << 20);
//!     task.set_message("250k tokens");
//! }
//! task.finish();
//! ```
//!
//! The crate knows nothing of ranks or models: it is the bottom layer the
//! data pipeline, the trainer and the launcher report through.

mod event;
pub mod format;
mod mode;
pub mod render;
mod style;
mod task;

pub use event::{DecodeError, Event, Kind, MARKER};
pub use mode::{
    DEFAULT_INTERVAL, ENV_INTERVAL, ENV_MODE, Mode, mode, plain_interval, stderr_color,
};
pub use task::{EVENT_INTERVAL, Stderr, Task, TaskBuilder, println, stderr, suspend};

use serde::{Deserialize, Serialize};

/// What a task counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// Bytes (shown with binary prefixes: KiB, MiB).
    Bytes,
    /// Tokens.
    Tokens,
    /// Optimizer steps.
    Steps,
    /// Anything else (files, rows, documents).
    Items,
}

impl Unit {
    /// The unit's name in lines and events: `bytes`, `tokens`, `steps`, `items`.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Bytes => "bytes",
            Unit::Tokens => "tokens",
            Unit::Steps => "steps",
            Unit::Items => "items",
        }
    }
}
