//! The wire format: every message between ranks is a frame, a fixed 40-byte
//! header followed by `len` payload bytes.
//!
//! ```text
//! offset size field
//!      0    4 magic    b"MLXF"
//!      4    1 version  WIRE_VERSION
//!      5    1 op       OpKind as u8
//!      6    1 dtype    dtype code (see `dtype_code`)
//!      7    1 reserved must be 0
//!      8    4 group    group id (u32, little endian)
//!     12    4 reserved must be 0
//!     16    8 seq      sequence number of the operation in its group (u64 LE)
//!     24    8 total    total size in bytes of the operation on the sender (u64 LE)
//!     32    8 len      payload bytes that follow this header (u64 LE)
//! ```
//!
//! The receiver always knows how many bytes it expects, so a payload length is
//! compared with that expectation before anything is read or allocated; the only
//! frames with a length chosen by the peer are `Abort` frames, capped at
//! [`MAX_ABORT_PAYLOAD`]. Element data travel in the host's little-endian layout.
//!
//! The liveness channel (one connection or stream per peer, beside the data
//! links) carries only `Heartbeat` frames (a [`Heartbeat`] payload of
//! [`HEARTBEAT_LEN`] bytes, every fifth of the liveness timeout), one `Abort`
//! frame when a rank gives up, and the `Bye` / `ByeAck` pair (no payload)
//! of a clean exit.

use std::io::Read;

use mlx_array::Dtype;

/// The four bytes that start every frame.
pub const MAGIC: [u8; 4] = *b"MLXF";
/// The version of this frame layout.
pub const WIRE_VERSION: u8 = 1;
/// Size of an encoded [`FrameHeader`].
pub const HEADER_LEN: usize = 40;
/// Largest payload an `Abort` frame may carry.
pub const MAX_ABORT_PAYLOAD: usize = 4096;

/// What operation a frame belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    /// Elementwise sum over all ranks.
    AllSum = 1,
    /// Elementwise maximum over all ranks.
    AllMax = 2,
    /// Elementwise minimum over all ranks.
    AllMin = 3,
    /// Concatenation of every rank's buffer in rank order.
    AllGather = 4,
    /// Elementwise sum, of which each rank keeps its own block.
    SumScatter = 5,
    /// Point-to-point message.
    Send = 6,
    /// Synchronisation with no data.
    Barrier = 7,
    /// The sender failed and gives up; the payload says why.
    Abort = 8,
    /// The sender is alive; the payload ([`Heartbeat`]) says what it is doing.
    Heartbeat = 9,
    /// The sender closes its group cleanly: its closing connections are no failure.
    Bye = 10,
    /// The answer to `Bye`: the receiver knows, and sends nothing more.
    ByeAck = 11,
}

impl OpKind {
    /// Decodes the op byte of a frame.
    pub fn from_u8(v: u8) -> Option<OpKind> {
        Some(match v {
            1 => OpKind::AllSum,
            2 => OpKind::AllMax,
            3 => OpKind::AllMin,
            4 => OpKind::AllGather,
            5 => OpKind::SumScatter,
            6 => OpKind::Send,
            7 => OpKind::Barrier,
            8 => OpKind::Abort,
            9 => OpKind::Heartbeat,
            10 => OpKind::Bye,
            11 => OpKind::ByeAck,
            _ => return None,
        })
    }

    /// The name used in error messages (`all_sum`, `send`, ...).
    pub fn name(self) -> &'static str {
        match self {
            OpKind::AllSum => "all_sum",
            OpKind::AllMax => "all_max",
            OpKind::AllMin => "all_min",
            OpKind::AllGather => "all_gather",
            OpKind::SumScatter => "sum_scatter",
            OpKind::Send => "send/recv",
            OpKind::Barrier => "barrier",
            OpKind::Abort => "abort",
            OpKind::Heartbeat => "heartbeat",
            OpKind::Bye => "goodbye",
            OpKind::ByeAck => "goodbye acknowledgement",
        }
    }
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// The one-byte code of a dtype on the wire.
pub fn dtype_code(d: Dtype) -> u8 {
    match d {
        Dtype::Bool => 0,
        Dtype::U32 => 1,
        Dtype::I32 => 2,
        Dtype::I64 => 3,
        Dtype::F16 => 4,
        Dtype::BF16 => 5,
        Dtype::F32 => 6,
    }
}

/// The dtype of a wire code, if the code is known.
pub fn dtype_from_code(c: u8) -> Option<Dtype> {
    Some(match c {
        0 => Dtype::Bool,
        1 => Dtype::U32,
        2 => Dtype::I32,
        3 => Dtype::I64,
        4 => Dtype::F16,
        5 => Dtype::BF16,
        6 => Dtype::F32,
        _ => return None,
    })
}

