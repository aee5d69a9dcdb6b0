//! Entry points for the coverage-guided fuzz targets (`fuzz/` at the
//! workspace root) and the property tests over arbitrary bytes: the frame
//! reads the mesh runs in production, fed from memory instead of a socket.
//! Not part of the API.

use std::io;
use std::sync::Mutex;
use std::time::Instant;

use mlx_array::Dtype;

use crate::config::Config;
use crate::mesh::{Mesh, OpCtx, membership};
use crate::transports::Connections;
use crate::transports::link::Link;
use crate::wire::{HEADER_LEN, OpKind};

/// A link whose peer sent `bytes` and then closed: reads take them in order
/// and fail with `UnexpectedEof` (what a closed TCP link reports) once they
/// run out; writes are accepted and dropped.
struct MemLink {
    bytes: Vec<u8>,
    at: Mutex<usize>,
}

impl MemLink {
    fn new(bytes: &[u8]) -> MemLink {
        MemLink {
            bytes: bytes.to_vec(),
            at: Mutex::new(0),
        }
    }
}

impl Link for MemLink {
    fn send_frame(&self, _header: &[u8; HEADER_LEN], _payload: &[u8]) -> io::Result<()> {
        Ok(())
    }

    fn send_frame_until(&self, _h: &[u8; HEADER_LEN], _p: &[u8], _deadline: Instant) -> bool {
        true
    }

    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        let mut at = self.at.lock().unwrap_or_else(|p| p.into_inner());
        let end = at
            .checked_add(buf.len())
            .filter(|&e| e <= self.bytes.len())
            .ok_or(io::ErrorKind::UnexpectedEof)?;
        buf.copy_from_slice(&self.bytes[*at..end]);
        *at = end;
        Ok(())
    }

    fn recv_exact_until(&self, buf: &mut [u8], _deadline: Instant) -> io::Result<()> {
        self.recv_exact(buf)
    }

    fn finish(&self, _deadline: Instant) {}

    fn shutdown(&self) {}
}

/// A two-rank mesh as rank 0 sees it: its one data link to rank 1 delivers
/// `data`, its witness (rank 1's liveness channel) `witness`.
fn mesh(data: &[u8], witness: &[u8]) -> Mesh {
    let cfg = Config::new(
        0,
        vec!["127.0.0.1:1".into(), "127.0.0.1:2".into()],
        [0; 16],
        Vec::new(),
    );
    let link: Box<dyn Link> = Box::new(MemLink::new(data));
    let witness: Box<dyn Link> = Box::new(MemLink::new(witness));
    Mesh::new(
        &cfg,
        Connections {
            links: vec![Vec::new(), vec![link]],
            witnesses: vec![None, Some(witness)],
        },
    )
}

/// The operation [`data_link_frames`] receives frames of (seeds build
/// headers that match it): an `all_sum` #1 of group 0 over 64 bytes of float32.
pub const FUZZ_OP: (OpKind, u32, u64, Dtype, u64) = (OpKind::AllSum, 0, 1, Dtype::F32, 64);

/// Payload lengths [`data_link_frames`] expects, frame after frame, chosen
/// by the first byte of its input.
pub const FUZZ_FRAME_LENS: [usize; 4] = [0, 4, 16, 64];

/// Receives frames of [`FUZZ_OP`] from a peer that sent `bytes[1..]` over a
/// data link, as the collectives do (`recv`, and `recv_with` as the
/// reductions do, alternately), until one fails or 16 have come; `bytes[0]`
/// picks the payload lengths expected (see [`FUZZ_FRAME_LENS`]). Returns
/// how many frames were received and the error that stopped it, as text.
pub fn data_link_frames(bytes: &[u8]) -> (usize, Option<String>) {
    let Some((&pick, sent)) = bytes.split_first() else {
        return (0, None);
    };
    let m = mesh(sent, &[]);
    let (op, group, seq, dtype, total) = FUZZ_OP;
    let ctx = OpCtx {
        mesh: &m,
        op,
        group,
        seq,
        dtype,
        total,
    };
    let mut scratch = vec![0u8; 64];
    for i in 0..16 {
        let len = FUZZ_FRAME_LENS[(pick as usize >> (2 * (i % 4))) % 4];
        let got = if i % 2 == 0 {
            ctx.recv(1, 0, &mut scratch[..len])
        } else {
            let mut seen = 0;
            ctx.recv_with(1, 0, len, &mut scratch, &mut |at, piece| {
                assert!(at + piece.len() <= len, "a piece past the payload");
                seen += piece.len();
            })
            .inspect(|()| assert_eq!(seen, len, "the payload handed over in part"))
        };
        if let Err(e) = got {
            return (i, Some(e.to_string()));
        }
    }
    (16, None)
}

