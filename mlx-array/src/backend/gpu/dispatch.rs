//! Recording: kernels' dispatches (and copies) go on the eval's command
//! encoder, consecutive dispatches in one compute pass, submitted in chunks
//! while an eval records and at its end ([`submit`]).

use wgpu::util::DeviceExt;

use super::device::{CONTEXT, GpuContext, context, lock};
use super::pool::buffer_of;
use super::stats::DISPATCHES;
use super::{codegen, submission, timestamps};
use crate::data::ArrayData;
use crate::{Dtype, Error, Result};

impl GpuContext {
    /// Runs `record` on the eval's command encoder (created on first use),
    /// submitting it when its chunk is full.
    pub(crate) fn record(&self, record: impl FnOnce(&mut wgpu::CommandEncoder)) -> Result<()> {
        self.check()?;
        let mut slot = lock(&self.encoder);
        record(slot.encoder(&self.device));
        if slot.count() {
            self.submit_chunk(&mut slot);
        }
        Ok(())
    }

    /// Submits the encoder of `slot` (whose lock the caller holds), if any,
    /// after queueing its dispatches' meta words, resolving its passes'
    /// timestamps into a readback that the end of the eval
    /// ([`GpuContext::flush`]) finishes.
    pub(super) fn submit_chunk(&self, slot: &mut submission::Recording) {
        if let Some(mut enc) = slot.take_encoder() {
            let readback = self
                .timestamps
                .as_ref()
                .and_then(|t| lock(t).resolve(&self.device, &mut enc));
            slot.meta.upload(&self.queue);
            let index = self.queue.submit([enc.finish()]);
            *lock(&self.last_submission) = Some(index);
            lock(&self.readbacks).extend(readback);
            slot.submitted();
        }
    }

    /// Records one dispatch of `pipeline` over a `grid` of workgroups on the
    /// eval's command encoder, binding `meta` at 0 and `buffers` at 1..;
    /// `clear` first zeroes that many bytes of the last buffer (outside any
    /// pass). Consecutive dispatches share a compute pass (wgpu puts a barrier between
    /// dispatches that depend on each other, as between passes), except
    /// while profiling with timestamps: then the pass is the dispatch's own,
    /// and writes the GPU's clock as it begins and ends for the primitive
    /// the calling thread is evaluating.
    pub(super) fn record_dispatch(
        &self,
        pipeline: &wgpu::ComputePipeline,
        meta: &[u32],
        buffers: &[&wgpu::Buffer],
        clear: Option<u64>,
        grid: (u32, u32),
    ) -> Result<()> {
        self.check()?;
        let layout = self.layout(pipeline);
        let mut slot = lock(&self.encoder);
        let slot = &mut *slot;
        let align = u64::from(self.limits.min_storage_buffer_offset_alignment).max(4);
        let staged = slot.meta.push(&self.device, align, meta);
        // Words larger than the arena's page: a buffer of their own.
        let own;
        let meta_binding = match staged {
            Some(slice) => wgpu::BindingResource::Buffer(slice),
            None => {
                own = self
                    .device
                    .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                        label: Some("meta"),
                        contents: bytemuck::cast_slice(meta),
                        usage: wgpu::BufferUsages::STORAGE,
                    });
                own.as_entire_binding()
            }
        };
        let entries: Vec<wgpu::BindGroupEntry> = std::iter::once(meta_binding)
            .chain(buffers.iter().map(|b| b.as_entire_binding()))
            .enumerate()
            .map(|(i, resource)| wgpu::BindGroupEntry {
                binding: i as u32,
                resource,
            })
            .collect();
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &layout,
            entries: &entries,
        });
        if let (Some(bytes), Some(out)) = (clear, buffers.last()) {
            slot.encoder(&self.device).clear_buffer(out, 0, Some(bytes));
        }
        // Untagged work (recorded outside the evaluator, or with the profile
        // off) is not timed: there is no primitive to put it down to.
        let writes = self.timestamps.as_ref().and_then(|t| {
            let tag = crate::timing::current()?;
            Some(lock(t).next(&self.device, tag))
        });
        let run = |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, &bind, &[]);
            pass.dispatch_workgroups(grid.0, grid.1, 1);
        };
        if writes.is_none() {
            run(slot.shared_pass(&self.device));
        } else {
            let mut pass =
                slot.encoder(&self.device)
                    .begin_compute_pass(&wgpu::ComputePassDescriptor {
                        label: None,
                        timestamp_writes: writes.as_ref().map(|(set, i)| {
                            wgpu::ComputePassTimestampWrites {
                                query_set: set,
                                beginning_of_pass_write_index: Some(*i),
                                end_of_pass_write_index: Some(i + 1),
                            }
                        }),
                    });
            run(&mut pass);
        }
        if slot.count() {
            self.submit_chunk(slot);
        }
        Ok(())
    }

    /// Submits the recorded work (the eval's last chunk); waits for it only
    /// when its passes were timed (to read the timestamps of this and the
    /// eval's earlier chunks back for the profile).
    pub(super) fn flush(&self) -> Result<()> {
        let mut slot = lock(&self.encoder);
        // Resolved and submitted under the encoder's lock, so the passes
        // listed are exactly this encoder's, and work that any thread
        // records after it (and which may read its outputs, or reuse
        // buffers it freed) reaches the queue after it.
        self.submit_chunk(&mut slot);
        slot.restart();
        let readbacks = std::mem::take(&mut *lock(&self.readbacks));
        drop(slot);
        self.finish_timestamps(readbacks)?;
        self.check()
    }

    /// Waits once for the submissions of `readbacks` (profiling
    /// synchronises at the end of each eval) and adds each of their passes'
    /// times to the profile.
    fn finish_timestamps(&self, readbacks: Vec<timestamps::Readback>) -> Result<()> {
        if readbacks.is_empty() {
            return Ok(());
        }
        let buffers: Vec<&wgpu::Buffer> =
            readbacks.iter().map(timestamps::Readback::buffer).collect();
        self.map_read_all(&buffers)?;
        readbacks
            .into_iter()
            .try_for_each(timestamps::Readback::record)
    }
}

