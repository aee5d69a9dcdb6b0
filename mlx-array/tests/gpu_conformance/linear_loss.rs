//! The output projection fused with the cross-entropy (`linear_cross_entropy`
//! and its gradient) on the GPU against the CPU: several vocabulary chunks,
//! every float dtype, strided views, targets at the edges of the vocabulary,
//! ignored rows and label smoothing.

use mlx_array::primitives::loss::{LinearCrossEntropyGrad, LinearCrossEntropyOptions};
use mlx_array::{Array, Dtype, linear_cross_entropy, linear_cross_entropy_sum};

use crate::common::{LAYOUTS, Layout, make};
use crate::elementwise::values_in;
use crate::harness::{CpuSum, compare, compare_grad, gpu, tol};

/// The primitives this module checks on the GPU.
pub const NAMES: &[&str] = &[
    "linear_cross_entropy",
    "linear_cross_entropy_grad",
    "linear_cross_entropy_value_and_grad",
    "packed_loss",
];

const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

/// Targets for `rows` rows of a `vocab`-class problem: the first and last
/// class, then pseudo-random ones, with every fifth row (from the third) set
/// to `ignored` when given.
fn targets(rows: usize, vocab: usize, ignored: Option<i64>, seed: u64) -> Vec<i32> {
    let r = values_in(&[rows], seed, 0.0, vocab as f64, true);
    (0..rows)
        .map(|i| match i {
            0 => 0,
            1 => vocab as i32 - 1,
            _ if i % 5 == 2 && ignored.is_some() => ignored.unwrap() as i32,
            _ => r.v[i] as i32,
        })
        .collect()
}

struct Case {
    rows: usize,
    dims: usize,
    vocab: usize,
    opts: LinearCrossEntropyOptions,
}

fn cases() -> Vec<Case> {
    let o = |chunk, ignore_index, label_smoothing| LinearCrossEntropyOptions {
        ignore_index,
        label_smoothing,
        chunk,
        block_rows: 0,
    };
    vec![
        // Several chunks, the last one partial; an ignore index outside the vocabulary.
        Case {
            rows: 5,
            dims: 16,
            vocab: 50,
            opts: o(16, Some(-100), 0.0),
        },
        // Wider than a matmul tile and a workgroup in every direction, smoothed.
        Case {
            rows: 37,
            dims: 40,
            vocab: 300,
            opts: o(70, None, 0.1),
        },
        // An ignore index inside the vocabulary; the default chunk (one chunk).
        Case {
            rows: 13,
            dims: 24,
            vocab: 130,
            opts: o(0, Some(3), 0.05),
        },
        // One class per chunk.
        Case {
            rows: 3,
            dims: 5,
            vocab: 4,
            opts: o(1, None, 0.0),
        },
    ]
}

#[test]
fn linear_cross_entropy_matches_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    for d in FLOATS {
        for (k, c) in cases().into_iter().enumerate() {
            for layout in LAYOUTS {
                let seed = 40 + k as u64;
                let h = make(
                    &values_in(&[c.rows, c.dims], seed, -1.0, 1.0, false),
                    d,
                    layout,
                );
                // The weight read transposed whenever the hidden states are not dense.
                let w_layout = match layout {
                    Layout::Dense => Layout::Dense,
                    _ => Layout::Transposed,
                };
                let w = make(
                    &values_in(&[c.vocab, c.dims], seed + 100, -1.0, 1.0, false),
                    d,
                    w_layout,
                );
                let t = Array::from_slice(
                    &targets(c.rows, c.vocab, c.opts.ignore_index, seed),
                    &[c.rows],
                )
                .unwrap();
                let opts = c.opts;
                let what = format!(
                    "linear_cross_entropy {d} {layout:?} {}x{}x{} {opts:?}",
                    c.rows, c.dims, c.vocab
                );
                compare(
                    &what,
                    &[h.clone(), w.clone(), t.clone()],
                    |a| linear_cross_entropy(&a[0], &a[1], &a[2], &opts),
                    1e-5,
                );
                // The gradient primitive directly, with per-row cotangents
                // (zeros among them) and the forward losses.
                let ct = make(
                    &values_in(&[c.rows], seed + 200, -2.0, 2.0, true),
                    Dtype::F32,
                    Layout::Reversed,
                );
                compare(
                    &format!("{what} grad"),
                    &[h, w, t, ct],
                    |a| {
                        let loss = linear_cross_entropy(&a[0], &a[1], &a[2], &opts)?;
                        Ok(Array::from_primitive(
                            LinearCrossEntropyGrad(opts),
                            vec![a[0].clone(), a[1].clone(), a[2].clone(), a[3].clone(), loss],
                            vec![a[0].size() + a[1].size()],
                            a[0].dtype(),
                        ))
                    },
                    tol(d).max(1e-5),
                );
            }
        }
    }
}

