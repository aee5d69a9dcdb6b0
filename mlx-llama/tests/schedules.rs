//! The learning-rate schedules (`--schedule`, `--min-lr`, `--decay-fraction`)
//! against values computed independently, and a run's metrics reporting the
//! rates it used.
//!
//! The expected values were computed in Python (float64) with transcriptions
//! of Hugging Face's `LambdaLR` factors in `transformers.optimization`, times
//! the base rate 1e-3, for 20 steps with 4 of warmup:
//!
//! ```text
//! warmup (t < W):  t / max(1, W)
//! linear:          max(0, (T - t) / max(1, T - W))           _get_linear_schedule_with_warmup_lr_lambda
//! cosine:          p = (t - W) / max(1, T - W); f = 0.5 * (1 + cos(pi * 2 * 0.5 * p));
//!                  f * (1 - min_lr_rate) + min_lr_rate       _get_cosine_schedule_with_warmup_lr_lambda
//! wsd:             1 for W <= t < W + S; then p = (t - W - S) / max(1, D),
//!                  f = 1 - p (linear) or 1 - sqrt(p) (1-sqrt);
//!                  f * (1 - min_lr_ratio) + min_lr_ratio     _get_wsd_scheduler_lambda
//! ```
//!
//! with `S = T - W - D` and `D = round(T * decay_fraction)` (torchtitan's
//! `decay_ratio`). Hugging Face's linear has no floor: with `--min-lr` the
//! same factor `f` is mapped to `min + (lr - min) * f`, as its cosine and
//! WSD map theirs. A few are checked by hand in the comments.

mod common;

use mlx_llama::{ScheduleKind, TrainConfig};

/// The schedule of a 20-step run at 1e-3 with 4 warmup steps.
fn config(schedule: ScheduleKind, min_lr: Option<f64>, decay_fraction: Option<f64>) -> TrainConfig {
    TrainConfig {
        steps: 20,
        warmup: 4,
        learning_rate: 1e-3,
        schedule,
        min_lr,
        decay_fraction,
        ..TrainConfig::default()
    }
}

/// Asserts the rate at each `(t, value)` to 1e-12 relative.
fn check(cfg: &TrainConfig, want: &[(u64, f64)]) {
    let s = mlx_llama::trainer::lr_schedule(cfg).unwrap();
    for &(t, v) in want {
        let got = s.at(t);
        assert!(
            (got - v).abs() <= 1e-12 * v.abs().max(1e-3),
            "{:?} min {:?} fraction {:?}: at t = {t} {got}, expected {v}",
            cfg.schedule,
            cfg.min_lr,
            cfg.decay_fraction
        );
    }
}

#[test]
fn cosine_decays_to_a_tenth_of_the_rate_unless_min_lr_names_the_floor() {
    // Today's default, unchanged: t = 12 is half way (8 of 16 steps), so
    // 0.1 + 0.9 * 0.5 = 0.55 of the rate.
    check(
        &config(ScheduleKind::Cosine, None, None),
        &[
            (0, 0.0),
            (2, 0.0005),
            (4, 0.001),
            (8, 0.0008681980515339464),
            (12, 0.00055),
            (19, 0.00010864662381854631),
        ],
    );
    check(
        &config(ScheduleKind::Cosine, Some(2e-4), None),
        &[
            (4, 0.001),
            (12, 0.0006000000000000001),
            (19, 0.00020768588783870784),
        ],
    );
}

#[test]
fn linear_decays_from_the_rate_to_min_lr_at_the_last_step() {
    // (20 - 19) / 16 of the rate at the last step: 6.25e-5.
    check(
        &config(ScheduleKind::Linear, None, None),
        &[
            (0, 0.0),
            (2, 0.0005),
            (4, 0.001),
            (12, 0.0005),
            (19, 6.25e-05),
        ],
    );
    check(
        &config(ScheduleKind::Linear, Some(2e-4), None),
        &[(4, 0.001), (12, 0.0006000000000000001), (19, 0.00025)],
    );
}

#[test]
fn wsd_holds_the_rate_then_decays_over_the_last_fraction_linearly_or_by_sqrt() {
    // D = 5 decay steps from t = 15: at t = 17, p = 0.4, so 0.1 + 0.9 * 0.6
    // = 0.64 of the rate, and with 1 - sqrt(0.4) = 0.3675, 0.4308.
    check(
        &config(ScheduleKind::Wsd, Some(1e-4), Some(0.25)),
        &[
            (2, 0.0005),
            (4, 0.001),
            (14, 0.001),
            (15, 0.001),
            (17, 0.00064),
            (19, 0.00028),
        ],
    );
    check(
        &config(ScheduleKind::WsdSqrt, Some(1e-4), Some(0.25)),
        &[
            (4, 0.001),
            (14, 0.001),
            (15, 0.001),
            (17, 0.00043079002116969166),
            (19, 0.00019501552810007573),
        ],
    );
    // The defaults: the last fifth (4 steps, from t = 16), down to 0.
    check(
        &config(ScheduleKind::Wsd, None, None),
        &[(15, 0.001), (16, 0.001), (18, 0.0005), (19, 0.00025)],
    );
}

#[test]
fn options_a_schedule_cannot_honour_are_refused_by_name() {
    let refused = |cfg: TrainConfig, says: &str| {
        let e = format!("{:#}", mlx_llama::trainer::lr_schedule(&cfg).unwrap_err());
        assert!(e.contains(says), "{e}");
    };
    refused(config(ScheduleKind::Constant, Some(1e-4), None), "--min-lr");
    refused(
        config(ScheduleKind::Cosine, None, Some(0.2)),
        "--decay-fraction",
    );
    refused(config(ScheduleKind::Linear, Some(2e-3), None), "--min-lr");
    refused(
        config(ScheduleKind::Wsd, None, Some(1.5)),
        "--decay-fraction",
    );
    // 4 warmup steps and 18 decay steps do not fit in 20.
    refused(
        config(ScheduleKind::Wsd, None, Some(0.9)),
        "would start before the 4 warmup steps end",
    );
}

#[test]
fn a_run_reports_the_rates_its_schedule_gives() {
    // 8 steps, 2 of warmup, wsd decaying over round(8 * 0.25) = 2 steps
    // from t = 6 to 1e-4: by hand, 0, 0.5, then 1 until t = 6, then
    // p = 1/2 at t = 7: 0.1 + 0.9 * 0.5 = 0.55 (of 1e-3).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let cfg = TrainConfig {
        learning_rate: 1e-3,
        warmup: 2,
        schedule: ScheduleKind::Wsd,
        min_lr: Some(1e-4),
        decay_fraction: Some(0.25),
        ..common::tiny(&out, 8)
    };
    mlx_llama::train(&cfg, &mlx_dist::Group::single()).unwrap();
    let got = common::metric_column(&out.join("metrics.jsonl"), "learning_rate");
    let want = [0.0, 5e-4, 1e-3, 1e-3, 1e-3, 1e-3, 1e-3, 5.5e-4];
    assert_eq!(got.len(), want.len());
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() < 1e-15, "step {}: {g} vs {w}", t + 1);
    }
    // The CSV beside it has the same column.
    let csv = std::fs::read_to_string(out.join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let col = header.iter().position(|h| *h == "learning_rate").unwrap();
    let rates: Vec<f64> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').nth(col).unwrap().parse().unwrap())
        .collect();
    assert_eq!(rates, got);
}
