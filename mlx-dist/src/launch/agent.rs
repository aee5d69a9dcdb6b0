//! The remote end of a launch: `mlx-launch --remote-agent`, which ssh starts
//! on each host, one per rank.
//!
//! Everything secret or long travels on ssh's standard input, never on a
//! command line (`ps` and `/proc/*/cmdline` show command lines to every
//! user of both machines): the launcher's first line is a JSON `Order`
//! (the rank's program, environment with the job secret and QUIC key,
//! working directory), then frames (`Frame`) follow: standard input for the
//! rank, signals to forward. When the launcher's side of the connection
//! ends without a goodbye, because the launcher or its ssh died, the agent
//! kills the rank and everything the rank started: a lost launcher leaves
//! nothing running on any host.
//!
//! The agent sends nothing back but the rank's own output (passed through),
//! the time the rank needs to stop (see [`crate::report::step_took`]) when
//! the launcher forwards Ctrl-C or SIGTERM to it, and, after the rank
//! exited, its failure report (see [`crate::report`]): each as one line on
//! standard error starting with `STOP_MARKER` or `REPORT_MARKER`, which
//! the launcher takes out of the output. Those lines are sealed with an
//! HMAC under a key of the order's that the rank never sees, so that
//! nothing the rank (or a program it runs) prints can pass for one.
//!
//! The rank writes its reports in a folder of the agent's: new, made
//! atomically with mode 0700 under a name nobody can guess, and checked
//! (see [`crate::report::new_private_dir`]).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::process::{signal_group, spawn_guarded, status_code};

/// The argument that makes `mlx-launch` the agent of one remote rank.
pub const AGENT_FLAG: &str = "--remote-agent";

/// Version of the launcher-agent protocol; a launcher and an agent of
/// different versions refuse each other (the agent says so).
pub(crate) const PROTOCOL: u64 = 1;

/// The start of the line that carries a remote rank's failure report.
pub(crate) const REPORT_MARKER: &str = "\u{1}mlx-launch-report ";

/// The start of the line that carries the time a remote rank needs to stop.
pub(crate) const STOP_MARKER: &str = "\u{1}mlx-launch-stop ";

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// The MAC of `text`, sent by rank `rank`'s agent after `marker`.
fn mac(key: &[u8; 32], marker: &str, rank: usize) -> HmacSha256 {
    use hmac::Mac;
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
    m.update(marker.as_bytes());
    m.update(&(rank as u64).to_le_bytes());
    m
}

/// The line (with its newline) that carries `text` (one line of JSON)
/// from rank `rank`'s agent after `marker`: the marker, the HMAC-SHA256 of
/// the marker, the rank and the text under `key` in hex, a space, the text.
pub(crate) fn seal(key: &[u8; 32], marker: &str, rank: usize, text: &str) -> String {
    use hmac::Mac;
    let mut m = mac(key, marker, rank);
    m.update(text.as_bytes());
    let tag = crate::config::hex_encode(&m.finalize().into_bytes());
    format!("{marker}{tag} {}\n", text.trim_end())
}

/// The text of a line that starts with `marker` (`rest` is what follows
/// it), when its MAC under `key` for rank `rank` is right; `None` for a
/// forgery or anything else.
pub(crate) fn unseal(key: &[u8; 32], marker: &str, rank: usize, rest: &[u8]) -> Option<String> {
    use hmac::Mac;
    let rest = std::str::from_utf8(rest)
        .ok()?
        .trim_end_matches(['\n', '\r']);
    let (tag, text) = rest.split_once(' ')?;
    let tag = crate::config::hex_decode(tag)?;
    let mut m = mac(key, marker, rank);
    m.update(text.as_bytes());
    m.verify_slice(&tag).ok()?;
    Some(text.to_string())
}

