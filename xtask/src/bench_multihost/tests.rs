//! The goals and the ring's samples, checked on made-up measurements.

use crate::alpha_beta;
use crate::bench_collectives::{Row, Run};

use super::goals::{GOAL_BYTES, goals};
use super::projection::efficiency;
use super::results::RateResult;

fn row(op: &str, bytes: u64, time_us: f64, busbw: f64) -> Row {
    Row {
        op: op.into(),
        bytes,
        time_us,
        algbw: busbw,
        busbw,
        ceiling: 1.0,
        ratio: busbw,
    }
}

fn run(backend: &str, world: usize, rows: Vec<Row>) -> Run {
    Run {
        backend: backend.into(),
        world,
        status: "ok".into(),
        reason: None,
        wall_s: 1.0,
        ceiling: vec![],
        rows,
    }
}

fn rate(bits: u64, ceiling: f64, runs: Vec<Run>) -> RateResult {
    RateResult {
        rate: format!("{}gbit", bits / 1_000_000_000),
        bits,
        ceiling: Ok(ceiling),
        ceiling_each: vec![ceiling],
        concurrent: vec![],
        runs,
        mlx: vec![],
        load_before: None,
    }
}

#[test]
fn goals_per_rate_world_and_quic_against_the_ring() {
    let m = GOAL_BYTES;
    let ten = rate(
        10_000_000_000,
        1.0,
        vec![
            run("ring", 2, vec![row("all_sum", m, 1.0, 0.91)]),
            run("ring", 4, vec![row("all_sum", m, 1.0, 0.5)]),
            run("tls", 2, vec![row("all_sum", m, 1.0, 0.55)]),
            run("quic", 2, vec![row("all_sum", m, 1.0, 0.40)]),
        ],
    );
    let one = rate(
        1_000_000_000,
        0.12,
        vec![run("ring", 2, vec![row("all_sum", m, 1.0, 0.115)])],
    );
    let g = goals(&[ten, one], &[2, 4]);
    let met: Vec<Option<bool>> = g.iter().map(|(_, x)| x.as_ref().map(|y| y.1)).collect();
    // 10gbit ring w2, w4; 1gbit ring w2, w4; 10gbit tls w2, w4; quic w2, w4.
    assert_eq!(
        met,
        vec![
            Some(true),
            Some(false),
            Some(true),
            None,
            Some(true),
            None,
            Some(false),
            None
        ]
    );
    assert!(g[0].0.contains("at least 90%"));
    assert!(g[2].0.contains("at least 95%"));
    assert!(g[4].0.contains("TLS all_sum, world 2"));
    assert!(g[4].1.as_ref().unwrap().0.starts_with("60%"));
    assert!(g[6].1.as_ref().unwrap().0.starts_with("44%"));
}

#[test]
fn the_ring_samples_feed_the_fit() {
    let (alpha, beta) = (40e-6, 1e-9);
    let rows = |n: usize| {
        [1u64 << 10, 1 << 20, 64 << 20]
            .iter()
            .map(|&b| {
                let t = alpha_beta::predict(alpha, beta, n, b as f64);
                row("all_sum", b, t * 1e6, 0.0)
            })
            .chain(std::iter::once(row("all_gather", 1 << 20, 1.0, 0.0)))
            .collect::<Vec<_>>()
    };
    let r = rate(
        10_000_000_000,
        1.0,
        vec![
            run("ring", 2, rows(2)),
            run("ring", 4, rows(4)),
            run("quic", 2, rows(2)),
        ],
    );
    assert_eq!(r.ring_samples(None).len(), 6);
    assert_eq!(r.ring_samples(Some(4)).len(), 3);
    let f = alpha_beta::fit(&r.ring_samples(None)).unwrap();
    assert!((f.alpha - alpha).abs() < 1e-9 && (f.beta - beta).abs() < 1e-15);
    // 1 ns/B = 1 GB/s on a 10 Gbit/s (1.25 GB/s) link.
    assert!((efficiency(&f, 10_000_000_000) - 0.8).abs() < 1e-6);
}
