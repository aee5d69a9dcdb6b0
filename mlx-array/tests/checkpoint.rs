//! Activation checkpointing: the same values and gradients, bit for bit,
//! with a chain's intermediates recomputed instead of kept.

use std::sync::{Arc, Mutex};

use mlx_array::autodiff::{Recompute, checkpoint, rematerialize, value_and_grad};
use mlx_array::{Array, Dtype, Result, eval, memory, random};

/// The byte counters are the process's: the tests that read them run one
/// at a time.
static MEMORY: Mutex<()> = Mutex::new(());

const BLOCKS: usize = 6;
const ROWS: usize = 512;
const WIDTH: usize = 128;

/// One residual block with several intermediates of the input's size.
fn block(x: &[Array]) -> Result<Vec<Array>> {
    let (h, w1, w2) = (&x[0], &x[1], &x[2]);
    let a = h.matmul(w1)?.tanh()?;
    let b = a.multiply(&a.sigmoid()?)?;
    let c = b.matmul(w2)?.exp()?.log1p()?;
    Ok(vec![h.add(&c)?])
}

fn weights() -> Vec<Array> {
    let k = random::key(7);
    let keys = random::split_keys(&k, 2 * BLOCKS + 1).unwrap();
    keys.iter()
        .enumerate()
        .map(|(i, k)| {
            let shape: &[usize] = if i == 0 {
                &[ROWS, WIDTH]
            } else {
                &[WIDTH, WIDTH]
            };
            random::normal(k, shape, Dtype::F32)
                .unwrap()
                .multiply(&Array::scalar(if i == 0 { 1.0f32 } else { 0.1 }))
                .unwrap()
        })
        .collect()
}

/// The chain's loss from `args` (input, then two weights per block), each
/// block checkpointed or not.
fn chain(args: &[Array], checkpointed: bool) -> Result<Array> {
    let f: Recompute = Arc::new(block);
    let mut h = args[0].clone();
    for b in 0..BLOCKS {
        let inputs = [h, args[1 + 2 * b].clone(), args[2 + 2 * b].clone()];
        h = if checkpointed {
            checkpoint(f.clone(), &inputs)?.remove(0)
        } else {
            block(&inputs)?.remove(0)
        };
    }
    h.square()?.sum_all()
}

/// The loss, every gradient, and the peak bytes held while computing them.
fn run(checkpointed: bool) -> (f32, Vec<Vec<f32>>, usize) {
    let args = weights();
    eval(&args).unwrap();
    let argnums: Vec<usize> = (0..args.len()).collect();
    let before = memory::active();
    memory::reset_peak();
    let (loss, grads) =
        value_and_grad(move |a: &[Array]| chain(a, checkpointed), &argnums)(&args).unwrap();
    eval((&loss, &grads)).unwrap();
    let peak = memory::peak() - before;
    let grads = grads.iter().map(|g| g.to_vec::<f32>().unwrap()).collect();
    (loss.item::<f32>().unwrap(), grads, peak)
}

#[test]
fn checkpointed_gradients_equal_kept_ones_bit_for_bit_and_hold_less() {
    let _one = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    let (loss, grads, kept_peak) = run(false);
    let (c_loss, c_grads, checkpointed_peak) = run(true);
    assert_eq!(loss.to_bits(), c_loss.to_bits());
    for (i, (g, c)) in grads.iter().zip(&c_grads).enumerate() {
        let same = g.iter().zip(c).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "gradient {i} differs with checkpointing");
    }
    // Kept: four intermediates of the input's size per block (tanh's and
    // sigmoid's outputs, their product, exp's output) live until the
    // backward pass reaches the block. Checkpointed: each block's input,
    // the gradients (one input's and two weights' per block), and a few
    // arrays of one block at a time (its recomputed values, their
    // cotangents).
    let activation = ROWS * WIDTH * 4;
    let weight = WIDTH * WIDTH * 4;
    assert!(
        kept_peak >= BLOCKS * 4 * activation,
        "kept peak {kept_peak} B: the plain chain should keep its intermediates"
    );
    let bound = BLOCKS * activation + (activation + BLOCKS * 2 * weight) + 6 * activation;
    assert!(
        checkpointed_peak <= bound,
        "checkpointed peak {checkpointed_peak} B over {bound} B ({kept_peak} B kept)"
    );
}

