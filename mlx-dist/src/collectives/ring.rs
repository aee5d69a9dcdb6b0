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
//!
//! The ring works in place on one buffer, except a reduce-scatter called
//! through [`reduce_scatter_into`]: it only reads its input and reduces each
//! received block into the output (this rank's chunk) or into scratch (the
//! chunks passing through), so a large input is never copied (see `Places`).

use std::ops::Range;
use std::sync::{OnceLock, mpsc};

use std::io::IoSlice;
use std::time::Instant;

use crate::error::{DistError, Result};
use crate::mesh::OpCtx;
use crate::reduce::{ReduceOp, reduce_into};
use crate::transports::link::{TcpLink, poll_until};
use crate::wire::HEADER_LEN;

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

/// Where the ring reads and writes the chunks of its (rank-major) buffer.
#[derive(Clone, Copy)]
enum Places {
    /// One buffer, read and overwritten in place.
    InPlace(SharedBuf),
    /// A reduce-scatter over an input it only reads: the blocks it receives
    /// are reduced into this rank's output block (its own chunk) or into
    /// scratch (the chunks only passing through, with more than two ranks),
    /// so nothing the size of the input is allocated.
    Split {
        /// The input, `n` blocks of `block` bytes; never written.
        src: SharedBuf,
        /// This rank's block of the result.
        out: SharedBuf,
        /// Blocks of other owners being reduced on their way round, one
        /// slot per owner but this rank (empty with two ranks).
        scratch: SharedBuf,
        /// Bytes per owner block.
        block: usize,
        /// This rank's block index.
        own: usize,
        /// Ranks (blocks).
        n: usize,
    },
}

impl Places {
    /// The bytes to send for `r`: `first` blocks (a lane's first chunk) are
    /// the input's, every other block one that this rank received.
    ///
    /// # Safety
    /// No other thread may be writing `r` while the slice lives.
    unsafe fn read(&self, r: Range<usize>, first: bool) -> &[u8] {
        match self {
            Places::InPlace(buf) => unsafe { buf.get(r) },
            Places::Split { src, .. } if first => unsafe { src.get(r) },
            Places::Split { .. } => unsafe { self.write(r) },
        }
    }

    /// Where the received bytes of `r` go (all within one owner's block).
    ///
    /// # Safety
    /// No other thread may be reading or writing `r` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    unsafe fn write(&self, r: Range<usize>) -> &mut [u8] {
        match self {
            Places::InPlace(buf) => unsafe { buf.get_mut(r) },
            &Places::Split {
                ref out,
                ref scratch,
                block,
                own,
                n,
                ..
            } => {
                let (owner, at) = (r.start / block, r.start % block);
                assert!(r.end <= (owner + 1) * block, "a range crosses blocks");
                if owner == own {
                    unsafe { out.get_mut(at..at + r.len()) }
                } else {
                    let slot = (owner + n - own - 1) % n;
                    let at = slot * block + at;
                    unsafe { scratch.get_mut(at..at + r.len()) }
                }
            }
        }
    }

    /// Where a received block `r` is reduced: [`Places::write`]'s bytes,
    /// holding this rank's own contribution (for `Split`, copied from the
    /// input first; in place they already do).
    ///
    /// # Safety
    /// As [`Places::write`].
    #[allow(clippy::mut_from_ref)]
    unsafe fn reduce_target(&self, r: Range<usize>) -> &mut [u8] {
        let dst = unsafe { self.write(r.clone()) };
        if let Places::Split { src, .. } = self {
            dst.copy_from_slice(unsafe { src.get(r) });
        }
        dst
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
pub(crate) struct FirstError<'a> {
    ctx: &'a OpCtx<'a>,
    err: OnceLock<DistError>,
}

impl<'a> FirstError<'a> {
    /// No error yet, for an operation on `ctx`.
    pub(crate) fn new(ctx: &'a OpCtx<'a>) -> Self {
        FirstError {
            ctx,
            err: OnceLock::new(),
        }
    }

