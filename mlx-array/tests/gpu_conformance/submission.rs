//! Chunked submission: an eval that records more passes than one chunk
//! reaches the GPU in several command buffers while the host still records,
//! and computes exactly what the CPU does, with no extra transfers; one
//! submission per eval (the tuning's `chunks=off`) computes the same.

use mlx_array::backend::gpu::{custom, dispatch_count, submit_count, transfers};
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result, SliceArg, settings};

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

    // chunks=off: the same eval in one submission, the same values.
    let (_mode, _) = Mode::set(false);
    let once = with_device(Device::Gpu, || chain(&xg, &pg, &cg, steps))?;
    let submits = submit_count();
    once.eval()?;
    let submits = submit_count() - submits;
    assert_eq!(submits, 1);
    assert_eq!(once.to_vec::<f32>()?, cpu.to_vec::<f32>()?);
    Ok(())
}

/// Sets chunked submission on or off; dropping it turns it back on, also
/// when a test fails.
struct Mode;

impl Mode {
    /// The mode, and its description.
    fn set(chunked: bool) -> (Mode, String) {
        settings::tune_gpu(|t| t.chunks = chunked);
        (Mode, format!("chunks {chunked}"))
    }
}

impl Drop for Mode {
    fn drop(&mut self) {
        settings::tune_gpu(|t| t.chunks = true);
    }
}

/// Writes a checksum of its whole `meta` (each word times its 1-based
/// position, wrapping) and `meta`'s length in words as bound.
const META_CHECKSUM: &str = "
@group(0) @binding(0) var<storage, read> params: array<u32>;
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(1)
fn main() {
    let n = arrayLength(&params);
    var s = 0u;
    for (var i = 0u; i < n; i = i + 1u) {
        s = s + params[i] * (i + 1u);
    }
    out[0] = s;
    out[1] = n;
}
";

#[test]
fn every_dispatch_reads_its_own_meta_words_chunked_or_not() -> Result<()> {
    let Some(_gpu) = gpu() else { return Ok(()) };
    // Sizes from one word to more than a 64 KiB page (17,000 words: a
    // buffer of its own), so slices pack, move to the next page and
    // overflow; 45 dispatches cross the first chunks' ends (16, 48).
    let sizes = [1usize, 3, 40, 700, 5000, 17_000, 9];
    for chunked in [true, false] {
        let (_mode, name) = Mode::set(chunked);
        let mut outs = Vec::new();
        for k in 0..45 {
            let meta: Vec<u32> = (0..sizes[k % sizes.len()])
                .map(|i| (k as u32).wrapping_mul(2_654_435_761) ^ (i as u32).wrapping_mul(40_503))
                .collect();
            let want = meta.iter().enumerate().fold(0u32, |s, (i, &w)| {
                s.wrapping_add(w.wrapping_mul(i as u32 + 1))
            });
            let out = custom::alloc(&[2], Dtype::U32)?;
            custom::dispatch(
                "test:meta_checksum",
                || META_CHECKSUM.to_string(),
                &meta,
                &[],
                &out,
                1,
            )?;
            outs.push((out, [want, meta.len() as u32]));
        }
        mlx_array::backend::gpu::submit()?;
        for (k, (out, want)) in outs.into_iter().enumerate() {
            let got = Array::from_data(out, vec![2], Dtype::U32).to_vec::<u32>()?;
            assert_eq!(got, want, "dispatch {k} with {name}");
        }
    }
    Ok(())
}

/// `steps` of `y = (y + x[i..i + 4]) @ p`: every step's add reads a view
/// at a different offset (its meta words differ), and in `bf16` every
/// product clears its packed output before the pass that writes it.
fn sliding_chain(x: &Array, p: &Array, y0: &Array, steps: usize) -> Result<Array> {
    let mut y = y0.clone();
    for i in 0..steps as i64 {
        y = y.add(&x.slice(&[SliceArg::range(i, i + 4)])?)?.matmul(p)?;
    }
    y.astype(Dtype::F32)
}

#[test]
fn cleared_outputs_and_distinct_views_compute_the_cpus_results_chunked_or_not() -> Result<()> {
    let Some(_gpu) = gpu() else { return Ok(()) };
    let steps = 120;
    for dtype in [Dtype::F32, Dtype::BF16] {
        // Halves from -1 to 1: |y| stays within 120 in steps of 0.5, exact
        // in bf16, and p is a signed permutation (exact products).
        let xv: Vec<f32> = (0..steps + 4).map(|i| (i % 5) as f32 * 0.5 - 1.0).collect();
        let x = Array::from_slice(&xv, &[steps + 4])?.astype(dtype)?;
        let mut pv = vec![0f32; 16];
        for j in 0..4 {
            pv[((j + 1) % 4) * 4 + j] = if j % 2 == 0 { -1.0 } else { 1.0 };
        }
        let p = Array::from_slice(&pv, &[4, 4])?.astype(dtype)?;
        let y0 = Array::from_slice(&[0.5f32, -1.5, 2.0, 0.0, 1.0, 0.0, -0.5, 3.0], &[2, 4])?
            .astype(dtype)?;
        let cpu =
            with_device(Device::Cpu, || sliding_chain(&x, &p, &y0, steps))?.to_vec::<f32>()?;
        let [xg, pg, yg] = [&x, &p, &y0].map(|a| a.to_device(Device::Gpu));
        mlx_array::eval((&xg, &pg, &yg))?;
        for chunked in [true, false] {
            let (_mode, name) = Mode::set(chunked);
            let gpu_y = with_device(Device::Gpu, || sliding_chain(&xg, &pg, &yg, steps))?;
            let dispatches = dispatch_count();
            gpu_y.eval()?;
            let dispatches = dispatch_count() - dispatches;
            assert!(dispatches >= 2 * steps, "{dispatches} dispatches");
            assert_eq!(gpu_y.to_vec::<f32>()?, cpu, "{dtype} with {name}");
        }
    }
    Ok(())
}