#[test]
fn outputs_without_cotangents_and_integer_inputs() {
    // Two outputs, one unused by the loss; an integer input that gets no
    // gradient; a checkpoint inside a checkpoint.
    let inner: Recompute = Arc::new(|x: &[Array]| Ok(vec![x[0].sin()?.multiply(&x[0])?]));
    let outer: Recompute = {
        let inner = inner.clone();
        Arc::new(move |x: &[Array]| {
            let picked = x[0].take(&x[1], 0)?;
            let y = checkpoint(inner.clone(), &[picked])?.remove(0);
            Ok(vec![y.exp()?, x[0].cos()?])
        })
    };
    let plain = {
        let inner = inner.clone();
        move |x: &[Array]| {
            let picked = x[0].take(&x[1], 0)?;
            let y = inner(&[picked])?.remove(0);
            y.exp()?.sum_all()
        }
    };
    let kept = move |x: &[Array]| {
        let outs = checkpoint(outer.clone(), &[x[0].clone(), x[1].clone()])?;
        outs[0].sum_all()
    };
    let args = [
        Array::from_slice(&[0.3f32, -1.2, 2.0, 0.7], &[4]).unwrap(),
        Array::from_slice(&[2i32, 0, 2], &[3]).unwrap(),
    ];
    let (a, ga) = value_and_grad(plain, &[0, 1])(&args).unwrap();
    let (b, gb) = value_and_grad(kept, &[0, 1])(&args).unwrap();
    assert_eq!(a.item::<f32>().unwrap(), b.item::<f32>().unwrap());
    assert_eq!(
        ga[0].to_vec::<f32>().unwrap(),
        gb[0].to_vec::<f32>().unwrap()
    );
    // Index 1 never picked: its gradient is zero; index 2 picked twice.
    let g = gb[0].to_vec::<f32>().unwrap();
    assert_eq!(g[1], 0.0);
    assert_eq!(g[3], 0.0);
    assert_ne!(g[2], 0.0);
    assert_eq!(gb[1].to_vec::<i32>().unwrap(), vec![0, 0, 0]);
}

#[test]
fn outside_differentiation_it_is_the_function() {
    let f: Recompute = Arc::new(|x: &[Array]| Ok(vec![x[0].exp()?]));
    let x = Array::from_slice(&[1.0f32, 2.0], &[2]).unwrap();
    let y = checkpoint(f, std::slice::from_ref(&x)).unwrap().remove(0);
    assert_eq!(y.primitive_name(), Some("exp"));
    assert_eq!(
        y.to_vec::<f32>().unwrap(),
        x.exp().unwrap().to_vec::<f32>().unwrap()
    );
}

/// A chain whose square weights are computed from vector parameters
/// (`exp(0.01 (p_i + p_j))`, standing in for a weight gathered from a
/// shard), each rematerialized or kept, each block checkpointed or not.
fn weighted_chain(args: &[Array], remat: bool, checkpointed: bool) -> Result<Array> {
    let weight: Recompute = Arc::new(|p: &[Array]| {
        let n = p[0].size() as i64;
        let outer = p[0].reshape(&[n, 1])?.add(&p[0].reshape(&[1, n])?)?;
        Ok(vec![outer.mul_scalar(0.01)?.exp()?])
    });
    let block: Recompute = Arc::new(|x: &[Array]| Ok(vec![x[0].matmul(&x[1])?.tanh()?]));
    let mut h = args[0].clone();
    for p in &args[1..] {
        let w = if remat {
            rematerialize(weight.clone(), std::slice::from_ref(p))?
        } else {
            weight(std::slice::from_ref(p))?.remove(0)
        };
        h = if checkpointed {
            checkpoint(block.clone(), &[h, w])?.remove(0)
        } else {
            block(&[h, w])?.remove(0)
        };
    }
    h.sum_all()
}

#[test]
fn rematerialized_weights_give_the_same_gradients_and_are_not_kept() {
    let _one = MEMORY.lock().unwrap_or_else(|e| e.into_inner());
    const BIG: usize = 256;
    let keys = random::split_keys(&random::key(3), BLOCKS + 1).unwrap();
    let args: Vec<Array> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| {
            let shape: &[usize] = if i == 0 { &[4, BIG] } else { &[BIG] };
            random::normal(k, shape, Dtype::F32).unwrap()
        })
        .collect();
    eval(&args).unwrap();
    let argnums: Vec<usize> = (0..args.len()).collect();
    let run = |remat: bool, checkpointed: bool| {
        let before = memory::active();
        memory::reset_peak();
        let f = move |a: &[Array]| weighted_chain(a, remat, checkpointed);
        let (loss, grads) = value_and_grad(f, &argnums)(&args).unwrap();
        // The last block's gradient first, as a trainer asks for its
        // updates: each is then computed as the backward pass leaves its
        // block.
        let last_first: Vec<&Array> = grads.iter().rev().collect();
        eval((&loss, &last_first)).unwrap();
        let peak = memory::peak() - before;
        let bits: Vec<Vec<u32>> = grads
            .iter()
            .map(|g| {
                g.to_vec::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f32::to_bits)
                    .collect()
            })
            .collect();
        (bits, peak)
    };
    let (want, kept_peak) = run(false, false);
    let weight = BIG * BIG * 4;
    // Kept: every block's weight lives until the backward pass reaches it.
    assert!(kept_peak >= BLOCKS * weight, "kept: peak {kept_peak} B");
    for checkpointed in [false, true] {
        let (got, peak) = run(true, checkpointed);
        assert!(
            got == want,
            "rematerialized (checkpointed {checkpointed}): gradients differ"
        );
        // A few weights at a time, of one block: its weight recomputed (its
        // sum and product are of its size too), its gradient before it
        // becomes the parameter's, and the weight once more for exp's own
        // gradient (a gather's gradient, a reduce-scatter, needs none).
        let bound = 5 * weight;
        assert!(
            peak <= bound,
            "rematerialized (checkpointed {checkpointed}): peak {peak} B over {bound} B ({kept_peak} B kept)"
        );
    }
}