/// Runs the reader of a peer's witness (heartbeats, goodbyes, announcements
/// of failure: the thread `Membership` starts per peer) over `bytes`, which
/// the peer sent before closing the connection; returns the mesh's failure
/// once the reader has stopped, as text (a closed witness fails the mesh
/// unless the peer said goodbye first).
pub fn witness_frames(bytes: &[u8]) -> Option<String> {
    let m = mesh(&[], bytes);
    membership::listen(&m, 1);
    m.first_failure().map(|e| e.to_string())
}

/// Answers the shared-memory offer a lower rank sent as `bytes[1..]` (the
/// higher rank's half of the negotiation after the handshake), with segments
/// enabled when `bytes[0]` is odd; whether a segment was mapped, or the
/// error that refused the offer, as text.
pub fn shm_offer(bytes: &[u8]) -> Result<bool, String> {
    let Some((&pick, sent)) = bytes.split_first() else {
        return Ok(false);
    };
    let mut stream = InputStream(sent);
    crate::transports::shm::answer(&mut stream, pick & 1 == 1)
        .map(|s| s.is_some())
        .map_err(|e| e.to_string())
}

/// An offer as the lower rank writes it (of a segment removed again before
/// this returns, or a refusal when `segment` is false): seeds for [`shm_offer`].
pub fn shm_offer_bytes(segment: bool) -> Vec<u8> {
    let mut sent = Vec::new();
    let offer = crate::transports::shm::offer(&mut sent, segment);
    drop(offer);
    sent
}

/// A stream whose reads come from `.0` (what a peer sent) and whose writes
/// are dropped: the fuzz targets' stand-in for a connection.
pub struct InputStream<'a>(pub &'a [u8]);

impl io::Read for InputStream<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read(buf)
    }
}

impl io::Write for InputStream<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The key the agent lines of [`launcher_output`] are sealed with.
#[cfg(feature = "launcher")]
const AGENT_KEY: [u8; 32] = [7; 32];

/// The launcher's readers of what ranks, `mpirun` and remote hosts print,
/// over `bytes[1..]`, chosen by `bytes[0] % 4`:
/// 0. `mpirun --tag-output`'s lines, split back into each rank's;
/// 1. a remote rank's stderr lines, sealed failure reports and stop times
///    among them (under a fixed key, as rank 1's);
/// 2. a `--check` request as a host reads it, and a host's answer to it;
/// 3. a rank's stderr lines drawn as progress bars.
///
/// Returns how many lines came out; panics where a reader breaks its bounds.
#[cfg(feature = "launcher")]
pub fn launcher_output(bytes: &[u8]) -> usize {
    use crate::launch::{agent, check, mpirun};
    let Some((&pick, rest)) = bytes.split_first() else {
        return 0;
    };
    let text = String::from_utf8_lossy(rest);
    let mut n = 0;
    match pick % 4 {
        0 => {
            let mut u = mpirun::Untagger::default();
            for line in text.split('\n') {
                for (_, l) in u.line(line) {
                    assert!(
                        l.len() < crate::launch::lines::MAX_LINE + line.len(),
                        "a line past the bound"
                    );
                    n += 1;
                }
            }
            n += u.finish().len();
        }
        1 => {
            for line in rest.split(|&b| b == b'\n') {
                for marker in [agent::REPORT_MARKER, agent::STOP_MARKER] {
                    if let Some(sealed) = line.strip_prefix(marker.as_bytes())
                        && let Some(t) = agent::unseal(&AGENT_KEY, marker, 1, sealed)
                    {
                        let _ = crate::report::parse_report(&t, 1, 4);
                        let _ = crate::report::parse_stop_time(&t);
                        n += 1;
                    }
                }
            }
        }
        2 => {
            if let Ok(req) = check::Request::parse(&text) {
                let _ = req.to_json();
                n += 1;
            }
            if let Ok(answer) = serde_json::from_str::<serde_json::Value>(&text) {
                let req = check::Request::parse(&check_request()).expect("the fixed request");
                n += check::host_problems(&req, &answer, &answer).len();
            }
        }
        _ => {
            let r = mlx_progress::render::Renderer::hidden();
            for line in text.split('\n') {
                n += usize::from(r.feed(1, line).is_some());
            }
            r.end_rank(1);
        }
    }
    n
}

/// The `--check` request [`launcher_output`] compares answers with.
#[cfg(feature = "launcher")]
fn check_request() -> String {
    r#"{"program":"/bin/sh","cwd":"/","names":["localhost"],"ports":[["127.0.0.1",0]]}"#.into()
}

