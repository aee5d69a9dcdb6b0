//! The Hugging Face Hub: configuration from the environment, the shared cache
//! layout, a resumable downloader for `resolve` URLs, repository file listings, and
//! whole snapshots of a model's files.
//!
//! Layout and naming follow Python's huggingface_hub (and the hf-hub crate, whose
//! repository naming we reuse), so either side can reuse the other's downloads.
//! Downloads go through a small HTTP client with per-phase deadlines because
//! hf-hub's blocking client offers no timeouts (a stalled server would hang it).

pub mod cache;
pub mod client;
pub mod config;
pub mod listing;
pub mod snapshot;

pub use cache::{CachedRepo, RepoKind};
pub use client::HubClient;
pub use config::{HubConfig, ProgressFn};
pub use listing::RepoListing;
pub use snapshot::{SnapshotFilter, snapshot};
