//! The mesh: every rank's links to every peer, shared by a world group and
//! every group split from it, with what makes failures final and blame
//! exact. This file holds [`Mesh`] and the per-operation context that sends
//! and checks frames; `liveness` the state of each peer (heartbeats,
//! goodbyes, announcements of failure), which imports nothing of the mesh;
//! `membership` the threads that keep that state over the mesh's witnesses
//! and the goodbye when the last group over the mesh leaves.
//!
//! Layering: the mesh is built from the transports' connections and knows
//! nothing of the collectives run over it or of the launcher.

pub(crate) mod liveness;
pub(crate) mod membership;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use mlx_array::Dtype;

use crate::config::Config;
use crate::error::{DistError, Result};
use crate::transports::Connections;
use crate::transports::link::Link;
use crate::wire::{AbortPayload, FrameHeader, HEADER_LEN, MAX_ABORT_PAYLOAD, OpKind};
use liveness::{Liveness, PeerStatus};

/// Links to every peer, the liveness state, and what makes failures final.
pub(crate) struct Mesh {
    /// This process's world rank.
    pub rank: usize,
    /// World size.
    pub world: usize,
    /// `links[peer][link]`; empty for this rank.
    links: Vec<Vec<Box<dyn Link>>>,
    /// Connections per peer and direction.
    pub conns: usize,
    /// The collective timeout: the longest a wait on a live peer may last
    /// without progress.
    pub timeout: Duration,
    /// Messages at least this large run on the threaded ring even over TCP:
    /// with a sender and a receiver thread per lane the kernel's copies in
    /// and out of the sockets run on several cores at once, which measured
    /// faster for large messages; below it the polled ring's lack of thread
    /// hand-offs wins by far ([`Config::threaded_bytes`], default 4 MiB).
    pub threaded_bytes: usize,
    /// Ring pipelining granularity.
    pub block: usize,
    /// Small-message threshold.
    pub small: usize,
    op_lock: Mutex<()>,
    /// The first failure, once there is one: every later error reports it.
    poison: Mutex<Option<DistError>>,
    /// Set first thing on failure: senders stop at the next frame boundary.
    failed: AtomicBool,
    /// Set once the first failure's announcement went out and the links are
    /// closed: a thread that meets the failure later waits for it, so that
    /// a caller who exits on the error does not cut the announcement short.
    told: Mutex<bool>,
    told_cv: Condvar,
    /// Reduction scratch buffers, one per lane, kept between operations.
    pub scratch: Mutex<Vec<Vec<u64>>>,
    /// `witnesses[peer]`: the liveness channel to each peer (`None` for this
    /// rank), see [`crate::mesh::liveness`].
    witnesses: Vec<Option<Box<dyn Link>>>,
    /// What the witnesses said.
    pub live: Liveness,
    /// World ranks of the group of the operation in progress.
    members: Mutex<Vec<usize>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Mesh {
    pub(crate) fn new(cfg: &Config, connections: Connections) -> Mesh {
        let Connections { links, witnesses } = connections;
        let world = cfg.world();
        Mesh {
            rank: cfg.rank,
            world,
            links,
            conns: cfg.connections_per_peer,
            timeout: cfg.collective_timeout,
            block: cfg.block_bytes.max(64),
            threaded_bytes: cfg.threaded_bytes,
            small: cfg.small_bytes,
            op_lock: Mutex::new(()),
            poison: Mutex::new(None),
            failed: AtomicBool::new(false),
            told: Mutex::new(false),
            told_cv: Condvar::new(),
            scratch: Mutex::new(Vec::new()),
            witnesses,
            live: Liveness::new(world, cfg.liveness_timeout),
            members: Mutex::new(Vec::new()),
        }
    }

    /// The liveness channel to `peer`.
    pub(crate) fn witness(&self, peer: usize) -> Option<&dyn Link> {
        self.witnesses.get(peer).and_then(|w| w.as_deref())
    }

    /// The error with exact blame:
    /// - a closed connection to a peer becomes what that peer's witness
    ///   says: [`DistError::Aborted`] naming the rank it blames if it gave
    ///   up, [`DistError::PeerLeft`] if it closed its group cleanly,
    ///   [`DistError::Unresponsive`] if it fell silent;
    /// - a collective timeout becomes [`DistError::Late`] naming the live
    ///   ranks that never reached the operation, as their heartbeats say.
    pub(crate) fn attribute(&self, err: DistError) -> DistError {
        let (peer, op) = match &err {
            DistError::PeerClosed { peer, op } | DistError::Io { peer, op, .. } => (*peer, *op),
            DistError::Stalled { peer, op, timeout } => {
                return match self.live.status(*peer) {
                    PeerStatus::Alive | PeerStatus::Closed => self.blame_late(*peer, *op, *timeout),
                    status => self.judged(*peer, *op, status).unwrap_or(err),
                };
            }
            _ => return err,
        };
        let status = self.live.verdict(peer, Instant::now() + self.live.timeout);
        self.judged(peer, op, status).unwrap_or(err)
    }

    /// What a closed or stalled link to `peer` means, given its witness's verdict.
    fn judged(&self, peer: usize, op: OpKind, status: PeerStatus) -> Option<DistError> {
        Some(match status {
            PeerStatus::Announced(a) => DistError::Aborted {
                op,
                reporter: peer,
                culprit: a.culprit.map(|c| c as usize),
                reason: a.reason,
            },
            PeerStatus::Departed => DistError::PeerLeft { peer, op },
            PeerStatus::Silent(silent) => DistError::Unresponsive {
                peer,
                silent,
                timeout: self.live.timeout,
            },
            PeerStatus::Closed | PeerStatus::Alive => return None,
        })
    }

    /// A collective that waited `timeout` on `peer` without progress: the
    /// ranks of its group whose heartbeats say they are elsewhere are late;
    /// if every one is inside it, `peer` stalled.
    fn blame_late(&self, peer: usize, op: OpKind, timeout: Duration) -> DistError {
        let stalled = DistError::Stalled { peer, op, timeout };
        let Some(mine) = self.live.current() else {
            return stalled;
        };
        let mut late = Vec::new();
        let mut detail = Vec::new();
        for &m in lock(&self.members).iter().filter(|&&m| m != self.rank) {
            let (hb, age) = self.live.heartbeat_of(m);
            if hb.current == Some(mine) {
                continue;
            }
            late.push(m);
            let doing = match hb.current {
                Some((o, g, s)) => format!("is in {o} #{s} of group {g}"),
                None => "is not in a collective".to_string(),
            };
            detail.push(format!("rank {m} {doing} (heartbeat {age:.1?} ago)"));
        }
        if late.is_empty() {
            return stalled;
        }
        DistError::Late {
            late,
            op: mine.0,
            group: mine.1,
            seq: mine.2,
            timeout,
            detail: detail.join(", "),
        }
    }

    /// Takes the mesh for one operation; fails at once if an earlier one poisoned it.
    pub(crate) fn begin(&self) -> Result<MutexGuard<'_, ()>> {
        let g = lock(&self.op_lock);
        let first = lock(&self.poison).clone();
        if let Some(first) = first {
            // The failure may still be being announced by the thread that
            // met it; a program that exits on this error before then would
            // leave the peers not yet told to blame this rank.
            self.wait_told();
            return Err(DistError::Poisoned {
                culprit: first.culprit(),
                reason: first.to_string(),
            });
        }
        Ok(g)
    }

