//! The collectives over a connected [`Mesh`]: the ring for large messages, a
//! direct exchange for small ones, large half-precision sums over more than
//! two ranks at each block's owner ([`crate::collectives::owners`]), point-to-point
//! messages, barrier and split.
//! Transport-independent: TCP and QUIC meshes both run this code.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mlx_array::Dtype;

use crate::collectives::owners;
use crate::collectives::ring::{self, Lane, Phase, split_even};
use crate::error::{DistError, Result};
use crate::group::CommImpl;
use crate::mesh::membership::Membership;
use crate::mesh::{Mesh, OpCtx};
use crate::reduce::{ReduceOp, reduce_all};
use crate::wire::OpKind;

/// Messages at least this large use every lane (both directions, all connections).
const MULTI_LANE_BYTES: usize = 1 << 20;

/// A group of ranks on a mesh.
pub(crate) struct MeshComm {
    /// The mesh, shared with every group split from the same world; the
    /// last group dropped leaves it cleanly.
    mesh: Arc<Membership>,
    /// World rank of each group rank.
    members: Vec<usize>,
    rank: usize,
    id: u32,
    seq: AtomicU64,
    /// Per group peer: frames sent to it and received from it.
    p2p: Mutex<Vec<[u64; 2]>>,
    splits: AtomicU64,
    backend: &'static str,
    /// Buffers of the half-precision sums at the owners, kept between them.
    owners: Mutex<owners::Scratch>,
}

fn op_kind(op: ReduceOp) -> OpKind {
    match op {
        ReduceOp::Sum => OpKind::AllSum,
        ReduceOp::Max => OpKind::AllMax,
        ReduceOp::Min => OpKind::AllMin,
    }
}

impl MeshComm {
    /// The world group of a mesh; starts its heartbeats.
    pub(crate) fn world(mesh: Mesh, backend: &'static str) -> Result<MeshComm> {
        let members = (0..mesh.world).collect();
        let rank = mesh.rank;
        let mesh = Membership::start(mesh).map_err(|e| DistError::Unavailable {
            backend,
            reason: format!("cannot start the heartbeat threads: {e}"),
        })?;
        Ok(Self::with_members(
            Arc::new(mesh),
            members,
            rank,
            0,
            backend,
        ))
    }

    fn with_members(
        mesh: Arc<Membership>,
        members: Vec<usize>,
        rank: usize,
        id: u32,
        backend: &'static str,
    ) -> MeshComm {
        let n = members.len();
        MeshComm {
            mesh,
            members,
            rank,
            id,
            seq: AtomicU64::new(0),
            p2p: Mutex::new(vec![[0, 0]; n]),
            splits: AtomicU64::new(0),
            backend,
            owners: Mutex::default(),
        }
    }

    fn n(&self) -> usize {
        self.members.len()
    }

