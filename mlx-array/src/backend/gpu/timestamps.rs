//! Timestamp queries for the profile (`MLX_PROFILE=1`): every compute pass
//! writes the GPU's clock as it begins and ends, each submitted chunk's
//! queries are resolved into a buffer of their own, all of an eval's are
//! read back at its end, and each pass's time goes to the primitive that
//! recorded it (see [`crate::profile`]).

use std::sync::Arc;
use std::time::Duration;

use crate::Result;
use crate::timing::Tag;

/// Queries per set: wgpu's most, two per pass. A submission with more
/// passes takes more sets, so a submission is never split for profiling.
const PER_SET: u32 = wgpu::QUERY_SET_MAX_QUERIES;

// Each set's results are resolved to a multiple of this set's size, which
// must be a legal resolve offset.
const _: () = assert!(
    (PER_SET as u64 * wgpu::QUERY_SIZE as u64).is_multiple_of(wgpu::QUERY_RESOLVE_BUFFER_ALIGNMENT)
);

/// The query sets, and the passes that wrote to them since the last submission.
pub(crate) struct Timestamps {
    /// Nanoseconds per tick of the GPU's clock.
    period: f64,
    /// Created as passes need them and reused by every submission: the
    /// queue runs submissions in order, so a set's next writes come after
    /// the resolve that read it.
    sets: Vec<wgpu::QuerySet>,
    /// The primitive of each timed pass since the last submission, in query
    /// order: pass `i` writes queries `2i` and `2i + 1`, counted across sets.
    passes: Vec<Arc<Tag>>,
}

impl Timestamps {
    /// No sets yet; `period` is the queue's nanoseconds per tick.
    pub(crate) fn new(period: f32) -> Timestamps {
        Timestamps {
            period: f64::from(period),
            sets: Vec::new(),
            passes: Vec::new(),
        }
    }

    /// Where the next pass, run for `tag`, writes its two timestamps: a
    /// query set and the first of two consecutive indices in it.
    pub(crate) fn next(&mut self, device: &wgpu::Device, tag: Arc<Tag>) -> (wgpu::QuerySet, u32) {
        let first = 2 * self.passes.len();
        let set = first / PER_SET as usize;
        if set == self.sets.len() {
            self.sets
                .push(device.create_query_set(&wgpu::QuerySetDescriptor {
                    label: Some("profile"),
                    ty: wgpu::QueryType::Timestamp,
                    count: PER_SET,
                }));
        }
        self.passes.push(tag);
        (self.sets[set].clone(), (first % PER_SET as usize) as u32)
    }

    /// Records, at the end of `encoder`, the copy of its passes' timestamps
    /// into a buffer the CPU can map; `None` when no pass was timed.
    pub(crate) fn resolve(
        &mut self,
        device: &wgpu::Device,
        encoder: &mut wgpu::CommandEncoder,
    ) -> Option<Readback> {
        if self.passes.is_empty() {
            return None;
        }
        let queries = 2 * self.passes.len() as u64;
        let bytes = queries * u64::from(wgpu::QUERY_SIZE);
        let buffer = |usage, label| {
            device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: bytes,
                usage,
                mapped_at_creation: false,
            })
        };
        let resolved = buffer(
            wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            "profile resolve",
        );
        let readback = buffer(
            wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            "profile readback",
        );
        for (k, set) in self.sets.iter().enumerate() {
            let start = k as u64 * u64::from(PER_SET);
            if start >= queries {
                break;
            }
            let n = (queries - start).min(u64::from(PER_SET)) as u32;
            encoder.resolve_query_set(set, 0..n, &resolved, start * u64::from(wgpu::QUERY_SIZE));
        }
        encoder.copy_buffer_to_buffer(&resolved, 0, &readback, 0, bytes);
        Some(Readback {
            buffer: readback,
            passes: std::mem::take(&mut self.passes),
            period: self.period,
        })
    }
}

/// One submission's timestamps on their way back to the CPU.
pub(crate) struct Readback {
    buffer: wgpu::Buffer,
    passes: Vec<Arc<Tag>>,
    period: f64,
}

impl Readback {
    /// The buffer the CPU maps to read the timestamps.
    pub(crate) fn buffer(&self) -> &wgpu::Buffer {
        &self.buffer
    }

    /// Adds each pass's time to the profile (the buffer is mapped).
    pub(crate) fn record(self) -> Result<()> {
        let ticks: Vec<u64> = {
            let view = self.buffer.slice(..).get_mapped_range().map_err(|e| {
                crate::Error::gpu(format!("reading the profile's timestamps failed: {e}"))
            })?;
            view.chunks_exact(8)
                .map(|b| u64::from_ne_bytes(b.try_into().expect("8 bytes")))
                .collect()
        };
        self.buffer.unmap();
        let period = self.period;
        crate::timing::record_gpu(self.passes.into_iter().zip(ticks.chunks_exact(2)).map(
            |(tag, t)| {
                // A clock that went backwards (some drivers reset it) counts as 0.
                let ns = t[1].saturating_sub(t[0]) as f64 * period;
                (tag, Duration::from_nanos(ns as u64))
            },
        ));
        Ok(())
    }
}
