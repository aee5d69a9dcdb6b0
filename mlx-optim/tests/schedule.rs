//! Schedules at their boundary steps, against values worked out by hand.

use mlx_optim::schedule::*;
use mlx_optim::{Optimizer, Sgd};

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-12 * b.abs().max(1.0)
}

macro_rules! assert_at {
    ($s:expr, $($step:expr => $want:expr),+ $(,)?) => {
        $(
            let got = $s.at($step);
            assert!(close(got, $want), "{:?} at step {}: got {got}, want {}", $s, $step, $want);
        )+
    };
}

#[test]
fn constant_and_numbers() {
    let s: Schedule = 0.25.into();
    assert_at!(s, 0 => 0.25, 1 => 0.25, 1_000_000 => 0.25);
    assert_at!(constant(3.0), 7 => 3.0);
}

#[test]
fn linear_schedule_boundaries() {
    let s = linear_schedule(0.0, 0.1, 10).unwrap();
    assert_at!(s, 0 => 0.0, 1 => 0.01, 5 => 0.05, 9 => 0.09, 10 => 0.1, 11 => 0.1, 500 => 0.1);
    let down = linear_schedule(1.0, 0.5, 4).unwrap();
    assert_at!(down, 0 => 1.0, 2 => 0.75, 4 => 0.5, 5 => 0.5);
    assert!(linear_schedule(0.0, 1.0, 0).is_err());
}

#[test]
fn cosine_decay_boundaries() {
    let s = cosine_decay(0.1, 100, 0.01).unwrap();
    assert_at!(s, 0 => 0.1, 50 => 0.055, 100 => 0.01, 101 => 0.01, 10_000 => 0.01);
    // A quarter of the way: 0.01 + 0.09 * 0.5 * (1 + cos(pi / 4)).
    assert_at!(s, 25 => 0.01 + 0.09 * 0.5 * (1.0 + std::f64::consts::FRAC_1_SQRT_2));
    let to_zero = cosine_decay(1.0, 4, 0.0).unwrap();
    assert_at!(to_zero, 2 => 0.5, 4 => 0.0);
    assert!(cosine_decay(1.0, 0, 0.0).is_err());
}

#[test]
fn step_decay_boundaries() {
    let s = step_decay(0.1, 0.5, 10).unwrap();
    assert_at!(s, 0 => 0.1, 9 => 0.1, 10 => 0.05, 19 => 0.05, 20 => 0.025, 30 => 0.0125);
    assert!(step_decay(0.1, 0.5, 0).is_err());
}

#[test]
fn exponential_decay_steps() {
    let s = exponential_decay(0.1, 0.9);
    assert_at!(s, 0 => 0.1, 1 => 0.09, 3 => 0.0729, 4 => 0.06561);
}

#[test]
fn join_schedules_switches_at_the_boundary() {
    let warmup = linear_schedule(0.0, 1.0, 10).unwrap();
    let hold = constant(0.7);
    let decay = step_decay(1.0, 0.5, 5).unwrap();
    let s = join_schedules(vec![warmup, hold, decay], &[10, 20]).unwrap();
    assert_at!(s, 0 => 0.0, 9 => 0.9, 10 => 0.7, 19 => 0.7, 20 => 1.0, 24 => 1.0, 25 => 0.5, 30 => 0.25);
    assert!(join_schedules(vec![], &[]).is_err());
    assert!(join_schedules(vec![constant(1.0)], &[3]).is_err());
}

#[test]
fn optimizer_learning_rate_follows_mlx_examples() {
    // mlx.optimizers.exponential_decay docs: after 5 updates, 0.06561.
    let mut opt = Sgd::new(exponential_decay(0.1, 0.9));
    assert!(close(opt.learning_rate(), 0.1));
    let params = mlx_array::Tree::new();
    for _ in 0..5 {
        opt.apply_gradients(&mlx_array::Tree::new(), &params)
            .unwrap();
    }
    assert!(close(opt.learning_rate(), 0.06561));
    // join_schedules docs: warmup 10 then cosine over 200; after 12 updates 0.0999938.
    let lr = join_schedules(
        vec![
            linear_schedule(0.0, 0.1, 10).unwrap(),
            cosine_decay(0.1, 200, 0.0).unwrap(),
        ],
        &[10],
    )
    .unwrap();
    let mut opt = Sgd::new(lr);
    assert_eq!(opt.learning_rate(), 0.0);
    for _ in 0..12 {
        opt.apply_gradients(&mlx_array::Tree::new(), &params)
            .unwrap();
    }
    assert!((opt.learning_rate() - 0.0999938).abs() < 1e-7);
    opt.set_learning_rate(0.5);
    assert_eq!(opt.learning_rate(), 0.5);
}

#[test]
fn next_learning_rate_is_the_rate_the_next_update_uses() {
    // Warmup over 4 updates: update k (0-based) uses 0.1 * min(k, 4) / 4.
    let mut opt = Sgd::new(linear_schedule(0.0, 0.1, 4).unwrap());
    let params = mlx_array::Tree::new();
    for k in 0..6u64 {
        let before = opt.next_learning_rate();
        assert!(
            close(before, 0.1 * k.min(4) as f64 / 4.0),
            "update {k}: {before}"
        );
        opt.apply_gradients(&mlx_array::Tree::new(), &params)
            .unwrap();
        // MLX's `learning_rate` after an update: the rate that update used.
        assert_eq!(opt.learning_rate(), before, "update {k}");
    }
}
