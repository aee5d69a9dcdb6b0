//! The error type of every fallible operation in this crate.

use std::sync::Arc;
use std::time::Duration;

use crate::wire::{OpKind, WireError};

/// An error from a distributed operation. Messages name the peer rank, the
/// operation and the sizes involved. Clonable, so that every operation that
/// fails after a failure reports that first failure.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DistError {
    /// The connection to a peer closed (the peer exited, crashed or was killed).
    #[error("{op}: connection to rank {peer} closed (rank {peer} exited, crashed or was killed)")]
    PeerClosed {
        /// World rank of the peer.
        peer: usize,
        /// The operation in progress.
        op: OpKind,
    },
    /// A peer stopped sending heartbeats: it is frozen or stopped, or its
    /// host or the network to it is gone.
    #[error(
        "rank {peer} is unresponsive: no heartbeat for {silent:.1?} (liveness timeout {timeout:?}); \
         it is frozen or stopped, or its host or the network to it is gone"
    )]
    Unresponsive {
        /// World rank of the peer.
        peer: usize,
        /// How long it had been silent.
        silent: Duration,
        /// The liveness timeout.
        timeout: Duration,
    },
    /// Live peers did not reach a collective within the collective timeout.
    #[error(
        "{op} #{seq} (group {group}): {} late: alive, but did not join within {timeout:?} \
         (collective timeout; raise it with MLX_DIST_TIMEOUT_MS or mlx-launch --timeout){}",
        ranks_phrase(late), if detail.is_empty() { String::new() } else { format!("; {detail}") }
    )]
    Late {
        /// The world ranks that had not reached the operation, lowest first.
        late: Vec<usize>,
        /// The operation waiting for them.
        op: OpKind,
        /// Its group id.
        group: u32,
        /// Its sequence number in the group.
        seq: u64,
        /// The timeout that ran out.
        timeout: Duration,
        /// What the late ranks were doing, as their heartbeats said.
        detail: String,
    },
    /// A peer made no progress within the collective timeout although its
    /// heartbeats say it is inside the same operation (a transport stall).
    #[error("{op}: rank {peer} stalled: no progress for {timeout:?} (collective timeout)")]
    Stalled {
        /// World rank of the peer.
        peer: usize,
        /// The operation in progress.
        op: OpKind,
        /// The timeout that ran out.
        timeout: Duration,
    },
    /// A peer closed its group cleanly while this rank still needed it.
    #[error(
        "{op}: rank {peer} left the job (closed its group normally) while this rank still \
         waited for it: the ranks did not run the same collectives"
    )]
    PeerLeft {
        /// World rank of the peer.
        peer: usize,
        /// The operation in progress.
        op: OpKind,
    },
    /// Another I/O error on the link to a peer.
    #[error("{op}: I/O error with rank {peer}: {source}")]
    Io {
        /// World rank of the peer.
        peer: usize,
        /// The operation in progress.
        op: OpKind,
        /// The underlying error.
        source: Arc<std::io::Error>,
    },
    /// The peer is taking part in a different operation, or the same one with other sizes.
    #[error(
        "collective mismatch with rank {peer}: this rank is in {ours}, rank {peer} sent {theirs}"
    )]
    Mismatch {
        /// World rank of the peer.
        peer: usize,
        /// What this rank is doing (op, group, seq, dtype, bytes).
        ours: String,
        /// What the peer's frame said.
        theirs: String,
    },
    /// A peer gave up and told us why.
    #[error("{op}: {} (reported by rank {reporter}): {reason}", match culprit { Some(c) => format!("rank {c} failed"), None => "a rank failed".to_string() })]
    Aborted {
        /// The operation in progress here.
        op: OpKind,
        /// The rank whose abort frame we read.
        reporter: usize,
        /// The world rank that failed first, as far as the reporter knows.
        culprit: Option<usize>,
        /// The reporter's reason.
        reason: String,
    },
    /// A peer sent bytes that are not a valid frame.
    #[error("{op}: malformed frame from rank {peer}: {source}")]
    Wire {
        /// World rank of the peer.
        peer: usize,
        /// The operation in progress.
        op: OpKind,
        /// The decoding error.
        source: WireError,
    },
    /// A peer could not be reached before the connect deadline.
    #[error("could not connect to rank {peer} at {addr} within {timeout:?}: {last}")]
    ConnectTimeout {
        /// World rank of the peer.
        peer: usize,
        /// Its address.
        addr: String,
        /// The deadline.
        timeout: Duration,
        /// The last connection error.
        last: String,
    },
    /// Not every peer connected to this rank before the deadline.
    #[error(
        "rank {rank}: ranks {missing:?} did not connect within {timeout:?} \
         ({turned_away} unauthenticated connections were turned away meanwhile: \
         {no_slot} for want of a handshake slot, the rest refused or too slow to authenticate)"
    )]
    AcceptTimeout {
        /// This rank.
        rank: usize,
        /// The ranks still missing.
        missing: Vec<usize>,
        /// The deadline.
        timeout: Duration,
        /// Connections that never authenticated: closed for want of a
        /// handshake slot (all taken, or their source's share taken),
        /// refused, or dropped at the handshake deadline. A flood of them
        /// is why a rank that did start may still be missing.
        turned_away: u64,
        /// Of those, the ones closed at once for want of a slot.
        no_slot: u64,
    },
    /// A connection handshake failed or was refused.
    #[error("handshake with {who}: {reason}")]
    Handshake {
        /// The peer (address or rank).
        who: String,
        /// Why.
        reason: String,
    },
    /// A caller error: wrong buffer size, rank out of range, ...
    #[error("{op}: invalid argument: {msg}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What was wrong.
        msg: String,
    },
    /// The launcher environment is incomplete or malformed.
    #[error("configuration: {0}")]
    Config(String),
    /// The backend is not compiled in or cannot start here.
    #[error("backend {backend} is not available: {reason}")]
    Unavailable {
        /// The backend name.
        backend: &'static str,
        /// Why.
        reason: String,
    },
    /// An earlier failure left the connections unusable.
    #[error("the communicator is unusable after an earlier failure: {reason}")]
    Poisoned {
        /// The world rank the earlier failure blamed, if any.
        culprit: Option<usize>,
        /// The earlier failure.
        reason: String,
    },
}