/// Why bytes could not be decoded as a frame.
#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum WireError {
    /// A heartbeat payload of the wrong length.
    #[error("heartbeat payload of {0} bytes (expected {HEARTBEAT_LEN})")]
    BadHeartbeat(usize),
    /// Fewer bytes than a header.
    #[error("truncated frame header: {0} of {HEADER_LEN} bytes")]
    Truncated(usize),
    /// The first four bytes are not [`MAGIC`].
    #[error(
        "bad frame magic {0:02x?} (expected {MAGIC:02x?}): not an mlx-dist peer or a corrupted stream"
    )]
    BadMagic([u8; 4]),
    /// A frame of another wire version.
    #[error("wire version {found} (this build speaks {WIRE_VERSION})")]
    BadVersion {
        /// The version found.
        found: u8,
    },
    /// Unknown op byte.
    #[error("unknown op code {0}")]
    BadOp(u8),
    /// Unknown dtype byte.
    #[error("unknown dtype code {0}")]
    BadDtype(u8),
    /// Reserved bytes were not zero.
    #[error("reserved header bytes are not zero")]
    Reserved,
    /// A payload longer than the receiver accepts.
    #[error("frame payload of {len} bytes exceeds the limit of {max} bytes")]
    TooLong {
        /// The announced length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The stream failed or ended while reading.
    #[error("I/O while reading a frame: {0}")]
    Io(String),
}

/// A decoded frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    /// The operation.
    pub op: OpKind,
    /// Element type of the payload.
    pub dtype: Dtype,
    /// Group id.
    pub group: u32,
    /// Sequence number of the operation within the group (or peer pair for send/recv).
    pub seq: u64,
    /// Total bytes of the operation on the sender.
    pub total: u64,
    /// Payload bytes following the header.
    pub len: u64,
}

impl FrameHeader {
    /// The encoded header of a control frame (`Abort`, `Heartbeat`, `Bye`,
    /// `ByeAck`): no group, sequence or dtype, a `len`-byte payload.
    pub fn control(op: OpKind, len: usize) -> [u8; HEADER_LEN] {
        FrameHeader {
            op,
            dtype: Dtype::Bool,
            group: 0,
            seq: 0,
            total: 0,
            len: len as u64,
        }
        .encode()
    }

    /// Encodes the header into its 40 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = WIRE_VERSION;
        b[5] = self.op as u8;
        b[6] = dtype_code(self.dtype);
        b[8..12].copy_from_slice(&self.group.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b[24..32].copy_from_slice(&self.total.to_le_bytes());
        b[32..40].copy_from_slice(&self.len.to_le_bytes());
        b
    }

    /// Decodes a header from the first [`HEADER_LEN`] bytes of `b`; never panics.
    pub fn decode(b: &[u8]) -> Result<FrameHeader, WireError> {
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated(b.len()));
        }
        let magic = [b[0], b[1], b[2], b[3]];
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        if b[4] != WIRE_VERSION {
            return Err(WireError::BadVersion { found: b[4] });
        }
        let op = OpKind::from_u8(b[5]).ok_or(WireError::BadOp(b[5]))?;
        let dtype = dtype_from_code(b[6]).ok_or(WireError::BadDtype(b[6]))?;
        if b[7] != 0 || b[12..16] != [0; 4] {
            return Err(WireError::Reserved);
        }
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let mut g = [0u8; 4];
        g.copy_from_slice(&b[8..12]);
        Ok(FrameHeader {
            op,
            dtype,
            group: u32::from_le_bytes(g),
            seq: u64_at(16),
            total: u64_at(24),
            len: u64_at(32),
        })
    }
}

/// Reads one whole frame, refusing (before allocating) payloads over `max_payload`.
pub fn read_frame<R: Read>(
    r: &mut R,
    max_payload: usize,
) -> Result<(FrameHeader, Vec<u8>), WireError> {
    let mut hb = [0u8; HEADER_LEN];
    r.read_exact(&mut hb)
        .map_err(|e| WireError::Io(e.to_string()))?;
    let h = FrameHeader::decode(&hb)?;
    if h.len > max_payload as u64 {
        return Err(WireError::TooLong {
            len: h.len,
            max: max_payload as u64,
        });
    }
    // Grown as bytes arrive, not allocated from the header: a peer that
    // claims a large frame and sends little costs what it sent.
    let mut payload = Vec::new();
    r.take(h.len)
        .read_to_end(&mut payload)
        .map_err(|e| WireError::Io(e.to_string()))?;
    if payload.len() as u64 != h.len {
        return Err(WireError::Io(format!(
            "the frame ended after {} of {} payload bytes",
            payload.len(),
            h.len
        )));
    }
    Ok((h, payload))
}

