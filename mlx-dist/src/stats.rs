//! Process-wide counters of what this process hands to collectives.
//!
//! [`payload_bytes`] counts the bytes of the buffers this process passes to
//! the collectives of every [`crate::Group`] with more than one rank:
//! `all_reduce` (and `all_sum`/`all_max`/`all_min`) its buffer, `all_gather`
//! its own input, `sum_scatter` its whole input, `send` its buffer. Groups of
//! one move nothing and count nothing. [`sent_bytes`] is what the ring
//! algorithms put on the wire for those payloads, per rank, with `n` ranks:
//! `2(n-1)/n` of an all-reduce's buffer, `(n-1)/n` of a sum-scatter's input,
//! `n-1` times an all-gather's input, a send's whole buffer (at world 2
//! an all-reduce sends its buffer once). Both only grow; take differences.

use std::sync::atomic::{AtomicU64, Ordering};

static PAYLOAD: AtomicU64 = AtomicU64::new(0);
static SENT: AtomicU64 = AtomicU64::new(0);

/// Which collective a payload was handed to (for [`record`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// All-reduce of a buffer in place.
    AllReduce,
    /// All-gather of this rank's input.
    AllGather,
    /// Sum-scatter (reduce-scatter) of an input of `n` blocks.
    SumScatter,
    /// Point-to-point send.
    Send,
}

/// Bytes this process has handed to collectives of groups of two or more ranks.
pub fn payload_bytes() -> u64 {
    PAYLOAD.load(Ordering::Relaxed)
}

/// Bytes the ring algorithms send from this process for those payloads.
pub fn sent_bytes() -> u64 {
    SENT.load(Ordering::Relaxed)
}

/// What a payload of `bytes` handed to `op` in a group of `ranks` sends from each rank.
pub fn ring_sent(op: Op, bytes: u64, ranks: usize) -> u64 {
    let n = ranks as u64;
    if n < 2 {
        return 0;
    }
    match op {
        Op::AllReduce => 2 * (n - 1) * bytes / n,
        Op::SumScatter => (n - 1) * bytes / n,
        Op::AllGather => (n - 1) * bytes,
        Op::Send => bytes,
    }
}

/// Counts a payload of `bytes` handed to `op` in a group of `ranks`.
pub fn record(op: Op, bytes: usize, ranks: usize) {
    if ranks < 2 {
        return;
    }
    PAYLOAD.fetch_add(bytes as u64, Ordering::Relaxed);
    SENT.fetch_add(ring_sent(op, bytes as u64, ranks), Ordering::Relaxed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_bytes_per_rank() {
        assert_eq!(ring_sent(Op::AllReduce, 1000, 2), 1000);
        assert_eq!(ring_sent(Op::AllReduce, 900, 3), 1200);
        assert_eq!(ring_sent(Op::SumScatter, 1000, 2), 500);
        assert_eq!(ring_sent(Op::AllGather, 500, 2), 500);
        assert_eq!(ring_sent(Op::Send, 7, 4), 7);
        assert_eq!(ring_sent(Op::AllReduce, 1000, 1), 0);
    }

    #[test]
    fn collectives_of_two_ranks_count_and_of_one_do_not() {
        // In-process world of two threads over loopback, as the group tests do.
        let before = (payload_bytes(), sent_bytes());
        crate::Group::single().all_sum(&mut [1.0f32; 16]).unwrap();
        assert_eq!((payload_bytes(), sent_bytes()), before);
        let results: Vec<f32> = crate::run_local(2, |g| {
            let mut x = vec![1.0f32; 256];
            g.all_sum(&mut x).unwrap();
            g.all_gather(&[0.0f32; 16]).unwrap();
            g.sum_scatter(&[1.0f32; 128]).unwrap();
            x[0]
        })
        .unwrap();
        assert_eq!(results, vec![2.0, 2.0]);
        // Both threads count in this process; other tests may run at the same time.
        let payload = payload_bytes() - before.0;
        let sent = sent_bytes() - before.1;
        assert!(payload >= 2 * (1024 + 64 + 512), "payload {payload}");
        assert!(sent >= 2 * (1024 + 64 + 256), "sent {sent}");
    }
}
