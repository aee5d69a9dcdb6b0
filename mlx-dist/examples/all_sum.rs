//! The classic first distributed program: every rank sums `ones(10)`.
//!
//! Until `mlx-array` has arrays this runs on a `Vec<f32>` through the typed
//! byte API; the graph primitive `all_sum(&Array, &Group)` will wrap the same call.
//!
//! ```text
//! cargo run -p mlx-dist --example all_sum                  # one process: prints 1s
//! mlx-launch -n 4 -- target/debug/examples/all_sum         # four ranks: prints 4s
//! ```

use mlx_dist::{Backend, init};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let world = init(Backend::Any)?;
    let mut x = vec![1.0f32; 10];
    world.all_sum(&mut x)?;
    println!("{} {:?}", world.rank(), x);
    Ok(())
}
