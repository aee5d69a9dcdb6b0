//! A data-parallel training loop with `average_gradients`: the same program
//! on one process or on N, as MLX's `nn.average_gradients` is used. Every
//! rank starts from the same weights (same seed), draws its own batches,
//! averages the gradients over the group and takes the same SGD step, so
//! the weights stay identical everywhere; rank 0 prints the world's loss.
//!
//! ```text
//! cargo build --release -p mlx-nn --example data_parallel -p mlx-dist --bin mlx-launch
//! target/release/examples/data_parallel                                  # one process
//! target/release/mlx-launch -n 2 -- target/release/examples/data_parallel # two
//! ```

use mlx_array::{Array, Dtype, eval, random};
use mlx_nn::{AverageOptions, Linear, ModuleExt, average_gradients, value_and_grad};

fn main() -> anyhow::Result<()> {
    let world = mlx_dist::init(mlx_dist::Backend::Any)?;
    let (rank, size) = (world.rank(), world.size());
    let mut model = Linear::new(8, 1, true, &random::key(0))?;
    let truth = random::normal(&random::key(1), &[8, 1], Dtype::F32)?;
    let step = value_and_grad(|m: &Linear, (x, y): &(Array, Array)| {
        m.forward(x)?.sub(y)?.square()?.mean_all()
    });
    let lr = 0.1;
    for i in 0..100u64 {
        // This rank's batch: a different stream of data on every rank.
        let key = random::key(1_000 + i * size as u64 + rank as u64);
        let x = random::normal(&key, &[32, 8], Dtype::F32)?;
        let y = x.matmul(&truth)?;
        let (loss, grads) = step(&mut model, &(x, y))?;
        // The one line data parallelism adds.
        let grads = average_gradients(&grads, &world, &AverageOptions::default())?;
        let new = model
            .trainable_parameters()
            .zip_map(&grads, |_, p, g| p.sub(&g.mul_scalar(lr)?))?;
        model.update(&new)?;
        let world_loss = mlx_dist::all_sum(&loss, &world)?.div_scalar(size as f64)?;
        eval((&world_loss, &model.parameters()))?;
        if rank == 0 && i % 20 == 0 {
            println!("step {i:3}: loss {:.5}", world_loss.item::<f32>()?);
        }
    }
    // Every rank holds the same weights: their sum over the group is `size`
    // times this rank's.
    let w = model.weight.value();
    let summed = mlx_dist::all_sum(w, &world)?.to_vec::<f32>()?;
    let mine = w.to_vec::<f32>()?;
    anyhow::ensure!(
        summed.iter().zip(&mine).all(|(s, m)| *s == m * size as f32),
        "the ranks' weights diverged"
    );
    if rank == 0 {
        println!("{size} rank(s) agree on the weights");
    }
    Ok(())
}
