//! `MLX_PROFILE=1` on the GPU: a primitive's GPU time is its passes'
//! execution time from timestamp queries, not the host time to record
//! them. A binary of its own: the profile's table is process-wide, and the
//! GPU device must be made with profiling already on.
//!
//! Without an adapter the tests skip with a printed reason, except when `CI`
//! or `MLX_REQUIRE_GPU` is set: there they fail (CI installs Mesa's
//! lavapipe, which has timestamps). An adapter without `TIMESTAMP_QUERY`
//! skips them too, with its reason.

use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use mlx_array::device::with_device;
use mlx_array::profile::{self, Clock, Entry};
use mlx_array::{Array, Device, Result, eval, settings};

static SERIAL: Mutex<()> = Mutex::new(());

/// A guard (the tests share the profile's table, so they run one at a
/// time) once profiling is on and the GPU's passes are timed; `None`, with
/// a printed reason, where they cannot be.
fn profiled_gpu() -> Option<MutexGuard<'static, ()>> {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // Before the first GPU use: the device asks for timestamps only then.
    settings::set_profile(true);
    if !mlx_array::conformance::gpu_or_skip() {
        return None;
    }
    match profile::gpu_untimed() {
        None => {
            profile::reset();
            Some(guard)
        }
        Some(why) if why.contains("has no TIMESTAMP_QUERY") => {
            eprintln!("skipping GPU profile test: {why}");
            None
        }
        Some(why) => panic!("GPU passes should be timed here: {why}"),
    }
}

/// A `rows x cols` f32 array on the GPU, evaluated.
fn gpu_matrix(rows: usize, cols: usize, seed: usize) -> Result<Array> {
    let v: Vec<f32> = (0..rows * cols)
        .map(|i| ((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0)
        .collect();
    let x = Array::from_slice(&v, &[rows, cols])?.to_device(Device::Gpu);
    x.eval()?;
    Ok(x)
}

/// The profile's one entry for `name` of output `shape` on `clock`.
fn entry(clock: Clock, name: &str, shape: &[usize]) -> Option<Entry> {
    let mut found = profile::entries()
        .into_iter()
        .filter(|e| e.clock == clock && e.name == name && e.shape == shape);
    let e = found.next();
    assert!(found.next().is_none(), "one entry per key");
    e
}

#[test]
fn a_gpu_matmul_is_timed_on_the_gpu() -> Result<()> {
    let Some(_gpu) = profiled_gpu() else {
        return Ok(());
    };
    let (a, b) = (gpu_matrix(256, 256, 1)?, gpu_matrix(256, 256, 2)?);
    profile::reset();
    let (product, sum) = with_device(Device::Gpu, || {
        Ok::<_, mlx_array::Error>((a.matmul(&b)?, a.add(&b)?))
    })?;
    let t0 = Instant::now();
    eval((&product, &sum))?;
    // Profiling waits for the GPU's timestamps before eval returns, so the
    // eval's wall time bounds the GPU time of the work it ran.
    let wall = t0.elapsed();

    let report = profile::report(20);
    let matmul = entry(Clock::Gpu, "matmul", &[256, 256])
        .unwrap_or_else(|| panic!("no GPU time for the matmul:\n{report}"));
    let add = entry(Clock::Gpu, "add", &[256, 256])
        .unwrap_or_else(|| panic!("no GPU time for the add:\n{report}"));
    assert_eq!((matmul.calls, add.calls), (1, 1), "{report}");
    assert!(!matmul.total.is_zero(), "{report}");
    assert!(
        matmul.total > add.total,
        "256^3 multiply-adds should take longer than 256^2 adds:\n{report}"
    );
    assert!(
        matmul.total <= wall,
        "GPU time {:?} beyond the eval's wall time {wall:?}:\n{report}",
        matmul.total
    );
    // The host time to record the matmul is kept apart, and labelled so.
    assert!(entry(Clock::GpuRecording, "matmul", &[256, 256]).is_some());
    assert!(entry(Clock::Cpu, "matmul", &[256, 256]).is_none());
    assert!(report.contains("GPU execution time"), "{report}");
    assert!(report.contains("matmul (GPU recording)"), "{report}");
    Ok(())
}

#[test]
fn passes_beyond_one_query_set_are_all_timed() -> Result<()> {
    let Some(_gpu) = profiled_gpu() else {
        return Ok(());
    };
    // Two timestamps a pass, 4096 to a query set: 2100 passes need two sets.
    let n = 2100;
    let mut y = gpu_matrix(1, 4, 3)?;
    let mut all = Vec::with_capacity(n);
    for _ in 0..n {
        y = with_device(Device::Gpu, || y.negative())?;
        // Held here, so none is fused into its reader: one pass each.
        all.push(y.clone());
    }
    let before = mlx_array::backend::gpu::dispatch_count();
    let (submits, moved) = (
        mlx_array::backend::gpu::submit_count(),
        mlx_array::backend::gpu::transfers(),
    );
    eval(&all)?;
    assert_eq!(mlx_array::backend::gpu::dispatch_count() - before, n);
    // The passes went to the GPU in several chunks, whose timestamps were
    // all read back with one wait at the end of the eval.
    assert!(mlx_array::backend::gpu::submit_count() - submits > 2);
    assert_eq!((mlx_array::backend::gpu::transfers() - moved).waits, 1);
    let negative = entry(Clock::Gpu, "negative", &[1, 4])
        .unwrap_or_else(|| panic!("no GPU time:\n{}", profile::report(20)));
    assert_eq!(negative.calls, n as u64);
    Ok(())
}
