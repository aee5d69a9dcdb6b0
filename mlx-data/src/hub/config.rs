//! Hub settings from the same environment variables Python's huggingface_hub reads.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// Called with (file name, bytes done, bytes total) while downloading.
pub type ProgressFn = Arc<dyn Fn(&str, u64, u64) + Send + Sync>;

/// Where and how to reach the Hub.
#[derive(Clone)]
pub struct HubConfig {
    /// Base URL (`HF_ENDPOINT`, default `https://huggingface.co`).
    pub endpoint: String,
    /// The hub cache folder (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else
    /// `~/.cache/huggingface/hub`), laid out exactly as Python's.
    pub cache_dir: PathBuf,
    /// Never touch the network (`HF_HUB_OFFLINE=1`); use the cache only.
    pub offline: bool,
    /// Bearer token (`HF_TOKEN`, else `$HF_HOME/token`).
    pub token: Option<String>,
    /// Deadline to connect.
    pub connect_timeout: Duration,
    /// Deadline for response headers.
    pub response_timeout: Duration,
    /// Deadline for each read of a response body (a stalled transfer fails).
    pub read_timeout: Duration,
    /// Attempts per file; each resumes from the bytes already on disk.
    pub max_attempts: u32,
    /// How long to wait for another process downloading the same file.
    pub lock_deadline: Duration,
    /// Progress reporting; `None` logs through `tracing` every 10%.
    pub progress: Option<ProgressFn>,
}

impl std::fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConfig")
            .field("endpoint", &self.endpoint)
            .field("cache_dir", &self.cache_dir)
            .field("offline", &self.offline)
            .field("token", &self.token.as_ref().map(|_| "<set>"))
            .finish_non_exhaustive()
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// True for the values huggingface_hub treats as "on".
pub fn env_flag(value: &str) -> bool {
    matches!(
        value.trim().to_ascii_lowercase().as_str(),
        "1" | "on" | "yes" | "true"
    )
}

fn hf_home() -> PathBuf {
    if let Some(h) = env("HF_HOME") {
        return PathBuf::from(h);
    }
    let base = env("XDG_CACHE_HOME").map(PathBuf::from).unwrap_or_else(|| {
        let home = env("HOME")
            .or_else(|| env("USERPROFILE"))
            .unwrap_or_else(|| ".".into());
        PathBuf::from(home).join(".cache")
    });
    base.join("huggingface")
}

impl HubConfig {
    /// Settings from `HF_ENDPOINT`, `HF_HOME`, `HF_HUB_CACHE`, `HF_HUB_OFFLINE`, `HF_TOKEN`.
    pub fn from_env() -> HubConfig {
        let home = hf_home();
        let token = env("HF_TOKEN").or_else(|| {
            std::fs::read_to_string(home.join("token"))
                .ok()
                .map(|t| t.trim().to_owned())
                .filter(|t| !t.is_empty())
        });
        HubConfig {
            endpoint: env("HF_ENDPOINT")
                .unwrap_or_else(|| "https://huggingface.co".into())
                .trim_end_matches('/')
                .to_owned(),
            cache_dir: env("HF_HUB_CACHE")
                .map(PathBuf::from)
                .unwrap_or_else(|| home.join("hub")),
            offline: env("HF_HUB_OFFLINE").is_some_and(|v| env_flag(&v)),
            token,
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(30),
            read_timeout: Duration::from_secs(60),
            max_attempts: 5,
            lock_deadline: Duration::from_secs(3600),
            progress: None,
        }
    }

    /// Settings for a given endpoint and cache folder (tests, tools), online.
    pub fn new(endpoint: impl Into<String>, cache_dir: impl Into<PathBuf>) -> HubConfig {
        HubConfig {
            endpoint: endpoint.into().trim_end_matches('/').to_owned(),
            cache_dir: cache_dir.into(),
            offline: false,
            token: None,
            ..HubConfig::from_env()
        }
    }
}
