//! The crate's typed error: every variant names the file, URL or setting involved.

use std::path::PathBuf;
use std::time::Duration;

/// Result alias used throughout `mlx-data`.
pub type Result<T, E = DataError> = std::result::Result<T, E>;

/// Everything that can go wrong while fetching, tokenizing, storing or batching data.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// An operating-system I/O error on a named file.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or folder involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A token store whose bytes do not match what its header promises.
    #[error(
        "token store {path} is corrupt at byte offset {offset}: expected {expected}, found {found}"
    )]
    CorruptStore {
        /// The store file.
        path: PathBuf,
        /// Byte offset of the offending field or region.
        offset: u64,
        /// What the reader expected there.
        expected: String,
        /// What it found.
        found: String,
    },
    /// A valid token store that was built from another source or tokenizer.
    #[error("token store {path} was built with {field} {found:?}, expected {expected:?}")]
    StaleStore {
        /// The store file.
        path: PathBuf,
        /// Which header field differs (`source`, `tokenizer_hash`, ...).
        field: &'static str,
        /// The value wanted by the caller.
        expected: String,
        /// The value in the file.
        found: String,
    },
    /// Another process held a build or download lock past the deadline.
    #[error(
        "timed out after {waited:?} waiting for lock {path} (another process is building or downloading)"
    )]
    LockTimeout {
        /// The lock file.
        path: PathBuf,
        /// How long this process waited.
        waited: Duration,
    },
    /// The global batch cannot be split evenly across the ranks.
    #[error("global batch size {global} is not divisible by world size {world}")]
    BatchNotDivisible {
        /// The requested global batch size.
        global: usize,
        /// The number of ranks.
        world: usize,
    },
    /// An invalid setting.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Too little data for the requested sharding and batching.
    #[error("not enough data: {what} needs {needed}, the store has {available}")]
    NotEnoughData {
        /// What was being set up.
        what: String,
        /// How many items it needs.
        needed: u64,
        /// How many there are.
        available: u64,
    },
    /// A saved loader state that does not fit this loader.
    #[error("cannot restore loader state: {field} is {found}, this loader has {expected}")]
    StateMismatch {
        /// The differing field.
        field: &'static str,
        /// This loader's value.
        expected: String,
        /// The saved value.
        found: String,
    },
    /// A tokenizer failed to load, train or encode.
    #[error("tokenizer ({context}): {message}")]
    Tokenizer {
        /// What was being done (file name, "training", ...).
        context: String,
        /// The tokenizer library's message.
        message: String,
    },
    /// A local data source could not be read as described.
    #[error("source {path} at byte offset {offset}: {message}")]
    Source {
        /// The source file.
        path: PathBuf,
        /// Byte offset of the problem.
        offset: u64,
        /// What was wrong.
        message: String,
    },
    /// A parquet file that cannot be read as asked (missing or non-string column,
    /// a corrupt file).
    #[error("parquet file {path}: {message}")]
    Parquet {
        /// The parquet file.
        path: PathBuf,
        /// What was wrong.
        message: String,
    },
    /// The Hub answered with something unexpected or could not be reached.
    #[error("hub request {url}: {message}")]
    Hub {
        /// The URL requested.
        url: String,
        /// What went wrong.
        message: String,
    },
    /// Offline mode is on (or the Hub is unreachable) and the file is not cached.
    #[error(
        "{repo}/{file} is not in the Hub cache {cache} and the Hub is not available ({reason})"
    )]
    NotCached {
        /// The repository id.
        repo: String,
        /// The file inside the repository.
        file: String,
        /// The cache folder searched.
        cache: PathBuf,
        /// Why the network was not used.
        reason: String,
    },
    /// A Hub repository (or its cached snapshot) lacks files that are needed.
    #[error("{repo} at {revision} lacks {missing} {place}", missing = .missing.join(", "))]
    RepoIncomplete {
        /// The repository id.
        repo: String,
        /// The branch, tag or commit asked for.
        revision: String,
        /// The files (or kinds of file) that are missing.
        missing: Vec<String>,
        /// Where they were looked for (on the Hub at a commit, or in the cache).
        place: String,
    },
    /// A download ended before all bytes arrived, after all retries.
    #[error(
        "download of {url} into {path} incomplete after {attempts} attempts: {received} of {expected} bytes ({message})"
    )]
    DownloadIncomplete {
        /// The URL.
        url: String,
        /// The partial file (kept so a later run can resume).
        path: PathBuf,
        /// Attempts made.
        attempts: u32,
        /// Bytes on disk.
        received: u64,
        /// Bytes expected.
        expected: u64,
        /// The last error.
        message: String,
    },
    /// A downloaded file whose content hash does not match the Hub's ETag.
    #[error("downloaded {path} has sha256 {found}, the Hub promised {expected}")]
    ChecksumMismatch {
        /// The file.
        path: PathBuf,
        /// The expected hash.
        expected: String,
        /// The computed hash.
        found: String,
    },
    /// The prefetch thread did not deliver a batch before the deadline.
    #[error("prefetch thread delivered no batch within {0:?}")]
    PrefetchTimeout(Duration),
    /// The prefetch thread stopped (it panicked or was shut down).
    #[error("prefetch thread stopped: {0}")]
    PrefetchStopped(String),
    /// Turning a batch into arrays failed.
    #[error("array conversion: {0}")]
    Array(String),
    /// A chat template that cannot be read, compiled or rendered.
    #[error("chat template {origin}: {message}")]
    Template {
        /// Where the template came from (a file, `tokenizer_config.json`).
        origin: String,
        /// What went wrong.
        message: String,
    },
}

impl DataError {
    /// Wraps an I/O error with the path it happened on.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            path: path.into(),
            source,
        }
    }
}

/// Adds a path to `std::io::Result`s.
pub(crate) trait IoContext<T> {
    /// Maps the error into [`DataError::Io`] naming `path`.
    fn at(self, path: &std::path::Path) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| DataError::io(path, e))
    }
}

/// What a caught panic said (its `&str` or `String` payload), for the error
/// that a library's panic on untrusted bytes becomes.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic".into())
}
