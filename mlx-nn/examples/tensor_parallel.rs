//! A tensor-parallel MLP trained with the sharded layers: the hidden
//! features are split over the ranks (an all-to-sharded layer, then a
//! sharded-to-all one), every rank sees the same batch and computes the
//! same loss, and each updates only its shard of the weights. The losses
//! printed are those of one process (to float round-off) at any world size
//! that divides the hidden width; at the end the program checks that every
//! rank computed the same loss.
//!
//! ```text
//! cargo build --release -p mlx-nn --example tensor_parallel -p mlx-dist --bin mlx-launch
//! target/release/examples/tensor_parallel                                  # one process
//! target/release/mlx-launch -n 4 -- target/release/examples/tensor_parallel # four shards
//! ```

use mlx_array::{Array, Dtype, eval, random};
use mlx_nn::{AllToShardedLinear, ModuleExt, ShardedToAllLinear, impl_module, value_and_grad};

struct Mlp {
    up: AllToShardedLinear,
    down: ShardedToAllLinear,
}
impl_module!(Mlp { up, down });

impl Mlp {
    fn forward(&self, x: &Array) -> mlx_array::Result<Array> {
        self.down.forward(&mlx_nn::silu(&self.up.forward(x)?)?)
    }
}

fn main() -> anyhow::Result<()> {
    let world = mlx_dist::init(mlx_dist::Backend::Any)?;
    let (rank, size) = (world.rank(), world.size());
    // The same keys on every rank: each keeps its shard of the same layers.
    let mut model = Mlp {
        up: AllToShardedLinear::new(8, 64, true, &world, &random::key(0))?,
        down: ShardedToAllLinear::new(64, 1, true, &world, &random::key(1))?,
    };
    let truth = random::normal(&random::key(2), &[8, 1], Dtype::F32)?;
    let step = value_and_grad(|m: &Mlp, (x, y): &(Array, Array)| {
        m.forward(x)?.sub(y)?.square()?.mean_all()
    });
    let lr = 0.05;
    let mut last = 0.0;
    for i in 0..100u64 {
        // The same batch on every rank: the ranks split the model, not the data.
        let x = random::normal(&random::key(1_000 + i), &[32, 8], Dtype::F32)?;
        let y = x.matmul(&truth)?.sin()?;
        let (loss, grads) = step(&mut model, &(x, y))?;
        let new = model
            .trainable_parameters()
            .zip_map(&grads, |_, p, g| p.sub(&g.mul_scalar(lr)?))?;
        model.update(&new)?;
        eval((&loss, &model.parameters()))?;
        last = loss.item::<f32>()?;
        if rank == 0 && i % 20 == 0 {
            println!("step {i:3}: loss {last:.5}");
        }
    }
    // Every rank computed the same loss; each holds 64 / size hidden units.
    let losses = world.all_gather(&[last])?;
    anyhow::ensure!(
        losses.iter().all(|&l| l == last),
        "the ranks' losses differ: {losses:?}"
    );
    if rank == 0 {
        println!(
            "{size} rank(s) agree on the final loss {last:.5}; each holds {} of the {} parameters",
            model.num_parameters(),
            8 * 64 + 64 + 64 + 1
        );
    }
    Ok(())
}
