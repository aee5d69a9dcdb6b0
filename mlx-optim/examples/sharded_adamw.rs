//! AdamW with its state sharded over the ranks (`Sharded`, ZeRO stage 1):
//! each rank keeps `1 / N` of the moments, gives its own gradients (no
//! `average_gradients`), and ends with the same weights as averaging whole
//! gradients would give. Prints each rank's share of the state.
//!
//! ```text
//! cargo build --release -p mlx-optim --example sharded_adamw -p mlx-dist --bin mlx-launch
//! target/release/mlx-launch -n 2 -- target/release/examples/sharded_adamw
//! ```

use mlx_array::{Array, Dtype, Tree, eval, random};
use mlx_nn::{AverageOptions, average_gradients};
use mlx_optim::{AdamW, Optimizer, Sharded};

fn main() -> anyhow::Result<()> {
    let world = mlx_dist::init(mlx_dist::Backend::Any)?;
    let rank = world.rank();
    let init = || -> anyhow::Result<Tree> {
        Ok(Tree::unflatten([
            (
                "w".to_string(),
                random::normal(&random::key(0), &[1000, 64], Dtype::F32)?,
            ),
            ("b".to_string(), Array::zeros(&[64], Dtype::F32)),
        ])?)
    };
    let (mut sharded_params, mut whole_params) = (init()?, init()?);
    let mut sharded = Sharded::new(AdamW::new(1e-2), &world);
    let mut whole = AdamW::new(1e-2);
    for step in 0..5u64 {
        // Each rank's own gradients (here: random, different on every rank).
        let key = random::key(100 + step * 64 + rank as u64);
        let grads = Tree::unflatten([
            (
                "w".to_string(),
                random::normal(&key, &[1000, 64], Dtype::F32)?,
            ),
            ("b".to_string(), random::normal(&key, &[64], Dtype::F32)?),
        ])?;
        sharded.update_tree(&mut sharded_params, &grads)?;
        let averaged = average_gradients(&grads, &world, &AverageOptions::default())?;
        whole.update_tree(&mut whole_params, &averaged)?;
        eval((
            &sharded_params,
            sharded.state(),
            &whole_params,
            whole.state(),
        ))?;
    }
    let w = |t: &Tree| t.get_array("w").expect("w").to_vec::<f32>();
    let diff = w(&sharded_params)?
        .iter()
        .zip(w(&whole_params)?)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    println!(
        "rank {rank}: optimizer state {:.0} KiB sharded, {:.0} KiB whole; weights differ by at most {diff:e}",
        sharded.state().nbytes() as f64 / 1024.0,
        whole.state().nbytes() as f64 / 1024.0,
    );
    Ok(())
}
