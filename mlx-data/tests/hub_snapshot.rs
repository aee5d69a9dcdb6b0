//! `hub::snapshot`: a model repository's files made local against a server
//! speaking the Hub's URL layout (started here, no mocks), pinned to the
//! listed commit, by branch, tag or commit; other weight formats passed
//! over; offline from our cache and from a cache laid out by Python's
//! huggingface_hub, with clear errors naming the repository and what is
//! missing.

mod common;

use common::hub_server::{HubServer, ServedFile};
use mlx_data::hub::{SnapshotFilter, snapshot};
use mlx_data::{DataError, HubClient, HubConfig, RepoKind};
use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

const REPO: &str = "org/tiny-llama";

fn config(endpoint: &str, cache: &Path) -> HubConfig {
    let mut c = HubConfig::new(endpoint, cache);
    c.read_timeout = Duration::from_millis(500);
    c.response_timeout = Duration::from_secs(5);
    c.connect_timeout = Duration::from_secs(2);
    c.max_attempts = 3;
    c
}

fn offline(cache: &Path) -> HubClient {
    let mut c = config("http://127.0.0.1:9", cache);
    c.offline = true;
    HubClient::new(c)
}

/// An endpoint nobody listens on.
fn dead_endpoint() -> String {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    dead
}

/// A model repository's files: sharded safetensors, the configuration and
/// tokenizer files, and files a model does not need.
/// A model's snapshot of `repo` at `revision`, as the trainer asks for it.
fn model(hub: &HubClient, repo: &str, revision: &str) -> mlx_data::Result<std::path::PathBuf> {
    snapshot(
        hub,
        RepoKind::Model,
        repo,
        revision,
        &SnapshotFilter::model(),
    )
}

fn model_files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("config.json", br#"{"model_type": "llama"}"#.to_vec()),
        ("generation_config.json", br#"{"eos_token_id": 2}"#.to_vec()),
        ("tokenizer.json", br#"{"version": "1.0"}"#.to_vec()),
        ("tokenizer_config.json", br#"{"eos_token": "</s>"}"#.to_vec()),
        (
            "model.safetensors.index.json",
            br#"{"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}"#
                .to_vec(),
        ),
        ("model-00001-of-00002.safetensors", vec![1u8; 3000]),
        ("model-00002-of-00002.safetensors", vec![2u8; 2000]),
        ("pytorch_model.bin", vec![3u8; 5000]),
        ("onnx/model.onnx", vec![4u8; 100]),
        ("README.md", b"# tiny".to_vec()),
    ]
}

fn serve(repo: &str, files: &[(&str, Vec<u8>)]) -> HubServer {
    let map: HashMap<String, ServedFile> = files
        .iter()
        .map(|(f, b)| (format!("{repo}/{f}"), ServedFile::lfs(b.clone())))
        .collect();
    HubServer::start(map)
}

const WANTED: [&str; 7] = [
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

#[test]
fn a_model_snapshot_fetches_what_a_model_needs_pinned_to_the_listed_commit() {
    let files = model_files();
    let srv = serve(REPO, &files);
    let dir = tempfile::tempdir().unwrap();
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let snap = model(&hub, REPO, "main").unwrap();
    let commit = &srv.state.commit;
    let repo_dir = dir.path().join("models--org--tiny-llama");
    assert_eq!(snap, repo_dir.join("snapshots").join(commit));
    for (name, bytes) in &files {
        let p = snap.join(name);
        if WANTED.contains(name) {
            assert_eq!(&std::fs::read(&p).unwrap(), bytes, "{name}");
        } else {
            assert!(!p.exists(), "{name} was fetched");
        }
    }
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/main")).unwrap(),
        *commit
    );
    // Listed once, every file fetched at the listed commit, nothing else.
    let seen = srv.seen();
    assert_eq!(seen[0].path, format!("/api/models/{REPO}/revision/main"));
    let mut gets: Vec<String> = seen
        .iter()
        .filter(|s| s.method == "GET" && !s.path.starts_with("/api/"))
        .map(|s| s.path.clone())
        .collect();
    gets.sort();
    let mut want: Vec<String> = WANTED
        .iter()
        .map(|f| format!("/{REPO}/resolve/{commit}/{f}"))
        .collect();
    want.sort();
    assert_eq!(gets, want);

    // Again, by tag and by commit: nothing downloaded, the same folder.
    for revision in ["v1.0", commit.as_str()] {
        srv.clear_seen();
        let again = model(&hub, REPO, revision).unwrap();
        assert_eq!(again, snap, "{revision}");
        let seen = srv.seen();
        assert!(
            seen.iter()
                .all(|s| s.method == "HEAD" || s.path.starts_with("/api/")),
            "{revision}: {seen:?}"
        );
    }
    assert_eq!(
        std::fs::read_to_string(repo_dir.join("refs/v1.0")).unwrap(),
        *commit
    );

    // Offline, and with the Hub gone: the same folder from the cache.
    srv.clear_seen();
    let off = model(&offline(dir.path()), REPO, "v1.0").unwrap();
    assert_eq!(off, snap);
    assert!(srv.seen().is_empty(), "offline touched the network");
    let gone = HubClient::new(config(&dead_endpoint(), dir.path()));
    let cached = model(&gone, REPO, "main").unwrap();
    assert_eq!(cached, snap);
}

#[test]
fn whole_weights_need_no_index_and_other_formats_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let whole = [
        ("config.json", b"{}".to_vec()),
        ("model.safetensors", vec![7u8; 100]),
    ];
    let srv = serve("org/whole", &whole);
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let snap = model(&hub, "org/whole", "main").unwrap();
    assert_eq!(
        std::fs::read(snap.join("model.safetensors")).unwrap(),
        [7u8; 100]
    );
    assert!(!snap.join("tokenizer.json").exists());

    let pytorch = [
        ("config.json", b"{}".to_vec()),
        ("pytorch_model.bin", vec![1u8; 10]),
    ];
    let srv = serve("org/pytorch", &pytorch);
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let err = model(&hub, "org/pytorch", "main").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::RepoIncomplete { .. }), "{msg}");
    for part in [
        "org/pytorch",
        "model.safetensors",
        "pytorch_model.bin",
        "only safetensors",
        &srv.state.commit,
    ] {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
    // Nothing was downloaded for a repository we cannot use.
    assert!(
        srv.seen()
            .iter()
            .all(|s| s.method != "GET" || s.path.starts_with("/api/"))
    );

    // An index naming a shard the repository lacks.
    let mut files = model_files();
    files.retain(|(n, _)| *n != "model-00002-of-00002.safetensors");
    let srv = serve("org/torn", &files);
    let hub = HubClient::new(config(&srv.endpoint, dir.path()));
    let msg = model(&hub, "org/torn", "main").unwrap_err().to_string();
    assert!(
        msg.contains("org/torn") && msg.contains("model-00002-of-00002.safetensors"),
        "{msg}"
    );

    // No such repository: the Hub's answer, not a fallback.
    let err = model(&hub, "org/nothing", "main").unwrap_err();
    assert!(err.to_string().contains("404"), "{err}");
}

