//! Hub downloads against a local server speaking the Hub's URL layout: cache
//! layout, interrupted transfers that resume, clear failures, offline mode,
//! deadlines, checksums, hostile headers and names, and the full pipeline from a Hub
//! dataset.

mod common;

use common::hub_server::{HubServer, ServedFile};
use mlx_data::{
    DataConfig, DataError, HubClient, HubConfig, HubDataset, RepoKind, SourceSpec, TokenizerSpec,
    prepare,
};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

const REPO: &str = "roneneldan/TinyStories";

fn stories_text(seed: u64, bytes: usize) -> Vec<u8> {
    mlx_data::corpus::stories(seed, bytes)
        .join("\n<|endoftext|>\n")
        .into_bytes()
}

fn server() -> (HubServer, Vec<u8>, Vec<u8>) {
    let train = stories_text(1, 400_000);
    let valid = stories_text(2, 40_000);
    let mut files = HashMap::new();
    files.insert(
        format!("datasets/{REPO}/TinyStories-train.txt"),
        ServedFile::lfs(train.clone()),
    );
    files.insert(
        format!("datasets/{REPO}/TinyStories-valid.txt"),
        ServedFile::lfs(valid.clone()),
    );
    (HubServer::start(files), train, valid)
}

fn config(endpoint: &str, cache: &std::path::Path) -> HubConfig {
    let mut c = HubConfig::new(endpoint, cache);
    c.read_timeout = Duration::from_millis(500);
    c.response_timeout = Duration::from_secs(5);
    c.connect_timeout = Duration::from_secs(2);
    c.max_attempts = 4;
    c
}

#[test]
fn download_lands_in_the_python_cache_layout_and_is_reused() {
    let (srv, _, valid) = server();
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let path = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-valid.txt")
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), valid);

    let commit = &srv.state.commit;
    let repo_dir = dir.path().join("datasets--roneneldan--TinyStories");
    assert_eq!(
        path,
        repo_dir
            .join("snapshots")
            .join(commit)
            .join("TinyStories-valid.txt")
    );
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        *commit
    );
    let etag = ServedFile::lfs(valid.clone()).etag;
    assert_eq!(
        std::fs::read(repo_dir.join("blobs").join(&etag)).unwrap(),
        valid
    );
    #[cfg(unix)]
    assert_eq!(
        std::fs::read_link(&path).unwrap(),
        std::path::Path::new("../../blobs").join(&etag)
    );

    // Second fetch: metadata only, no body transfer.
    srv.clear_seen();
    hub.fetch(RepoKind::Dataset, REPO, "main", "TinyStories-valid.txt")
        .unwrap();
    let seen = srv.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].method, "HEAD");
    assert_eq!(
        seen[0].path,
        format!("/datasets/{REPO}/resolve/main/TinyStories-valid.txt")
    );
}

#[test]
fn interrupted_download_resumes_from_the_partial_file() {
    let (srv, train, _) = server();
    srv.state.truncate_gets.store(2, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let path = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-train.txt")
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), train);
    let gets: Vec<_> = srv
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .collect();
    assert_eq!(gets.len(), 3, "{gets:?}");
    assert_eq!(gets[0].range, None);
    // Each retry asks only for the bytes still missing.
    let first_cut = train.len() / 3;
    let second_cut = first_cut + (train.len() - first_cut) / 3;
    assert_eq!(
        gets[1].range.as_deref(),
        Some(format!("bytes={first_cut}-").as_str())
    );
    assert_eq!(
        gets[2].range.as_deref(),
        Some(format!("bytes={second_cut}-").as_str())
    );
}

#[test]
fn download_that_keeps_failing_errors_clearly_and_a_later_run_resumes() {
    let (srv, train, _) = server();
    srv.state.truncate_gets.store(100, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(&srv.endpoint, dir.path());
    cfg.max_attempts = 2;
    let hub = HubClient::new(cfg.clone());
    let err = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-train.txt")
        .unwrap_err();
    let DataError::DownloadIncomplete {
        attempts,
        received,
        expected,
        path,
        ..
    } = &err
    else {
        panic!("expected DownloadIncomplete, got {err}");
    };
    assert_eq!(*attempts, 2);
    assert_eq!(*expected, train.len() as u64);
    assert!(*received > 0 && *received < *expected);
    assert!(path.to_string_lossy().ends_with(".incomplete"));
    assert!(err.to_string().contains("TinyStories-train.txt"), "{err}");
    let received = *received;

    srv.state.truncate_gets.store(0, Ordering::SeqCst);
    srv.clear_seen();
    let path = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-train.txt")
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), train);
    let gets: Vec<_> = srv
        .seen()
        .into_iter()
        .filter(|s| s.method == "GET")
        .collect();
    assert_eq!(gets.len(), 1);
    assert_eq!(
        gets[0].range.as_deref(),
        Some(format!("bytes={received}-").as_str())
    );
}

