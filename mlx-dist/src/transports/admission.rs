//! Who may hold one of a rank's handshake slots while its job forms: the
//! limits that keep a flood of idle or stalled connections (a port scan, a
//! misbehaving client, a stranger reconnecting every few milliseconds) from
//! keeping the job's own ranks out. TCP and QUIC accept through the same
//! [`Admission`]:
//! - at most [`MAX_PENDING_HANDSHAKES`] connections handshake at once, and
//!   at most [`MAX_PENDING_PER_SOURCE`] of them from one source address, so
//!   that one flooding host cannot take every slot; a connection beyond
//!   either limit is closed at once (a rank's dialler retries);
//! - a connection that has not authenticated (proved it knows the job
//!   secret) within [`ACCEPT_HANDSHAKE_DEADLINE`] is dropped, freeing its
//!   slot for the next;
//! - every connection turned away is counted, so that a rank that waited in
//!   vain for a peer can say how many strangers it turned away meanwhile
//!   ([`crate::error::DistError::AcceptTimeout`]).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The most connections that may be handshaking with a rank at once.
pub(crate) const MAX_PENDING_HANDSHAKES: usize = 32;

/// The most of them from one source address: a few, so that the ranks of
/// a job on one host (which dial one link at a time each) rarely wait,
/// while one flooding host leaves most slots free.
pub(crate) const MAX_PENDING_PER_SOURCE: usize = 4;

/// How long an accepted connection has to authenticate, all its reads and
/// writes together (over QUIC: its TLS handshake and its first stream's):
/// an idle, stalled or trickling connection loses its slot after this. A
/// rank's own handshake takes milliseconds; one that misses the deadline
/// on a starved host is retried by its dialler.
pub(crate) const ACCEPT_HANDSHAKE_DEADLINE: Duration = Duration::from_secs(2);

#[derive(Default)]
struct Pending {
    total: usize,
    by_source: HashMap<IpAddr, usize>,
}

/// The handshake slots of one rank's acceptor, and the count of the
/// connections it turned away. Shared by the acceptor and the threads
/// that run the handshakes (a slot is held by a [`Slot`]).
#[derive(Default)]
pub(crate) struct Admission {
    pending: Mutex<Pending>,
    no_slot: AtomicU64,
    refused: AtomicU64,
}

/// One connection's handshake slot; given back when dropped.
pub(crate) struct Slot {
    admission: Arc<Admission>,
    source: IpAddr,
}

impl Admission {
    /// An acceptor's admission, every slot free.
    pub(crate) fn new() -> Arc<Admission> {
        Arc::new(Admission::default())
    }

    /// A slot for a connection from `source`, or `None` (counted as turned
    /// away) when every slot or its source's share is taken.
    pub(crate) fn admit(self: &Arc<Self>, source: IpAddr) -> Option<Slot> {
        let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let mine = p.by_source.get(&source).copied().unwrap_or(0);
        if p.total >= MAX_PENDING_HANDSHAKES || mine >= MAX_PENDING_PER_SOURCE {
            drop(p);
            self.no_slot.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        p.total += 1;
        *p.by_source.entry(source).or_insert(0) += 1;
        Some(Slot {
            admission: self.clone(),
            source,
        })
    }

    /// Counts a connection that held a slot but never authenticated
    /// (refused, failed or too slow).
    pub(crate) fn refused(&self) {
        self.refused.fetch_add(1, Ordering::Relaxed);
    }

    /// The connections turned away so far: all of them, and those closed
    /// for want of a slot.
    pub(crate) fn turned_away(&self) -> (u64, u64) {
        let no_slot = self.no_slot.load(Ordering::Relaxed);
        (no_slot + self.refused.load(Ordering::Relaxed), no_slot)
    }

    /// Warns, once rank `rank`'s links are up, how many connections were
    /// turned away while they formed (nothing when none was).
    pub(crate) fn warn_if_turned_away(&self, rank: usize) {
        let (turned_away, no_slot) = self.turned_away();
        if turned_away > 0 {
            tracing::warn!(
                rank,
                turned_away,
                no_slot,
                "connected; unauthenticated connections were turned away meanwhile"
            );
        }
    }

    /// How many handshakes are in progress.
    pub(crate) fn pending(&self) -> usize {
        self.pending.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut p = self
            .admission
            .pending
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        p.total -= 1;
        if let Some(n) = p.by_source.get_mut(&self.source) {
            *n -= 1;
            if *n == 0 {
                p.by_source.remove(&self.source);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_source_gets_a_few_slots_and_all_sources_the_rest() {
        let a = Admission::new();
        let flood: IpAddr = "127.0.0.2".parse().unwrap();
        let held: Vec<Slot> = (0..MAX_PENDING_PER_SOURCE)
            .map(|_| a.admit(flood).expect("a free slot"))
            .collect();
        assert!(a.admit(flood).is_none(), "a source beyond its share");
        assert_eq!(a.turned_away(), (1, 1));
        // Other sources fill the remaining slots, then nobody gets one.
        let mut others = Vec::new();
        for i in 0..MAX_PENDING_HANDSHAKES - MAX_PENDING_PER_SOURCE {
            let ip: IpAddr = format!("10.0.{}.{}", i / 3, i % 3).parse().unwrap();
            others.push(a.admit(ip).expect("a free slot for another source"));
        }
        assert!(a.admit("10.9.9.9".parse().unwrap()).is_none());
        assert_eq!(a.pending(), MAX_PENDING_HANDSHAKES);
        // A slot given back is free again, for its source too.
        drop(held);
        assert_eq!(a.pending(), MAX_PENDING_HANDSHAKES - MAX_PENDING_PER_SOURCE);
        let _again = a.admit(flood).expect("the source's share is back");
        a.refused();
        assert_eq!(a.turned_away(), (3, 2));
    }
}
