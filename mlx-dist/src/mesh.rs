//! The connected mesh shared by a world group and every group split from it,
//! and the per-operation context that sends and checks frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mlx_array::Dtype;

use crate::config::Config;
use crate::error::{DistError, Result};
use crate::link::Link;
use crate::wire::{AbortPayload, FrameHeader, HEADER_LEN, MAX_ABORT_PAYLOAD, OpKind};

/// How long a rank whose link to a peer closed waits to hear whether that
/// peer gave up on its own (and whom it blamed) or died; capped by the stall
/// timeout. A peer that died answers at once over TCP (end of stream); only
/// a QUIC peer that vanished without closing costs the whole grace. 3 s was
/// too short on a loaded 2-core machine: a relaying rank's QUIC close
/// reason arrived after 3.5 s and the relay was blamed.
const VERDICT_GRACE: Duration = Duration::from_secs(6);

/// One channel per peer, beside the data links, that only carries the news of
/// a failure: exact attribution. A rank that fails *announces* whom it blames
/// before it closes its data links; a rank that sees a peer's data link close
/// *hears* that peer's witness: an announcement means the peer is alive and
/// relays the failure of the rank it names; an end of stream (or silence
/// until the grace period ends) means the peer itself died.
pub(crate) trait Witness: Send + Sync {
    /// Tells the peer that this rank gave up, and why (best effort, bounded by `deadline`).
    fn announce(&self, failure: &AbortPayload, deadline: Instant);
    /// Waits until `deadline` for the peer's announcement; `None` if the peer
    /// closed without one (it died or exited) or said nothing in time.
    fn hear(&self, deadline: Instant) -> Option<AbortPayload>;
}

/// Links to every peer, and the state that makes failures final.
pub(crate) struct Mesh {
    /// This process's world rank.
    pub rank: usize,
    /// World size.
    pub world: usize,
    /// `links[peer][link]`; empty for this rank.
    links: Vec<Vec<Box<dyn Link>>>,
    /// Connections per peer and direction.
    pub conns: usize,
    /// Stall timeout.
    pub stall: Duration,
    /// Ring pipelining granularity.
    pub block: usize,
    /// Small-message threshold.
    pub small: usize,
    op_lock: Mutex<()>,
    poison: Mutex<Option<String>>,
    /// Set first thing on failure: senders stop at the next frame boundary.
    failed: AtomicBool,
    /// Reduction scratch buffers, one per lane, kept between operations.
    pub scratch: Mutex<Vec<Vec<u64>>>,
    /// `witnesses[peer]`, the failure channel to each peer (`None` for this rank).
    witnesses: Vec<Option<Box<dyn Witness>>>,
    /// What each peer's witness said, once heard: `Some(None)` = the peer died.
    verdicts: Mutex<Vec<Option<Option<AbortPayload>>>>,
}

impl Mesh {
    pub(crate) fn new(
        cfg: &Config,
        links: Vec<Vec<Box<dyn Link>>>,
        witnesses: Vec<Option<Box<dyn Witness>>>,
    ) -> Mesh {
        let world = cfg.world();
        Mesh {
            rank: cfg.rank,
            world: cfg.world(),
            links,
            conns: cfg.connections_per_peer,
            stall: cfg.stall_timeout,
            block: cfg.block_bytes.max(64),
            small: cfg.small_bytes,
            op_lock: Mutex::new(()),
            poison: Mutex::new(None),
            failed: AtomicBool::new(false),
            scratch: Mutex::new(Vec::new()),
            witnesses,
            verdicts: Mutex::new(vec![None; world]),
        }
    }

    /// What `peer`'s witness says about why its links closed (asked once per
    /// peer, then remembered): `Some` if it gave up and named the rank that
    /// failed first, `None` if it died.
    fn verdict(&self, peer: usize) -> Option<AbortPayload> {
        let mut v = self.verdicts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(known) = &v[peer] {
            return known.clone();
        }
        let heard = self
            .witnesses
            .get(peer)
            .and_then(|w| w.as_ref())
            .and_then(|w| w.hear(Instant::now() + VERDICT_GRACE.min(self.stall)));
        v[peer] = Some(heard.clone());
        heard
    }

