//! The pipelined ring: reduce-scatter then all-gather (or either half alone),
//! run on several lanes at once (both ring directions times the connections
//! per peer). Each lane has a sender thread and a receiving thread; chunks are
//! cut into blocks, and a block is forwarded as soon as it has been received
//! and reduced, so reduction overlaps transfer.
//!
//! With `n` ranks a lane's data is cut into `n` chunks indexed by ring
//! position. At position `p`, receive step `i` (of `m`) takes chunk
//! `(p - i - 1 + o) mod n` from the left; the first send is chunk
//! `(p + o) mod n` and every later send forwards what the previous receive
//! step produced. All-reduce runs `m = 2(n-1)` steps (reducing in the first
//! `n-1`), reduce-scatter `n-1` reducing steps with `o = -1` so position `p`
//! ends owning chunk `p`, all-gather `n-1` copying steps with `o = 0`.

use std::ops::Range;
use std::sync::{OnceLock, mpsc};

use crate::error::{DistError, Result};
use crate::mesh::OpCtx;
use crate::reduce::{ReduceOp, reduce_into};

/// Which ring algorithm to run.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Phase {
    /// Reduce-scatter then all-gather.
    AllReduce(ReduceOp),
    /// Reduce-scatter only; position `p` ends with chunk `p` reduced.
    ReduceScatter(ReduceOp),
    /// All-gather only; position `p` starts with chunk `p`.
    AllGather,
}

/// One lane: a ring over some links, and the byte ranges of its chunks by position.
pub(crate) struct Lane {
    /// Chunk byte ranges in the buffer, indexed by ring position.
    pub chunks: Vec<Range<usize>>,
    /// Our position in this lane's ring.
    pub pos: usize,
    /// World rank we send to.
    pub right: usize,
    /// World rank we receive from.
    pub left: usize,
    /// Link index used (towards both neighbours).
    pub link: usize,
}

/// A buffer shared between a lane's sender and receiver threads.
#[derive(Clone, Copy)]
struct SharedBuf {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the ring schedule gives the sender and the receiver disjoint byte
// ranges at any moment (see `run_lane`); the buffer outlives the scope.
unsafe impl Send for SharedBuf {}
unsafe impl Sync for SharedBuf {}

impl SharedBuf {
    /// # Safety
    /// No other thread may be writing `r` while the slice lives.
    unsafe fn get(&self, r: Range<usize>) -> &[u8] {
        assert!(r.start <= r.end && r.end <= self.len);
        unsafe { std::slice::from_raw_parts(self.ptr.add(r.start), r.len()) }
    }

    /// # Safety
    /// No other thread may be reading or writing `r` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn get_mut(&self, r: Range<usize>) -> &mut [u8] {
        assert!(r.start <= r.end && r.end <= self.len);
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }
}

/// Splits `len` elements into `parts` nearly equal ranges (the first ones one larger).
pub(crate) fn split_even(len: usize, parts: usize) -> Vec<Range<usize>> {
    let (q, r) = (len / parts, len % parts);
    let mut start = 0;
    (0..parts)
        .map(|i| {
            let l = q + usize::from(i < r);
            let rg = start..start + l;
            start += l;
            rg
        })
        .collect()
}

fn blocks(r: Range<usize>, block: usize) -> impl Iterator<Item = Range<usize>> {
    (r.start..r.end)
        .step_by(block.max(1))
        .map(move |s| s..(s + block).min(r.end))
}

/// The first error of an operation; recording it fails the mesh so every blocked thread wakes.
struct FirstError<'a> {
    ctx: &'a OpCtx<'a>,
    err: OnceLock<DistError>,
}

impl FirstError<'_> {
    /// Records a send-side failure a moment late: the receiving side usually
    /// learns more (an abort frame naming the rank that failed first).
    fn record_late(&self, e: DistError) {
        if self.err.get().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.record(e);
    }

    fn record(&self, e: DistError) {
        if self.err.get().is_none() {
            self.ctx.mesh.fail(&e, self.ctx.op);
            let _ = self.err.set(e);
        }
    }
}

