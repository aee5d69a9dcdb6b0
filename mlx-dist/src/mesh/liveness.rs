//! Liveness, kept apart from progress.
//!
//! Every pair of ranks has one channel beside its data links (a TCP
//! connection, or a QUIC stream): the *witness*. A thread of this module
//! sends a heartbeat on every witness each fifth of the liveness timeout,
//! whatever the evaluator is doing, and one reader thread per peer listens
//! to that peer's witness. So a rank that computes for minutes is alive
//! (its heartbeats keep coming, and a collective waits for it up to the
//! collective timeout), while one that is frozen, stopped, or cut off by its
//! host or the network is declared dead after the liveness timeout, and one
//! that exits or is killed as soon as its connection ends.
//!
//! The witness also carries the news that make blame exact and exits clean:
//! - a rank that gives up *announces* whom it blames (an `Abort` frame)
//!   before it closes its data links, so a peer that sees those links close
//!   can tell a relayed failure from a dead rank;
//! - a heartbeat says which collective its sender is inside, so a rank whose
//!   collective times out names the live ranks that never reached it;
//! - a rank that closes its group says `Bye` after its data is delivered and
//!   waits (bounded) for each peer's `ByeAck`, so its closing connections
//!   are not mistaken for a crash while a peer finishes its last collective.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::error::DistError;
use crate::mesh::Mesh;
use crate::wire::{
    AbortPayload, FrameHeader, HEADER_LEN, HEARTBEAT_LEN, Heartbeat, MAX_ABORT_PAYLOAD, OpKind,
    WireError,
};