    /// The error with exact blame: a closed connection to a peer that was
    /// itself only relaying a failure becomes [`DistError::Aborted`] naming
    /// the rank that failed first; anything else is returned as it is.
    pub(crate) fn attribute(&self, err: DistError) -> DistError {
        let (peer, op) = match &err {
            DistError::PeerClosed { peer, op } | DistError::Io { peer, op, .. } => (*peer, *op),
            _ => return err,
        };
        match self.verdict(peer) {
            Some(a) if a.culprit != Some(peer as u32) => DistError::Aborted {
                op,
                reporter: peer,
                culprit: a.culprit.map(|c| c as usize),
                reason: a.reason,
            },
            _ => err,
        }
    }

    /// Takes the mesh for one operation; fails at once if an earlier one poisoned it.
    pub(crate) fn begin(&self) -> Result<MutexGuard<'_, ()>> {
        let g = self.op_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = self
            .poison
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
        {
            return Err(DistError::Poisoned(p.clone()));
        }
        Ok(g)
    }

    /// Whether a failure has been recorded (threads of an operation stop at their next step).
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    pub(crate) fn link(&self, peer: usize, link: usize) -> &dyn Link {
        &*self.links[peer][link]
    }

    /// Records the first failure, tells every peer why (best effort), and
    /// closes every link so that all blocked threads here and there wake up.
    ///
    /// A closed connection is first attributed (see [`Mesh::attribute`]), so
    /// the abort frames and the witnesses name the rank that failed first.
    pub(crate) fn fail(&self, err: &DistError, op: OpKind) {
        let mut p = self.poison.lock().unwrap_or_else(|p| p.into_inner());
        if p.is_some() {
            return;
        }
        // Other threads of this operation stop while the verdict is awaited.
        self.failed.store(true, Ordering::SeqCst);
        let relayed = match err {
            DistError::PeerClosed { peer, .. } | DistError::Io { peer, .. } => self
                .verdict(*peer)
                .filter(|a| a.culprit != Some(*peer as u32)),
            _ => None,
        };
        let failure = relayed.unwrap_or_else(|| AbortPayload {
            culprit: err.culprit().map(|c| c as u32),
            reason: err.to_string(),
        });
        *p = Some(match failure.culprit {
            Some(c) => format!("rank {c} failed: {}", failure.reason),
            None => failure.reason.clone(),
        });
        drop(p);
        tracing::error!(rank = self.rank, %op, error = %err, culprit = ?failure.culprit, "collective failed; closing all links");
        let payload = failure.encode();
        let h = FrameHeader {
            op: OpKind::Abort,
            dtype: Dtype::Bool,
            group: 0,
            seq: 0,
            total: 0,
            len: payload.len() as u64,
        }
        .encode();
        // Senders stop at their next frame boundary, so the abort frame is not
        // spliced into a payload; a stalled link is given up after the deadline.
        let deadline = Instant::now() + Duration::from_millis(1000);
        for row in &self.links {
            for l in row {
                let _ = l.send_frame_until(&h, &payload, deadline);
            }
        }
        // The witnesses speak before any data link closes, so a peer that
        // sees our links close finds the announcement waiting.
        for w in self.witnesses.iter().flatten() {
            w.announce(&failure, deadline);
        }
        for row in &self.links {
            for l in row {
                l.shutdown();
            }
        }
    }
}

/// The identity of one operation, as every frame of it carries.
#[derive(Clone, Copy)]
pub(crate) struct OpCtx<'a> {
    pub mesh: &'a Mesh,
    pub op: OpKind,
    pub group: u32,
    pub seq: u64,
    pub dtype: Dtype,
    pub total: u64,
}