/// What the launcher asks the agent to start. Its `Debug` shows the
/// environment's names, not their values (the job secret is one).
#[derive(Clone, PartialEq)]
pub(crate) struct Order {
    /// The rank (for messages and its report).
    pub rank: usize,
    /// The program and its arguments.
    pub command: Vec<String>,
    /// Working directory.
    pub cwd: Option<String>,
    /// Environment to add (the job's variables, secrets included).
    pub env: Vec<(String, String)>,
    /// How many ranks of the job run on this host: they share its cores.
    pub ranks_on_host: usize,
    /// The key that seals what the agent sends back (see [`seal`]); the
    /// rank never gets it.
    pub key: [u8; 32],
}

impl std::fmt::Debug for Order {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Order")
            .field("rank", &self.rank)
            .field("command", &self.command)
            .field("cwd", &self.cwd)
            .field("env", &super::RedactedEnv(&self.env))
            .field("ranks_on_host", &self.ranks_on_host)
            .field("key", &"<redacted>")
            .finish()
    }
}

impl Order {
    /// The order as the one JSON line the agent reads first.
    pub fn to_line(&self) -> String {
        let mut s = serde_json::json!({
            "protocol": PROTOCOL,
            "version": env!("CARGO_PKG_VERSION"),
            "rank": self.rank,
            "command": self.command,
            "cwd": self.cwd,
            "env": self.env.iter().map(|(k, v)| [k, v]).collect::<Vec<_>>(),
            "ranks_on_host": self.ranks_on_host,
            "key": crate::config::hex_encode(&self.key),
        })
        .to_string();
        s.push('\n');
        s
    }

    /// Parses the order line, refusing another protocol or version.
    pub fn parse(line: &str) -> Result<Order, String> {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| format!("the order is not JSON: {e}"))?;
        let theirs = v["version"].as_str().unwrap_or("?");
        if v["protocol"].as_u64() != Some(PROTOCOL) || theirs != env!("CARGO_PKG_VERSION") {
            return Err(format!(
                "the launcher is mlx-launch {theirs} but this host runs mlx-launch {}: install the same version on every host",
                env!("CARGO_PKG_VERSION")
            ));
        }
        let strings = |key: &str| -> Result<Vec<String>, String> {
            v[key]
                .as_array()
                .ok_or(format!("the order has no {key}"))?
                .iter()
                .map(|s| s.as_str().map(str::to_string))
                .collect::<Option<_>>()
                .ok_or(format!("the order's {key} holds a non-string"))
        };
        let env = v["env"]
            .as_array()
            .ok_or("the order has no env")?
            .iter()
            .map(|kv| match (kv[0].as_str(), kv[1].as_str()) {
                (Some(k), Some(v)) => Ok((k.to_string(), v.to_string())),
                _ => Err("the order's env holds a non-pair".to_string()),
            })
            .collect::<Result<_, _>>()?;
        let command = strings("command")?;
        if command.is_empty() {
            return Err("the order names no program".into());
        }
        let key = v["key"]
            .as_str()
            .and_then(crate::config::hex_decode)
            .and_then(|k| <[u8; 32]>::try_from(k).ok())
            .ok_or("the order has no key of 32 bytes")?;
        Ok(Order {
            key,
            rank: v["rank"].as_u64().ok_or("the order has no rank")? as usize,
            command,
            cwd: v["cwd"].as_str().map(str::to_string),
            env,
            ranks_on_host: v["ranks_on_host"].as_u64().unwrap_or(1).max(1) as usize,
        })
    }
}

/// The largest input frame: the launcher sends 64 KiB at most, and a
/// length from the stream must not size an allocation unchecked.
pub(crate) const MAX_INPUT_FRAME: usize = 1 << 20;

/// The longest order line (the environment with the job's keys is a few KiB).
pub(crate) const MAX_ORDER: u64 = 4 << 20;

/// What the launcher sends after the order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    /// Bytes for the rank's standard input.
    Input(Vec<u8>),
    /// The rank's standard input ends.
    EndOfInput,
    /// Send this signal to the rank's process group.
    Signal(i32),
}