#[test]
fn stalled_transfer_hits_the_read_deadline() {
    let (srv, train, _) = server();
    srv.state.stall_gets.store(1, Ordering::SeqCst);
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let t = Instant::now();
    let path = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-train.txt")
        .unwrap();
    // The stalled attempt was abandoned after the 0.5 s read deadline, then resumed.
    assert!(t.elapsed() < Duration::from_secs(4), "{:?}", t.elapsed());
    assert_eq!(std::fs::read(&path).unwrap(), train);
}

#[test]
fn checksum_mismatch_is_detected() {
    let mut files = HashMap::new();
    let mut f = ServedFile::lfs(b"some text".to_vec());
    f.etag = ServedFile::lfs(b"other text".to_vec()).etag;
    files.insert(format!("datasets/{REPO}/x.txt"), f);
    let srv = HubServer::start(files);
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let err = hub
        .fetch(RepoKind::Dataset, REPO, "main", "x.txt")
        .unwrap_err();
    assert!(matches!(err, DataError::ChecksumMismatch { .. }), "{err}");
}

#[test]
fn offline_and_unreachable_use_the_cache_or_fail_clearly() {
    let (srv, _, valid) = server();
    let dir = tempfile::tempdir().unwrap();
    let file = "TinyStories-valid.txt";

    let mut offline = config(&srv.endpoint, dir.path());
    offline.offline = true;
    let err = HubClient::new(offline.clone())
        .fetch(RepoKind::Dataset, REPO, "main", file)
        .unwrap_err();
    assert!(
        matches!(err, DataError::NotCached { .. }) && err.to_string().contains("HF_HUB_OFFLINE"),
        "{err}"
    );
    assert!(
        srv.seen().is_empty(),
        "offline mode must not touch the network"
    );

    // A closed port: unreachable, nothing cached.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = HubClient::new(config(&dead, dir.path()))
        .fetch(RepoKind::Dataset, REPO, "main", file)
        .unwrap_err();
    assert!(matches!(err, DataError::NotCached { .. }), "{err}");

    HubClient::new(config(&srv.endpoint, dir.path()))
        .fetch(RepoKind::Dataset, REPO, "main", file)
        .unwrap();
    let p = HubClient::new(offline)
        .fetch(RepoKind::Dataset, REPO, "main", file)
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), valid);
    let p = HubClient::new(config(&dead, dir.path()))
        .fetch(RepoKind::Dataset, REPO, "main", file)
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), valid);

    // A missing file on a reachable Hub is an error, not a silent fallback.
    let err = HubClient::new(config(&srv.endpoint, dir.path()))
        .fetch(RepoKind::Dataset, REPO, "main", "nope.txt")
        .unwrap_err();
    assert!(
        matches!(err, DataError::Hub { .. }) && err.to_string().contains("404"),
        "{err}"
    );
}

#[test]
fn relative_redirects_are_followed_like_huggingface_hub() {
    let mut files = HashMap::new();
    files.insert(
        "openai-community/gpt2/tokenizer.json".to_string(),
        ServedFile::lfs(b"{}".to_vec()),
    );
    let srv = HubServer::start(files);
    let dir = tempfile::tempdir().unwrap();
    let p = HubClient::new(config(&srv.endpoint, dir.path()))
        .fetch(RepoKind::Model, "gpt2", "main", "tokenizer.json")
        .unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), b"{}");
    assert!(p.starts_with(dir.path().join("models--gpt2")));
}

#[test]
fn prepare_builds_stores_from_a_hub_dataset() {
    let (srv, _, valid) = server();
    let dir = tempfile::tempdir().unwrap();
    let cfg = DataConfig {
        source: SourceSpec::Auto {
            hub: HubDataset::default(),
            offline: Default::default(),
        },
        tokenizer: TokenizerSpec::TrainByteLevel { vocab_size: 400 },
        cache_dir: dir.path().join("cache"),
        hub: config(&srv.endpoint, &dir.path().join("hf")),
        lock_deadline: Duration::from_secs(60),
    };
    let data = prepare(&cfg).unwrap();
    assert_eq!(data.source_kind, "hub");
    let docs: Vec<String> = String::from_utf8(valid)
        .unwrap()
        .split("<|endoftext|>")
        .map(|d| d.trim().to_owned())
        .collect();
    assert_eq!(data.validation.n_docs() as usize, docs.len());
    let ids = data.validation.doc(1).unwrap().to_vec();
    assert_eq!(data.tokenizer.decode(&ids).unwrap(), docs[1]);
}

/// Every entry under `root` (symlinks not followed) with its length, recursively.
fn tree(root: &Path) -> BTreeMap<PathBuf, u64> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let path = e.unwrap().path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.is_dir() {
                todo.push(path.clone());
            }
            out.insert(path, meta.len());
        }
    }
    out
}

/// A tempdir holding the Hub cache as a subfolder, with one honest download in it so
/// that a test can see that nothing was created, changed or deleted, inside or out.
fn hostile_setup() -> (HubServer, tempfile::TempDir, HubClient) {
    let (srv, _, _) = server();
    let root = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, &root.path().join("hf").join("hub")));
    hub.fetch(RepoKind::Dataset, REPO, "main", "TinyStories-valid.txt")
        .unwrap();
    (srv, root, hub)
}

