//! The link over a segment: large payloads cut into slot-sized pieces, each
//! published in a slot with a doorbell byte on the socket; everything else
//! on the TCP link it wraps.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::segment::{SLOT, SLOTS, Segment, head_at, tail_at};
use crate::transports::link::{Link, TcpLink};
use crate::wire::HEADER_LEN;

/// Payloads from this size go through the segment; smaller ones stay on the
/// socket, where one write moves them.
pub(crate) const MIN_PAYLOAD: usize = 64 << 10;
/// The byte that tells the receiver a piece is in its slot.
const DOORBELL: u8 = 0xDB;

/// A TCP link whose large payloads go through a shared segment.
pub(crate) struct ShmLink {
    tcp: TcpLink,
    seg: Segment,
    /// The direction this side sends on (0 for the creator, the lower rank).
    out: usize,
    /// The collective timeout: how long a sender waits for a free slot.
    timeout: Duration,
    closed: AtomicBool,
}

impl ShmLink {
    /// `lower`: whether this side created the segment (the lower rank).
    pub(crate) fn new(tcp: TcpLink, seg: Segment, lower: bool, timeout: Duration) -> ShmLink {
        ShmLink {
            tcp,
            seg,
            out: usize::from(!lower),
            timeout,
            closed: AtomicBool::new(false),
        }
    }

    /// Waits until slot `head` of our direction is free (the receiver has
    /// taken slot `head - SLOTS`): spins briefly, then sleeps with backoff,
    /// giving up when the link closes, the peer goes away or the collective
    /// timeout passes without the receiver taking anything. The receiver's
    /// counter lives in memory the peer writes: a value that runs ahead of
    /// what was published is an error, never an overflow.
    fn wait_for_slot(&self, head: u64) -> io::Result<()> {
        let tail = self.seg.counter(tail_at(self.out));
        let mut seen = tail.load(Ordering::Acquire);
        let mut deadline = Instant::now() + self.timeout;
        let mut round = 0u32;
        loop {
            let in_flight = head.checked_sub(seen).ok_or_else(|| {
                out_of_step(format!(
                    "the receiver freed slot {seen}, past the {head} published"
                ))
            })?;
            if in_flight < SLOTS {
                return Ok(());
            }
            if self.closed.load(Ordering::Relaxed) {
                return Err(io::ErrorKind::NotConnected.into());
            }
            round += 1;
            if round < 100 {
                std::hint::spin_loop();
            } else if round < 120 {
                std::thread::yield_now();
            } else {
                if self.tcp.peer_closed() {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                if Instant::now() >= deadline {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                let us = 10u64 << (round - 120).min(6);
                std::thread::sleep(Duration::from_micros(us));
            }
            let now = tail.load(Ordering::Acquire);
            if now != seen {
                seen = now;
                deadline = Instant::now() + self.timeout;
            }
        }
    }

    /// Sends a large payload: the header, then each piece into a slot with its doorbell.
    fn send_pieces(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let head = self.seg.counter(head_at(self.out));
        for (i, piece) in payload.chunks(SLOT).enumerate() {
            let h = head.load(Ordering::Relaxed);
            self.wait_for_slot(h)?;
            // SAFETY: slot `h` is free (the receiver freed it) and only this
            // thread, holding the write lock, fills our direction's slots.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    piece.as_ptr(),
                    self.seg.slot(self.out, h),
                    piece.len(),
                )
            };
            head.store(h.wrapping_add(1), Ordering::Release);
            // The first doorbell travels with the header.
            let hdr: &[u8] = if i == 0 { header } else { &[] };
            self.tcp.write_frame(hdr, &[DOORBELL], None)?;
        }
        Ok(())
    }
}

impl Link for ShmLink {
    fn send_frame(&self, header: &[u8; HEADER_LEN], payload: &[u8]) -> io::Result<()> {
        let _g = self.tcp.lock_writes();
        if payload.len() < MIN_PAYLOAD {
            return self.tcp.write_frame(header, payload, None);
        }
        self.send_pieces(header, payload).inspect_err(|_| {
            // The peer may be inside this frame: no abort frame can follow.
            self.tcp.mark_torn();
        })
    }

    fn send_frame_until(
        &self,
        header: &[u8; HEADER_LEN],
        payload: &[u8],
        deadline: Instant,
    ) -> bool {
        // Only abort frames come this way: small, on the socket.
        self.tcp.send_frame_until(header, payload, deadline)
    }

    fn recv_exact(&self, buf: &mut [u8]) -> io::Result<()> {
        self.tcp.recv_exact(buf)
    }

    fn recv_exact_until(&self, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
        self.tcp.recv_exact_until(buf, deadline)
    }

    fn finish(&self, deadline: Instant) {
        self.tcp.finish(deadline)
    }

    fn recv_payload(&self, buf: &mut [u8]) -> io::Result<()> {
        if buf.len() < MIN_PAYLOAD {
            return self.tcp.recv_exact(buf);
        }
        let len = buf.len();
        self.recv_pieces(len, &mut |at, piece| {
            buf[at..at + piece.len()].copy_from_slice(piece)
        })
    }

    fn recv_payload_with(
        &self,
        len: usize,
        scratch: &mut [u8],
        f: &mut dyn FnMut(usize, &[u8]),
    ) -> io::Result<()> {
        if len < MIN_PAYLOAD {
            return self.tcp.recv_payload_with(len, scratch, f);
        }
        self.recv_pieces(len, f)
    }

    fn shutdown(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.tcp.shutdown();
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn as_tcp(&self) -> Option<&TcpLink> {
        Some(&self.tcp)
    }
}

/// The error of a shared memory link whose counters or doorbells disagree.
fn out_of_step(what: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("shared memory link out of step: {what}"),
    )
}