impl Frame {
    /// The frame's bytes: a tag, then for input a 4-byte length and the data.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Frame::Input(d) => {
                let mut v = Vec::with_capacity(5 + d.len());
                v.push(b'i');
                v.extend_from_slice(&(d.len() as u32).to_le_bytes());
                v.extend_from_slice(d);
                v
            }
            Frame::EndOfInput => vec![b'e'],
            Frame::Signal(s) => vec![b's', *s as u8],
        }
    }

    /// Reads one frame; `Ok(None)` at the end of the stream.
    pub fn read(r: &mut impl Read) -> std::io::Result<Option<Frame>> {
        let mut tag = [0u8; 1];
        if r.read(&mut tag)? == 0 {
            return Ok(None);
        }
        Ok(Some(match tag[0] {
            b'i' => {
                let mut len = [0u8; 4];
                r.read_exact(&mut len)?;
                let len = u32::from_le_bytes(len) as usize;
                if len > MAX_INPUT_FRAME {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("an input frame of {len} bytes (at most {MAX_INPUT_FRAME})"),
                    ));
                }
                let mut d = vec![0u8; len];
                r.read_exact(&mut d)?;
                Frame::Input(d)
            }
            b'e' => Frame::EndOfInput,
            b's' => {
                let mut s = [0u8; 1];
                r.read_exact(&mut s)?;
                Frame::Signal(s[0] as i32)
            }
            t => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("unknown frame tag {t:#x}"),
                ));
            }
        }))
    }
}

/// Runs the agent: reads the order on standard input, starts the rank and
/// returns the exit code to end with (the rank's, or 128 + the signal that
/// killed it; 127 when the rank could not be started).
pub fn run_agent() -> i32 {
    let host = hostname();
    let mut input = BufReader::new(std::io::stdin());
    let mut line = String::new();
    if let Err(e) = (&mut input).take(MAX_ORDER).read_line(&mut line) {
        eprintln!("mlx-launch agent on {host}: cannot read the order: {e}");
        return 127;
    }
    if !line.ends_with('\n') {
        eprintln!(
            "mlx-launch agent on {host}: the order did not end (a line of at most {MAX_ORDER} bytes)"
        );
        return 127;
    }
    let order = match Order::parse(&line) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("mlx-launch agent on {host}: {e}");
            return 127;
        }
    };
    let prefix = format!("mlx-launch-agent-{}-{}-", std::process::id(), order.rank);
    let reports = match crate::report::new_private_dir(&std::env::temp_dir(), &prefix) {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "mlx-launch agent on {host}: cannot make a private folder for rank {}'s reports in {}: {e}",
                order.rank,
                std::env::temp_dir().display()
            );
            return 127;
        }
    };
    let err = AgentStderr::default();
    match start_and_wait(&order, input, &reports, &err) {
        Ok(code) => {
            if let Some(json) = crate::report::read_raw(&reports, order.rank) {
                err.send(&seal(&order.key, REPORT_MARKER, order.rank, &json));
            }
            let _ = std::fs::remove_dir_all(&reports);
            code
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&reports);
            eprintln!(
                "mlx-launch agent on {host}: cannot start rank {} ({}): {e}",
                order.rank, order.command[0]
            );
            127
        }
    }
}

