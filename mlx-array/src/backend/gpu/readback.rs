//! Copies from the GPU to the host that wait only when read: the copy is
//! queued behind the work that computes the data, and the host blocks for
//! that submission alone when it asks for the bytes, not for whatever was
//! queued after it. A training loop reads step `n`'s loss this way while
//! the GPU runs step `n + 1` (see [`crate::HostRead`]).

use std::sync::mpsc::{Receiver, sync_channel};
use std::time::{Duration, Instant};

use super::device::{context, lock};
use super::elementwise::copy_contiguous;
use super::pool::buffer_of;
use super::transfers;
use crate::data::{ArrayData, Operand};
use crate::{Dtype, Error, Result};

/// A copy of GPU data on its way to the host (made by [`start`]).
pub(crate) struct PendingDownload {
    /// The host-visible copy, mapped once the GPU has written it (`None`
    /// for empty arrays).
    staging: Option<wgpu::Buffer>,
    /// The submission that writes it.
    submission: Option<wgpu::SubmissionIndex>,
    mapped: Receiver<std::result::Result<(), wgpu::BufferAsyncError>>,
    shape: Vec<usize>,
    dtype: Dtype,
}

/// Queues a copy of `x` (any view of a GPU array) to the host, behind
/// everything recorded so far, and submits it without waiting.
pub(crate) fn start(x: &Operand<'_>) -> Result<PendingDownload> {
    let (data, shape, dtype) = (&x.data, x.shape, x.dtype);
    let c = context()?;
    let len = crate::shape::size_of_shape(shape);
    let n = len * dtype.size_of();
    transfers::downloaded(n);
    let (tx, mapped) = sync_channel(1);
    let mut pending = PendingDownload {
        staging: None,
        submission: None,
        mapped,
        shape: shape.to_vec(),
        dtype,
    };
    if n == 0 {
        return Ok(pending);
    }
    let dense = if data.offset() == 0 && data.is_contiguous(shape) {
        data.clone()
    } else {
        copy_contiguous(x)?
    };
    let padded = n.next_multiple_of(4) as u64;
    let staging = c.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("download"),
        size: padded,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let src = buffer_of(&dense)?;
    c.record(|enc| enc.copy_buffer_to_buffer(src, 0, &staging, 0, padded))?;
    c.flush()?;
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        let _ = tx.send(r);
    });
    pending.submission = lock(&c.last_submission).clone();
    pending.staging = Some(staging);
    Ok(pending)
}

impl PendingDownload {
    /// The copied elements as a new contiguous host array, waiting for the
    /// submission that writes them if it has not finished.
    pub(crate) fn finish(self) -> Result<ArrayData> {
        let mut out = ArrayData::alloc(&self.shape, self.dtype);
        let Some(staging) = self.staging else {
            return Ok(out);
        };
        let c = context()?;
        let t0 = Instant::now();
        c.device
            .poll(wgpu::PollType::Wait {
                submission_index: self.submission,
                timeout: Some(Duration::from_secs(120)),
            })
            .map_err(|e| Error::gpu(format!("waiting for the GPU failed: {e}")))?;
        transfers::waited(t0.elapsed());
        c.check()?;
        self.mapped
            .recv()
            .map_err(|_| Error::gpu("the GPU never finished mapping a buffer"))?
            .map_err(|e| Error::gpu(format!("reading a GPU buffer failed: {e}")))?;
        let n = crate::shape::size_of_shape(&self.shape) * self.dtype.size_of();
        {
            let view = staging
                .slice(..)
                .get_mapped_range()
                .map_err(|e| Error::gpu(format!("reading a GPU buffer failed: {e}")))?;
            out.as_mut_slice::<u8>(n).copy_from_slice(&view[..n]);
        }
        staging.unmap();
        Ok(out)
    }
}
