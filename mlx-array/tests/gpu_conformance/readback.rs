//! Reads that wait later (`Array::read_later`): the copy is queued behind
//! the work that computes the values, so work recorded after it (which
//! reuses the freed buffers) cannot change what it reads, and starting it
//! does not wait for the GPU.

use mlx_array::backend::gpu::transfers;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result, SliceArg};

use crate::harness::gpu;

/// `steps` of `y = y * 0.5 + c` then `y @ p` (a signed permutation): every
/// intermediate freed as soon as read, so later chains reuse its buffers.
/// Exact in f32 on both devices.
fn chain(x: &Array, p: &Array, c: f64, steps: usize) -> Result<Array> {
    let mut y = x.clone();
    for _ in 0..steps {
        y = y.mul_scalar(0.5)?.add_scalar(c)?.matmul(p)?;
    }
    Ok(y)
}

fn inputs() -> Result<(Array, Array)> {
    let x = Array::from_slice(
        &(0..64)
            .map(|i| i as f32 * 0.75 - 20.0)
            .collect::<Vec<f32>>(),
        &[16, 4],
    )?;
    let mut pv = vec![0f32; 16];
    for j in 0..4 {
        pv[((j + 3) % 4) * 4 + j] = if j % 2 == 0 { 1.0 } else { -1.0 };
    }
    Ok((x, Array::from_slice(&pv, &[4, 4])?))
}

#[test]
fn a_read_started_before_later_work_reads_its_own_values() -> Result<()> {
    let Some(_gpu) = gpu() else { return Ok(()) };
    let (x, p) = inputs()?;
    let want = |c| with_device(Device::Cpu, || chain(&x, &p, c, 40)?.to_vec::<f32>());
    let (want1, want2) = (want(1.5)?, want(-3.0)?);
    assert_ne!(want1, want2);
    let (xg, pg) = (x.to_device(Device::Gpu), p.to_device(Device::Gpu));
    mlx_array::eval((&xg, &pg))?;

    let before = transfers();
    let first = with_device(Device::Gpu, || chain(&xg, &pg, 1.5, 40))?;
    let read = first.read_later()?;
    drop(first);
    // The next "step": the same shapes, so the pool hands it the buffers
    // the first one freed, queued after the copy.
    let second = with_device(Device::Gpu, || chain(&xg, &pg, -3.0, 40))?;
    second.eval()?;
    let started = transfers() - before;
    assert_eq!(
        (started.to_host, started.to_host_bytes, started.waits),
        (1, 64 * 4, 0),
        "starting the read copies once and waits for nothing: {started}"
    );
    assert_eq!(read.to_vec::<f32>()?, want1);
    let finished = transfers() - before;
    assert_eq!(finished.waits, 1, "{finished}");
    assert_eq!(second.to_vec::<f32>()?, want2);
    Ok(())
}

#[test]
fn reads_later_give_views_dtypes_and_empty_arrays_as_to_vec_does() -> Result<()> {
    let Some(_gpu) = gpu() else { return Ok(()) };
    let x = Array::from_slice(
        &(0..24).map(|i| i as f32 - 7.5).collect::<Vec<f32>>(),
        &[4, 6],
    )?;
    let xg = x.to_device(Device::Gpu);
    let cases: Vec<Array> = with_device(Device::Gpu, || -> Result<Vec<Array>> {
        Ok(vec![
            xg.swapaxes(0, 1)?,                                  // a strided view
            xg.astype(Dtype::BF16)?,                             // stored in half the bytes
            xg.astype(Dtype::I32)?,                              // integers
            xg.sum(&[0, 1], false)?,                             // a scalar
            xg.reshape(&[24])?.slice(&[SliceArg::range(3, 3)])?, // empty
        ])
    })?;
    for a in &cases {
        assert_eq!(a.device(), Device::Gpu);
        let later = a.read_later()?.to_vec::<f32>()?;
        assert_eq!(later, a.to_vec::<f32>()?, "{a:?}");
    }
    assert_eq!(
        cases[3].read_later()?.item::<f32>()?,
        (0..24).map(|i| i as f32 - 7.5).sum::<f32>()
    );
    let err = cases[0]
        .read_later()?
        .item::<f32>()
        .unwrap_err()
        .to_string();
    assert!(err.contains("exactly one element"), "{err}");
    Ok(())
}