#[test]
fn offline_with_nothing_cached_fails_naming_the_repository() {
    let dir = tempfile::tempdir().unwrap();
    let err = model(&offline(dir.path()), REPO, "main").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::NotCached { .. }), "{msg}");
    assert!(
        msg.contains(REPO) && msg.contains("HF_HUB_OFFLINE") && msg.contains("main"),
        "{msg}"
    );
    // Unsafe names are refused before anything is touched.
    for (repo, rev) in [("../x", "main"), (REPO, "../../x"), ("/abs", "main")] {
        let err = model(&offline(dir.path()), repo, rev).unwrap_err();
        assert!(matches!(err, DataError::Config(_)), "{repo} {rev}: {err}");
    }
}

/// Writes `files` into `cache` as huggingface_hub lays them out: content in
/// `blobs/<sha256>`, `snapshots/<commit>/<file>` a relative link to it, and
/// `refs/<ref>` holding the commit (no newline, as Python writes it).
#[cfg(unix)]
fn python_cache(cache: &Path, repo: &str, commit: &str, refs: &[&str], files: &[(&str, Vec<u8>)]) {
    let root = cache.join(format!("models--{}", repo.replace('/', "--")));
    std::fs::create_dir_all(root.join("blobs")).unwrap();
    for (name, bytes) in files {
        let etag = ServedFile::lfs(bytes.clone()).etag;
        std::fs::write(root.join("blobs").join(&etag), bytes).unwrap();
        let link = root.join("snapshots").join(commit).join(name);
        std::fs::create_dir_all(link.parent().unwrap()).unwrap();
        let up = "../".repeat(1 + name.split('/').count());
        std::os::unix::fs::symlink(format!("{up}blobs/{etag}"), &link).unwrap();
    }
    for r in refs {
        let p = root.join("refs").join(r);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, commit).unwrap();
    }
}

#[cfg(unix)]
#[test]
fn a_cache_written_by_python_serves_offline_and_what_it_lacks_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("hub");
    let commit = "89abcdef0123456789abcdef0123456789abcdef";
    let files: Vec<(&str, Vec<u8>)> = model_files()
        .into_iter()
        .filter(|(n, _)| n.ends_with(".json") || n.ends_with(".safetensors"))
        .collect();
    python_cache(&cache, REPO, commit, &["main", "v1.0"], &files);
    let want = cache.join("models--org--tiny-llama/snapshots").join(commit);
    for revision in ["main", "v1.0", commit] {
        let snap = model(&offline(&cache), REPO, revision).unwrap();
        assert_eq!(snap, want, "{revision}");
        for (name, bytes) in &files {
            assert_eq!(&std::fs::read(snap.join(name)).unwrap(), bytes, "{name}");
        }
    }
    // The Hub out of reach (not offline) falls back to the same snapshot.
    let gone = HubClient::new(config(&dead_endpoint(), &cache));
    let snap = model(&gone, REPO, "main").unwrap();
    assert_eq!(snap, want);

    // A revision the cache does not know: not cached, naming it.
    let msg = model(&offline(&cache), REPO, "dev")
        .unwrap_err()
        .to_string();
    assert!(msg.contains(REPO) && msg.contains("dev"), "{msg}");

    // A shard whose blob is gone (a link left dangling) and no config.json:
    // both named, with the snapshot folder searched.
    let repo_dir = cache.join("models--org--tiny-llama");
    let shard = want.join("model-00002-of-00002.safetensors");
    let target = std::fs::read_link(&shard).unwrap();
    std::fs::remove_file(shard.parent().unwrap().join(target)).unwrap();
    std::fs::remove_file(want.join("config.json")).unwrap();
    let err = model(&offline(&cache), REPO, "main").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DataError::RepoIncomplete { .. }), "{msg}");
    for part in [
        REPO,
        "config.json",
        "model-00002-of-00002.safetensors",
        "HF_HUB_OFFLINE",
        &repo_dir.display().to_string(),
    ] {
        assert!(msg.contains(part), "`{part}` missing from: {msg}");
    }
}
