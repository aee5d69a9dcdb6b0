//! Where a step's host time goes on the GPU: recording GPU work (and how
//! many kernels it dispatched), waiting for the GPU, and CPU kernels, with
//! what crossed between the two. The transfers and dispatches are counted
//! always (a few atomics); the times come from the profile and are printed
//! per step with `MLX_PROFILE=1`.

use std::ops::Sub;
use std::time::Duration;

use mlx_array::backend::gpu::{Transfers, dispatch_count, transfers};
use mlx_array::profile::{self, Clock};

/// The process's totals at one moment; subtract two for a step's.
pub(super) struct HostTime {
    /// Host-GPU transfers and waits for the GPU.
    pub transfers: Transfers,
    /// GPU kernels dispatched.
    dispatches: usize,
    /// Host time GPU primitives spent recording their dispatches (zero
    /// unless profiling).
    recording: Duration,
    /// Host time in CPU kernels, collectives and transfers to the host
    /// (which include their wait; zero unless profiling).
    cpu: Duration,
}

impl HostTime {
    /// The totals so far.
    pub(super) fn now() -> HostTime {
        let (mut recording, mut cpu) = (Duration::ZERO, Duration::ZERO);
        if profile::enabled() {
            for e in profile::entries() {
                match e.clock {
                    Clock::GpuRecording => recording += e.total,
                    Clock::Cpu => cpu += e.total,
                    Clock::Gpu => {}
                }
            }
        }
        HostTime {
            transfers: transfers(),
            dispatches: dispatch_count(),
            recording,
            cpu,
        }
    }

    /// One line for a step of `wall` time.
    pub(super) fn describe(&self, wall: Duration) -> String {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        format!(
            "host_ms={:.1} gpu_recording_ms={:.1} gpu_dispatches={} gpu_wait_ms={:.1} gpu_waits={} \
             cpu_kernels_ms={:.1} to_gpu={} to_gpu_bytes={} to_host={} to_host_bytes={}",
            ms(wall),
            ms(self.recording),
            self.dispatches,
            ms(self.transfers.waited),
            self.transfers.waits,
            ms(self.cpu),
            self.transfers.to_device,
            self.transfers.to_device_bytes,
            self.transfers.to_host,
            self.transfers.to_host_bytes,
        )
    }
}

impl Sub for HostTime {
    type Output = HostTime;
    fn sub(self, earlier: HostTime) -> HostTime {
        HostTime {
            transfers: self.transfers - earlier.transfers,
            dispatches: self.dispatches.saturating_sub(earlier.dispatches),
            recording: self.recording.saturating_sub(earlier.recording),
            cpu: self.cpu.saturating_sub(earlier.cpu),
        }
    }
}