/// Submits the work recorded since the last submit (the end of each `eval`).
pub fn submit() -> Result<()> {
    match CONTEXT.get() {
        Some(Ok(c)) => c.flush(),
        _ => Ok(()),
    }
}

/// Records one dispatch of `pipeline` over `threads` invocations (in
/// workgroups of [`codegen::WORKGROUP`]), binding `meta` at 0, the inputs
/// at 1.., and the output last. `clear_output` zeroes the output first
/// (packed outputs are written with atomic ORs).
pub(crate) fn dispatch(
    pipeline: &wgpu::ComputePipeline,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    output_bytes: usize,
    clear_output: bool,
    threads: usize,
) -> Result<()> {
    let groups = threads.div_ceil(codegen::WORKGROUP as usize);
    dispatch_groups(
        pipeline,
        meta,
        inputs,
        output,
        output_bytes,
        clear_output,
        groups,
    )
}

/// [`dispatch_groups`] of a kernel whose f32 `output` (not cleared) may
/// have a half-precision copy beside it ([`codegen::store_with_half`]):
/// `half` is that buffer, its dtype and its elements, bound after
/// `output` and cleared first where its dtype is packed into words.
pub(crate) fn dispatch_groups_with_half(
    pipeline: &wgpu::ComputePipeline,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    output_bytes: usize,
    half: Option<(&ArrayData, Dtype, usize)>,
    groups: usize,
) -> Result<()> {
    let Some((copy, dtype, len)) = half else {
        return dispatch_groups(pipeline, meta, inputs, output, output_bytes, false, groups);
    };
    let bound: Vec<&ArrayData> = inputs.iter().copied().chain([output]).collect();
    let (bytes, clear) = (len * dtype.size_of(), codegen::packed(dtype));
    dispatch_groups(pipeline, meta, &bound, copy, bytes, clear, groups)
}

/// Like [`dispatch`], but over `groups` workgroups of whatever size and
/// shape the kernel declares (one per reduced row, one per output tile).
/// They are spread over a 2-D grid: kernels number them
/// `wid.x + wid.y * nw.x` ([`codegen::GROUP_INDEX`]) and must ignore
/// numbers from `groups` on.
pub(crate) fn dispatch_groups(
    pipeline: &wgpu::ComputePipeline,
    meta: &[u32],
    inputs: &[&ArrayData],
    output: &ArrayData,
    output_bytes: usize,
    clear_output: bool,
    groups: usize,
) -> Result<()> {
    let c = context()?;
    if groups == 0 {
        return Ok(());
    }
    let mut buffers = Vec::with_capacity(inputs.len() + 1);
    for d in inputs {
        buffers.push(buffer_of(d)?);
    }
    buffers.push(buffer_of(output)?);
    let max = c.limits.max_compute_workgroups_per_dimension as usize;
    let (x, y) = if groups <= max {
        (groups, 1)
    } else {
        (max, groups.div_ceil(max))
    };
    if y > max {
        return Err(Error::gpu(format!(
            "{groups} workgroups exceed one dispatch"
        )));
    }
    DISPATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let clear = clear_output.then(|| (output_bytes.next_multiple_of(4) as u64).max(4));
    c.record_dispatch(pipeline, meta, &buffers, clear, (x as u32, y as u32))
}