    /// Records (for heartbeats and blame) that this rank entered `op` #`seq`
    /// of group `group`, whose members are `members` (world ranks).
    pub(crate) fn enter(&self, op: OpKind, group: u32, seq: u64, members: &[usize]) {
        let mut m = lock(&self.members);
        m.clear();
        m.extend_from_slice(members);
        self.live.enter(op, group, seq);
    }

    /// Records that this rank left its operation.
    pub(crate) fn exit(&self) {
        self.live.exit();
    }

    /// Whether a failure has been recorded (threads of an operation stop at their next step).
    pub(crate) fn has_failed(&self) -> bool {
        self.failed.load(Ordering::Relaxed)
    }

    /// The first failure, if there was one.
    pub(crate) fn first_failure(&self) -> Option<DistError> {
        lock(&self.poison).clone()
    }

    pub(crate) fn link(&self, peer: usize, link: usize) -> &dyn Link {
        &*self.links[peer][link]
    }

    /// Records the first failure (attributed, see [`Mesh::attribute`]),
    /// tells every peer whom it blames (the witnesses first, then an abort
    /// frame on each data link, best effort and bounded), and closes every
    /// data link so that all blocked threads here and there wake up.
    pub(crate) fn fail(&self, err: &DistError) {
        if self.has_failed() {
            return self.wait_told();
        }
        let err = self.attribute(err.clone());
        {
            let mut p = lock(&self.poison);
            if p.is_some() {
                drop(p);
                return self.wait_told();
            }
            self.failed.store(true, Ordering::SeqCst);
            *p = Some(err.clone());
        }
        let failure = match &err {
            DistError::Aborted {
                culprit, reason, ..
            } => AbortPayload {
                culprit: culprit.map(|c| c as u32),
                reason: reason.clone(),
            },
            e => AbortPayload {
                culprit: e.culprit().map(|c| c as u32),
                reason: e.to_string(),
            },
        };
        tracing::error!(
            rank = self.rank,
            error = %err,
            culprit = %failure.culprit.map_or("unknown".into(), |c| c.to_string()),
            "collective failed; closing all links"
        );
        crate::report::failure(self.rank, failure.culprit, &err.to_string());
        let payload = failure.encode();
        let h = FrameHeader::control(OpKind::Abort, payload.len());
        // The witnesses of the live peers speak (and are delivered) before
        // any data link closes, so a peer that sees our links close finds
        // the announcement; a dead or silent peer hears nothing, and waiting
        // for its acknowledgement would only delay the others.
        let alive = |p: usize| matches!(self.live.status(p), PeerStatus::Alive);
        let deadline = Instant::now() + Duration::from_millis(500);
        for (p, w) in self.witnesses.iter().enumerate() {
            if let Some(w) = w.as_ref().filter(|_| alive(p))
                && w.send_frame_until(&h, &payload, deadline)
            {
                w.finish(deadline);
            }
        }
        // An abort frame on each data link too, for a peer reading it right
        // now; only where the link is free at once (an operation blocked on
        // it holds its write side, and the witnesses have told that peer).
        let deadline = Instant::now() + Duration::from_millis(20);
        for (_, row) in self.links.iter().enumerate().filter(|&(p, _)| alive(p)) {
            for l in row {
                let _ = l.send_frame_until(&h, &payload, deadline);
            }
        }
        for row in &self.links {
            for l in row {
                l.shutdown();
            }
        }
        *lock(&self.told) = true;
        self.told_cv.notify_all();
    }

