//! Downloads files from the Hub's `resolve` URLs into the shared cache, with
//! resume, retries, deadlines, checksum verification and progress reports.

use super::cache::{CachedRepo, RepoKind, check_relative, is_blob_id, is_commit};
use super::config::HubConfig;
use crate::error::{DataError, IoContext, Result};
use crate::lockfile::{FileLock, sibling};
use mlx_progress::{Task, Unit};
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;
use ureq::Agent;

/// What a `HEAD` on a resolve URL tells us.
#[derive(Debug, Clone)]
struct FileMeta {
    commit: String,
    etag: String,
    size: u64,
}

/// A blocking Hub client bound to one [`HubConfig`].
#[derive(Debug, Clone)]
pub struct HubClient {
    cfg: HubConfig,
    head_agent: Agent,
    get_agent: Agent,
}

pub(super) fn agent(cfg: &HubConfig, redirects: u32) -> Agent {
    Agent::config_builder()
        .http_status_as_error(false)
        .max_redirects(redirects)
        .max_redirects_will_error(false)
        .timeout_connect(Some(cfg.connect_timeout))
        .timeout_recv_response(Some(cfg.response_timeout))
        .timeout_per_read(Some(cfg.read_timeout))
        .accept_encoding("identity")
        .user_agent(concat!("mlx-data/", env!("CARGO_PKG_VERSION")))
        .build()
        .into()
}

