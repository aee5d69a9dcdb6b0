//! Chunked submission: an eval that records more passes than one chunk
//! reaches the GPU in several command buffers while the host still records,
//! and computes exactly what the CPU does, with no extra transfers.

use mlx_array::backend::gpu::{dispatch_count, submit_count, transfers};
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Result};

use crate::harness::gpu;

/// `steps` of `y = y @ p + c` from `x`: every step two passes (the
/// product is not fused), every intermediate dropped as soon as read, so
/// its buffer is reused by later passes, across chunk boundaries. `p` is a
/// signed permutation and `c` halves, so every value is exact in f32 on
/// both devices.
fn chain(x: &Array, p: &Array, c: &Array, steps: usize) -> Result<Array> {
    let mut y = x.clone();
    for _ in 0..steps {
        y = y.matmul(p)?.add(c)?;
    }
    Ok(y)
}

#[test]
fn an_eval_longer_than_a_chunk_submits_in_chunks_with_the_cpus_results() -> Result<()> {
    let Some(_gpu) = gpu() else { return Ok(()) };
    let steps = 300;
    let x = Array::from_slice(
        &(0..32).map(|i| i as f32 - 10.25).collect::<Vec<f32>>(),
        &[8, 4],
    )?;
    // Column j of y @ p is -y[:, (j + 1) % 4] for even j, +y[..] for odd.
    let mut pv = vec![0f32; 16];
    for j in 0..4 {
        pv[((j + 1) % 4) * 4 + j] = if j % 2 == 0 { -1.0 } else { 1.0 };
    }
    let p = Array::from_slice(&pv, &[4, 4])?;
    let c = Array::from_slice(&[0.5f32, -1.5, 2.0, 0.0], &[4])?;
    let cpu = with_device(Device::Cpu, || chain(&x, &p, &c, steps))?;
    let [xg, pg, cg] = [&x, &p, &c].map(|a| a.to_device(Device::Gpu));
    mlx_array::eval((&xg, &pg, &cg))?;
    let gpu_y = with_device(Device::Gpu, || chain(&xg, &pg, &cg, steps))?;

    let (dispatches, submits, moved) = (dispatch_count(), submit_count(), transfers());
    gpu_y.eval()?;
    let dispatches = dispatch_count() - dispatches;
    let submits = submit_count() - submits;
    let moved = transfers() - moved;
    assert!(dispatches >= 2 * steps, "{dispatches} dispatches");
    // 600 passes: chunks of 16, 32, 64, 128 and 256, the rest at the end.
    assert!(
        (3..=dispatches / 16 + 1).contains(&submits),
        "{dispatches} passes went to the GPU in {submits} submissions"
    );
    // Chunking moves nothing between host and GPU (the inputs are there
    // already), and the eval does not wait for the GPU.
    assert_eq!(
        (moved.to_device, moved.to_host, moved.waits),
        (0, 0, 0),
        "{moved}"
    );

    assert_eq!(gpu_y.device(), Device::Gpu);
    assert_eq!(gpu_y.to_vec::<f32>()?, cpu.to_vec::<f32>()?);

    // MLX_GPU_CHUNKS=0: the same eval in one submission, the same values.
    mlx_array::settings::set_gpu_chunks(false);
    let once = with_device(Device::Gpu, || chain(&xg, &pg, &cg, steps))?;
    let submits = submit_count();
    once.eval()?;
    let submits = submit_count() - submits;
    mlx_array::settings::set_gpu_chunks(true);
    assert_eq!(submits, 1);
    assert_eq!(once.to_vec::<f32>()?, cpu.to_vec::<f32>()?);
    Ok(())
}