/// Runs `phase` on every lane over `buf`, in parallel.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    buf: &mut [u8],
    lanes: &[Lane],
    n: usize,
    phase: Phase,
) -> Result<()> {
    let shared = SharedBuf {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    };
    let first = FirstError {
        ctx,
        err: OnceLock::new(),
    };
    let words = ctx.mesh.block.div_ceil(8) + 1;
    let mut scratch =
        std::mem::take(&mut *ctx.mesh.scratch.lock().unwrap_or_else(|p| p.into_inner()));
    scratch.resize_with(lanes.len().max(scratch.len()), Vec::new);
    for v in &mut scratch {
        v.resize(words, 0);
    }
    std::thread::scope(|s| {
        let mut bufs = scratch.iter_mut();
        let first_buf = bufs.next().expect("at least one lane");
        for (lane, buf) in lanes[1..].iter().zip(bufs) {
            let first = &first;
            s.spawn(move || run_lane(ctx, shared, lane, n, phase, first, buf.as_mut_slice()));
        }
        run_lane(
            ctx,
            shared,
            &lanes[0],
            n,
            phase,
            &first,
            first_buf.as_mut_slice(),
        );
    });
    *ctx.mesh.scratch.lock().unwrap_or_else(|p| p.into_inner()) = scratch;
    match first.err.into_inner() {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

fn run_lane(
    ctx: &OpCtx<'_>,
    buf: SharedBuf,
    lane: &Lane,
    n: usize,
    phase: Phase,
    first: &FirstError<'_>,
    scratch: &mut [u64],
) {
    let elem = ctx.dtype.size_of();
    let block = (ctx.mesh.block / elem).max(1) * elem;
    let (steps, offset, reduce_steps, op) = match phase {
        Phase::AllReduce(op) => (2 * (n - 1), 0, n - 1, Some(op)),
        Phase::ReduceScatter(op) => (n - 1, n - 1, n - 1, Some(op)),
        Phase::AllGather => (n - 1, 0, 0, None),
    };
    let chunk = |k: usize| lane.chunks[k % n].clone();
    let (tx, rx) = mpsc::channel::<Range<usize>>();
    std::thread::scope(|s| {
        // Owned by this closure so that an early return closes the channel.
        let tx = tx;
        s.spawn(move || {
            for r in rx {
                // SAFETY: `r` was either never written in this operation or was
                // handed over by the receiver after its last write; the receiver
                // writes it again only after the right neighbour has received it
                // (ring causality), i.e. after this send completed.
                let data = unsafe { buf.get(r) };
                if let Err(e) = ctx.send(lane.right, lane.link, data) {
                    first.record_late(e);
                    return;
                }
            }
        });
        for b in blocks(chunk(lane.pos + offset), block) {
            let _ = tx.send(b);
        }
        let scratch: &mut [u8] = bytemuck::cast_slice_mut(scratch);
        for i in 0..steps {
            let c = chunk(lane.pos + offset + 2 * n - i - 1);
            for b in blocks(c, block) {
                let res = match op {
                    Some(op) if i < reduce_steps => {
                        let tmp = &mut scratch[..b.len()];
                        ctx.recv(lane.left, lane.link, tmp).map(|()| {
                            // SAFETY: the sender is not reading this chunk now (see above).
                            reduce_into(unsafe { buf.get_mut(b.clone()) }, tmp, ctx.dtype, op)
                        })
                    }
                    // SAFETY: as above.
                    _ => ctx.recv(lane.left, lane.link, unsafe { buf.get_mut(b.clone()) }),
                };
                if let Err(e) = res {
                    first.record(e);
                    return;
                }
                if i + 1 < steps {
                    let _ = tx.send(b);
                }
            }
        }
        drop(tx);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_even_covers_everything() {
        for len in [0, 1, 5, 100, 101] {
            for parts in 1..6 {
                let r = split_even(len, parts);
                assert_eq!(r.len(), parts);
                assert_eq!(r[0].start, 0);
                assert_eq!(r[parts - 1].end, len);
                assert!(r.windows(2).all(|w| w[0].end == w[1].start));
            }
        }
        let b: Vec<_> = blocks(3..10, 4).collect();
        assert_eq!(b, vec![3..7, 7..10]);
    }
}