    fn ctx(&self, op: OpKind, dtype: Dtype, total: usize) -> OpCtx<'_> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        self.ctx_at(op, seq, dtype, total, &self.members)
    }

    /// The context of operation `seq` among `members` (world ranks),
    /// recorded as this rank's current one (its heartbeats say so, and a
    /// timeout names who is missing).
    fn ctx_at(
        &self,
        op: OpKind,
        seq: u64,
        dtype: Dtype,
        total: usize,
        members: &[usize],
    ) -> OpCtx<'_> {
        self.mesh.enter(op, self.id, seq, members);
        OpCtx {
            mesh: &self.mesh,
            op,
            group: self.id,
            seq,
            dtype,
            total: total as u64,
        }
    }

    /// Runs `f` holding the mesh; a failure poisons the mesh and tells the
    /// peers, and the error is the mesh's first failure, naming the rank at
    /// fault (see [`Mesh::attribute`]).
    fn guarded<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _g = self.mesh.begin()?;
        let r = f().map_err(|e| {
            self.mesh.fail(&e);
            self.mesh.first_failure().unwrap_or(e)
        });
        self.mesh.exit();
        r
    }

    /// Lane `k` of `count`: (ring position, right, left, link, rank at each position).
    fn lane_geometry(&self, k: usize, count: usize) -> (usize, usize, usize, usize, bool) {
        let (n, r) = (self.n(), self.rank);
        let (dir, conn) = if count == 1 { (0, 0) } else { (k % 2, k / 2) };
        let link = dir * self.mesh.conns + conn;
        let next = self.members[(r + 1) % n];
        let prev = self.members[(r + n - 1) % n];
        if dir == 0 {
            (r, next, prev, link, false)
        } else {
            (n - 1 - r, prev, next, link, true)
        }
    }

    fn lane_count(&self, total: usize) -> usize {
        if total >= MULTI_LANE_BYTES {
            2 * self.mesh.conns
        } else {
            1
        }
    }

    /// Lanes for an all-reduce of `total` bytes.
    fn reduce_lanes(&self, total: usize, elem: usize) -> Vec<Lane> {
        let count = self.lane_count(total);
        split_even(total / elem, count)
            .into_iter()
            .enumerate()
            .map(|(k, seg)| {
                let (pos, right, left, link, _) = self.lane_geometry(k, count);
                let chunks = split_even(seg.len(), self.n())
                    .into_iter()
                    .map(|c| (seg.start + c.start) * elem..(seg.start + c.end) * elem)
                    .collect();
                Lane {
                    chunks,
                    pos,
                    right,
                    left,
                    link,
                }
            })
            .collect()
    }

    /// Lanes over a rank-major buffer of `n` blocks of `block` bytes (all-gather, reduce-scatter).
    fn block_lanes(&self, block: usize, elem: usize) -> Vec<Lane> {
        let n = self.n();
        let count = self.lane_count(block * n);
        split_even(block / elem, count)
            .into_iter()
            .enumerate()
            .map(|(k, sub)| {
                let (pos, right, left, link, reversed) = self.lane_geometry(k, count);
                let chunks = (0..n)
                    .map(|q| {
                        let owner = if reversed { n - 1 - q } else { q };
                        owner * block + sub.start * elem..owner * block + sub.end * elem
                    })
                    .collect();
                Lane {
                    chunks,
                    pos,
                    right,
                    left,
                    link,
                }
            })
            .collect()
    }

    /// Receives one frame of `len` bytes from every other group rank, in rank order.
    fn recv_all(&self, ctx: &OpCtx<'_>, len: usize) -> Result<Vec<Option<Vec<u8>>>> {
        (0..self.n())
            .map(|j| {
                if j == self.rank {
                    return Ok(None);
                }
                let mut v = vec![0u8; len];
                ctx.recv(self.members[j], 0, &mut v)?;
                Ok(Some(v))
            })
            .collect()
    }

    /// Whether a large reduction is summed at each block's owner
    /// ([`owners`]) rather than along the ring, whose partial
    /// sums travel in the buffer's dtype and so are rounded at every hop:
    /// half-precision sums over more than two ranks (with two, the ring's
    /// one hop adds the two parts once, as the owner would).
    fn sums_at_owners(&self, dtype: Dtype, op: ReduceOp) -> bool {
        self.n() > 2 && op == ReduceOp::Sum && matches!(dtype, Dtype::F16 | Dtype::BF16)
    }

    fn send_all(&self, ctx: &OpCtx<'_>, data: impl Fn(usize) -> Vec<u8>) -> Result<()> {
        for j in (0..self.n()).filter(|&j| j != self.rank) {
            ctx.send(self.members[j], 0, &data(j))?;
        }
        Ok(())
    }

    fn split_group(&self, color: i32, key: i32) -> Result<MeshComm> {
        let mine: Vec<u8> = [color.to_le_bytes(), key.to_le_bytes()].concat();
        let mut all = vec![0u8; 8 * self.n()];
        self.all_gather(&mine, &mut all, Dtype::I32)?;
        let mut entries: Vec<(i32, usize)> = Vec::new();
        for j in 0..self.n() {
            let c = i32::from_le_bytes(all[8 * j..8 * j + 4].try_into().expect("4 bytes"));
            let k = i32::from_le_bytes(all[8 * j + 4..8 * j + 8].try_into().expect("4 bytes"));
            if c == color {
                entries.push((k, j));
            }
        }
        entries.sort();
        let new_rank = entries
            .iter()
            .position(|&(_, j)| j == self.rank)
            .expect("we share our own colour");
        let members = entries.iter().map(|&(_, j)| self.members[j]).collect();
        let index = self.splits.fetch_add(1, Ordering::Relaxed);
        // FNV-1a of (parent id, split index, colour): equal on every member, distinct between groups.
        let mut h: u32 = 0x811c_9dc5;
        for b in self
            .id
            .to_le_bytes()
            .into_iter()
            .chain(index.to_le_bytes())
            .chain(color.to_le_bytes())
        {
            h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        }
        Ok(Self::with_members(
            self.mesh.clone(),
            members,
            new_rank,
            h,
            self.backend,
        ))
    }
}

