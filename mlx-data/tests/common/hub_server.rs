//! A tiny HTTP/1.1 server on 127.0.0.1 that serves repositories in the Hugging
//! Face Hub's URL layout (`/datasets/{repo}/resolve/{rev}/{file}`) and their file
//! listings (`/api/datasets/{repo}/revision/{rev}`: `sha` and `siblings`), with
//! switches for interrupted and stalled transfers. Every connection is bounded in
//! time.

use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A file the server serves.
#[derive(Clone)]
pub struct ServedFile {
    /// Content.
    pub bytes: Vec<u8>,
    /// ETag to announce (sha256 of the content unless overridden).
    pub etag: String,
}

impl ServedFile {
    /// A file whose ETag is its sha256, as the Hub does for LFS files.
    pub fn lfs(bytes: Vec<u8>) -> ServedFile {
        let etag = Sha256::digest(&bytes)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        ServedFile { bytes, etag }
    }
}

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct Seen {
    /// `GET` or `HEAD`.
    pub method: String,
    /// Request path.
    pub path: String,
    /// The `Range` header, if any.
    pub range: Option<String>,
}

/// Shared server state.
pub struct State {
    /// URL path (after `/resolve/{rev}/` is matched) -> file.
    pub files: Mutex<HashMap<String, ServedFile>>,
    /// Commit announced in `x-repo-commit`.
    pub commit: String,
    /// Header values sent instead of the defaults (`x-repo-commit`, `ETag`) or in
    /// addition to them, matched by case-insensitive name; lets a test play a
    /// hostile server.
    pub headers: Mutex<Vec<(String, String)>>,
    /// This many next GETs send only part of the body, then close.
    pub truncate_gets: AtomicUsize,
    /// This many next GETs send part of the body, then stall.
    pub stall_gets: AtomicUsize,
    /// Requests seen.
    pub seen: Mutex<Vec<Seen>>,
    stop: AtomicBool,
}

/// A running server; stops when dropped.
pub struct HubServer {
    /// Base URL, e.g. `http://127.0.0.1:PORT`.
    pub endpoint: String,
    /// Shared state.
    pub state: Arc<State>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HubServer {
    /// Starts a server for `files`, keyed by `"{kind_prefix}{repo}/{file}"`, e.g.
    /// `"datasets/roneneldan/TinyStories/TinyStories-valid.txt"`.
    pub fn start(files: HashMap<String, ServedFile>) -> HubServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let state = Arc::new(State {
            files: Mutex::new(files),
            commit: "0123456789abcdef0123456789abcdef01234567".into(),
            headers: Mutex::new(vec![]),
            truncate_gets: AtomicUsize::new(0),
            stall_gets: AtomicUsize::new(0),
            seen: Mutex::new(vec![]),
            stop: AtomicBool::new(false),
        });
        let st = state.clone();
        let thread = std::thread::spawn(move || {
            // Bounded: the server never outlives 120 s even if a test forgets it.
            let deadline = Instant::now() + Duration::from_secs(120);
            while !st.stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                match listener.accept() {
                    Ok((conn, _)) => {
                        let st = st.clone();
                        std::thread::spawn(move || {
                            let _ = handle(conn, &st);
                        });
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(2)),
                }
            }
        });
        HubServer {
            endpoint,
            state,
            thread: Some(thread),
        }
    }

    /// Requests seen so far.
    pub fn seen(&self) -> Vec<Seen> {
        self.state.seen.lock().unwrap().clone()
    }

    /// Sends `value` for header `name` from now on (replacing the default value).
    pub fn set_header(&self, name: &str, value: &str) {
        let mut h = self.state.headers.lock().unwrap();
        h.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        h.push((name.to_owned(), value.to_owned()));
    }

    /// Goes back to the default headers.
    pub fn clear_headers(&self) {
        self.state.headers.lock().unwrap().clear();
    }

    /// Forgets the requests seen so far.
    pub fn clear_seen(&self) {
        self.state.seen.lock().unwrap().clear();
    }
}

