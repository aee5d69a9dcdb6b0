//! Activation checkpointing and rematerialization: the same gradients of a
//! deep chain, with its intermediates kept, recomputed per block
//! (`autodiff::checkpoint`), and with its weights recomputed for the
//! backward pass (`autodiff::rematerialize`, what fully sharded training
//! does with gathered weights). Prints each variant's peak array memory.
//!
//! Run with `cargo run --release -p mlx-array --example checkpoint`.

use std::sync::Arc;

use mlx_array::autodiff::{Recompute, checkpoint, rematerialize, value_and_grad};
use mlx_array::{Array, Dtype, Result, eval, memory, random};

const BLOCKS: usize = 16;
const ROWS: usize = 1024;
const WIDTH: usize = 256;

/// One residual block with a few intermediates of the input's size.
fn block(x: &[Array]) -> Result<Vec<Array>> {
    let a = x[0].matmul(&x[1])?.tanh()?;
    let b = a.multiply(&a.sigmoid()?)?;
    Ok(vec![x[0].add(&b.matmul(&x[2])?)?])
}

/// A weight `W * exp(s)` of a raw weight `W` and a scale `s`: a value
/// computed from parameters, which rematerialization recomputes.
fn scaled(p: &[Array]) -> Result<Vec<Array>> {
    Ok(vec![p[0].multiply(&p[1].exp()?)?])
}

/// The chain's loss: every block checkpointed or not, every weight
/// rematerialized or not.
fn loss(args: &[Array], checkpointed: bool, remat: bool) -> Result<Array> {
    let f: Recompute = Arc::new(block);
    let w: Recompute = Arc::new(scaled);
    let mut h = args[0].clone();
    for b in 0..BLOCKS {
        let p = &args[1 + 3 * b..4 + 3 * b];
        let w1 = if remat {
            rematerialize(w.clone(), &[p[0].clone(), p[2].clone()])?
        } else {
            scaled(&[p[0].clone(), p[2].clone()])?.remove(0)
        };
        let inputs = [h, w1, p[1].clone()];
        h = if checkpointed {
            checkpoint(f.clone(), &inputs)?.remove(0)
        } else {
            block(&inputs)?.remove(0)
        };
    }
    h.square()?.mean_all()
}

fn main() -> Result<()> {
    let keys = random::split_keys(&random::key(0), 3 * BLOCKS + 1)?;
    let mut args = vec![random::normal(&keys[0], &[ROWS, WIDTH], Dtype::F32)?];
    for b in 0..BLOCKS {
        let w = |k: &Array| random::normal(k, &[WIDTH, WIDTH], Dtype::F32)?.mul_scalar(0.05);
        args.push(w(&keys[1 + 3 * b])?);
        args.push(w(&keys[2 + 3 * b])?);
        args.push(Array::zeros(&[], Dtype::F32));
    }
    eval(&args)?;
    let argnums: Vec<usize> = (0..args.len()).collect();
    let mut reference: Option<Vec<Vec<f32>>> = None;
    for (name, checkpointed, remat) in [
        ("kept", false, false),
        ("checkpointed blocks", true, false),
        ("rematerialized weights", false, true),
        ("both", true, true),
    ] {
        let before = memory::active();
        memory::reset_peak();
        let f = move |a: &[Array]| loss(a, checkpointed, remat);
        let (value, grads) = value_and_grad(f, &argnums)(&args)?;
        // The last block's gradients first, as a trainer asks for them.
        let last_first: Vec<&Array> = grads.iter().rev().collect();
        eval((&value, &last_first))?;
        let peak = (memory::peak() - before) as f64 / (1 << 20) as f64;
        let got: Vec<Vec<f32>> = grads.iter().map(|g| g.to_vec()).collect::<Result<_>>()?;
        let same = reference.get_or_insert_with(|| got.clone()) == &got;
        println!(
            "{name:>24}: loss {:.6}, peak {peak:6.1} MiB, gradients {}",
            value.item::<f32>()?,
            if same { "equal to kept" } else { "DIFFERENT" }
        );
    }
    Ok(())
}
