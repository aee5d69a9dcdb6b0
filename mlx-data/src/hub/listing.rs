//! The files of a Hub repository at one revision, from the Hub API's
//! `/api/{models|datasets}/{repo}/revision/{revision}` (what huggingface_hub's
//! `model_info`/`dataset_info` call): the commit the revision points to and its
//! `siblings`. The listing is cached at `<repo folder>/mlx-data/listings/<commit>.json`
//! (beside `blobs`, `refs` and `snapshots`, which stay exactly as Python lays them
//! out) and `refs/<revision>` is updated, so offline runs see the same files.

use super::cache::{CachedRepo, RepoKind, check_relative, is_commit};
use super::client::{HubClient, agent};
use crate::error::{DataError, IoContext, Result};
use crate::lockfile::{publish, temp_sibling};
use std::path::PathBuf;

/// A repository's file paths at one commit.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RepoListing {
    /// The commit the revision resolved to (40 hex digits).
    pub commit: String,
    /// Every file in the repository at that commit (`/`-separated paths).
    pub files: Vec<String>,
}

impl CachedRepo {
    /// `<repo folder>/mlx-data/listings/<commit>.json`.
    pub fn listing_path(&self, commit: &str) -> PathBuf {
        self.dir()
            .join("mlx-data")
            .join("listings")
            .join(format!("{commit}.json"))
    }

    /// The cached listing of the commit this revision points to, if any.
    pub fn cached_listing(&self) -> Option<RepoListing> {
        let commit = self.cached_commit()?;
        let text = std::fs::read_to_string(self.listing_path(&commit)).ok()?;
        RepoListing::from_cached_json(&commit, &text)
    }

    /// Saves `listing` (atomically) and points the revision at its commit.
    pub fn save_listing(&self, listing: &RepoListing) -> Result<()> {
        if !is_commit(&listing.commit) {
            return Err(DataError::Config(format!(
                "listing commit {:?} is not a 40-hex-digit id",
                listing.commit
            )));
        }
        let path = self.listing_path(&listing.commit);
        if let Some(d) = path.parent() {
            std::fs::create_dir_all(d).at(d)?;
        }
        let tmp = temp_sibling(&path);
        let json = serde_json::to_vec_pretty(listing)
            .map_err(|e| DataError::Config(format!("cannot encode a repo listing: {e}")))?;
        std::fs::write(&tmp, json).at(&tmp)?;
        publish(&tmp, &path)?;
        self.write_ref(&listing.commit)
    }
}

/// Why the listing request did not give an answer to parse.
enum Failure {
    /// Network failure or server error: fall back to the cache.
    Unreachable(String),
    /// A definite answer that is an error (missing repository, no permission).
    Refused(DataError),
}

impl HubClient {
    /// The API URL listing a repository at `revision`.
    pub fn revision_url(&self, kind: RepoKind, repo: &str, revision: &str) -> String {
        let kind = match kind {
            RepoKind::Model => "models",
            RepoKind::Dataset => "datasets",
        };
        format!(
            "{}/api/{kind}/{repo}/revision/{}",
            self.config().endpoint,
            revision.replace('/', "%2F")
        )
    }

    /// The commit `revision` points to and the repository's files there. Asks the
    /// Hub and caches the answer; offline mode, or a Hub that cannot be reached,
    /// uses the cached listing of the commit the cache maps `revision` to, and
    /// otherwise fails with [`DataError::NotCached`].
    pub fn list_files(&self, kind: RepoKind, repo: &str, revision: &str) -> Result<RepoListing> {
        check_relative("repository id", repo)?;
        check_relative("revision", revision)?;
        let cfg = self.config();
        let cache = CachedRepo {
            cache_dir: cfg.cache_dir.clone(),
            kind,
            repo: repo.to_owned(),
            revision: revision.to_owned(),
        };
        let not_cached = |reason: String| DataError::NotCached {
            repo: repo.to_owned(),
            file: format!("(file listing at revision {revision})"),
            cache: cfg.cache_dir.clone(),
            reason,
        };
        if cfg.offline {
            return cache
                .cached_listing()
                .ok_or_else(|| not_cached("HF_HUB_OFFLINE is set".into()));
        }
        let url = self.revision_url(kind, repo, revision);
        let body = match self.get_text(&url) {
            Ok(b) => b,
            Err(Failure::Refused(e)) => return Err(e),
            Err(Failure::Unreachable(reason)) => {
                return match cache.cached_listing() {
                    Some(l) => {
                        tracing::warn!(%url, %reason, commit = %l.commit, "Hub unreachable; using the cached file listing");
                        Ok(l)
                    }
                    None => Err(not_cached(format!("cannot reach {url}: {reason}"))),
                };
            }
        };
        let listing = RepoListing::from_revision_info(&url, &body)?;
        cache.save_listing(&listing)?;
        Ok(listing)
    }