    /// The first error recorded, if any.
    pub(crate) fn into_result(self) -> Result<()> {
        match self.err.into_inner() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl FirstError<'_> {
    /// Records a send-side failure a moment late: the receiving side usually
    /// learns more (an abort frame naming the rank that failed first).
    pub(crate) fn record_late(&self, e: DistError) {
        if self.err.get().is_none() {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        self.record(e);
    }

    /// Keeps `e` if it is the operation's first error, and only then fails
    /// the mesh. The error is kept *before* the mesh fails: failing closes
    /// this rank's links, and the errors other threads then see (a
    /// connection this rank closed itself) must not replace the cause.
    pub(crate) fn record(&self, e: DistError) {
        if self.err.set(e).is_ok() {
            let first = self.err.get().expect("the error was just kept");
            self.ctx.mesh.fail(first);
        }
    }
}

/// Runs `phase` on every lane over `buf`: on this thread with non-blocking
/// I/O when every link is TCP and the message is below [`threaded_bytes`]
/// (see [`run_polled`]), else with a sender and a receiver thread per lane.
pub(crate) fn run(
    ctx: &OpCtx<'_>,
    buf: &mut [u8],
    lanes: &[Lane],
    n: usize,
    phase: Phase,
) -> Result<()> {
    let places = Places::InPlace(SharedBuf {
        ptr: buf.as_mut_ptr(),
        len: buf.len(),
    });
    run_over(ctx, places, buf.len(), lanes, n, phase)
}

/// Reduce-scatter of `src` (`n` blocks of `out.len()` bytes, laid out as
/// [`Lane::chunks`] say) into `out`, this rank's block (`own`), reading
/// `src` only: the received blocks are reduced into `out` or, with more
/// than two ranks, into scratch for the ones passing through.
pub(crate) fn reduce_scatter_into(
    ctx: &OpCtx<'_>,
    src: &[u8],
    out: &mut [u8],
    own: usize,
    lanes: &[Lane],
    n: usize,
    op: ReduceOp,
) -> Result<()> {
    let block = out.len();
    let mut scratch = vec![0u8; if n > 2 { (n - 1) * block } else { 0 }];
    let shared = |b: &mut [u8]| SharedBuf {
        ptr: b.as_mut_ptr(),
        len: b.len(),
    };
    let places = Places::Split {
        // Never written through (see `Places::read`).
        src: SharedBuf {
            ptr: src.as_ptr().cast_mut(),
            len: src.len(),
        },
        out: shared(out),
        scratch: shared(&mut scratch),
        block,
        own,
        n,
    };
    run_over(ctx, places, src.len(), lanes, n, Phase::ReduceScatter(op))
}

/// [`run`] over `places`, for a message of `total` bytes.
fn run_over(
    ctx: &OpCtx<'_>,
    places: Places,
    total: usize,
    lanes: &[Lane],
    n: usize,
    phase: Phase,
) -> Result<()> {
    let tcp = lanes.iter().all(|l| {
        ctx.mesh.link(l.left, l.link).as_tcp().is_some()
            && ctx.mesh.link(l.right, l.link).as_tcp().is_some()
    });
    if tcp && total < ctx.mesh.threaded_bytes {
        let mut scratch =
            std::mem::take(&mut *ctx.mesh.scratch.lock().unwrap_or_else(|p| p.into_inner()));
        let r = run_polled(ctx, places, lanes, n, phase, &mut scratch);
        *ctx.mesh.scratch.lock().unwrap_or_else(|p| p.into_inner()) = scratch;
        if let Err(e) = &r {
            ctx.mesh.fail(e);
        }
        return r;
    }
    run_threaded(ctx, places, lanes, n, phase)
}

/// The steps of one lane: what it sends first and what it receives, in order.
struct Schedule {
    /// Blocks sent before anything is received.
    first: Vec<Range<usize>>,
    /// `(reduce, forward, block)` for every block received, in order.
    recvs: Vec<(bool, bool, Range<usize>)>,
}

fn schedule(lane: &Lane, n: usize, phase: Phase, block: usize) -> Schedule {
    let (steps, offset, reduce_steps) = match phase {
        Phase::AllReduce(_) => (2 * (n - 1), 0, n - 1),
        Phase::ReduceScatter(_) => (n - 1, n - 1, n - 1),
        Phase::AllGather => (n - 1, 0, 0),
    };
    let chunk = |k: usize| lane.chunks[k % n].clone();
    let first = blocks(chunk(lane.pos + offset), block).collect();
    let mut recvs = Vec::new();
    for i in 0..steps {
        for b in blocks(chunk(lane.pos + offset + 2 * n - i - 1), block) {
            recvs.push((i < reduce_steps, i + 1 < steps, b));
        }
    }
    Schedule { first, recvs }
}

/// One lane's progress in [`run_polled`].
struct PolledLane<'a> {
    lane: &'a Lane,
    left: &'a TcpLink,
    right: &'a TcpLink,
    sched: Schedule,
    /// Blocks ready to send (and whether they are of the lane's first
    /// chunk), in order; the front one has `sent` bytes (header included) out.
    queue: std::collections::VecDeque<(Range<usize>, bool)>,
    sent: usize,
    header_out: [u8; HEADER_LEN],
    /// Next entry of `sched.recvs`, and how much of its frame has arrived.
    next: usize,
    header_in: [u8; HEADER_LEN],
    got: usize,
}

impl PolledLane<'_> {
    fn done(&self) -> bool {
        self.queue.is_empty() && self.next == self.sched.recvs.len()
    }