/// Fetches a cached and an uncached file; both must fail naming `header` and `value`.
fn assert_refused(hub: &HubClient, header: &str, value: &str) {
    for file in ["TinyStories-valid.txt", "TinyStories-train.txt"] {
        let err = hub
            .fetch(RepoKind::Dataset, REPO, "main", file)
            .unwrap_err();
        let msg = err.to_string();
        assert!(
            matches!(err, DataError::Hub { .. }) && msg.contains(header) && msg.contains(value),
            "{header}: {value}: {msg}"
        );
    }
}

#[test]
fn commit_header_that_is_not_a_hex_id_is_refused_and_nothing_is_written() {
    let (srv, root, hub) = hostile_setup();
    let before = tree(root.path());
    let hex39 = "0123456789abcdef0123456789abcdef0123456";
    let not_hex = "0123456789abcdef0123456789abcdef0123456g";
    for commit in [
        "../../escape",
        "../../../../escape",
        "../../../../../../../../escape",
        "/tmp/escape",
        "..",
        hex39,
        not_hex,
    ] {
        srv.set_header("x-repo-commit", commit);
        assert_refused(&hub, "x-repo-commit", commit);
        assert_eq!(tree(root.path()), before, "x-repo-commit: {commit}");
    }
}

#[test]
fn etag_headers_that_are_not_hex_ids_are_refused_and_nothing_is_written() {
    let (srv, root, hub) = hostile_setup();
    let before = tree(root.path());
    let sha = ServedFile::lfs(b"x".to_vec()).etag;
    for header in ["ETag", "x-linked-etag"] {
        for value in [
            "\"../../escape\"".to_owned(),
            "W/\"../../../../escape\"".to_owned(),
            "\"..\"".to_owned(),
            format!("\"{}/{}\"", &sha[..20], &sha[21..]),
            format!("\"{}\"", &sha[..63]),
            format!("\"{}z\"", &sha[..63]),
            "\"\"".to_owned(),
        ] {
            srv.clear_headers();
            srv.set_header(header, &value);
            assert_refused(
                &hub,
                &header.to_ascii_lowercase(),
                &value.replace('"', "\\\""),
            );
            assert_eq!(tree(root.path()), before, "{header}: {value}");
        }
    }
}

#[test]
fn weak_and_linked_etags_with_hex_ids_are_accepted() {
    let (srv, train, valid) = server();
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    srv.set_header(
        "ETag",
        &format!("W/\"{}\"", ServedFile::lfs(train.clone()).etag),
    );
    let p = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-train.txt")
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), train);
    srv.clear_headers();
    srv.set_header("ETag", "\"not-the-blob-id\"");
    srv.set_header(
        "x-linked-etag",
        &format!("\"{}\"", ServedFile::lfs(valid.clone()).etag),
    );
    let p = hub
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-valid.txt")
        .unwrap();
    assert_eq!(std::fs::read(p).unwrap(), valid);
}

#[test]
fn unsafe_names_from_the_caller_are_refused_before_any_request() {
    let (srv, _, _) = server();
    let root = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, &root.path().join("hub")));
    let ok_file = "TinyStories-valid.txt";
    let cases = [
        (REPO, "main", "../escape"),
        (REPO, "main", "a/../../escape"),
        (REPO, "main", "/etc/passwd"),
        (REPO, "main", "a//b"),
        (REPO, "main", "./a"),
        (REPO, "main", "a\\..\\b"),
        (REPO, "main", ""),
        (REPO, "../../escape", ok_file),
        (REPO, "refs/../..", ok_file),
        (REPO, "", ok_file),
        ("../escape", "main", ok_file),
        ("/abs/repo", "main", ok_file),
    ];
    for (repo, revision, file) in cases {
        for offline in [false, true] {
            let mut cfg = hub.config().clone();
            cfg.offline = offline;
            let err = HubClient::new(cfg)
                .fetch(RepoKind::Dataset, repo, revision, file)
                .unwrap_err();
            assert!(
                matches!(err, DataError::Config(_)),
                "{repo} {revision} {file}: {err}"
            );
        }
    }
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
    assert!(tree(root.path()).is_empty());
}

#[test]
fn a_ref_file_that_is_not_a_commit_is_not_followed() {
    let (_srv, root, hub) = hostile_setup();
    let cache = &hub.config().cache_dir;
    // A file outside the repository folder that a `..` ref would reach.
    std::fs::create_dir_all(cache.join("elsewhere")).unwrap();
    std::fs::write(cache.join("elsewhere/TinyStories-valid.txt"), b"not yours").unwrap();
    let repo_dir = cache.join("datasets--roneneldan--TinyStories");
    std::fs::write(repo_dir.join("refs/main"), "../../elsewhere").unwrap();
    let mut offline = hub.config().clone();
    offline.offline = true;
    let err = HubClient::new(offline)
        .fetch(RepoKind::Dataset, REPO, "main", "TinyStories-valid.txt")
        .unwrap_err();
    assert!(matches!(err, DataError::NotCached { .. }), "{err}");
    drop(root);
}