impl CommImpl for MeshComm {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.n()
    }

    fn backend(&self) -> &'static str {
        self.backend
    }

    fn shared_memory_peers(&self) -> usize {
        let me = self.members[self.rank];
        self.members
            .iter()
            .filter(|&&p| p != me && self.mesh.link(p, 0).is_shared())
            .count()
    }

    fn all_reduce(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()> {
        let kind = op_kind(op);
        self.guarded(|| {
            let ctx = self.ctx(kind, dtype, buf.len());
            // The direct exchange sends the whole message to every other
            // rank, (n-1) x bytes, where the ring sends 2(n-1)/n x bytes in
            // 2(n-1) steps: it is taken while a rank sends at most `small`
            // bytes (64 KiB at world 2, 21 KiB at world 4). Where it stops
            // paying depends on the links (world 4 across emulated hosts,
            // 2026-11-24, direct against ring, collectives_bench in a build
            // with this threshold forced either way): at 10 Gbit/s 16 KiB 88
            // against 178 us, 32 KiB 115 against 199, 64 KiB 311 against
            // 208 (the crossover near 45 KiB); at 1 Gbit/s 4 KiB 105 against
            // 182 us, 8 KiB 208 against 174, 16 KiB 414 against 216 (near
            // 6 KiB); on loopback 16 KiB direct wins and 64 KiB loses (0.6
            // against 0.28 ms). Every rank must choose alike, so the rule is
            // a fixed size, set for 10 Gbit/s and faster links; on 1 Gbit/s
            // messages of 6-21 KiB take up to 2x the ring's time (small
            // messages only: gradient buckets are megabytes).
            if buf.len() * (self.n() - 1) <= self.mesh.small {
                let mine = buf.to_vec();
                self.send_all(&ctx, |_| mine.clone())?;
                let mut got = self.recv_all(&ctx, buf.len())?;
                got[self.rank] = Some(mine);
                // The same order on every rank, so every rank gets identical
                // bits; half-precision sums accumulate in f32.
                let parts: Vec<Vec<u8>> = got.into_iter().map(|v| v.expect("filled")).collect();
                let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                reduce_all(buf, &parts, dtype, op);
                return Ok(());
            }
            if self.sums_at_owners(dtype, op) {
                let mut scratch = self.owners.lock().unwrap_or_else(|p| p.into_inner());
                return owners::all_sum(&ctx, &self.members, self.rank, buf, dtype, &mut scratch);
            }
            let lanes = self.reduce_lanes(buf.len(), dtype.size_of());
            ring::run(&ctx, buf, &lanes, self.n(), Phase::AllReduce(op))
        })
    }

    fn all_gather(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()> {
        self.guarded(|| {
            let (n, b) = (self.n(), input.len());
            let ctx = self.ctx(OpKind::AllGather, dtype, b);
            out[self.rank * b..(self.rank + 1) * b].copy_from_slice(input);
            if n * b <= self.mesh.small {
                self.send_all(&ctx, |_| input.to_vec())?;
                for (j, v) in self.recv_all(&ctx, b)?.into_iter().enumerate() {
                    if let Some(v) = v {
                        out[j * b..(j + 1) * b].copy_from_slice(&v);
                    }
                }
                return Ok(());
            }
            let lanes = self.block_lanes(b, dtype.size_of());
            ring::run(&ctx, out, &lanes, n, Phase::AllGather)
        })
    }

    fn sum_scatter(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()> {
        self.guarded(|| {
            let (n, r) = (self.n(), self.rank);
            let b = out.len();
            let ctx = self.ctx(OpKind::SumScatter, dtype, input.len());
            if input.len() <= self.mesh.small {
                self.send_all(&ctx, |j| input[j * b..(j + 1) * b].to_vec())?;
                // The same order on every rank as for all_reduce, so that a
                // block's sum has the same bits whichever rank keeps it.
                let mut got = self.recv_all(&ctx, b)?;
                got[r] = Some(input[r * b..(r + 1) * b].to_vec());
                let parts: Vec<Vec<u8>> = got.into_iter().map(|v| v.expect("filled")).collect();
                let parts: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
                reduce_all(out, &parts, dtype, ReduceOp::Sum);
                return Ok(());
            }
            if self.sums_at_owners(dtype, ReduceOp::Sum) {
                let mut scratch = self.owners.lock().unwrap_or_else(|p| p.into_inner());
                return owners::sum_scatter(
                    &ctx,
                    &self.members,
                    r,
                    input,
                    out,
                    dtype,
                    &mut scratch,
                );
            }
            let lanes = self.block_lanes(b, dtype.size_of());
            ring::reduce_scatter_into(&ctx, input, out, r, &lanes, n, ReduceOp::Sum)
        })
    }

    fn send(&self, buf: &[u8], dtype: Dtype, dst: usize) -> Result<()> {
        self.guarded(|| {
            let seq = {
                let mut p = self.p2p.lock().unwrap_or_else(|p| p.into_inner());
                p[dst][0] += 1;
                p[dst][0]
            };
            let pair = [self.members[self.rank], self.members[dst]];
            let ctx = self.ctx_at(OpKind::Send, seq, dtype, buf.len(), &pair);
            ctx.send(self.members[dst], 0, buf)
        })
    }

    fn recv(&self, buf: &mut [u8], dtype: Dtype, src: usize) -> Result<()> {
        self.guarded(|| {
            let seq = {
                let mut p = self.p2p.lock().unwrap_or_else(|p| p.into_inner());
                p[src][1] += 1;
                p[src][1]
            };
            let pair = [self.members[self.rank], self.members[src]];
            let ctx = self.ctx_at(OpKind::Send, seq, dtype, buf.len(), &pair);
            ctx.recv(self.members[src], 0, buf)
        })
    }

    fn barrier(&self) -> Result<()> {
        self.guarded(|| {
            let ctx = self.ctx(OpKind::Barrier, Dtype::Bool, 0);
            self.send_all(&ctx, |_| Vec::new())?;
            self.recv_all(&ctx, 0).map(|_| ())
        })
    }

    fn split(&self, color: i32, key: i32) -> Result<Arc<dyn CommImpl>> {
        Ok(Arc::new(self.split_group(color, key)?))
    }
}

impl std::fmt::Debug for MeshComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshComm")
            .field("rank", &self.rank)
            .field("members", &self.members)
            .field("id", &self.id)
            .finish()
    }
}