/// Inputs for [`launcher_output`] as the launcher receives them: tagged
/// mpirun output, sealed agent lines, a check request and this host's
/// answer to it, progress events.
#[cfg(feature = "launcher")]
pub fn launcher_output_seeds() -> Vec<Vec<u8>> {
    use crate::launch::{agent, check};
    let req = check::Request::parse(&check_request()).expect("the fixed request");
    let report = r#"{"rank":1,"culprit":2,"reason":"rank 2 closed its connection"}"#;
    let stop = r#"{"step_ms":1500,"checkpoint_ms":9000}"#;
    let agent_lines = [
        agent::seal(&AGENT_KEY, agent::REPORT_MARKER, 1, report),
        "a line of the rank's own\n".into(),
        agent::seal(&AGENT_KEY, agent::STOP_MARKER, 1, stop),
    ]
    .concat();
    let event = |kind: mlx_progress::Kind, pos: u64| {
        mlx_progress::Event {
            pid: 9,
            id: 1,
            kind,
            name: "tokenizing".into(),
            unit: mlx_progress::Unit::Tokens,
            pos,
            total: Some(100),
            msg: String::new(),
        }
        .encode()
    };
    use mlx_progress::Kind;
    let events = [
        event(Kind::Start, 0),
        event(Kind::Update, 50),
        event(Kind::Finish, 100),
    ]
    .join("\n");
    vec![
        b"\0[1,1]<stdout>:test result: [1,3]<stdout>:RANK 3 OK\n[1,1]<stdout>: done\nplain\n"
            .to_vec(),
        [b"\x01".as_slice(), agent_lines.as_bytes()].concat(),
        [b"\x02".as_slice(), check_request().as_bytes()].concat(),
        [
            b"\x02".as_slice(),
            check::probe(&req).to_string().as_bytes(),
        ]
        .concat(),
        [b"\x03".as_slice(), events.as_bytes()].concat(),
    ]
}

/// Reads the frames the launcher sends a remote agent after its order
/// (standard input, signals, end of input) from `bytes`, as the agent does,
/// until the stream ends or a frame is refused; returns how many were read.
#[cfg(feature = "launcher")]
pub fn agent_frames(bytes: &[u8]) -> usize {
    let mut r = bytes;
    let mut n = 0;
    while let Ok(Some(_)) = crate::launch::agent::Frame::read(&mut r) {
        n += 1;
    }
    n
}

/// Parses an agent's order line (what the launcher sends first) from
/// `text`; the error, as text, when it is refused.
#[cfg(feature = "launcher")]
pub fn agent_order(text: &str) -> Result<(), String> {
    crate::launch::agent::Order::parse(text).map(|_| ())
}

/// An order line for `command` as the launcher writes it (seeds for the
/// fuzz target of [`agent_order`]).
#[cfg(feature = "launcher")]
pub fn agent_order_line(command: &[&str]) -> String {
    crate::launch::agent::Order {
        rank: 1,
        command: command.iter().map(|s| s.to_string()).collect(),
        cwd: Some("/tmp".into()),
        env: vec![("MLX_RANK".into(), "1".into())],
        ranks_on_host: 2,
        key: [7; 32],
    }
    .to_line()
}

/// The bytes of agent frames as the launcher writes them: some input, a
/// signal, the end of input (seeds for [`agent_frames`]).
#[cfg(feature = "launcher")]
pub fn agent_frame_bytes(input: &[u8], signal: i32) -> Vec<u8> {
    use crate::launch::agent::Frame;
    [
        Frame::Input(input.to_vec()),
        Frame::Signal(signal),
        Frame::EndOfInput,
    ]
    .iter()
    .flat_map(Frame::encode)
    .collect()
}

#[cfg(test)]
mod tests {
    //! The mesh's frame reads over arbitrary bytes (the fuzz targets
    //! `mesh_data_link` and `mesh_witness` run the same functions under
    //! coverage guidance).

    use super::*;
    use crate::wire::{AbortPayload, FrameHeader, HEARTBEAT_LEN, Heartbeat};
    use proptest::prelude::*;

    fn frame(op: OpKind, payload: &[u8]) -> Vec<u8> {
        let (_, group, seq, dtype, total) = FUZZ_OP;
        let h = FrameHeader {
            op,
            dtype,
            group,
            seq,
            total,
            len: payload.len() as u64,
        };
        [h.encode().as_slice(), payload].concat()
    }

    fn heartbeat() -> Vec<u8> {
        let p = Heartbeat {
            current: Some((OpKind::AllSum, 0, 3)),
            begun: 3,
        }
        .encode();
        [
            &FrameHeader::control(OpKind::Heartbeat, HEARTBEAT_LEN)[..],
            &p,
        ]
        .concat()
    }

    fn abort() -> Vec<u8> {
        let p = AbortPayload {
            culprit: Some(1),
            reason: "gone".into(),
        }
        .encode();
        [&FrameHeader::control(OpKind::Abort, p.len())[..], &p].concat()
    }

