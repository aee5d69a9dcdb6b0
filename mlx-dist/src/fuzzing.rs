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
