//! Copies between the host and the GPU: [`upload`], [`download`], and the
//! wait for mapped copies that every read of GPU data ends in.

use std::time::Duration;

use wgpu::util::DeviceExt;

use super::device::{GpuContext, context};
use super::pool::{alloc, buffer_of, supported};
use super::{readback, transfers};
use crate::data::{ArrayData, Operand};
use crate::{Error, Result};

impl GpuContext {
    /// Maps every one of `buffers` (`MAP_READ` copy destinations of
    /// submitted work) for reading, waiting for the GPU once.
    pub(super) fn map_read_all(&self, buffers: &[&wgpu::Buffer]) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(buffers.len());
        for buffer in buffers {
            let tx = tx.clone();
            buffer.slice(..).map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        }
        let t0 = std::time::Instant::now();
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: Some(Duration::from_secs(120)),
            })
            .map_err(|e| Error::gpu(format!("waiting for the GPU failed: {e}")))?;
        transfers::waited(t0.elapsed());
        self.check()?;
        for _ in buffers {
            rx.recv()
                .map_err(|_| Error::gpu("the GPU never finished mapping a buffer"))?
                .map_err(|e| Error::gpu(format!("reading a GPU buffer failed: {e}")))?;
        }
        Ok(())
    }
}

/// Copies host `data` (contiguous from its offset: the caller makes a
/// strided view dense on the host first) into a new contiguous GPU array.
pub(crate) fn upload(host: &Operand<'_>) -> Result<ArrayData> {
    let (shape, dtype, host) = (host.shape, host.dtype, &host.data);
    supported(dtype)?;
    if !host.is_contiguous(shape) {
        return Err(Error::gpu(
            "upload needs a contiguous host view; copy it with the CPU backend first",
        ));
    }
    let c = context()?;
    let n = crate::shape::size_of_shape(shape) * dtype.size_of();
    let out = alloc(shape, dtype)?;
    if n > 0 {
        let mut bytes = host
            .as_bytes(dtype, crate::shape::size_of_shape(shape))
            .to_vec();
        bytes.resize(n.next_multiple_of(4), 0);
        // Staged through the encoder (not queue.write_buffer) so the copy is
        // ordered after recorded work that still reads a reused buffer.
        let staging = c
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some("upload"),
                contents: &bytes,
                usage: wgpu::BufferUsages::COPY_SRC,
            });
        let dst = buffer_of(&out)?;
        c.record(|enc| enc.copy_buffer_to_buffer(&staging, 0, dst, 0, bytes.len() as u64))?;
    }
    transfers::uploaded(n);
    Ok(out)
}

/// Copies GPU data `x` (any view) into a new contiguous host array,
/// waiting for the GPU (see [`readback`] for the copy that waits later).
pub(crate) fn download(x: &Operand<'_>) -> Result<ArrayData> {
    readback::start(x)?.finish()
}
