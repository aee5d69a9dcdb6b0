//! When recorded work goes to the GPU: in chunks during an eval, so the GPU
//! executes the first kernels while the host still records the rest.
//!
//! Before chunking, an eval recorded every pass into one command encoder and
//! submitted it at its end: on an H100 a reference f32 training step spent
//! 6.2 ms recording about a thousand passes while the GPU sat idle, then
//! 26 ms executing them while the host waited (41 ms a step; issue 38). Now
//! the encoder is submitted once it holds a chunk of passes, and a fresh one
//! takes the next passes: the GPU starts after the first chunk's recording
//! and the rest of the recording hides behind execution.
//!
//! Chunk sizes grow geometrically within an eval, from [`FIRST_CHUNK`]
//! passes, doubling up to [`MAX_CHUNK`]:
//! - the first chunk is small so the GPU starts early: 16 passes take the
//!   host ~0.1 ms to record (6.2 ms / ~1,000 passes a step on the H100);
//! - later chunks are large so submissions stay few: each `queue.submit`
//!   costs the host tens of microseconds (wgpu's resource tracking plus
//!   `vkQueueSubmit`), so a 1,000-pass step takes 7 submissions
//!   (16 + 32 + 64 + 128 + 256 + 256 + the rest at the eval's end), well
//!   under 0.5 ms of host time, while the GPU, which runs ~4x longer than
//!   the host records, always has a chunk queued behind the running one.
//!
//! Every ordering guarantee holds as before: submissions reach the queue in
//! recording order (a chunk is submitted under the encoder's lock, before
//! any later pass is recorded), the queue runs them in that order, and a
//! buffer is read back only after the submission of its producing copy
//! (`download` submits before it waits). Only the number of submissions
//! changes: counted by [`submit_count`]. Within a chunk, consecutive
//! dispatches share one compute pass (ended by anything else recorded on the
//! encoder: a copy, a clear, a timed pass), and the chunk's parameter words
//! are written just before it is submitted (`meta_arena`). The tuning's
//! `chunks=off` ([`crate::settings::GpuTuning::chunks`]) submits once per
//! eval again, to measure what the overlap gains (and, on a software
//! adapter that runs chunks on the recording host's cores, for a quieter
//! figure of the host's own cost).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::meta_arena::MetaArena;

/// Passes in the first chunk of an eval (see the module docs).
pub(crate) const FIRST_CHUNK: usize = 16;

/// The most passes one chunk grows to.
pub(crate) const MAX_CHUNK: usize = 256;

/// The eval's open command encoder and where its chunk ends.
pub(crate) struct Recording {
    /// The compute pass that consecutive dispatches share, open on `encoder` until
    /// anything else is recorded there. Declared first: it ends before the
    /// encoder is dropped.
    pass: Option<wgpu::ComputePass<'static>>,
    /// Where passes and copies are recorded (created on first use).
    encoder: Option<wgpu::CommandEncoder>,
    /// The chunk's dispatches' parameter words (kept from chunk to chunk).
    pub(crate) meta: MetaArena,
    /// Passes and copies in `encoder`.
    commands: usize,
    /// Commands at which `encoder` is submitted.
    chunk: usize,
    /// Whether this eval submits in chunks: the tuning's `chunks`, read at
    /// the eval's first command.
    chunked: Option<bool>,
}

impl Recording {
    /// Nothing recorded; the next chunk is the eval's first.
    pub(crate) const fn new() -> Recording {
        Recording {
            pass: None,
            encoder: None,
            meta: MetaArena::new(),
            commands: 0,
            chunk: FIRST_CHUNK,
            chunked: None,
        }
    }

    /// The encoder, created on first use, with no pass open on it (the
    /// shared pass ends here), for copies, clears and passes of their own.
    pub(crate) fn encoder(&mut self, device: &wgpu::Device) -> &mut wgpu::CommandEncoder {
        self.pass = None;
        self.encoder.get_or_insert_with(|| new_encoder(device))
    }

    /// The shared compute pass, begun on the encoder if none is open.
    pub(crate) fn shared_pass(&mut self, device: &wgpu::Device) -> &mut wgpu::ComputePass<'static> {
        let Recording { pass, encoder, .. } = self;
        pass.get_or_insert_with(|| {
            encoder
                .get_or_insert_with(|| new_encoder(device))
                .begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                .forget_lifetime()
        })
    }

    /// The encoder to submit, its pass ended; `None` when nothing was recorded.
    pub(crate) fn take_encoder(&mut self) -> Option<wgpu::CommandEncoder> {
        self.pass = None;
        self.encoder.take()
    }

    /// The eval ended (its last chunk was submitted): the next chunk is the
    /// next eval's first. The meta arena's pages are kept.
    pub(crate) fn restart(&mut self) {
        debug_assert!(self.encoder.is_none(), "restarted with work unsubmitted");
        self.commands = 0;
        self.chunk = FIRST_CHUNK;
        self.chunked = None;
    }

    /// Counts one more command in the encoder; true when the chunk is full
    /// (the caller submits it and calls [`Recording::submitted`]).
    /// Never full with the tuning's `chunks` off.
    pub(crate) fn count(&mut self) -> bool {
        self.commands += 1;
        let chunked = *self
            .chunked
            .get_or_insert_with(|| crate::settings::gpu_tuning().chunks);
        self.commands >= self.chunk && chunked
    }

    /// The encoder was submitted: the next chunk is twice as large, up to
    /// [`MAX_CHUNK`] (the end of an eval then starts over with
    /// [`Recording::restart`]).
    pub(crate) fn submitted(&mut self) {
        self.commands = 0;
        self.chunk = (self.chunk * 2).min(MAX_CHUNK);
        SUBMITS.fetch_add(1, Ordering::Relaxed);
    }
}

fn new_encoder(device: &wgpu::Device) -> wgpu::CommandEncoder {
    device.create_command_encoder(&wgpu::CommandEncoderDescriptor {
        label: Some("eval"),
    })
}

static SUBMITS: AtomicUsize = AtomicUsize::new(0);

/// Command buffers submitted to the GPU queue since the process started
/// (all threads): one per chunk of an eval, the last at the eval's end.
pub fn submit_count() -> usize {
    SUBMITS.load(Ordering::Relaxed)
}
