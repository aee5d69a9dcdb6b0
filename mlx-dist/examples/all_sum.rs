//! The classic first distributed program: every rank sums `ones(10)`.
//!
//! ```text
//! cargo run -p mlx-dist --example all_sum                  # one process: prints 1s
//! mlx-launch -n 4 -- target/debug/examples/all_sum         # four ranks: prints 4s
//! ```

use mlx_array::{Array, Dtype};
use mlx_dist::{Backend, all_sum, init};

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let world = init(Backend::Any)?;
    let x = all_sum(&Array::ones(&[10], Dtype::F32), &world)?;
    println!("{} {:?}", world.rank(), x.to_vec::<f32>()?);
    Ok(())
}
