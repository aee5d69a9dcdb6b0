//! Fits a linear model `y = x W + b` to synthetic data with AdamW, a warmup +
//! cosine schedule and gradient clipping, saving and resuming the optimizer
//! state half-way, and prints the loss as it falls.
//!
//! ```text
//! cargo run --release -p mlx-optim --example train_regression
//! ```
//!
//! The gradients are written out by hand (mean squared error), so the example
//! needs nothing beyond `mlx-array` and this crate.

use mlx_array::{Array, Dtype, Tree, eval, load_tree, random, save_tree};
use mlx_optim::{AdamW, Optimizer, clip_grad_norm, schedule};

const STEPS: u64 = 300;

fn optimizer() -> anyhow::Result<AdamW> {
    let lr = schedule::join_schedules(
        vec![
            schedule::linear_schedule(0.0, 0.05, 20)?,
            schedule::cosine_decay(0.05, STEPS - 20, 1e-3)?,
        ],
        &[20],
    )?;
    Ok(AdamW::new(lr).weight_decay(1e-4))
}

/// Loss and gradients of `mean((x W + b - y)^2)`.
fn loss_and_grads(params: &Tree, x: &Array, y: &Array) -> anyhow::Result<(Array, Tree)> {
    let w = params.get_array("w").expect("w");
    let b = params.get_array("b").expect("b");
    let err = x.matmul(w)?.add(b)?.sub(y)?;
    let n = err.size() as f64;
    let loss = err.square()?.sum_all()?.div_scalar(n)?;
    let d = err.mul_scalar(2.0 / n)?;
    let grads = Tree::unflatten([
        ("w".to_string(), x.t()?.matmul(&d)?),
        ("b".to_string(), d.sum(&[0], false)?),
    ])?;
    Ok((loss, grads))
}

fn main() -> anyhow::Result<()> {
    let [k1, k2, k3] = {
        let ks = random::split(&random::key(42), 3)?;
        [0u32, 1, 2].map(|i| ks.take(&Array::scalar(i), 0).unwrap())
    };
    let x = random::normal(&k1, &[256, 8], Dtype::F32)?;
    let true_w = random::normal(&k2, &[8, 2], Dtype::F32)?;
    let noise = random::normal(&k3, &[256, 2], Dtype::F32)?.mul_scalar(0.01)?;
    let y = x.matmul(&true_w)?.add_scalar(0.5)?.add(&noise)?;
    let mut params = Tree::unflatten([
        ("w".to_string(), Array::zeros(&[8, 2], Dtype::F32)),
        ("b".to_string(), Array::zeros(&[2], Dtype::F32)),
    ])?;
    let dir = std::env::temp_dir().join(format!("mlx-optim-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;

    let mut opt = optimizer()?;
    for step in 0..STEPS {
        if step == STEPS / 2 {
            // Checkpoint, throw everything away, and resume from the files.
            save_tree(dir.join("params.safetensors"), &params, None)?;
            opt.save_state(&dir.join("optimizer.safetensors"))?;
            params = load_tree(dir.join("params.safetensors"))?;
            opt = optimizer()?;
            opt.load_state(&dir.join("optimizer.safetensors"), &params)?;
            println!("resumed at step {}", opt.step());
        }
        let (loss, grads) = loss_and_grads(&params, &x, &y)?;
        let (grads, norm) = clip_grad_norm(&grads, 1.0)?;
        opt.update_tree(&mut params, &grads)?;
        eval((&loss, &norm, &params, opt.state()))?;
        if step % 50 == 0 || step == STEPS - 1 {
            println!(
                "step {step:3}  loss {:.6}  grad norm {:.4}  lr {:.5}",
                loss.item::<f32>()?,
                norm.item::<f32>()?,
                opt.learning_rate()
            );
        }
    }
    std::fs::remove_dir_all(&dir)?;
    let b: Vec<f32> = params.get_array("b").expect("b").to_vec()?;
    println!("learned bias {b:?} (true 0.5)");
    Ok(())
}