/// How often heartbeats go out for a liveness `timeout`: a fifth of it,
/// from 10 ms to 1 s.
pub(crate) fn heartbeat_interval(timeout: Duration) -> Duration {
    (timeout / 5).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// What this rank knows about a peer.
#[derive(Clone, Debug)]
pub(crate) enum PeerStatus {
    /// Heartbeats arrive.
    Alive,
    /// The peer gave up and named the rank it blames.
    Announced(AbortPayload),
    /// The peer closed its group cleanly.
    Departed,
    /// Its witness connection ended without a goodbye: it exited, crashed or was killed.
    Closed,
    /// No heartbeat for this long (the liveness timeout ran out).
    Silent(Duration),
}

struct Peer {
    status: PeerStatus,
    last_heard: Instant,
    heartbeat: Heartbeat,
    /// The peer acknowledged our goodbye.
    acked: bool,
}

/// The liveness state of one mesh: what each peer's witness said, and what
/// this rank's heartbeats say about it.
pub(crate) struct Liveness {
    /// The liveness timeout.
    pub timeout: Duration,
    peers: Mutex<Vec<Peer>>,
    changed: Condvar,
    /// This rank's current operation and count, sent in every heartbeat.
    own: Mutex<Heartbeat>,
    /// Set when this rank closes its group: the heartbeats stop, and peers
    /// that close are no failure.
    leaving: Mutex<bool>,
    leaving_cv: Condvar,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Liveness {
    /// The state of a `world`-rank mesh whose peers all count as just heard.
    pub(crate) fn new(world: usize, timeout: Duration) -> Liveness {
        let now = Instant::now();
        Liveness {
            timeout,
            peers: Mutex::new(
                (0..world)
                    .map(|_| Peer {
                        status: PeerStatus::Alive,
                        last_heard: now,
                        heartbeat: Heartbeat::default(),
                        acked: false,
                    })
                    .collect(),
            ),
            changed: Condvar::new(),
            own: Mutex::new(Heartbeat::default()),
            leaving: Mutex::new(false),
            leaving_cv: Condvar::new(),
        }
    }

    /// How often heartbeats go out (see [`heartbeat_interval`]).
    pub(crate) fn interval(&self) -> Duration {
        heartbeat_interval(self.timeout)
    }

    /// What is known about `peer` now.
    pub(crate) fn status(&self, peer: usize) -> PeerStatus {
        lock(&self.peers)[peer].status.clone()
    }

    /// What `peer` turned out to be once its witness said so, waiting until
    /// `deadline` while it still counts as alive.
    pub(crate) fn verdict(&self, peer: usize, deadline: Instant) -> PeerStatus {
        let mut g = lock(&self.peers);
        loop {
            if !matches!(g[peer].status, PeerStatus::Alive) {
                return g[peer].status.clone();
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return PeerStatus::Alive;
            }
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// `peer`'s last heartbeat and how long ago it arrived.
    pub(crate) fn heartbeat_of(&self, peer: usize) -> (Heartbeat, Duration) {
        let g = lock(&self.peers);
        (g[peer].heartbeat, g[peer].last_heard.elapsed())
    }

    /// Records that this rank entered an operation (sent in heartbeats).
    pub(crate) fn enter(&self, op: OpKind, group: u32, seq: u64) {
        let mut own = lock(&self.own);
        own.current = Some((op, group, seq));
        own.begun += 1;
    }

    /// Records that this rank left its operation.
    pub(crate) fn exit(&self) {
        lock(&self.own).current = None;
    }

    /// The operation this rank is inside, if any.
    pub(crate) fn current(&self) -> Option<(OpKind, u32, u64)> {
        lock(&self.own).current
    }

    /// Moves an alive `peer` to `status`; false if it had already been settled.
    fn settle(&self, peer: usize, status: PeerStatus) -> bool {
        let mut g = lock(&self.peers);
        if !matches!(g[peer].status, PeerStatus::Alive) {
            return false;
        }
        g[peer].status = status;
        self.changed.notify_all();
        true
    }

    fn heard(&self, peer: usize, hb: Heartbeat) {
        let mut g = lock(&self.peers);
        g[peer].last_heard = Instant::now();
        g[peer].heartbeat = hb;
    }

    fn acked(&self, peer: usize) {
        lock(&self.peers)[peer].acked = true;
        self.changed.notify_all();
    }

    fn last_heard(&self, peer: usize) -> Instant {
        lock(&self.peers)[peer].last_heard
    }

    fn is_leaving(&self) -> bool {
        *lock(&self.leaving)
    }

    /// Waits until every peer in `peers` acknowledged our goodbye or is no
    /// longer alive, or `deadline` passes.
    fn wait_for_acks(&self, peers: &[usize], deadline: Instant) {
        let mut g = lock(&self.peers);
        loop {
            let pending = peers
                .iter()
                .any(|&p| !g[p].acked && matches!(g[p].status, PeerStatus::Alive));
            let left = deadline.saturating_duration_since(Instant::now());
            if !pending || left.is_zero() {
                return;
            }
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// This process's membership in a mesh: the mesh, and the threads that keep
/// its liveness (one heartbeat sender, one reader per peer). Groups hold it;
/// dropping the last one leaves the mesh cleanly (see [`Membership::drop`]).
pub(crate) struct Membership {
    mesh: Arc<Mesh>,
    sender: Option<JoinHandle<()>>,
}

impl std::ops::Deref for Membership {
    type Target = Mesh;
    fn deref(&self) -> &Mesh {
        &self.mesh
    }
}

impl Membership {
    /// Starts heartbeating to every peer of `mesh` and listening to each.
    pub(crate) fn start(mesh: Mesh) -> std::io::Result<Membership> {
        let mesh = Arc::new(mesh);
        for peer in (0..mesh.world).filter(|&p| mesh.witness(p).is_some()) {
            let m = mesh.clone();
            std::thread::Builder::new()
                .name(format!("mlx-dist-listen-{peer}"))
                .spawn(move || listen(&m, peer))?;
        }
        let m = mesh.clone();
        let sender = std::thread::Builder::new()
            .name("mlx-dist-heartbeat".into())
            .spawn(move || heartbeat(&m))?;
        Ok(Membership {
            mesh,
            sender: Some(sender),
        })
    }
}

impl Drop for Membership {
    /// Closes the group cleanly: delivers what was sent, says goodbye to
    /// every live peer and waits (at most the liveness timeout) for their
    /// acknowledgements, then closes every link. After a failure it only
    /// closes the links. The readers end with their connections.
    fn drop(&mut self) {
        let mesh = &self.mesh;
        let live = &mesh.live;
        *lock(&live.leaving) = true;
        live.leaving_cv.notify_all();
        if let Some(h) = self.sender.take() {
            let _ = h.join();
        }
        if !mesh.has_failed() {
            let deadline = Instant::now() + live.timeout;
            mesh.flush_links(deadline);
            let bye = FrameHeader::control(OpKind::Bye, 0);
            let told: Vec<usize> = (0..mesh.world)
                .filter(|&p| matches!(live.status(p), PeerStatus::Alive))
                .filter(|&p| {
                    mesh.witness(p)
                        .is_some_and(|w| w.send_frame_until(&bye, &[], deadline))
                })
                .collect();
            live.wait_for_acks(&told, deadline);
        }
        mesh.close_links();
    }
}

/// The heartbeat sender: every interval, this rank's heartbeat to every live peer.
fn heartbeat(mesh: &Mesh) {
    let live = &mesh.live;
    let every = live.interval();
    let h = FrameHeader::control(OpKind::Heartbeat, HEARTBEAT_LEN);
    let mut stop = lock(&live.leaving);
    loop {
        if *stop || mesh.has_failed() {
            return;
        }
        drop(stop);
        let payload = lock(&live.own).encode();
        for p in 0..mesh.world {
            if let (Some(w), PeerStatus::Alive) = (mesh.witness(p), live.status(p)) {
                // A peer that takes nothing is the reader's business, not ours.
                let _ = w.send_frame_until(&h, &payload, Instant::now() + every);
            }
        }
        stop = lock(&live.leaving);
        if !*stop {
            stop = live
                .leaving_cv
                .wait_timeout(stop, every)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The reader of `peer`'s witness: records heartbeats, goodbyes and
/// announcements, and fails the mesh when the peer dies or falls silent.
fn listen(mesh: &Mesh, peer: usize) {
    let live = &mesh.live;
    let Some(w) = mesh.witness(peer) else { return };
    // The first heartbeat may come a little late: the peer finishes setting
    // up its own links after ours.
    let mut slack = live.timeout;
    let fail = |status: PeerStatus, err: DistError| {
        if live.settle(peer, status) && !live.is_leaving() {
            mesh.fail(&err);
        }
    };
    let wire = |source: WireError| DistError::Wire {
        peer,
        op: OpKind::Heartbeat,
        source,
    };
    loop {
        let deadline = live.last_heard(peer) + live.timeout + slack;
        let mut hb = [0u8; HEADER_LEN];
        if let Err(e) = w.recv_exact_until(&mut hb, deadline) {
            if e.kind() == std::io::ErrorKind::TimedOut {
                let silent = live.last_heard(peer).elapsed();
                let timeout = live.timeout;
                let err = DistError::Unresponsive {
                    peer,
                    silent,
                    timeout,
                };
                fail(PeerStatus::Silent(silent), err);
            } else {
                let err = DistError::PeerClosed {
                    peer,
                    op: OpKind::Heartbeat,
                };
                fail(PeerStatus::Closed, err);
            }
            return;
        }
        slack = Duration::ZERO;
        let h = match FrameHeader::decode(&hb) {
            Ok(h) => h,
            Err(e) => return fail(PeerStatus::Closed, wire(e)),
        };
        let read_deadline = Instant::now() + live.timeout;
        match h.op {
            OpKind::Heartbeat => {
                if h.len != HEARTBEAT_LEN as u64 {
                    return fail(
                        PeerStatus::Closed,
                        wire(WireError::BadHeartbeat(h.len as usize)),
                    );
                }
                let mut p = [0u8; HEARTBEAT_LEN];
                if w.recv_exact_until(&mut p, read_deadline).is_err() {
                    continue; // the next read reports what happened
                }
                match Heartbeat::decode(&p) {
                    Ok(b) => live.heard(peer, b),
                    Err(e) => return fail(PeerStatus::Closed, wire(e)),
                }
            }
            OpKind::Abort => {
                let mut p = vec![0u8; (h.len as usize).min(MAX_ABORT_PAYLOAD)];
                let a = match w.recv_exact_until(&mut p, read_deadline) {
                    Ok(()) => AbortPayload::decode(&p),
                    Err(_) => AbortPayload {
                        culprit: None,
                        reason: "(truncated abort frame)".into(),
                    },
                };
                let err = DistError::Aborted {
                    op: OpKind::Heartbeat,
                    reporter: peer,
                    culprit: a.culprit.map(|c| c as usize),
                    reason: a.reason.clone(),
                };
                return fail(PeerStatus::Announced(a), err);
            }
            OpKind::Bye => {
                live.settle(peer, PeerStatus::Departed);
                let _ = w.send_frame_until(
                    &FrameHeader::control(OpKind::ByeAck, 0),
                    &[],
                    read_deadline,
                );
                // Read on until the peer closes (its acknowledgement of our
                // own goodbye may still come).
            }
            OpKind::ByeAck => live.acked(peer),
            other => return fail(PeerStatus::Closed, wire(WireError::BadOp(other as u8))),
        }
    }
}
