//! Liveness, kept apart from progress.
//!
//! Every pair of ranks has one channel beside its data links (a TCP
//! connection, or a QUIC stream): the *witness*. A thread
//! ([`super::membership`]) sends a heartbeat on every witness each fifth of the liveness timeout,
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
//!   waits (bounded) for each peer's `ByeAck`, heartbeating all along, so
//!   that neither its closing connections nor a slow delivery are mistaken
//!   for a crash or a freeze while a peer finishes its last collective; a
//!   peer that said `Bye` is never declared unresponsive.

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::heartbeat_interval;
use crate::wire::{AbortPayload, Heartbeat, OpKind};

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
    pub(super) own: Mutex<Heartbeat>,
    /// Set when this rank closes its group: peers that close are no failure.
    pub(super) leaving: Mutex<bool>,
    /// Set once this rank's goodbyes are delivered (or after a failure):
    /// the heartbeats stop.
    pub(super) quiet: Mutex<bool>,
    pub(super) quiet_cv: Condvar,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
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
            quiet: Mutex::new(false),
            quiet_cv: Condvar::new(),
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
    pub(super) fn settle(&self, peer: usize, status: PeerStatus) -> bool {
        let mut g = lock(&self.peers);
        if !matches!(g[peer].status, PeerStatus::Alive) {
            return false;
        }
        g[peer].status = status;
        self.changed.notify_all();
        true
    }

    pub(super) fn heard(&self, peer: usize, hb: Heartbeat) {
        let mut g = lock(&self.peers);
        g[peer].last_heard = Instant::now();
        g[peer].heartbeat = hb;
    }

    pub(super) fn acked(&self, peer: usize) {
        lock(&self.peers)[peer].acked = true;
        self.changed.notify_all();
    }

    pub(super) fn last_heard(&self, peer: usize) -> Instant {
        lock(&self.peers)[peer].last_heard
    }

    pub(super) fn is_leaving(&self) -> bool {
        *lock(&self.leaving)
    }

    /// Waits until every peer in `peers` acknowledged our goodbye or is no
    /// longer alive, or `deadline` passes.
    pub(super) fn wait_for_acks(&self, peers: &[usize], deadline: Instant) {
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