/// The payload of an `Abort` frame: who is to blame (if known) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AbortPayload {
    /// The world rank that failed first, as far as the sender knows.
    pub culprit: Option<u32>,
    /// A human-readable reason.
    pub reason: String,
}

impl AbortPayload {
    /// Encodes the payload, truncating the reason so it fits [`MAX_ABORT_PAYLOAD`].
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(8 + self.reason.len());
        v.extend_from_slice(&self.culprit.unwrap_or(u32::MAX).to_le_bytes());
        let mut end = self.reason.len().min(MAX_ABORT_PAYLOAD - 4);
        while !self.reason.is_char_boundary(end) {
            end -= 1;
        }
        v.extend_from_slice(&self.reason.as_bytes()[..end]);
        v
    }

    /// Decodes a payload; never panics (invalid UTF-8 is replaced).
    pub fn decode(b: &[u8]) -> AbortPayload {
        if b.len() < 4 {
            return AbortPayload {
                culprit: None,
                reason: "(malformed abort frame)".into(),
            };
        }
        let c = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
        AbortPayload {
            culprit: (c != u32::MAX).then_some(c),
            reason: String::from_utf8_lossy(&b[4..]).into_owned(),
        }
    }
}

/// Size of an encoded [`Heartbeat`].
pub const HEARTBEAT_LEN: usize = 24;

/// The payload of a `Heartbeat` frame: the operation the sender is inside,
/// if any, so that a peer whose collective times out can name the ranks
/// that have not reached it.
///
/// ```text
/// offset size field
///      0    1 in_op  1 if inside an operation, else 0
///      1    1 op     OpKind of that operation (0 when idle)
///      2    2 reserved
///      4    4 group  its group id (u32 LE)
///      8    8 seq    its sequence number in the group (u64 LE)
///     16    8 begun  operations begun by the sender so far (u64 LE)
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Heartbeat {
    /// The operation the sender is inside: (op, group, seq).
    pub current: Option<(OpKind, u32, u64)>,
    /// How many operations the sender has begun.
    pub begun: u64,
}

impl Heartbeat {
    /// The [`HEARTBEAT_LEN`] bytes of this heartbeat.
    pub fn encode(&self) -> [u8; HEARTBEAT_LEN] {
        let mut b = [0u8; HEARTBEAT_LEN];
        if let Some((op, group, seq)) = self.current {
            b[0] = 1;
            b[1] = op as u8;
            b[4..8].copy_from_slice(&group.to_le_bytes());
            b[8..16].copy_from_slice(&seq.to_le_bytes());
        }
        b[16..24].copy_from_slice(&self.begun.to_le_bytes());
        b
    }