/// Starts the rank of `order`, forwards the launcher's frames (read from
/// `frames`, which may hold some already) and waits for the rank's exit.
fn start_and_wait(
    order: &Order,
    mut frames: BufReader<std::io::Stdin>,
    reports: &std::path::Path,
    err: &AgentStderr,
) -> std::io::Result<i32> {
    let mut cmd = Command::new(&order.command[0]);
    cmd.args(&order.command[1..]);
    if let Some(d) = &order.cwd {
        // A clear error instead of exec's "No such file or directory".
        if !std::path::Path::new(d).is_dir() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                format!("the working directory {d} does not exist here (use --cwd)"),
            ));
        }
        cmd.current_dir(d);
    }
    cmd.envs(super::thread_vars(order.ranks_on_host, &order.env));
    cmd.envs(order.env.iter().map(|(k, v)| (k, v)));
    cmd.env(crate::report::ENV_REPORT_DIR, reports);
    cmd.env(
        super::parent::ENV_PARENT_PID,
        std::process::id().to_string(),
    );
    cmd.stdin(Stdio::piped()).stderr(Stdio::piped());
    let (mut child, guard) = spawn_guarded(&mut cmd)?;
    let pgid = child.id();
    let stdin = child.stdin.take();
    let stderr = child.stderr.take().expect("piped");
    // The rank's standard error passes through a thread that notes
    // whether the last line ended, so that the agent's lines start one.
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let passed = err.clone();
    std::thread::spawn(move || {
        let mut src = stderr;
        let mut buf = [0u8; 8192];
        while let Ok(n) = src.read(&mut buf) {
            if n == 0 {
                break;
            }
            passed.pass(&buf[..n]);
        }
        let _ = done_tx.send(());
    });
    let (key, rank, dir, err) = (order.key, order.rank, reports.to_path_buf(), err.clone());
    // Frames from the launcher, until it goes away. The rank's input goes
    // through a queue of its own: a rank that does not read it must not
    // stop this thread from reading the signals behind it.
    let input = stdin.map(RankInput::start);
    std::thread::spawn(move || {
        loop {
            match Frame::read(&mut frames) {
                Ok(Some(Frame::Input(d))) => {
                    if let Some(i) = &input {
                        i.push(d);
                    }
                }
                Ok(Some(Frame::EndOfInput)) => {
                    if let Some(i) = &input {
                        i.end();
                    }
                }
                Ok(Some(Frame::Signal(sig))) => {
                    signal_group(pgid, sig);
                    // Asked to stop: say how long the rank needs to.
                    if [libc::SIGINT, libc::SIGTERM, libc::SIGHUP].contains(&sig)
                        && let Some((_, text)) = crate::report::stop_time(&dir)
                    {
                        let json = serde_json::from_str::<serde_json::Value>(&text)
                            .map(|v| v.to_string())
                            .unwrap_or_default();
                        // On a thread of its own: a full stderr pipe must
                        // not hold up the frames behind this one.
                        let (err, line) = (err.clone(), seal(&key, STOP_MARKER, rank, &json));
                        std::thread::spawn(move || err.send(&line));
                    }
                }
                // The launcher, its ssh or the network is gone while the
                // rank runs: nobody would ever stop it.
                Ok(None) | Err(_) => {
                    signal_group(pgid, libc::SIGKILL);
                    return;
                }
            }
        }
    });
    let status = child.wait()?;
    // Whatever the rank left in its group goes with it.
    signal_group(pgid, libc::SIGKILL);
    guard.end();
    let _ = done_rx.recv_timeout(Duration::from_secs(2));
    Ok(status_code(&status))
}

/// The agent's standard error, shared by the rank's output passing
/// through and the agent's own sealed lines, which always start a line.
#[derive(Clone, Default)]
struct AgentStderr(std::sync::Arc<std::sync::Mutex<MidLine>>);

/// Whether the rank's output last written ended in the middle of a line.
#[derive(Default)]
struct MidLine(bool);

impl AgentStderr {
    /// Passes `bytes` of the rank's standard error through.
    fn pass(&self, bytes: &[u8]) {
        let mut mid = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::io::stderr().lock();
        let _ = out.write_all(bytes);
        let _ = out.flush();
        mid.0 = bytes.last() != Some(&b'\n');
    }

    /// Writes one of the agent's lines, on a line of its own.
    fn send(&self, line: &str) {
        let mut mid = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = std::io::stderr().lock();
        if mid.0 {
            let _ = out.write_all(b"\n");
        }
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
        mid.0 = false;
    }
}

/// Input the rank has not read yet that the agent holds at most; past it,
/// the rest of the input is dropped and the rank's input ends (once said on
/// stderr): the alternative, to stop reading the launcher's frames, would
/// hold up the signals behind the input.
const INPUT_BACKLOG: usize = 16 << 20;

/// The rank's standard input, written by a thread of its own from a queue
/// that [`RankInput::push`] fills without ever waiting on the rank.
struct RankInput(std::sync::Arc<(std::sync::Mutex<Backlog>, std::sync::Condvar)>);