    /// Writes as much as the socket takes; `Ok(true)` if anything was written.
    fn push(&mut self, ctx: &OpCtx<'_>, buf: Places) -> Result<bool> {
        let mut progress = false;
        while let Some((b, first)) = self.queue.front().cloned() {
            if self.sent == 0 {
                self.header_out = ctx.header(b.len());
            }
            // SAFETY: only this lane's thread touches this lane's ranges, and
            // it writes a queued block only after it has left the queue.
            let payload = unsafe { buf.read(b.clone(), first) };
            let r = if self.sent < HEADER_LEN {
                self.right.try_write(&[
                    IoSlice::new(&self.header_out[self.sent..]),
                    IoSlice::new(payload),
                ])
            } else {
                self.right
                    .try_write(&[IoSlice::new(&payload[self.sent - HEADER_LEN..])])
            };
            match r {
                Ok(0) => {
                    return Err(ctx.io(std::io::ErrorKind::WriteZero.into(), self.lane.right));
                }
                Ok(k) => {
                    progress = true;
                    self.sent += k;
                    if self.sent == HEADER_LEN + b.len() {
                        self.queue.pop_front();
                        self.sent = 0;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ctx.io(e, self.lane.right)),
            }
        }
        Ok(progress)
    }

    /// Reads what has arrived, reducing and forwarding complete blocks.
    fn pull(
        &mut self,
        ctx: &OpCtx<'_>,
        buf: Places,
        scratch: &mut [u8],
        op: Option<ReduceOp>,
    ) -> Result<bool> {
        let mut progress = false;
        while self.next < self.sched.recvs.len() {
            let (reduce, forward, b) = self.sched.recvs[self.next].clone();
            let r = if self.got < HEADER_LEN {
                self.left.try_read(&mut self.header_in[self.got..])
            } else {
                let at = self.got - HEADER_LEN;
                let target = if reduce {
                    &mut scratch[at..b.len()]
                } else {
                    // SAFETY: as in `push`; a block being received is not queued.
                    unsafe { buf.write(b.start + at..b.end) }
                };
                self.left.try_read(target)
            };
            match r {
                Ok(0) => {
                    return Err(ctx.io(std::io::ErrorKind::UnexpectedEof.into(), self.lane.left));
                }
                Ok(k) => {
                    progress = true;
                    self.got += k;
                    if self.got == HEADER_LEN {
                        ctx.check_header(self.lane.left, self.lane.link, &self.header_in, b.len())?;
                    }
                    if self.got == HEADER_LEN + b.len() {
                        if let (true, Some(op)) = (reduce, op) {
                            // SAFETY: as above.
                            let dst = unsafe { buf.reduce_target(b.clone()) };
                            reduce_into(dst, &scratch[..b.len()], ctx.dtype, op);
                        }
                        if forward {
                            self.queue.push_back((b, false));
                        }
                        self.next += 1;
                        self.got = 0;
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(ctx.io(e, self.lane.left)),
            }
        }
        Ok(progress)
    }
}

/// Runs every lane on the calling thread over non-blocking TCP links: each lane
/// writes what its socket takes, reads what has arrived, reduces and
/// forwards complete blocks, and the thread sleeps in `poll` only when no
/// lane can move. No thread is spawned and no buffer allocated per
/// operation (the reduction scratch is the mesh's).
///
/// Ordering: a block is forwarded only after it has been completely
/// received (and reduced), and a chunk is overwritten only after the right
/// neighbour has received what we sent of it (ring causality), so a queued
/// send never sees a half-updated block.
fn run_polled(
    ctx: &OpCtx<'_>,
    buf: Places,
    lanes: &[Lane],
    n: usize,
    phase: Phase,
    scratch: &mut Vec<Vec<u64>>,
) -> Result<()> {
    let elem = ctx.dtype.size_of();
    let block = (ctx.mesh.block / elem).max(1) * elem;
    let op = match phase {
        Phase::AllReduce(op) | Phase::ReduceScatter(op) => Some(op),
        Phase::AllGather => None,
    };
    let words = block.div_ceil(8) + 1;
    scratch.resize_with(lanes.len().max(scratch.len()), Vec::new);
    for v in scratch.iter_mut() {
        v.resize(words, 0);
    }
    drive(ctx, buf, lanes, n, phase, block, op, scratch)
}

/// Drives `lanes` to completion on this thread.
#[allow(clippy::too_many_arguments)]
fn drive(
    ctx: &OpCtx<'_>,
    buf: Places,
    lanes: &[Lane],
    n: usize,
    phase: Phase,
    block: usize,
    op: Option<ReduceOp>,
    scratch: &mut [Vec<u64>],
) -> Result<()> {
    let mut state: Vec<PolledLane<'_>> = lanes
        .iter()
        .map(|lane| {
            let tcp = |peer| {
                ctx.mesh
                    .link(peer, lane.link)
                    .as_tcp()
                    .expect("checked by run")
            };
            let sched = schedule(lane, n, phase, block);
            PolledLane {
                lane,
                left: tcp(lane.left),
                right: tcp(lane.right),
                queue: sched.first.iter().map(|b| (b.clone(), true)).collect(),
                sched,
                sent: 0,
                header_out: [0; HEADER_LEN],
                next: 0,
                header_in: [0; HEADER_LEN],
                got: 0,
            }
        })
        .collect();
    let writers: Vec<_> = state.iter().map(|l| l.right.lock_writes()).collect();
    let mut fds: Vec<libc::pollfd> = Vec::with_capacity(2 * lanes.len());
    let result = (|| -> Result<()> {
        loop {
            if ctx.mesh.has_failed() {
                return Err(DistError::Poisoned {
                    culprit: None,
                    reason: "another lane of this operation failed".into(),
                });
            }
            let mut progress = false;
            for (l, s) in state.iter_mut().zip(scratch.iter_mut()) {
                progress |= l.push(ctx, buf)?;
                progress |= l.pull(ctx, buf, bytemuck::cast_slice_mut(s), op)?;
                // What was just received may be sendable at once.
                progress |= l.push(ctx, buf)?;
            }
            if state.iter().all(PolledLane::done) {
                return Ok(());
            }
            if progress {
                continue;
            }
            fds.clear();
            for l in &state {
                if l.next < l.sched.recvs.len() {
                    fds.push(libc::pollfd {
                        fd: l.left.fd(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
                if !l.queue.is_empty() {
                    fds.push(libc::pollfd {
                        fd: l.right.fd(),
                        events: libc::POLLOUT,
                        revents: 0,
                    });
                }
            }
            let ready = poll_until(&mut fds, Instant::now() + ctx.mesh.timeout)
                .map_err(|e| ctx.io(e, lanes[0].left))?;
            if ready == 0 {
                // Blame the peer we are waiting to hear from, else the one not taking our data.
                let peer = state
                    .iter()
                    .find(|l| l.next < l.sched.recvs.len())
                    .map_or(lanes[0].right, |l| l.lane.left);
                return Err(DistError::Stalled {
                    peer,
                    op: ctx.op,
                    timeout: ctx.mesh.timeout,
                });
            }
            if let Some(bad) = fds.iter().position(|p| p.revents & libc::POLLNVAL != 0) {
                let peer = state
                    .iter()
                    .find(|l| l.left.fd() == fds[bad].fd)
                    .map_or(lanes[0].right, |l| l.lane.left);
                return Err(ctx.io(std::io::ErrorKind::NotConnected.into(), peer));
            }
        }
    })();
    if result.is_err() {
        for l in &state {
            if l.sent > 0 {
                l.right.mark_torn();
            }
        }
        drop(writers);
        // Wake the other lanes of this operation (they check the flag each round).
        if let Err(e) = &result
            && !matches!(e, DistError::Poisoned { .. })
        {
            ctx.mesh.fail(e);
        }
    }
    result
}

/// Runs `phase` on every lane over `buf`, a sender and a receiver thread per lane.
fn run_threaded(
    ctx: &OpCtx<'_>,
    shared: Places,
    lanes: &[Lane],
    n: usize,
    phase: Phase,
) -> Result<()> {
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
    buf: Places,
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
    // Blocks to send, and whether they are of the lane's first chunk.
    let (tx, rx) = mpsc::channel::<(Range<usize>, bool)>();
    std::thread::scope(|s| {
        // Owned by this closure so that an early return closes the channel.
        let tx = tx;
        s.spawn(move || {
            for (r, from_input) in rx {
                // SAFETY: `r` was either never written in this operation or was
                // handed over by the receiver after its last write; the receiver
                // writes it again only after the right neighbour has received it
                // (ring causality), i.e. after this send completed.
                let data = unsafe { buf.read(r, from_input) };
                if let Err(e) = ctx.send(lane.right, lane.link, data) {
                    first.record_late(e);
                    return;
                }
            }
        });
        for b in blocks(chunk(lane.pos + offset), block) {
            let _ = tx.send((b, true));
        }
        let scratch: &mut [u8] = bytemuck::cast_slice_mut(scratch);
        for i in 0..steps {
            let c = chunk(lane.pos + offset + 2 * n - i - 1);
            for b in blocks(c, block) {
                let res = match op {
                    Some(op) if i < reduce_steps => {
                        // SAFETY: the sender is not reading this chunk now (see above).
                        let dst = unsafe { buf.reduce_target(b.clone()) };
                        ctx.recv_with(lane.left, lane.link, b.len(), scratch, &mut |at, src| {
                            reduce_into(&mut dst[at..at + src.len()], src, ctx.dtype, op)
                        })
                    }
                    // SAFETY: as above.
                    _ => ctx.recv(lane.left, lane.link, unsafe { buf.write(b.clone()) }),
                };
                if let Err(e) = res {
                    first.record(e);
                    return;
                }
                if i + 1 < steps {
                    let _ = tx.send((b, false));
                }
            }
        }
        drop(tx);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::mesh::Mesh;
    use crate::transports::link::Link;
    use crate::wire::OpKind;
    use std::sync::Mutex;

    /// A link that carries nothing and, when closed, says so and then waits
    /// to be released: it holds a failing mesh in the middle of `Mesh::fail`.
    struct SlowToClose {
        closing: mpsc::Sender<()>,
        release: Mutex<mpsc::Receiver<()>>,
    }

    impl Link for SlowToClose {
        fn send_frame(&self, _: &[u8; HEADER_LEN], _: &[u8]) -> std::io::Result<()> {
            Ok(())
        }
        fn send_frame_until(&self, _: &[u8; HEADER_LEN], _: &[u8], _: Instant) -> bool {
            true
        }
        fn recv_exact(&self, _: &mut [u8]) -> std::io::Result<()> {
            Err(std::io::ErrorKind::UnexpectedEof.into())
        }
        fn recv_exact_until(&self, b: &mut [u8], _: Instant) -> std::io::Result<()> {
            self.recv_exact(b)
        }
        fn finish(&self, _: Instant) {}
        fn shutdown(&self) {
            let _ = self.closing.send(());
            let _ = self.release.lock().unwrap().recv();
        }
    }

    /// The error an operation reports is its first one, even when another
    /// thread's error (its link closed by this very failure) is recorded
    /// while the mesh is still closing its links.
    #[test]
    fn the_first_error_survives_errors_from_closing_the_links() {
        let (closing_tx, closing) = mpsc::channel();
        let (release, release_rx) = mpsc::channel();
        let link = SlowToClose {
            closing: closing_tx,
            release: Mutex::new(release_rx),
        };
        let cfg = Config::new(0, vec!["a:1".into(), "b:1".into()], [1; 16], b"s".to_vec());
        let links: Vec<Vec<Box<dyn Link>>> = vec![Vec::new(), vec![Box::new(link)]];
        let witnesses = vec![None, None];
        let mesh = Mesh::new(&cfg, crate::transports::Connections { links, witnesses });
        let ctx = OpCtx {
            mesh: &mesh,
            op: OpKind::AllSum,
            group: 0,
            seq: 0,
            dtype: mlx_array::Dtype::F32,
            total: 4,
        };
        let first = FirstError {
            ctx: &ctx,
            err: OnceLock::new(),
        };
        std::thread::scope(|s| {
            s.spawn(|| {
                first.record(DistError::Aborted {
                    op: OpKind::AllSum,
                    reporter: 1,
                    culprit: Some(1),
                    reason: "the cause".into(),
                })
            });
            closing.recv().unwrap();
            first.record(DistError::PeerClosed {
                peer: 1,
                op: OpKind::AllSum,
            });
            release.send(()).unwrap();
        });
        let kept = first.err.into_inner().unwrap();
        assert!(
            matches!(&kept, DistError::Aborted { reason, .. } if reason == "the cause"),
            "{kept}"
        );
    }

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