    /// Decodes a heartbeat; an unknown op or a wrong length is an error, never a panic.
    pub fn decode(b: &[u8]) -> Result<Heartbeat, WireError> {
        if b.len() != HEARTBEAT_LEN {
            return Err(WireError::BadHeartbeat(b.len()));
        }
        let word = |r: std::ops::Range<usize>| {
            let mut w = [0u8; 8];
            w[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(w)
        };
        let current = match b[0] {
            0 => None,
            _ => Some((
                OpKind::from_u8(b[1]).ok_or(WireError::BadOp(b[1]))?,
                word(4..8) as u32,
                word(8..16),
            )),
        };
        Ok(Heartbeat {
            current,
            begun: word(16..24),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> FrameHeader {
        FrameHeader {
            op: OpKind::AllSum,
            dtype: Dtype::BF16,
            group: 7,
            seq: 42,
            total: 1 << 40,
            len: 12345,
        }
    }

    #[test]
    fn round_trip() {
        let h = header();
        assert_eq!(FrameHeader::decode(&h.encode()), Ok(h));
    }

    #[test]
    fn rejects_bad_magic_version_and_reserved() {
        let mut b = header().encode();
        b[0] = b'X';
        assert!(matches!(
            FrameHeader::decode(&b),
            Err(WireError::BadMagic(_))
        ));
        let mut b = header().encode();
        b[4] = 9;
        assert_eq!(
            FrameHeader::decode(&b),
            Err(WireError::BadVersion { found: 9 })
        );
        let mut b = header().encode();
        b[13] = 1;
        assert_eq!(FrameHeader::decode(&b), Err(WireError::Reserved));
    }

    #[test]
    fn hostile_length_is_refused_before_allocation() {
        let mut h = header();
        h.len = u64::MAX;
        let bytes = h.encode();
        let r = read_frame(&mut &bytes[..], 1024);
        assert!(matches!(r, Err(WireError::TooLong { .. })));
    }

    #[test]
    fn a_frame_claiming_a_terabyte_allocates_what_arrived() {
        // Even with no limit, a header's length is not an allocation size.
        let mut h = header();
        h.len = 1 << 40;
        let mut bytes = h.encode().to_vec();
        bytes.extend_from_slice(&[7; 10]);
        let r = read_frame(&mut &bytes[..], usize::MAX);
        assert!(
            matches!(&r, Err(WireError::Io(m)) if m.contains("10 of 1099511627776")),
            "{r:?}"
        );
    }

    #[test]
    fn abort_payload_round_trip_and_truncation() {
        let p = AbortPayload {
            culprit: Some(3),
            reason: "é".repeat(5000),
        };
        let e = p.encode();
        assert!(e.len() <= MAX_ABORT_PAYLOAD);
        let d = AbortPayload::decode(&e);
        assert_eq!(d.culprit, Some(3));
        assert!(d.reason.chars().all(|c| c == 'é'));
        assert_eq!(AbortPayload::decode(&[1]).culprit, None);
    }

    #[test]
    fn heartbeat_round_trip() {
        for hb in [
            Heartbeat::default(),
            Heartbeat {
                current: Some((OpKind::SumScatter, 0xdead_beef, u64::MAX - 1)),
                begun: 1 << 40,
            },
        ] {
            assert_eq!(Heartbeat::decode(&hb.encode()), Ok(hb));
        }
        let mut b = Heartbeat::default().encode();
        b[0] = 1;
        b[1] = 200;
        assert_eq!(Heartbeat::decode(&b), Err(WireError::BadOp(200)));
        assert_eq!(Heartbeat::decode(&b[..3]), Err(WireError::BadHeartbeat(3)));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let _ = FrameHeader::decode(&bytes);
            let _ = AbortPayload::decode(&bytes);
            let _ = Heartbeat::decode(&bytes);
            if let Ok((h, p)) = read_frame(&mut &bytes[..], 64) {
                prop_assert!(p.len() <= 64);
                prop_assert_eq!(h.len as usize, p.len());
            }
            // No limit at all: still bounded by the bytes given.
            if let Ok((h, p)) = read_frame(&mut &bytes[..], usize::MAX) {
                prop_assert_eq!(h.len as usize, p.len());
                prop_assert!(p.len() < bytes.len());
            }
        }

        /// A valid header with one byte changed, then a tail: an error or
        /// a frame, never a panic, and never more payload than was sent.
        #[test]
        fn mutated_headers_are_refused_or_bounded(at in 0usize..HEADER_LEN, byte: u8,
                                                  len in prop_oneof![0u64..64, Just(1u64 << 32), Just(u64::MAX)],
                                                  tail in proptest::collection::vec(any::<u8>(), 0..64)) {
            let mut h = header();
            h.len = len;
            let mut bytes = h.encode().to_vec();
            bytes[at] = byte;
            bytes.extend_from_slice(&tail);
            let _ = FrameHeader::decode(&bytes);
            if let Ok((got, p)) = read_frame(&mut &bytes[..], usize::MAX) {
                prop_assert_eq!(got.len as usize, p.len());
                prop_assert!(p.len() <= tail.len());
            }
        }

        #[test]
        fn valid_prefix_with_random_tail(seq: u64, total: u64, len: u64, group: u32,
                                        op in 1u8..=11, dt in 0u8..=6,
                                        tail in proptest::collection::vec(any::<u8>(), 0..256)) {
            let h = FrameHeader { op: OpKind::from_u8(op).unwrap(), dtype: dtype_from_code(dt).unwrap(),
                                  group, seq, total, len };
            let mut bytes = h.encode().to_vec();
            prop_assert_eq!(FrameHeader::decode(&bytes), Ok(h));
            bytes.extend_from_slice(&tail);
            match read_frame(&mut &bytes[..], 128) {
                Ok((got, p)) => { prop_assert_eq!(got, h); prop_assert!(p.len() <= 128); }
                Err(WireError::TooLong { .. }) => prop_assert!(len > 128),
                Err(WireError::Io(_)) => prop_assert!(len as usize > tail.len()),
                Err(e) => prop_assert!(false, "unexpected {e}"),
            }
        }
    }
}