    #[test]
    fn valid_frames_are_received_and_an_abort_names_its_culprit() {
        let mut bytes = vec![0xff];
        for _ in 0..16 {
            bytes.extend(frame(OpKind::AllSum, &[1; 64]));
        }
        assert_eq!(data_link_frames(&bytes), (16, None));
        let mut bytes = vec![0xff];
        bytes.extend(frame(OpKind::AllSum, &[1; 64]));
        bytes.extend(abort());
        let (n, err) = data_link_frames(&bytes);
        assert_eq!(n, 1);
        assert!(err.unwrap().contains("gone"));
    }

    #[test]
    fn a_witness_that_said_goodbye_is_no_failure_and_one_that_closed_is() {
        let bye = FrameHeader::control(OpKind::Bye, 0).to_vec();
        assert_eq!(witness_frames(&[heartbeat(), bye].concat()), None);
        assert!(witness_frames(&heartbeat()).is_some());
        assert!(witness_frames(&abort()).unwrap().contains("gone"));
    }

    #[cfg(feature = "launcher")]
    #[test]
    fn the_launchers_readers_take_what_the_launcher_receives() {
        let seeds = launcher_output_seeds();
        // "test result:  done" (rank 1), "RANK 3 OK", "plain", and the empty
        // line after the last newline.
        assert_eq!(launcher_output(&seeds[0]), 4);
        // Both sealed lines, and nothing once a byte of the text changes.
        assert_eq!(launcher_output(&seeds[1]), 2);
        let forged = String::from_utf8(seeds[1].clone())
            .unwrap()
            .replace("rank 2", "rank 3");
        assert_eq!(launcher_output(forged.as_bytes()), 1);
        // The request parses (1); read as an answer, it names no version,
        // no program and no address for the host (3 problems).
        assert_eq!(launcher_output(&seeds[2]), 4);
        // This host's own answer has no problems.
        assert_eq!(launcher_output(&seeds[3]), 0);
        // Start, update, finish: no line printed as it is.
        assert_eq!(launcher_output(&seeds[4]), 0);
    }

    #[test]
    fn a_shared_memory_offer_is_answered_and_anything_else_refused() {
        let declined = shm_offer_bytes(false);
        assert_eq!(shm_offer(&[[1].as_slice(), &declined].concat()), Ok(false));
        // A real offer, of a segment removed before the answer: not mapped.
        let offered = shm_offer_bytes(true);
        assert_eq!(offered[0], b'S');
        assert_eq!(shm_offer(&[[1].as_slice(), &offered].concat()), Ok(false));
        let cut = &offered[..offered.len() - 1];
        assert!(shm_offer(&[[1].as_slice(), cut].concat()).is_err());
        let e = shm_offer(&[1, b'x']).unwrap_err();
        assert!(e.contains("expected a shared memory offer"), "{e}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Arbitrary bytes on a data link are frames or an error.
        #[test]
        fn any_bytes_on_a_data_link_are_frames_or_an_error(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let _ = data_link_frames(&bytes);
        }

        /// Valid frames (data, then an abort) with bytes flipped, cut or inserted.
        #[test]
        fn mutated_data_frames_are_frames_or_an_error(
            pick: u8,
            edits in crate::mutation::edits(1..6),
        ) {
            let mut b = vec![pick];
            for len in [0usize, 4, 16, 64] {
                b.extend(frame(OpKind::AllSum, &vec![7; len]));
            }
            b.extend(abort());
            crate::mutation::apply(&mut b, &edits);
            let _ = data_link_frames(&b);
        }

        /// Arbitrary bytes to the launcher's readers of ranks' and hosts' output.
        #[cfg(feature = "launcher")]
        #[test]
        fn any_output_is_read_within_bounds(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let _ = launcher_output(&bytes);
        }

        /// Arbitrary bytes as a shared-memory offer are answered or refused.
        #[test]
        fn any_bytes_as_a_shared_memory_offer_are_answered_or_refused(
            bytes in proptest::collection::vec(any::<u8>(), 0..300),
        ) {
            let _ = shm_offer(&bytes);
        }

        /// Arbitrary bytes on a witness end the reader with a failure or a goodbye.
        #[test]
        fn any_bytes_on_a_witness_end_its_reader(
            bytes in proptest::collection::vec(any::<u8>(), 0..400),
        ) {
            let _ = witness_frames(&bytes);
        }

        /// Heartbeats, an abort and goodbyes with bytes flipped, cut or inserted.
        #[test]
        fn mutated_witness_frames_end_its_reader(edits in crate::mutation::edits(1..6)) {
            let mut b = [
                heartbeat(),
                heartbeat(),
                FrameHeader::control(OpKind::ByeAck, 0).to_vec(),
                abort(),
            ]
            .concat();
            crate::mutation::apply(&mut b, &edits);
            let _ = witness_frames(&b);
        }
    }
}