    /// Waits (5 s at most: the announcement's sends are bounded at about
    /// half a second, more only on a starved host) until the first failure
    /// has been announced. The rank's collective thread and a witness
    /// reader often meet one failure at once, and a collective begun after
    /// it finds the mesh poisoned; without this, the one that lost the race
    /// returned the error, the program exited on it, and the peers that
    /// had not yet been told saw only this rank's links close and blamed it
    /// (seen in the suite: survivors of a killed rank 1 named rank 0, which
    /// had exited; the second time under a loaded suite, through a
    /// collective begun on the poisoned mesh, with a one-second bound).
    fn wait_told(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut told = lock(&self.told);
        while !*told {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return;
            }
            told = self
                .told_cv
                .wait_timeout(told, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// Delivers what this rank sent on every data link and ends its side
    /// (a clean exit), giving up at `deadline`.
    pub(crate) fn flush_links(&self, deadline: Instant) {
        for l in self.links.iter().flatten() {
            l.finish(deadline);
        }
    }

    /// Closes every link and witness.
    pub(crate) fn close_links(&self) {
        for l in self.links.iter().flatten() {
            l.shutdown();
        }
        for w in self.witnesses.iter().flatten() {
            w.shutdown();
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
        DistError::from_io(e, peer, self.op, self.mesh.timeout)
    }

    /// Sends one frame with `payload` to world rank `peer` over link `link`.
    pub(crate) fn send(&self, peer: usize, link: usize, payload: &[u8]) -> Result<()> {
        if self.mesh.failed.load(Ordering::Relaxed) {
            return Err(DistError::Poisoned {
                culprit: None,
                reason: "an earlier failure in this operation".into(),
            });
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
            // A frame cut short is a link that ended: the peer's witness,
            // which spoke before its data links closed, says whom it blamed.
            let a = match l.recv_exact(&mut p) {
                Ok(()) => AbortPayload::decode(&p),
                Err(e) => return Err(self.io(e, peer)),
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