impl OpCtx<'_> {
    fn describe(op: OpKind, group: u32, seq: u64, dtype: Dtype, total: u64) -> String {
        format!(
            "{op} #{seq} (group {group}, {}, {total} bytes)",
            dtype.name()
        )
    }

    pub(crate) fn io(&self, e: std::io::Error, peer: usize) -> DistError {
        DistError::from_io(e, peer, self.op, self.mesh.stall)
    }

    /// Sends one frame with `payload` to world rank `peer` over link `link`.
    pub(crate) fn send(&self, peer: usize, link: usize, payload: &[u8]) -> Result<()> {
        if self.mesh.failed.load(Ordering::Relaxed) {
            return Err(DistError::Poisoned(
                "an earlier failure in this operation".into(),
            ));
        }
        let h = FrameHeader {
            op: self.op,
            dtype: self.dtype,
            group: self.group,
            seq: self.seq,
            total: self.total,
            len: payload.len() as u64,
        };
        self.mesh
            .link(peer, link)
            .send_frame(&h.encode(), payload)
            .map_err(|e| self.io(e, peer))
    }

    /// Receives one frame from `peer` over `link` into `buf`, which must be exactly its payload.
    pub(crate) fn recv(&self, peer: usize, link: usize, buf: &mut [u8]) -> Result<()> {
        self.recv_header(peer, link, buf.len())?
            .recv_payload(buf)
            .map_err(|e| self.io(e, peer))
    }

    /// Reads and checks the header of a frame of `len` bytes from `peer`
    /// over `link`; the link, for its payload.
    fn recv_header(&self, peer: usize, link: usize, len: usize) -> Result<&dyn Link> {
        let l = self.mesh.link(peer, link);
        let mut hb = [0u8; HEADER_LEN];
        l.recv_exact(&mut hb).map_err(|e| self.io(e, peer))?;
        self.check_header(peer, link, &hb, len)?;
        Ok(l)
    }

    /// Receives one frame of `len` bytes from `peer` over `link` and hands
    /// its payload to `f` piece by piece as `(offset, bytes)` (through
    /// `scratch`, at least `len` bytes, unless the link can lend its own memory).
    pub(crate) fn recv_with(
        &self,
        peer: usize,
        link: usize,
        len: usize,
        scratch: &mut [u8],
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> Result<()> {
        self.recv_header(peer, link, len)?
            .recv_payload_with(len, scratch, f)
            .map_err(|e| self.io(e, peer))
    }

    /// Checks a received frame header against this operation and the payload
    /// length expected; an abort frame (whose payload is read here) becomes
    /// [`DistError::Aborted`].
    pub(crate) fn check_header(
        &self,
        peer: usize,
        link: usize,
        hb: &[u8; HEADER_LEN],
        expected_len: usize,
    ) -> Result<()> {
        let l = self.mesh.link(peer, link);
        let h = FrameHeader::decode(hb).map_err(|source| DistError::Wire {
            peer,
            op: self.op,
            source,
        })?;
        if h.op == OpKind::Abort {
            let mut p = vec![0u8; (h.len as usize).min(MAX_ABORT_PAYLOAD)];
            let a = match l.recv_exact(&mut p) {
                Ok(()) => AbortPayload::decode(&p),
                Err(_) => AbortPayload {
                    culprit: None,
                    reason: "(truncated abort frame)".into(),
                },
            };
            return Err(DistError::Aborted {
                op: self.op,
                reporter: peer,
                culprit: a.culprit.map(|c| c as usize),
                reason: a.reason,
            });
        }
        if (h.op, h.group, h.seq, h.dtype, h.total)
            != (self.op, self.group, self.seq, self.dtype, self.total)
        {
            return Err(DistError::Mismatch {
                peer,
                ours: Self::describe(self.op, self.group, self.seq, self.dtype, self.total),
                theirs: Self::describe(h.op, h.group, h.seq, h.dtype, h.total),
            });
        }
        if h.len != expected_len as u64 {
            return Err(DistError::Mismatch {
                peer,
                ours: format!(
                    "{} expecting a frame of {} bytes",
                    Self::describe(self.op, self.group, self.seq, self.dtype, self.total),
                    expected_len
                ),
                theirs: format!("a frame of {} bytes", h.len),
            });
        }
        Ok(())
    }

    /// The header of a frame of this operation with a `len`-byte payload.
    pub(crate) fn header(&self, len: usize) -> [u8; HEADER_LEN] {
        FrameHeader {
            op: self.op,
            dtype: self.dtype,
            group: self.group,
            seq: self.seq,
            total: self.total,
            len: len as u64,
        }
        .encode()
    }
}