#[derive(Default)]
struct Backlog {
    chunks: std::collections::VecDeque<Vec<u8>>,
    bytes: usize,
    /// No more input: the launcher's ended, or the backlog overflowed.
    ended: bool,
}

impl RankInput {
    fn start(mut stdin: std::process::ChildStdin) -> RankInput {
        let shared = std::sync::Arc::new((
            std::sync::Mutex::new(Backlog::default()),
            std::sync::Condvar::new(),
        ));
        let s = shared.clone();
        std::thread::spawn(move || {
            loop {
                let chunk = {
                    let mut b = s.0.lock().unwrap_or_else(|p| p.into_inner());
                    loop {
                        if let Some(c) = b.chunks.pop_front() {
                            b.bytes -= c.len();
                            break c;
                        }
                        if b.ended {
                            return; // drops stdin: the rank's input ends
                        }
                        b = s.1.wait(b).unwrap_or_else(|p| p.into_inner());
                    }
                };
                if stdin.write_all(&chunk).is_err() {
                    // The rank closed its input: drop what comes.
                    let mut b = s.0.lock().unwrap_or_else(|p| p.into_inner());
                    b.ended = true;
                    b.chunks.clear();
                    b.bytes = 0;
                    return;
                }
            }
        });
        RankInput(shared)
    }

    /// Queues `data` for the rank; never waits.
    fn push(&self, data: Vec<u8>) {
        let mut b = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        if b.ended {
            return;
        }
        if b.bytes + data.len() > INPUT_BACKLOG {
            b.ended = true;
            eprintln!(
                "mlx-launch agent: the rank has not read {} MiB of its standard input; the rest of the input is dropped",
                b.bytes >> 20
            );
        } else {
            b.bytes += data.len();
            b.chunks.push_back(data);
        }
        self.0.1.notify_all();
    }

    /// Ends the rank's input once the backlog is written.
    fn end(&self) {
        self.0.0.lock().unwrap_or_else(|p| p.into_inner()).ended = true;
        self.0.1.notify_all();
    }
}