impl ShmLink {
    /// Takes a large payload piece by piece: each doorbell, then the slot.
    fn recv_pieces(&self, len: usize, f: &mut dyn FnMut(usize, &[u8])) -> io::Result<()> {
        let d = 1 - self.out;
        let (head, tail) = (self.seg.counter(head_at(d)), self.seg.counter(tail_at(d)));
        for at in (0..len).step_by(SLOT) {
            let n = SLOT.min(len - at);
            let mut bell = [0u8; 1];
            self.tcp.recv_exact(&mut bell)?;
            let t = tail.load(Ordering::Relaxed);
            let h = head.load(Ordering::Acquire);
            if bell[0] != DOORBELL {
                return Err(out_of_step(format!(
                    "byte {:#04x} where a doorbell was due",
                    bell[0]
                )));
            }
            // Both counters live in memory the peer can write: a slot is
            // taken only if it was published and not more than SLOTS ahead.
            if h <= t || h - t > SLOTS {
                return Err(out_of_step(format!(
                    "{h} slots published, {t} taken (at most {SLOTS} in flight)"
                )));
            }
            // SAFETY: the sender published slot `t` (head > t) and will not
            // touch it again until we free it below.
            let piece = unsafe { std::slice::from_raw_parts(self.seg.slot(d, t), n) };
            f(at, piece);
            tail.store(t + 1, Ordering::Release);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transports::shm::negotiate::{answer, offer};
    use std::net::{TcpListener, TcpStream};

    /// Two ends of a loopback connection, each as a shared memory link.
    fn pair(stall: Duration) -> (ShmLink, ShmLink) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let mut a = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut b, _) = l.accept().unwrap();
        let o = offer(&mut a, true).unwrap();
        let sb = answer(&mut b, true).unwrap().expect("same host");
        let sa = o.settle(&mut a).unwrap().expect("accepted");
        let a = TcpLink::new(a, stall, 0).unwrap();
        let b = TcpLink::new(b, stall, 0).unwrap();
        (
            ShmLink::new(a, sa, true, stall),
            ShmLink::new(b, sb, false, stall),
        )
    }

    fn pattern(n: usize, seed: u8) -> Vec<u8> {
        (0..n)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[test]
    fn frames_of_every_size_arrive_whole_and_in_order_both_ways() {
        let (a, b) = pair(Duration::from_secs(10));
        // Small (socket), exactly the threshold, several slots, more than all slots.
        let sizes = [
            0,
            1,
            1000,
            MIN_PAYLOAD - 1,
            MIN_PAYLOAD,
            SLOT + 3,
            40 * SLOT + 7,
        ];
        std::thread::scope(|s| {
            for (link, peer, seed) in [(&a, &b, 1u8), (&b, &a, 2u8)] {
                s.spawn(move || {
                    for (k, &n) in sizes.iter().enumerate() {
                        let h = [k as u8; HEADER_LEN];
                        link.send_frame(&h, &pattern(n, seed + k as u8)).unwrap();
                    }
                });
                s.spawn(move || {
                    for (k, &n) in sizes.iter().enumerate() {
                        let mut h = [0u8; HEADER_LEN];
                        peer.recv_exact(&mut h).unwrap();
                        assert_eq!(h, [k as u8; HEADER_LEN]);
                        let mut got = vec![0u8; n];
                        if k % 2 == 0 {
                            peer.recv_payload(&mut got).unwrap();
                        } else {
                            let mut scratch = vec![0u8; n];
                            let mut seen = 0;
                            peer.recv_payload_with(n, &mut scratch, &mut |at, p| {
                                assert_eq!(at, seen, "pieces come in order");
                                got[at..at + p.len()].copy_from_slice(p);
                                seen += p.len();
                            })
                            .unwrap();
                            assert_eq!(seen, n);
                        }
                        assert!(got == pattern(n, seed + k as u8), "frame {k} of {n} bytes");
                    }
                });
            }
        });
    }

    #[test]
    fn a_sender_with_no_free_slot_fails_when_the_peer_goes_away_or_stalls() {
        let (a, b) = pair(Duration::from_millis(300));
        let big = vec![7u8; (SLOTS as usize + 2) * SLOT];
        let t = Instant::now();
        let e = a.send_frame(&[0; HEADER_LEN], &big).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut, "nobody reads: {e}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        let (a, b2) = pair(Duration::from_secs(30));
        drop(b);
        let t = Instant::now();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(100));
                drop(b2);
            });
            let e = a.send_frame(&[0; HEADER_LEN], &big).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                ),
                "{e}"
            );
        });
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "far within the collective timeout"
        );
    }

    /// The counters live in memory the peer writes: a receiver counter that
    /// runs ahead of what was published, or a publisher counter too far
    /// ahead, is an error on the link, never a panic or an overflow.
    #[test]
    fn counters_a_peer_corrupts_are_errors_not_panics() {
        let (a, b) = pair(Duration::from_secs(5));
        // The receiver of a's direction "freed" slots a never published.
        a.seg
            .counter(tail_at(a.out))
            .store(u64::MAX, Ordering::Release);
        let e = a
            .send_frame(&[0; HEADER_LEN], &pattern(SLOT, 1))
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
        // A doorbell arrives for a slot whose publisher counter ran far ahead.
        let (a, b2) = pair(Duration::from_secs(5));
        drop(b);
        b2.seg
            .counter(head_at(1 - b2.out))
            .store(u64::MAX / 2, Ordering::Release);
        a.tcp.write_frame(&[], &[DOORBELL], None).unwrap();
        let mut buf = vec![0u8; MIN_PAYLOAD];
        let e = b2.recv_payload(&mut buf).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }
}
