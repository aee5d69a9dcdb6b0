//! This process's membership in a mesh: the threads that keep its liveness
//! (a heartbeat sender, a reader of each peer's witness; the protocol is
//! described in [`super::liveness`]) and the clean goodbye when the last
//! group over the mesh is dropped.

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::Mesh;
use super::liveness::{PeerStatus, lock};
use crate::error::DistError;
use crate::wire::{
    AbortPayload, FrameHeader, HEADER_LEN, HEARTBEAT_LEN, Heartbeat, MAX_ABORT_PAYLOAD, OpKind,
    WireError,
};

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
    /// acknowledgements, then closes every link. The heartbeats go on until
    /// the goodbyes are delivered (acknowledged, or that wait is over): a
    /// flush that waits on a slow peer (QUIC waits for its acknowledgements)
    /// must not make this rank look frozen to the others meanwhile. After a
    /// failure it only closes the links. The readers end with their
    /// connections.
    fn drop(&mut self) {
        let mesh = &self.mesh;
        let live = &mesh.live;
        *lock(&live.leaving) = true;
        if !mesh.has_failed() {
            let t = Instant::now();
            mesh.flush_links(t + live.timeout);
            let bye = FrameHeader::control(OpKind::Bye, 0);
            let deadline = Instant::now() + live.timeout;
            let told: Vec<usize> = (0..mesh.world)
                .filter(|&p| matches!(live.status(p), PeerStatus::Alive))
                .filter(|&p| {
                    mesh.witness(p)
                        .is_some_and(|w| w.send_frame_until(&bye, &[], deadline))
                })
                .collect();
            live.wait_for_acks(&told, deadline);
            tracing::debug!(rank = mesh.rank, ?told, took = ?t.elapsed(), "left the mesh");
        }
        *lock(&live.quiet) = true;
        live.quiet_cv.notify_all();
        if let Some(h) = self.sender.take() {
            let _ = h.join();
        }
        mesh.close_links();
    }
}

/// The heartbeat sender: every interval, this rank's heartbeat to every
/// live peer, until this rank's goodbyes are delivered.
fn heartbeat(mesh: &Mesh) {
    let live = &mesh.live;
    let every = live.interval();
    let h = FrameHeader::control(OpKind::Heartbeat, HEARTBEAT_LEN);
    let mut stop = lock(&live.quiet);
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
        stop = lock(&live.quiet);
        if !*stop {
            stop = live
                .quiet_cv
                .wait_timeout(stop, every)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// The reader of `peer`'s witness: records heartbeats, goodbyes and
/// announcements, and fails the mesh when the peer dies or falls silent.
pub(crate) fn listen(mesh: &Mesh, peer: usize) {
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
