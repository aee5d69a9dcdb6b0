//! [`Group`]: a set of ranks that run collectives together, the API the graph
//! primitives wrap. Every method blocks until the operation is done on this
//! rank, so it can be called from a communication thread.

use std::sync::Arc;

use mlx_array::{Dtype, Element};

use crate::error::{DistError, Result};
use crate::reduce::ReduceOp;

/// What a transport implements; [`Group`] validates arguments before calling it.
pub(crate) trait CommImpl: Send + Sync + std::fmt::Debug {
    fn rank(&self) -> usize;
    fn size(&self) -> usize;
    fn backend(&self) -> &'static str;
    fn all_reduce(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()>;
    fn all_gather(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()>;
    /// Sums block `rank` of the `size` equal blocks of `input` over the
    /// group into `out` (one block long).
    fn sum_scatter(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()>;
    fn send(&self, buf: &[u8], dtype: Dtype, dst: usize) -> Result<()>;
    fn recv(&self, buf: &mut [u8], dtype: Dtype, src: usize) -> Result<()>;
    fn barrier(&self) -> Result<()>;
    fn split(&self, color: i32, key: i32) -> Result<Arc<dyn CommImpl>>;
    /// Peers in the group reached through shared memory.
    fn shared_memory_peers(&self) -> usize {
        0
    }
}

/// The group of one process: every collective is the identity.
#[derive(Debug)]
struct Single;

impl CommImpl for Single {
    fn rank(&self) -> usize {
        0
    }
    fn size(&self) -> usize {
        1
    }
    fn backend(&self) -> &'static str {
        "single"
    }
    fn all_reduce(&self, _: &mut [u8], _: Dtype, _: ReduceOp) -> Result<()> {
        Ok(())
    }
    fn all_gather(&self, input: &[u8], out: &mut [u8], _: Dtype) -> Result<()> {
        out.copy_from_slice(input);
        Ok(())
    }
    fn sum_scatter(&self, input: &[u8], out: &mut [u8], _: Dtype) -> Result<()> {
        out.copy_from_slice(input);
        Ok(())
    }
    fn send(&self, _: &[u8], _: Dtype, _: usize) -> Result<()> {
        unreachable!("Group::send_bytes rejects dst == rank")
    }
    fn recv(&self, _: &mut [u8], _: Dtype, _: usize) -> Result<()> {
        unreachable!("Group::recv_bytes rejects src == rank")
    }
    fn barrier(&self) -> Result<()> {
        Ok(())
    }
    fn split(&self, _: i32, _: i32) -> Result<Arc<dyn CommImpl>> {
        Ok(Arc::new(Single))
    }
}

/// A group of ranks (MLX's `mx.distributed.Group`). Cheap to clone; clones
/// share the connections. Operations on groups that share a world are
/// serialised, in the order they are called.
#[derive(Clone, Debug)]
pub struct Group {
    inner: Arc<dyn CommImpl>,
}

fn check_len(op: &'static str, len: usize, dtype: Dtype) -> Result<()> {
    if !len.is_multiple_of(dtype.size_of()) {
        return Err(DistError::InvalidArgument {
            op,
            msg: format!(
                "{len} bytes is not a whole number of {} elements ({} bytes each)",
                dtype.name(),
                dtype.size_of()
            ),
        });
    }
    Ok(())
}

impl Group {
    pub(crate) fn from_impl(inner: Arc<dyn CommImpl>) -> Group {
        Group { inner }
    }

    /// The group of a process started without a launcher: rank 0 of 1.
    pub fn single() -> Group {
        Group::from_impl(Arc::new(Single))
    }

    /// This process's rank in the group, `0..size()`.
    pub fn rank(&self) -> usize {
        self.inner.rank()
    }

    /// Number of ranks in the group.
    pub fn size(&self) -> usize {
        self.inner.size()
    }

    /// The transport's name: `single`, `ring`, `quic` or `mpi`.
    pub fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// How many of this rank's peers in the group it exchanges large
    /// payloads with through shared memory instead of its sockets (the ring
    /// backend, for peers on the same host; `MLX_DIST_SHM=0` turns it off).
    pub fn shared_memory_peers(&self) -> usize {
        self.inner.shared_memory_peers()
    }

    /// Splits the group as `MPI_Comm_split` does: ranks passing the same
    /// `color` form a new group, ordered by `key` and then by rank here (pass
    /// the same key, e.g. -1, everywhere to keep the current order). Every rank
    /// of this group must call it.
    pub fn split(&self, color: i32, key: i32) -> Result<Group> {
        Ok(Group::from_impl(self.inner.split(color, key)?))
    }

    /// Elementwise reduction of `buf` over the group, in place; every rank gets the same bits.
    pub fn all_reduce_bytes(&self, buf: &mut [u8], dtype: Dtype, op: ReduceOp) -> Result<()> {
        check_len("all_reduce", buf.len(), dtype)?;
        if self.size() == 1 {
            return Ok(());
        }
        crate::stats::record(crate::stats::Op::AllReduce, buf.len(), self.size());
        self.inner.all_reduce(buf, dtype, op)
    }

    /// Elementwise sum over the group, in place (MLX's `all_sum`).
    pub fn all_sum_bytes(&self, buf: &mut [u8], dtype: Dtype) -> Result<()> {
        self.all_reduce_bytes(buf, dtype, ReduceOp::Sum)
    }

    /// Elementwise maximum over the group, in place (MLX's `all_max`).
    pub fn all_max_bytes(&self, buf: &mut [u8], dtype: Dtype) -> Result<()> {
        self.all_reduce_bytes(buf, dtype, ReduceOp::Max)
    }

    /// Elementwise minimum over the group, in place (MLX's `all_min`).
    pub fn all_min_bytes(&self, buf: &mut [u8], dtype: Dtype) -> Result<()> {
        self.all_reduce_bytes(buf, dtype, ReduceOp::Min)
    }

    /// Every rank's `input` (all the same length), concatenated in rank order.
    pub fn all_gather_bytes(&self, input: &[u8], dtype: Dtype) -> Result<Vec<u8>> {
        let mut out = vec![0u8; input.len() * self.size()];
        self.all_gather_into_bytes(input, &mut out, dtype)?;
        Ok(out)
    }

    /// [`Group::all_gather_bytes`] into a caller-owned buffer of `size() * input.len()`
    /// bytes (reusing buffers avoids page faults on every call).
    pub fn all_gather_into_bytes(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()> {
        check_len("all_gather", input.len(), dtype)?;
        if out.len() != input.len() * self.size() {
            return Err(DistError::InvalidArgument {
                op: "all_gather",
                msg: format!(
                    "output has {} bytes, expected {} ranks x {} bytes",
                    out.len(),
                    self.size(),
                    input.len()
                ),
            });
        }
        if self.size() == 1 {
            out.copy_from_slice(input);
            return Ok(());
        }
        crate::stats::record(crate::stats::Op::AllGather, input.len(), self.size());
        self.inner.all_gather(input, out, dtype)
    }

    /// Sums `input` over the group and returns this rank's block of the result:
    /// `input` holds `size()` equal blocks and rank `r` gets the sum of block `r`.
    pub fn sum_scatter_bytes(&self, input: &[u8], dtype: Dtype) -> Result<Vec<u8>> {
        let mut out = vec![0u8; input.len() / self.size()];
        self.sum_scatter_into_bytes(input, &mut out, dtype)?;
        Ok(out)
    }

    /// [`Group::sum_scatter_bytes`] into `out`, which must be one block
    /// (`input.len() / size()` bytes) long. Only `out` is written: with two
    /// ranks the operation needs no memory beyond it (with more, a block
    /// per other rank for the sums passing through).
    pub fn sum_scatter_into_bytes(&self, input: &[u8], out: &mut [u8], dtype: Dtype) -> Result<()> {
        check_len("sum_scatter", input.len(), dtype)?;
        let unit = dtype.size_of() * self.size();
        if !input.len().is_multiple_of(unit) {
            return Err(DistError::InvalidArgument {
                op: "sum_scatter",
                msg: format!(
                    "{} elements cannot be split evenly over {} ranks",
                    input.len() / dtype.size_of(),
                    self.size()
                ),
            });
        }
        if out.len() * self.size() != input.len() {
            return Err(DistError::InvalidArgument {
                op: "sum_scatter",
                msg: format!(
                    "the output holds {} bytes; one of {} blocks of {} input bytes is {}",
                    out.len(),
                    self.size(),
                    input.len(),
                    input.len() / self.size()
                ),
            });
        }
        if self.size() == 1 || input.is_empty() {
            out.copy_from_slice(input);
            return Ok(());
        }
        crate::stats::record(crate::stats::Op::SumScatter, input.len(), self.size());
        self.inner.sum_scatter(input, out, dtype)
    }

    fn check_peer(&self, op: &'static str, peer: usize) -> Result<()> {
        if peer >= self.size() || peer == self.rank() {
            return Err(DistError::InvalidArgument {
                op,
                msg: format!(
                    "peer rank {peer} is not another rank of this group (rank {} of {})",
                    self.rank(),
                    self.size()
                ),
            });
        }
        Ok(())
    }

    /// Sends `buf` to rank `dst`; returns once it is handed to the transport.
    pub fn send_bytes(&self, buf: &[u8], dtype: Dtype, dst: usize) -> Result<()> {
        check_len("send", buf.len(), dtype)?;
        self.check_peer("send", dst)?;
        crate::stats::record(crate::stats::Op::Send, buf.len(), self.size());
        self.inner.send(buf, dtype, dst)
    }

    /// Receives exactly `buf.len()` bytes of `dtype` from rank `src`; a message
    /// of another size or dtype is an error on both ranks.
    pub fn recv_bytes(&self, buf: &mut [u8], dtype: Dtype, src: usize) -> Result<()> {
        check_len("recv", buf.len(), dtype)?;
        self.check_peer("recv", src)?;
        self.inner.recv(buf, dtype, src)
    }

    /// Returns when every rank of the group has called it.
    pub fn barrier(&self) -> Result<()> {
        if self.size() == 1 {
            return Ok(());
        }
        self.inner.barrier()
    }

    /// Typed [`Group::all_sum_bytes`].
    pub fn all_sum<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_sum_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE)
    }

    /// Typed [`Group::all_max_bytes`].
    pub fn all_max<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_max_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE)
    }

    /// Typed [`Group::all_min_bytes`].
    pub fn all_min<T: Element>(&self, buf: &mut [T]) -> Result<()> {
        self.all_min_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE)
    }

    /// Typed [`Group::all_gather_bytes`].
    pub fn all_gather<T: Element>(&self, input: &[T]) -> Result<Vec<T>> {
        let mut out = vec![T::zeroed(); input.len() * self.size()];
        self.all_gather_into_bytes(
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(&mut out),
            T::DTYPE,
        )?;
        Ok(out)
    }

    /// Typed [`Group::sum_scatter_bytes`].
    pub fn sum_scatter<T: Element>(&self, input: &[T]) -> Result<Vec<T>> {
        let v = self.sum_scatter_bytes(bytemuck::cast_slice(input), T::DTYPE)?;
        Ok(bytemuck::pod_collect_to_vec(&v))
    }

    /// Typed [`Group::sum_scatter_into_bytes`].
    pub fn sum_scatter_into<T: Element>(&self, input: &[T], out: &mut [T]) -> Result<()> {
        self.sum_scatter_into_bytes(
            bytemuck::cast_slice(input),
            bytemuck::cast_slice_mut(out),
            T::DTYPE,
        )
    }

    /// Typed [`Group::send_bytes`].
    pub fn send<T: Element>(&self, buf: &[T], dst: usize) -> Result<()> {
        self.send_bytes(bytemuck::cast_slice(buf), T::DTYPE, dst)
    }

    /// Typed [`Group::recv_bytes`].
    pub fn recv<T: Element>(&self, buf: &mut [T], src: usize) -> Result<()> {
        self.recv_bytes(bytemuck::cast_slice_mut(buf), T::DTYPE, src)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_group_is_the_identity() {
        let g = Group::single();
        assert_eq!((g.rank(), g.size()), (0, 1));
        let mut x = vec![1.0f32; 10];
        g.all_sum(&mut x).unwrap();
        assert_eq!(x, vec![1.0; 10]);
        assert_eq!(g.all_gather(&[1i32, 2]).unwrap(), vec![1, 2]);
        assert_eq!(g.sum_scatter(&[3i64]).unwrap(), vec![3]);
        g.barrier().unwrap();
        assert_eq!(g.split(5, 0).unwrap().size(), 1);
        assert!(matches!(
            g.send(&[1u32], 0),
            Err(DistError::InvalidArgument { .. })
        ));
        assert!(matches!(
            g.all_sum_bytes(&mut [0u8; 3], Dtype::F32),
            Err(DistError::InvalidArgument { .. })
        ));
    }
}
