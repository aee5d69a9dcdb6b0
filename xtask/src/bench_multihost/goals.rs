//! The goals across hosts: the ring against one TCP stream, and TLS
//! and QUIC against the ring, checked on what was measured.

use crate::report_common::Goal;

use super::results::RateResult;

/// The goals' message size.
pub(super) const GOAL_BYTES: u64 = 64 << 20;

/// The encrypted transports' goal at 10 Gbit/s: this fraction of the
/// ring's bus bandwidth (TLS over the ring's TCP is the road taken; QUIC is
/// measured beside it).
const GOAL_QUIC_OF_RING: f64 = 0.5;

/// The ring's goal at a link rate: a fraction of the one-stream ceiling.
fn ring_goal(bits: u64) -> Option<f64> {
    match bits {
        1_000_000_000 => Some(0.95),
        10_000_000_000 => Some(0.90),
        _ => None,
    }
}

/// The goals: `(goal, measured, met)`; `None` where not measured.
pub(super) fn goals(results: &[RateResult], worlds: &[usize]) -> Vec<Goal> {
    let mut v = Vec::new();
    for r in results {
        let Some(goal) = ring_goal(r.bits) else {
            continue;
        };
        let ceil = r.ceiling_gbs();
        for &w in worlds {
            let got = r.point("ring", w, "all_sum", GOAL_BYTES).map(|(_, bus)| {
                (
                    format!("{:.0}% ({bus:.3} of {ceil:.3} GB/s)", 100.0 * bus / ceil),
                    bus / ceil >= goal,
                )
            });
            v.push((
                format!(
                    "{}: ring all_sum, world {w}, 64 MiB: bus bandwidth at least {:.0}% of one TCP stream",
                    r.rate,
                    goal * 100.0
                ),
                got,
            ));
        }
    }
    for r in results.iter().filter(|r| r.bits == 10_000_000_000) {
        for (backend, name) in [("tls", "TLS"), ("quic", "QUIC")] {
            for &w in worlds {
                let ring = r.point("ring", w, "all_sum", GOAL_BYTES);
                let quic = r.point(backend, w, "all_sum", GOAL_BYTES);
                let got = ring.zip(quic).map(|((_, rb), (_, qb))| {
                    (
                        format!("{:.0}% ({qb:.3} of {rb:.3} GB/s)", 100.0 * qb / rb),
                        qb / rb >= GOAL_QUIC_OF_RING,
                    )
                });
                v.push((
                format!(
                    "{}: {name} all_sum, world {w}, 64 MiB: at least {:.0}% of the ring's bus bandwidth",
                    r.rate,
                    GOAL_QUIC_OF_RING * 100.0
                ),
                got,
            ));
            }
        }
    }
    v
}