pub(super) fn header(resp: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn clean_etag(e: &str) -> String {
    e.trim()
        .trim_start_matches("W/")
        .trim_matches('"')
        .to_owned()
}

/// Result of one transfer attempt.
enum Attempt {
    Done,
    Retry(String),
}

impl HubClient {
    /// A client for `cfg`.
    pub fn new(cfg: HubConfig) -> HubClient {
        HubClient {
            head_agent: agent(&cfg, 0),
            get_agent: agent(&cfg, 10),
            cfg,
        }
    }

    /// The configuration.
    pub fn config(&self) -> &HubConfig {
        &self.cfg
    }

    /// The `resolve` URL of `file` in a repository.
    pub fn url(&self, kind: RepoKind, repo: &str, revision: &str, file: &str) -> String {
        let prefix = match kind {
            RepoKind::Model => "",
            RepoKind::Dataset => "datasets/",
        };
        format!(
            "{}/{prefix}{repo}/resolve/{}/{file}",
            self.cfg.endpoint,
            revision.replace('/', "%2F")
        )
    }

    /// The local path of `file`, downloading it unless the cache already has it at
    /// the revision's current commit. Offline mode, or a Hub that cannot be reached,
    /// falls back to the cached copy and otherwise fails with [`DataError::NotCached`].
    /// `repo`, `revision` and `file` must be plain relative names (no `..`, no leading
    /// `/`), and the server's commit and ETag must be hex ids; anything else is refused
    /// before it touches the cache.
    pub fn fetch(&self, kind: RepoKind, repo: &str, revision: &str, file: &str) -> Result<PathBuf> {
        check_relative("repository id", repo)?;
        check_relative("revision", revision)?;
        check_relative("file name", file)?;
        let cache = CachedRepo {
            cache_dir: self.cfg.cache_dir.clone(),
            kind,
            repo: repo.to_owned(),
            revision: revision.to_owned(),
        };
        let not_cached = |reason: String| DataError::NotCached {
            repo: repo.to_owned(),
            file: file.to_owned(),
            cache: self.cfg.cache_dir.clone(),
            reason,
        };
        if self.cfg.offline {
            return cache
                .cached_file(file)
                .map(|(_, p)| p)
                .ok_or_else(|| not_cached("HF_HUB_OFFLINE is set".into()));
        }
        let url = self.url(kind, repo, revision, file);
        let meta = match self.head(&url) {
            Ok(m) => m,
            Err(Unreachable(reason)) => {
                return match cache.cached_file(file) {
                    Some((commit, p)) => {
                        tracing::warn!(%url, %reason, %commit, "Hub unreachable; using the cached copy");
                        Ok(p)
                    }
                    None => Err(not_cached(format!("cannot reach {url}: {reason}"))),
                };
            }
        }?;
        let snapshot = cache.snapshot_file(&meta.commit, file);
        if !snapshot.is_file() {
            let blob = cache.blob(&meta.etag);
            if !blob.is_file() {
                self.download(&url, &cache, &meta, file)?;
            }
            cache.link_snapshot(&meta.commit, file, &meta.etag)?;
        }
        cache.write_ref(&meta.commit)?;
        Ok(snapshot)
    }

    /// `HEAD` the resolve URL, following only relative redirects (like huggingface_hub).
    fn head(&self, url: &str) -> std::result::Result<Result<FileMeta>, Unreachable> {
        let mut current = url.to_owned();
        for _ in 0..5 {
            let mut req = self.head_agent.head(&current);
            if let Some(t) = &self.cfg.token {
                req = req.header("Authorization", format!("Bearer {t}"));
            }
            let resp = req.call().map_err(|e| Unreachable(e.to_string()))?;
            let status = resp.status().as_u16();
            let location = header(&resp, "location");
            if (300..400).contains(&status) {
                if let Some(loc) = location.as_deref().filter(|l| l.starts_with('/')) {
                    let origin_end = current
                        .find("://")
                        .and_then(|i| current[i + 3..].find('/').map(|j| i + 3 + j))
                        .unwrap_or(current.len());
                    current = format!("{}{loc}", &current[..origin_end]);
                    continue;
                }
            } else if status >= 500 || status == 429 {
                return Err(Unreachable(format!("HTTP {status}")));
            } else if status >= 400 {
                return Ok(Err(DataError::Hub {
                    url: url.to_owned(),
                    message: format!("HTTP {status} (missing file, repository or permission)"),
                }));
            }
            let missing = |h: &str| DataError::Hub {
                url: url.to_owned(),
                message: format!("response lacks the {h} header (is this a Hub endpoint?)"),
            };
            // Commit and ETag become path components (snapshots/<commit>, blobs/<etag>):
            // only hex ids are accepted, so a hostile server cannot reach outside the cache.
            let refused = |h: &str, value: &str, expected: &str| DataError::Hub {
                url: url.to_owned(),
                message: format!("refusing the {h} header {value:?}: expected {expected}"),
            };
            let meta = (|| {
                let commit =
                    header(&resp, "x-repo-commit").ok_or_else(|| missing("x-repo-commit"))?;
                if !is_commit(&commit) {
                    return Err(refused(
                        "x-repo-commit",
                        &commit,
                        "a 40-hex-digit commit id",
                    ));
                }
                let (name, raw) = ["x-linked-etag", "etag"]
                    .into_iter()
                    .find_map(|h| header(&resp, h).map(|v| (h, v)))
                    .ok_or_else(|| missing("etag"))?;
                let etag = clean_etag(&raw);
                if !is_blob_id(&etag) {
                    return Err(refused(name, &raw, "a quoted 40- or 64-hex-digit id"));
                }
                let size = header(&resp, "x-linked-size")
                    .or_else(|| header(&resp, "content-length"))
                    .and_then(|s| s.trim().parse().ok())
                    .ok_or_else(|| missing("content-length"))?;
                Ok(FileMeta { commit, etag, size })
            })();
            return Ok(meta);
        }
        Ok(Err(DataError::Hub {
            url: url.to_owned(),
            message: "too many relative redirects".into(),
        }))
    }

    fn download(&self, url: &str, cache: &CachedRepo, meta: &FileMeta, file: &str) -> Result<()> {
        let blob = cache.blob(&meta.etag);
        let doing = format!("downloading {file}");
        let lock = cache.blob_lock(&meta.etag);
        let _lock = FileLock::acquire_while(&lock, self.cfg.lock_deadline, &doing)?;
        if blob.is_file() {
            return Ok(()); // another process finished it while we waited
        }
        let dir = blob.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).at(dir)?;
        let part = sibling(&blob, ".incomplete");
        let resumed = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        let task = Task::builder(doing, Unit::Bytes)
            .total(Some(meta.size))
            .position(resumed.min(meta.size))
            .start();
        let mut last_error = String::from("no attempt made");
        let mut attempts = 0;
        while attempts < self.cfg.max_attempts.max(1) {
            let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
            if have == meta.size && have > 0 {
                break;
            }
            if attempts > 0 {
                std::thread::sleep(Duration::from_millis(100 * (1 << attempts.min(5))));
            }
            attempts += 1;
            match self.transfer(url, &part, have, meta, file, &task)? {
                Attempt::Done => break,
                Attempt::Retry(msg) => {
                    tracing::warn!(%url, attempt = attempts, error = %msg, "download interrupted; resuming");
                    last_error = msg;
                }
            }
        }
        let have = std::fs::metadata(&part).map(|m| m.len()).unwrap_or(0);
        if have != meta.size {
            return Err(DataError::DownloadIncomplete {
                url: url.to_owned(),
                path: part,
                attempts,
                received: have,
                expected: meta.size,
                message: last_error,
            });
        }
        task.set_message("checking its sha256");
        verify_sha256(&part, &meta.etag)?;
        crate::lockfile::publish(&part, &blob)?;
        task.set_message("");
        task.finish();
        Ok(())
    }

    /// One GET from byte `have`; appends to `part`.
    fn transfer(
        &self,
        url: &str,
        part: &Path,
        have: u64,
        meta: &FileMeta,
        file: &str,
        task: &Task,
    ) -> Result<Attempt> {
        let mut req = self.get_agent.get(url);
        if have > 0 {
            req = req.header("Range", format!("bytes={have}-"));
        }
        if let Some(t) = &self.cfg.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = match req.call() {
            Ok(r) => r,
            Err(e) => return Ok(Attempt::Retry(e.to_string())),
        };
        let status = resp.status().as_u16();
        let mut start = have;
        match status {
            206 => {
                let range = header(&resp, "content-range").unwrap_or_default();
                let from = range
                    .trim_start_matches("bytes ")
                    .split('-')
                    .next()
                    .and_then(|s| s.parse::<u64>().ok());
                if from != Some(have) {
                    return Err(DataError::Hub {
                        url: url.to_owned(),
                        message: format!(
                            "asked for bytes from {have}, got Content-Range {range:?}"
                        ),
                    });
                }
            }
            200 => start = 0, // the server ignored the range: start over
            416 if have > meta.size => {
                std::fs::remove_file(part).at(part)?;
                return Ok(Attempt::Retry(
                    "local partial file longer than the remote file".into(),
                ));
            }
            s if s >= 500 || s == 429 => return Ok(Attempt::Retry(format!("HTTP {s}"))),
            s => {
                return Err(DataError::Hub {
                    url: url.to_owned(),
                    message: format!("HTTP {s} while downloading"),
                });
            }
        }
        let mut out = OpenOptions::new()
            .create(true)
            .append(start > 0)
            .write(true)
            .truncate(start == 0)
            .open(part)
            .at(part)?;
        let mut reader = resp.into_body().into_reader();
        let mut buf = vec![0u8; 256 << 10];
        let mut done = start;
        self.report(file, done, meta.size, task);
        loop {
            let n = match reader.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) => {
                    out.flush().at(part)?;
                    return Ok(Attempt::Retry(format!("after {done} bytes: {e}")));
                }
            };
            if done + n as u64 > meta.size {
                return Err(DataError::Hub {
                    url: url.to_owned(),
                    message: format!("server sent more than the announced {} bytes", meta.size),
                });
            }
            out.write_all(&buf[..n]).at(part)?;
            done += n as u64;
            self.report(file, done, meta.size, task);
        }
        out.sync_all().at(part)?;
        if done == meta.size {
            Ok(Attempt::Done)
        } else {
            Ok(Attempt::Retry(format!(
                "connection closed after {done} of {} bytes",
                meta.size
            )))
        }
    }

    /// Reports `done` of `total` bytes of `file`: to the configured callback
    /// and on `task` (a bar, or lines in logs).
    fn report(&self, file: &str, done: u64, total: u64, task: &Task) {
        if let Some(p) = &self.cfg.progress {
            p(file, done, total);
        }
        task.set_position(done);
    }
}

/// Why the Hub could not be used at all (network-level failure or server error).
struct Unreachable(String);

/// If the ETag is a sha256 (as for LFS files), checks the file against it.
fn verify_sha256(path: &Path, etag: &str) -> Result<()> {
    if etag.len() != 64 || !etag.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Ok(());
    }
    let mut f = File::open(path).at(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).at(path)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    let found: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    if found != etag.to_ascii_lowercase() {
        let _ = std::fs::remove_file(path);
        return Err(DataError::ChecksumMismatch {
            path: path.to_path_buf(),
            expected: etag.to_owned(),
            found,
        });
    }
    Ok(())
}