/// "rank 3 is" or "ranks 1, 3 are".
fn ranks_phrase(r: &[usize]) -> String {
    match r {
        [one] => format!("rank {one} is"),
        _ => format!(
            "ranks {} are",
            r.iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

impl DistError {
    /// The world rank this error blames, when it blames one.
    pub fn culprit(&self) -> Option<usize> {
        match self {
            DistError::PeerClosed { peer, .. }
            | DistError::Stalled { peer, .. }
            | DistError::Unresponsive { peer, .. }
            | DistError::PeerLeft { peer, .. }
            | DistError::Io { peer, .. }
            | DistError::Wire { peer, .. }
            | DistError::ConnectTimeout { peer, .. } => Some(*peer),
            DistError::Aborted { culprit, .. } | DistError::Poisoned { culprit, .. } => *culprit,
            DistError::Late { late, .. } => late.first().copied(),
            _ => None,
        }
    }

    /// Maps an I/O error on the link to `peer` into the matching variant.
    pub(crate) fn from_io(e: std::io::Error, peer: usize, op: OpKind, timeout: Duration) -> Self {
        use std::io::ErrorKind as K;
        match e.kind() {
            K::UnexpectedEof
            | K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::NotConnected => DistError::PeerClosed { peer, op },
            K::WouldBlock | K::TimedOut => DistError::Stalled { peer, op, timeout },
            _ => DistError::Io {
                peer,
                op,
                source: Arc::new(e),
            },
        }
    }
}

/// Result alias for this crate.
pub type Result<T, E = DistError> = std::result::Result<T, E>;