    fn get_text(&self, url: &str) -> std::result::Result<String, Failure> {
        let cfg = self.config();
        let mut req = agent(cfg, 10).get(url);
        if let Some(t) = &cfg.token {
            req = req.header("Authorization", format!("Bearer {t}"));
        }
        let resp = req
            .call()
            .map_err(|e| Failure::Unreachable(e.to_string()))?;
        let status = resp.status().as_u16();
        if status >= 500 || status == 429 {
            return Err(Failure::Unreachable(format!("HTTP {status}")));
        }
        if status != 200 {
            return Err(Failure::Refused(DataError::Hub {
                url: url.to_owned(),
                message: format!("HTTP {status} (missing repository, revision or permission)"),
            }));
        }
        resp.into_body()
            .read_to_string()
            .map_err(|e| Failure::Unreachable(format!("reading the answer: {e}")))
    }
}

impl RepoListing {
    /// The commit (`sha`) and file names (`siblings[].rfilename`) of a revision's
    /// JSON description, as the Hub at `url` answered it; the commit must be a
    /// 40-hex-digit id and every name a plain relative path (the names become
    /// paths in the cache).
    pub fn from_revision_info(url: &str, body: &str) -> Result<RepoListing> {
        let bad = |message: String| DataError::Hub {
            url: url.to_owned(),
            message,
        };
        let v: serde_json::Value =
            serde_json::from_str(body).map_err(|e| bad(format!("expected JSON: {e}")))?;
        let commit = v.get("sha").and_then(|s| s.as_str()).ok_or_else(|| {
            bad("the answer lacks a string \"sha\" (is this a Hub endpoint?)".into())
        })?;
        if !is_commit(commit) {
            return Err(bad(format!(
                "refusing the commit {commit:?}: expected a 40-hex-digit id"
            )));
        }
        let siblings = v
            .get("siblings")
            .and_then(|s| s.as_array())
            .ok_or_else(|| bad("the answer lacks a \"siblings\" array".into()))?;
        let files = siblings
            .iter()
            .map(|s| {
                s.get("rfilename")
                    .and_then(|f| f.as_str())
                    .map(str::to_owned)
                    .ok_or_else(|| bad(format!("sibling {s} lacks a string \"rfilename\"")))
            })
            .collect::<Result<Vec<_>>>()?;
        for f in &files {
            check_relative("file name", f).map_err(|e| bad(format!("sibling {f:?}: {e}")))?;
        }
        Ok(RepoListing {
            commit: commit.to_owned(),
            files,
        })
    }

    /// A listing this cache saved for `commit` (`<commit>.json`), or `None`
    /// when `text` is not one: another commit's, or a name that is not a plain
    /// relative path (a cache file is as untrusted as the server).
    pub fn from_cached_json(commit: &str, text: &str) -> Option<RepoListing> {
        let listing: RepoListing = serde_json::from_str(text).ok()?;
        let plain = listing
            .files
            .iter()
            .all(|f| check_relative("file name", f).is_ok());
        (listing.commit == commit && plain).then_some(listing)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHA: &str = "0123456789abcdef0123456789abcdef01234567";

    fn answer(names: &[&str]) -> String {
        let siblings: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({ "rfilename": n }))
            .collect();
        serde_json::json!({ "sha": SHA, "siblings": siblings }).to_string()
    }

    #[test]
    fn an_answer_gives_its_commit_and_files() {
        let l = RepoListing::from_revision_info("u", &answer(&["config.json", "a/b.safetensors"]))
            .unwrap();
        assert_eq!(l.commit, SHA);
        assert_eq!(l.files, ["config.json", "a/b.safetensors"]);
    }

    #[test]
    fn a_name_outside_the_repository_is_refused_from_the_server_and_the_cache() {
        for bad in ["../escape", "/etc/passwd", "a//b", "a\\b"] {
            let e = RepoListing::from_revision_info("u", &answer(&["ok", bad])).unwrap_err();
            assert!(e.to_string().contains(&format!("{bad:?}")), "{e}");
            let cached = serde_json::json!({ "commit": SHA, "files": ["ok", bad] }).to_string();
            assert_eq!(RepoListing::from_cached_json(SHA, &cached), None);
        }
        let cached = serde_json::json!({ "commit": SHA, "files": ["ok"] }).to_string();
        assert!(RepoListing::from_cached_json(SHA, &cached).is_some());
        assert_eq!(
            RepoListing::from_cached_json(&"f".repeat(40), &cached),
            None
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// Arbitrary bytes from the server or the cache give an error or a
        /// listing of plain relative names.
        #[test]
        fn any_answer_is_refused_or_names_inside_the_repository(
            bytes in proptest::collection::vec(any::<u8>(), 0..256),
        ) {
            let text = String::from_utf8_lossy(&bytes);
            if let Ok(l) = RepoListing::from_revision_info("u", &text) {
                prop_assert!(is_commit(&l.commit));
                for f in &l.files {
                    prop_assert!(check_relative("file name", f).is_ok());
                }
            }
            let _ = RepoListing::from_cached_json(SHA, &text);
        }

        /// Answers whose names are arbitrary paths keep only plain ones.
        #[test]
        fn answers_with_any_names_keep_only_plain_ones(
            names in proptest::collection::vec("[a-z./\\\\]{0,10}", 0..5),
        ) {
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let plain = refs.iter().all(|n| {
                !n.is_empty()
                    && !n.contains('\\')
                    && n.split('/').all(|c| !c.is_empty() && c != "." && c != "..")
            });
            prop_assert_eq!(RepoListing::from_revision_info("u", &answer(&refs)).is_ok(), plain);
        }
    }
}
