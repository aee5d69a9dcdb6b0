//! Half-precision sums over more than two ranks, summed at each block's
//! owner: the ring's partial sums travel in the buffer's dtype, so an
//! `f16`/`bf16` sum along it is rounded at every hop. Here block `j` of
//! every rank's buffer goes straight to rank `j`, which sums the blocks in
//! float32 as they arrive and rounds once (the reduce-scatter); for an
//! all-reduce each owner then sends its block to every other rank (the
//! all-gather). Each rank sends as many bytes as on the ring, `(n - 1) / n`
//! of the buffer per half.
//!
//! Both halves exchange blocks the same way: a sender thread sends to rank
//! `r + 1`, `r + 2`, ... while this thread receives from `r - 1`, `r - 2`,
//! ..., so at step `s` every send meets the receive waiting for it. The
//! first error fails the mesh, which wakes the other thread.

use std::ops::Range;

use mlx_array::Dtype;

use crate::collectives::ring::{FirstError, split_even};
use crate::error::Result;
use crate::mesh::OpCtx;
use crate::reduce::{add_half, round_half};

/// Buffers kept between operations (a fresh multi-megabyte buffer costs
/// its page faults every time).
#[derive(Default)]
pub(crate) struct Scratch {
    part: Vec<u8>,
    acc: Vec<f32>,
}

/// The byte ranges of the `n` blocks of a buffer of `len` bytes of `elem`
/// bytes each (as even as whole elements allow).
fn blocks(len: usize, elem: usize, n: usize) -> Vec<Range<usize>> {
    split_even(len / elem, n)
        .into_iter()
        .map(|r| r.start * elem..r.end * elem)
        .collect()
}

/// Sends `send(j)` to every other rank `j` on a sender thread while this
/// thread calls `recv(j)` for every other rank, in the order the module doc
/// gives; the first error, after both are done.
fn exchange<'a>(
    ctx: &OpCtx<'_>,
    members: &[usize],
    r: usize,
    send: impl Fn(usize) -> &'a [u8] + Send,
    mut recv: impl FnMut(&OpCtx<'_>, usize) -> Result<()>,
) -> Result<()> {
    let n = members.len();
    let first = FirstError::new(ctx);
    std::thread::scope(|s| {
        let first = &first;
        s.spawn(move || {
            for step in 1..n {
                let j = (r + step) % n;
                if let Err(e) = ctx.send(members[j], 0, send(j)) {
                    return first.record_late(e);
                }
            }
        });
        for step in 1..n {
            let j = (r + n - step) % n;
            if let Err(e) = recv(ctx, j) {
                return first.record(e);
            }
        }
    });
    first.into_result()
}

/// Block `j` of `input` (`blocks[j]`) to rank `j`, and this rank's block
/// summed over every rank in float32 into `scratch.acc` (its own first,
/// then from ranks `r - 1`, `r - 2`, ...: one fixed order per block).
fn sum_blocks(
    ctx: &OpCtx<'_>,
    members: &[usize],
    r: usize,
    input: &[u8],
    blocks: &[Range<usize>],
    dtype: Dtype,
    scratch: &mut Scratch,
) -> Result<()> {
    let mine = blocks[r].clone();
    let Scratch { part, acc } = scratch;
    acc.clear();
    acc.resize(mine.len() / dtype.size_of(), 0.0);
    part.resize(mine.len(), 0);
    add_half(acc, &input[mine], dtype);
    exchange(
        ctx,
        members,
        r,
        |j| &input[blocks[j].clone()],
        |ctx, j| {
            // Added piece by piece as it arrives, straight from shared
            // memory where the link lends it (`part` is for the others).
            let size = dtype.size_of();
            ctx.recv_with(members[j], 0, part.len(), part, &mut |at, piece| {
                add_half(&mut acc[at / size..(at + piece.len()) / size], piece, dtype)
            })
        },
    )
}

/// The reduce-scatter of `f16`/`bf16` `input` (`n` blocks of `out.len()`
/// bytes): this rank's block, summed over every rank and rounded once,
/// into `out`.
pub(crate) fn sum_scatter(
    ctx: &OpCtx<'_>,
    members: &[usize],
    r: usize,
    input: &[u8],
    out: &mut [u8],
    dtype: Dtype,
    scratch: &mut Scratch,
) -> Result<()> {
    let b = out.len();
    let ranges: Vec<Range<usize>> = (0..members.len()).map(|j| j * b..(j + 1) * b).collect();
    sum_blocks(ctx, members, r, input, &ranges, dtype, scratch)?;
    round_half(&scratch.acc, out, dtype);
    Ok(())
}

/// A sum of `f16`/`bf16` `buf` over every rank, in place: each rank's
/// block summed at it and rounded once, then the blocks gathered straight
/// from their owners.
pub(crate) fn all_sum(
    ctx: &OpCtx<'_>,
    members: &[usize],
    r: usize,
    buf: &mut [u8],
    dtype: Dtype,
    scratch: &mut Scratch,
) -> Result<()> {
    let n = members.len();
    let ranges = blocks(buf.len(), dtype.size_of(), n);
    sum_blocks(ctx, members, r, buf, &ranges, dtype, scratch)?;
    round_half(&scratch.acc, &mut buf[ranges[r].clone()], dtype);
    // Every block as its own slice: this rank's is sent, the others received.
    let mut parts: Vec<&mut [u8]> = Vec::with_capacity(n);
    let mut rest = &mut buf[..];
    for range in &ranges {
        let (head, tail) = rest.split_at_mut(range.len());
        parts.push(head);
        rest = tail;
    }
    let mine: &[u8] = std::mem::take::<&mut [u8]>(&mut parts[r]);
    exchange(
        ctx,
        members,
        r,
        |_| mine,
        |ctx, j| ctx.recv(members[j], 0, parts[j]),
    )
}
