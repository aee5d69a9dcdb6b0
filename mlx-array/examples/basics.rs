//! A tour of mlx-array: lazy ops, eval, random keys, memory and safetensors.
//!
//! Run with `cargo run --release -p mlx-array --example basics`.

use mlx_array::{Array, Dtype, Result, eval, memory, random};

fn main() -> Result<()> {
    // Building costs nothing: this records a graph.
    let k = random::key(42);
    let x = random::normal(&k, &[512, 256], Dtype::F32)?;
    let w = random::uniform(
        &random::split(&k, 1)?.reshape(&[2])?,
        -0.06,
        0.06,
        &[256, 64],
        Dtype::F32,
    )?;
    let logits = x.matmul(&w)?;
    let probs = logits.softmax(&[-1])?;
    let entropy = probs
        .multiply(&probs.log()?)?
        .sum(&[-1], false)?
        .negative()?
        .mean_all()?;

    // eval runs it; Display evaluates implicitly too.
    eval((&probs, &entropy))?;
    println!("mean entropy of 512 softmaxes over 64 classes: {entropy}");
    println!(
        "first row sums to {}",
        probs.slice_axis(0, 0, 1)?.sum_all()?
    );
    println!("GEMM: {}", mlx_array::blas::name());
    println!(
        "memory: active {} KiB, peak {} KiB, cache {} KiB",
        memory::active() >> 10,
        memory::peak() >> 10,
        memory::cache() >> 10
    );

    // safetensors, readable by MLX (mx.load) and PyTorch (safetensors.torch.load_file).
    let path = std::env::temp_dir().join("mlx_array_basics.safetensors");
    mlx_array::save_safetensors(&path, &[("w".into(), w.clone())], None)?;
    let (loaded, _) = mlx_array::load_safetensors(&path)?;
    let same = loaded["w"]
        .equal(&w)?
        .astype(Dtype::I32)?
        .sum_all()?
        .item::<i32>()?;
    println!(
        "reloaded {} of {} weights exactly from {}",
        same,
        w.size(),
        path.display()
    );
    let _ = std::fs::remove_file(&path);
    let _unused = Array::zeros(&[1], Dtype::F32);
    Ok(())
}