#[test]
fn linear_cross_entropy_batched_rows_u32_targets_and_no_rows() {
    let Some(_gpu) = gpu() else { return };
    // Hidden states [2, 3, D] and u32 targets [2, 3] with an ignored row.
    let h = make(
        &values_in(&[2, 3, 8], 50, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Dense,
    );
    let w = make(
        &values_in(&[33, 8], 51, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Dense,
    );
    let t = Array::from_slice(&[32u32, 0, 7, 4_000_000_000, 5, 31], &[2, 3]).unwrap();
    let opts = LinearCrossEntropyOptions {
        ignore_index: Some(4_000_000_000),
        label_smoothing: 0.0,
        chunk: 10,
        block_rows: 0,
    };
    compare(
        "linear_cross_entropy batched u32",
        &[h, w.clone(), t],
        |a| linear_cross_entropy(&a[0], &a[1], &a[2], &opts),
        1e-5,
    );
    // No rows: empty losses, and a zero weight gradient.
    let h = Array::from_slice::<f32>(&[], &[0, 8]).unwrap();
    let t = Array::from_slice::<i32>(&[], &[0]).unwrap();
    compare(
        "linear_cross_entropy no rows",
        &[h.clone(), w.clone(), t.clone()],
        |a| linear_cross_entropy(&a[0], &a[1], &a[2], &opts),
        0.0,
    );
    let ct = Array::from_slice::<f32>(&[], &[0]).unwrap();
    compare(
        "linear_cross_entropy_grad no rows",
        &[h, w, t, ct],
        |a| {
            let loss = linear_cross_entropy(&a[0], &a[1], &a[2], &opts)?;
            Ok(Array::from_primitive(
                LinearCrossEntropyGrad(opts),
                vec![a[0].clone(), a[1].clone(), a[2].clone(), a[3].clone(), loss],
                vec![a[0].size() + a[1].size()],
                a[0].dtype(),
            ))
        },
        0.0,
    );
}

/// Mean loss over 21 rows (2 ignored) of a 150-class problem in chunks of
/// 32, weighted per row so that the cotangents differ.
fn weighted_mean_loss(a: &[Array]) -> mlx_array::Result<Array> {
    let opts = LinearCrossEntropyOptions {
        ignore_index: Some(-1),
        label_smoothing: 0.0,
        chunk: 32,
        block_rows: 0,
    };
    let mut t = targets(21, 150, Some(-1), 60);
    t[20] = 149;
    let t = Array::from_slice(&t, &[21])?;
    let weights = Array::from_slice(
        &(0..21).map(|i| 0.5 + i as f32 / 21.0).collect::<Vec<_>>(),
        &[21],
    )?;
    linear_cross_entropy(&a[0], &a[1], &t, &opts)?
        .multiply(&weights)?
        .cpu_sum(&[0])?
        .mul_scalar(1.0 / 21.0)
}

/// A smoothed sum over a `[3, 4, D]` batch in chunks of 50 (a partial last one).
fn smoothed_sum_loss(a: &[Array]) -> mlx_array::Result<Array> {
    let opts = LinearCrossEntropyOptions {
        ignore_index: None,
        label_smoothing: 0.2,
        chunk: 50,
        block_rows: 0,
    };
    let t = Array::from_slice(&targets(12, 120, None, 61), &[3, 4])?;
    linear_cross_entropy(&a[0], &a[1], &t, &opts)?.cpu_sum(&[0, 1])
}

#[test]
fn linear_cross_entropy_gradients_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    for d in [Dtype::F32, Dtype::BF16] {
        let h = make(
            &values_in(&[21, 24], 62, -1.0, 1.0, false),
            d,
            Layout::Transposed,
        );
        let w = make(
            &values_in(&[150, 24], 63, -1.0, 1.0, false),
            d,
            Layout::Dense,
        );
        compare_grad(
            &format!("weighted mean linear_cross_entropy {d}"),
            &[h, w],
            weighted_mean_loss,
            tol(d).max(1e-5),
        );
        let h = make(
            &values_in(&[3, 4, 16], 64, -1.0, 1.0, false),
            d,
            Layout::Strided,
        );
        let w = make(
            &values_in(&[120, 16], 65, -1.0, 1.0, false),
            d,
            Layout::Reversed,
        );
        compare_grad(
            &format!("smoothed sum linear_cross_entropy {d}"),
            &[h, w],
            smoothed_sum_loss,
            tol(d).max(1e-5),
        );
    }
}

/// The training loss (value and gradient in one pass) over 21 rows of a
/// 150-class problem with masked and ignored rows and label smoothing.
fn training_loss(a: &[Array]) -> mlx_array::Result<Array> {
    let opts = LinearCrossEntropyOptions {
        ignore_index: Some(-1),
        label_smoothing: 0.1,
        chunk: 32,
        block_rows: 8,
    };
    let t = Array::from_slice(&targets(21, 150, Some(-1), 66), &[21])?;
    let weights = Array::from_slice(
        &(0..21)
            .map(|i| {
                if i % 4 == 1 {
                    0.0
                } else {
                    0.5 + i as f32 / 21.0
                }
            })
            .collect::<Vec<_>>(),
        &[21],
    )?;
    linear_cross_entropy_sum(&a[0], &a[1], &t, &weights, &opts)
}

#[test]
fn the_training_loss_and_its_gradients_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    for d in FLOATS {
        let h = make(
            &values_in(&[21, 24], 67, -1.0, 1.0, false),
            d,
            Layout::Transposed,
        );
        let w = make(
            &values_in(&[150, 24], 68, -1.0, 1.0, false),
            d,
            Layout::Dense,
        );
        compare_grad(
            &format!("linear_cross_entropy_sum {d}"),
            &[h, w],
            training_loss,
            tol(d).max(1e-5),
        );
    }
}