impl Drop for HubServer {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn take_one(counter: &AtomicUsize) -> bool {
    counter
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
        .is_ok()
}

fn handle(mut conn: TcpStream, st: &State) -> std::io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let method = parts.next().unwrap_or("").to_owned();
    let path = parts.next().unwrap_or("").to_owned();
    let mut range = None;
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':')
            && k.eq_ignore_ascii_case("range")
        {
            range = Some(v.trim().to_owned());
        }
    }
    st.seen.lock().unwrap().push(Seen {
        method: method.clone(),
        path: path.clone(),
        range: range.clone(),
    });
    // The Hub redirects `gpt2` to its canonical repo with a relative Location.
    if let Some(rest) = path.strip_prefix("/gpt2/") {
        let resp = format!(
            "HTTP/1.1 307 Temporary Redirect\r\nLocation: /openai-community/gpt2/{rest}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return conn.write_all(resp.as_bytes());
    }
    // /api/{models|datasets}/{owner}/{name}/revision/{rev}: the repository's files.
    if method == "GET"
        && let Some((repo, _rev)) = path
            .strip_prefix("/api/")
            .and_then(|p| p.split_once("/revision/"))
    {
        let repo = repo.strip_prefix("models/").unwrap_or(repo);
        let prefix = format!("{repo}/");
        let mut names: Vec<String> = st
            .files
            .lock()
            .unwrap()
            .keys()
            .filter_map(|k| k.strip_prefix(&prefix).map(str::to_owned))
            .collect();
        if names.is_empty() {
            return conn.write_all(
                b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
        // Listed in reverse name order: clients must order shards themselves.
        names.sort_by_key(|n| std::cmp::Reverse(n.clone()));
        let siblings: Vec<_> = names
            .iter()
            .map(|n| serde_json::json!({ "rfilename": n }))
            .collect();
        let body =
            serde_json::json!({ "id": repo, "sha": st.commit, "siblings": siblings }).to_string();
        let resp = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        return conn.write_all(resp.as_bytes());
    }
    // /{datasets/}{owner}/{name}/resolve/{rev}/{file}
    let key = path
        .trim_start_matches('/')
        .split_once("/resolve/")
        .and_then(|(repo, rest)| {
            let (_rev, file) = rest.split_once('/')?;
            Some(format!("{repo}/{file}"))
        });
    let file = key.and_then(|k| st.files.lock().unwrap().get(&k).cloned());
    let Some(file) = file else {
        return conn.write_all(
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
    };
    let total = file.bytes.len();
    let mut headers = vec![
        ("x-repo-commit".to_owned(), st.commit.clone()),
        ("ETag".to_owned(), format!("\"{}\"", file.etag)),
    ];
    for (name, value) in st.headers.lock().unwrap().iter() {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(name));
        headers.push((name.clone(), value.clone()));
    }
    let mut common = String::from("Accept-Ranges: bytes\r\nConnection: close\r\n");
    for (name, value) in headers {
        common.push_str(&format!("{name}: {value}\r\n"));
    }
    if method == "HEAD" {
        let resp = format!("HTTP/1.1 200 OK\r\n{common}Content-Length: {total}\r\n\r\n");
        return conn.write_all(resp.as_bytes());
    }
    let start = range
        .as_deref()
        .and_then(|r| r.strip_prefix("bytes="))
        .and_then(|r| r.trim_end_matches('-').parse::<usize>().ok())
        .unwrap_or(0);
    if start >= total && total > 0 {
        let resp = format!(
            "HTTP/1.1 416 Range Not Satisfiable\r\n{common}Content-Range: bytes */{total}\r\nContent-Length: 0\r\n\r\n"
        );
        return conn.write_all(resp.as_bytes());
    }
    let body = &file.bytes[start..];
    let head = if range.is_some() {
        format!(
            "HTTP/1.1 206 Partial Content\r\n{common}Content-Range: bytes {start}-{}/{total}\r\nContent-Length: {}\r\n\r\n",
            total - 1,
            body.len()
        )
    } else {
        format!(
            "HTTP/1.1 200 OK\r\n{common}Content-Length: {}\r\n\r\n",
            body.len()
        )
    };
    conn.write_all(head.as_bytes())?;
    if take_one(&st.truncate_gets) {
        conn.write_all(&body[..body.len() / 3])?;
        conn.flush()?;
        return conn.shutdown(std::net::Shutdown::Both);
    }
    if take_one(&st.stall_gets) {
        conn.write_all(&body[..body.len() / 3])?;
        conn.flush()?;
        // Stall (bounded) without closing: the client's read deadline must fire.
        std::thread::sleep(Duration::from_secs(5));
        return Ok(());
    }
    conn.write_all(body)
}
