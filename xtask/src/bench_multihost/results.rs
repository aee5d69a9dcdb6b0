//! What one link rate measured ([`RateResult`]) and the ring's fits at it
//! ([`RateFits`]).

use crate::alpha_beta::{Fit, Sample};
use crate::bench_collectives::Run;

use super::mlx::MlxRun;

/// Everything measured at one link rate.
pub(super) struct RateResult {
    /// As given (tc syntax).
    pub(super) rate: String,
    pub(super) bits: u64,
    /// One stream host 0 -> host 1, GB/s (the median transfer), or why not.
    pub(super) ceiling: Result<f64, String>,
    /// Each timed transfer of the one stream, GB/s.
    pub(super) ceiling_each: Vec<f64>,
    /// `(n, per-stream GB/s)`: n streams at once around the ring of hosts.
    pub(super) concurrent: Vec<(usize, Result<Vec<f64>, String>)>,
    pub(super) runs: Vec<Run>,
    pub(super) mlx: Vec<MlxRun>,
    pub(super) load_before: Option<String>,
}

impl RateResult {
    /// The ceiling used for the ratios: the measured stream's best timed
    /// transfer (the machine's other work only ever slows a transfer down),
    /// else what the link carries as TCP payload with a 1500-byte MTU (1448
    /// of 1514 bytes).
    pub(super) fn ceiling_gbs(&self) -> f64 {
        match &self.ceiling {
            Ok(g) => self.ceiling_each.iter().copied().fold(*g, f64::max),
            Err(_) => self.bits as f64 / 8e9 * 1448.0 / 1514.0,
        }
    }

    /// `op` of `backend` at `world` and `bytes`: (seconds, busbw GB/s).
    pub(super) fn point(
        &self,
        backend: &str,
        world: usize,
        op: &str,
        bytes: u64,
    ) -> Option<(f64, f64)> {
        if backend == "mlx" {
            if op != "all_sum" {
                return None;
            }
            return self
                .mlx
                .iter()
                .filter(|r| r.world == world)
                .flat_map(|r| &r.rows)
                .find(|x| x.bytes == bytes)
                .map(|x| (x.secs, x.busbw));
        }
        self.runs
            .iter()
            .filter(|r| r.backend == backend && r.world == world)
            .flat_map(|r| &r.rows)
            .find(|x| x.op == op && x.bytes == bytes)
            .map(|x| (x.time_us / 1e6, x.busbw))
    }

    /// The ring's all_sum measurements at `world` (every world when `None`).
    pub(super) fn ring_samples(&self, world: Option<usize>) -> Vec<Sample> {
        self.runs
            .iter()
            .filter(|r| r.backend == "ring" && world.is_none_or(|w| r.world == w))
            .flat_map(|r| {
                r.rows
                    .iter()
                    .filter(|x| x.op == "all_sum")
                    .map(move |x| Sample {
                        n: r.world,
                        bytes: x.bytes as f64,
                        secs: x.time_us / 1e6,
                    })
            })
            .collect()
    }
}

/// The fits of one rate: over every world, then per world.
pub(super) struct RateFits {
    pub(super) rate: String,
    pub(super) bits: u64,
    pub(super) joint: Option<Fit>,
    pub(super) per_world: Vec<(usize, Option<Fit>)>,
}