/// This machine's host name, for messages.
pub(crate) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most buf.len() bytes into buf.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return "this host".into();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_round_trip_and_other_versions_are_refused() {
        let o = Order {
            rank: 3,
            command: vec!["./train".into(), "--steps".into(), "it's 5".into()],
            cwd: Some("/work dir".into()),
            env: vec![("MLX_DIST_JOB_SECRET".into(), "ab\ncd".into())],
            ranks_on_host: 2,
            key: [7; 32],
        };
        let line = o.to_line();
        assert_eq!(line.matches('\n').count(), 1, "one line: {line}");
        assert_eq!(Order::parse(&line).unwrap(), o);
        let other = line.replace(env!("CARGO_PKG_VERSION"), "0.0.0-other");
        let e = Order::parse(&other).unwrap_err();
        assert!(e.contains("0.0.0-other"), "{e}");
        assert!(Order::parse("{").is_err());
        let shown = format!("{o:?} {o:#?}");
        assert!(
            !shown.contains("ab\\ncd") && !shown.contains("ab\ncd"),
            "{shown}"
        );
        assert!(shown.contains("MLX_DIST_JOB_SECRET=<redacted>"), "{shown}");
    }

    #[test]
    fn frames_round_trip() {
        let frames = [
            Frame::Input(b"hello\n".to_vec()),
            Frame::Input(Vec::new()),
            Frame::Signal(libc::SIGINT),
            Frame::EndOfInput,
        ];
        let bytes: Vec<u8> = frames.iter().flat_map(Frame::encode).collect();
        let mut r = &bytes[..];
        for f in &frames {
            assert_eq!(Frame::read(&mut r).unwrap().as_ref(), Some(f));
        }
        assert_eq!(Frame::read(&mut r).unwrap(), None);
        assert!(Frame::read(&mut &b"x"[..]).is_err());
        assert!(
            Frame::read(&mut &b"i\x05\0\0\0ab"[..]).is_err(),
            "a cut frame"
        );
    }

    use proptest::prelude::*;

    fn order() -> Order {
        Order {
            rank: 1,
            command: vec!["./train".into(), "--steps".into(), "5".into()],
            cwd: Some("/work".into()),
            env: vec![("MLX_RANK".into(), "1".into())],
            ranks_on_host: 2,
            key: [9; 32],
        }
    }

    /// Reads frames until the end or an error: at most one per byte.
    fn read_all(bytes: &[u8]) -> Result<usize, std::io::Error> {
        let mut r = bytes;
        let mut n = 0;
        while let Some(f) = Frame::read(&mut r)? {
            if let Frame::Input(d) = &f {
                assert!(d.len() <= MAX_INPUT_FRAME);
            }
            n += 1;
            assert!(n <= bytes.len(), "more frames than bytes");
        }
        Ok(n)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Arbitrary bytes are frames or an error, never a panic or an
        /// allocation the length field alone decides.
        #[test]
        fn any_bytes_are_frames_or_an_error(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = read_all(&bytes);
        }

        /// Valid frames with bytes flipped, cut or inserted.
        #[test]
        fn mutated_frames_are_frames_or_an_error(
            data in proptest::collection::vec(any::<u8>(), 0..64),
            sig in any::<i32>(),
            edits in crate::mutation::edits(1..6),
        ) {
            let mut b: Vec<u8> = [Frame::Input(data), Frame::Signal(sig), Frame::EndOfInput]
                .iter()
                .flat_map(Frame::encode)
                .collect();
            crate::mutation::apply(&mut b, &edits);
            let _ = read_all(&b);
        }

        /// Arbitrary text is an order or an error.
        #[test]
        fn any_text_is_an_order_or_an_error(text in ".{0,200}") {
            let _ = Order::parse(&text);
        }

        /// A valid order with bytes flipped, cut or inserted: an order
        /// that names a program, or an error.
        #[test]
        fn mutated_orders_name_a_program_or_fail(
            edits in crate::mutation::edits(1..6),
        ) {
            let mut b = order().to_line().into_bytes();
            crate::mutation::apply(&mut b, &edits);
            if let Ok(o) = Order::parse(&String::from_utf8_lossy(&b)) {
                prop_assert!(!o.command.is_empty());
                prop_assert!(o.ranks_on_host >= 1);
            }
        }
    }

    /// A sealed line opens with its key, marker and rank only; a line
    /// with the marker and anything else (a rank printing one) does not.
    #[test]
    fn only_sealed_lines_open() {
        let key = [3u8; 32];
        let json = r#"{"rank":0,"culprit":1,"reason":"peer gone"}"#;
        let line = seal(&key, REPORT_MARKER, 0, json);
        assert!(line.ends_with('\n') && line.matches('\n').count() == 1);
        let rest = line.strip_prefix(REPORT_MARKER).unwrap().as_bytes();
        assert_eq!(unseal(&key, REPORT_MARKER, 0, rest).as_deref(), Some(json));
        assert!(
            unseal(&[4; 32], REPORT_MARKER, 0, rest).is_none(),
            "another key"
        );
        assert!(
            unseal(&key, REPORT_MARKER, 1, rest).is_none(),
            "another rank"
        );
        assert!(
            unseal(&key, STOP_MARKER, 0, rest).is_none(),
            "another marker"
        );
        let forged = json.replace("peer gone", "forged");
        let tampered = format!(
            "{} {forged}",
            std::str::from_utf8(rest)
                .unwrap()
                .split_once(' ')
                .unwrap()
                .0
        );
        assert!(unseal(&key, REPORT_MARKER, 0, tampered.as_bytes()).is_none());
        assert!(
            unseal(&key, REPORT_MARKER, 0, json.as_bytes()).is_none(),
            "unsealed"
        );
        assert!(unseal(&key, REPORT_MARKER, 0, b"zz {}").is_none());
    }

    #[test]
    fn an_input_frame_longer_than_the_bound_is_refused_before_allocating() {
        let mut b = vec![b'i'];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = Frame::read(&mut &b[..]).unwrap_err();
        assert!(e.to_string().contains("at most"), "{e}");
    }
}
