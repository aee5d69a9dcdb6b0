//! Hub downloads against a local server speaking the Hub's URL layout: cache
//! layout, interrupted transfers that resume, clear failures, offline mode,
//! deadlines, checksums, hostile headers and names, and the full pipeline from a Hub
//! dataset (its text files, and its parquet shards found through the file listing).

mod common;

use common::hub_server::{HubServer, ServedFile};
use common::parquet_files::{expected_docs, text_parquet};
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
fn prepare_builds_stores_from_a_hub_datasets_text_files() {
    let (srv, _, valid) = server();
    let dir = tempfile::tempdir().unwrap();
    let cfg = DataConfig {
        source: SourceSpec::Auto {
            hub: HubDataset::tinystories_text(),
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

/// TinyStories' layout: two training shards, one validation shard, and files that
/// are not shards of either split. Returns the server and each split's rows in order.
fn parquet_server() -> (HubServer, Vec<Option<String>>, Vec<Option<String>>) {
    let rows = |seed, bytes| -> Vec<Option<String>> {
        let mut r: Vec<Option<String>> = mlx_data::corpus::stories(seed, bytes)
            .into_iter()
            .map(Some)
            .collect();
        r.insert(2, None);
        r.insert(4, Some("  ".into()));
        r
    };
    let (train0, train1, valid) = (rows(21, 60_000), rows(22, 50_000), rows(23, 20_000));
    let shard = |r: &[Option<String>]| ServedFile::lfs(text_parquet(r, 16));
    let mut files = HashMap::new();
    let d = format!("datasets/{REPO}/data");
    files.insert(
        format!("{d}/train-00001-of-00002-b3c4.parquet"),
        shard(&train1),
    );
    files.insert(
        format!("{d}/train-00000-of-00002-a1b2.parquet"),
        shard(&train0),
    );
    files.insert(
        format!("{d}/validation-00000-of-00001-c5d6.parquet"),
        shard(&valid),
    );
    // Not shards of train or validation: never downloaded.
    files.insert(
        format!("{d}/test-00000-of-00001-e7f8.parquet"),
        shard(&train0),
    );
    files.insert(
        format!("{d}/nested/train-00000-of-00001.parquet"),
        shard(&valid),
    );
    files.insert(
        format!("datasets/{REPO}/TinyStories-train.txt"),
        ServedFile::lfs(b"text route".to_vec()),
    );
    files.insert(
        format!("datasets/{REPO}/README.md"),
        ServedFile::lfs(b"# TinyStories".to_vec()),
    );
    let train = train0.into_iter().chain(train1).collect();
    (HubServer::start(files), train, valid)
}

fn parquet_config(srv: &HubServer, dir: &Path, offline: bool) -> DataConfig {
    let mut hub = config(&srv.endpoint, &dir.join("hf"));
    hub.offline = offline;
    DataConfig {
        source: SourceSpec::Auto {
            hub: HubDataset::default(),
            offline: Default::default(),
        },
        tokenizer: TokenizerSpec::TrainByteLevel { vocab_size: 320 },
        cache_dir: dir.join("cache"),
        hub,
        lock_deadline: Duration::from_secs(60),
    }
}

#[test]
fn prepare_builds_stores_from_the_hubs_parquet_shards_then_works_offline() {
    let (srv, train, valid) = parquet_server();
    let dir = tempfile::tempdir().unwrap();
    let data = prepare(&parquet_config(&srv, dir.path(), false)).unwrap();
    assert_eq!(data.source_kind, "hub");

    // Both splits hold their shards' documents in shard order.
    for (store, rows) in [(&data.train, &train), (&data.validation, &valid)] {
        let docs = expected_docs(rows);
        assert_eq!(store.n_docs() as usize, docs.len());
        for (i, doc) in docs.iter().enumerate() {
            let ids = store.doc(i as u64).unwrap().to_vec();
            assert_eq!(&data.tokenizer.decode(&ids).unwrap(), doc, "doc {i}");
        }
    }
    // The store's identity pins the commit and the shard names.
    let commit = &srv.state.commit;
    assert_eq!(
        data.train.meta().source,
        format!(
            "hub-parquet:{REPO}@{commit}:train:column=text:\
             data/train-00000-of-00002-a1b2.parquet,data/train-00001-of-00002-b3c4.parquet"
        )
    );
    assert!(
        data.validation
            .meta()
            .source
            .ends_with(":validation:column=text:data/validation-00000-of-00001-c5d6.parquet"),
        "{}",
        data.validation.meta().source
    );
    // Listed once per split, only the split's shards fetched, pinned to the commit.
    let seen = srv.seen();
    let listings: Vec<_> = seen
        .iter()
        .filter(|s| s.path.starts_with("/api/"))
        .collect();
    assert_eq!(listings.len(), 2, "{seen:?}");
    assert_eq!(
        listings[0].path,
        format!("/api/datasets/{REPO}/revision/main")
    );
    let mut got: Vec<&str> = seen
        .iter()
        .filter(|s| s.method == "GET" && !s.path.starts_with("/api/"))
        .map(|s| s.path.as_str())
        .collect();
    got.sort();
    let resolve = format!("/datasets/{REPO}/resolve/{commit}/data");
    assert_eq!(
        got,
        [
            format!("{resolve}/train-00000-of-00002-a1b2.parquet"),
            format!("{resolve}/train-00001-of-00002-b3c4.parquet"),
            format!("{resolve}/validation-00000-of-00001-c5d6.parquet"),
        ]
    );
    let repo_dir = dir.path().join("hf/datasets--roneneldan--TinyStories");
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        *commit
    );

    // A second online run lists again and checks each shard with a HEAD, but
    // downloads nothing: the shards and stores come from the caches.
    srv.clear_seen();
    let again = prepare(&parquet_config(&srv, dir.path(), false)).unwrap();
    assert_eq!(again.train.path(), data.train.path());
    let seen = srv.seen();
    let shard_gets = seen
        .iter()
        .filter(|s| s.method == "GET" && !s.path.starts_with("/api/"))
        .count();
    let heads = seen.iter().filter(|s| s.method == "HEAD").count();
    assert_eq!((shard_gets, heads), (0, 3), "{seen:?}");

    // Offline: the cached listing and shards give the same stores, with no request.
    srv.clear_seen();
    let offline = prepare(&parquet_config(&srv, dir.path(), true)).unwrap();
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
    assert_eq!(offline.source_kind, "hub");
    assert_eq!(offline.train.path(), data.train.path());
    assert_eq!(offline.validation.path(), data.validation.path());
    assert_eq!(offline.tokenizer.hash(), data.tokenizer.hash());

    // Offline with a cache that lacks a shard: the Hub source fails naming the file,
    // and Auto falls back to the offline corpus.
    let shard = repo_dir
        .join("snapshots")
        .join(commit)
        .join("data/train-00001-of-00002-b3c4.parquet");
    std::fs::remove_file(&shard).unwrap();
    let mut hub_only = parquet_config(&srv, dir.path(), true);
    hub_only.source = SourceSpec::Hub(HubDataset::default());
    let err = prepare(&hub_only).unwrap_err();
    assert!(
        matches!(err, DataError::NotCached { .. })
            && err
                .to_string()
                .contains("train-00001-of-00002-b3c4.parquet"),
        "{err}"
    );
    let fallback = prepare(&parquet_config(&srv, &dir.path().join("other"), true)).unwrap();
    assert_eq!(fallback.source_kind, "offline");
    assert!(srv.seen().is_empty(), "{:?}", srv.seen());
}

#[test]
fn hub_listing_errors_are_clear() {
    // A repository without the split's shards.
    let mut files = HashMap::new();
    files.insert(
        format!("datasets/{REPO}/data/train-00000-of-00002-a.parquet"),
        ServedFile::lfs(b"x".to_vec()),
    );
    let srv = HubServer::start(files);
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let err = SourceSpec::Hub(HubDataset::default())
        .resolve(mlx_data::Split::Train, &hub)
        .unwrap_err();
    let msg = err.to_string();
    assert!(
        msg.contains("data/train-NNNNN-of-NNNNN*.parquet")
            && msg.contains("complete set of 2")
            && msg.contains(&srv.state.commit),
        "{msg}"
    );
    let err = SourceSpec::Hub(HubDataset::default())
        .resolve(mlx_data::Split::Validation, &hub)
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no parquet shards named data/validation-"),
        "{err}"
    );

    // A repository the Hub does not have: an error, not a fallback.
    let err = hub
        .list_files(RepoKind::Dataset, "nobody/nothing", "main")
        .unwrap_err();
    assert!(
        matches!(err, DataError::Hub { .. }) && err.to_string().contains("404"),
        "{err}"
    );
    // Unreachable, nothing cached: NotCached, so Auto can fall back.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = HubClient::new(config(&dead, &dir.path().join("empty")))
        .list_files(RepoKind::Dataset, REPO, "main")
        .unwrap_err();
    assert!(matches!(err, DataError::NotCached { .. }), "{err}");
    // Unreachable after a listing was cached: the cached listing.
    let listed = hub.list_files(RepoKind::Dataset, REPO, "main").unwrap();
    let cached = HubClient::new(config(&dead, dir.path()))
        .list_files(RepoKind::Dataset, REPO, "main")
        .unwrap();
    assert_eq!(cached, listed);
    assert_eq!(
        cached.files,
        ["data/train-00000-of-00002-a.parquet".to_string()]
    );
}

#[test]
fn shard_selection_follows_the_hugging_face_convention() {
    use mlx_data::source::hub::select_shards;
    let files: Vec<String> = [
        "README.md",
        "data/train-00002-of-00003.parquet",
        "data/train-00000-of-00003-x.parquet",
        "data/train-00001-of-00003-y.parquet",
        "data/validation-00000-of-00001-z.parquet",
        "data/trainer-00000-of-00001.parquet",
        "other/train-00000-of-00001.parquet",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        select_shards(&files, "data", "train").unwrap(),
        [
            "data/train-00000-of-00003-x.parquet",
            "data/train-00001-of-00003-y.parquet",
            "data/train-00002-of-00003.parquet",
        ]
    );
    assert_eq!(
        select_shards(&files, "other", "train").unwrap(),
        ["other/train-00000-of-00001.parquet"]
    );
    let mut gap = files.clone();
    gap.retain(|f| !f.contains("train-00001"));
    let err = select_shards(&gap, "data", "train")
        .unwrap_err()
        .to_string();
    assert!(err.contains("complete set of 3"), "{err}");
    let mut twice = files.clone();
    twice.push("data/train-00001-of-00003-again.parquet".into());
    assert!(select_shards(&twice, "data", "train").is_err());
    let mut mixed = files;
    mixed.push("data/train-00003-of-00004.parquet".into());
    assert!(select_shards(&mixed, "data", "train").is_err());
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
