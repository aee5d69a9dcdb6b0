//! Several threads evaluating on the GPU at once, as ranks in one process
//! and a trainer's helper threads do: they share one command encoder, so
//! each thread's kernels may be submitted by another thread's eval, and
//! the queue must still see them in the order they were recorded.

use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype};

use crate::harness::gpu;

/// Each thread runs chains of dependent kernels (unfused: a reduction
/// between elementwise steps) on its own values and checks every result
/// against arithmetic done here. A submission that overtakes an earlier
/// one hands a kernel inputs not yet written: wrong sums, or NaNs.
#[test]
fn threads_sharing_the_gpu_each_get_their_own_results() {
    let Some(_g) = gpu() else { return };
    let n = 4096;
    std::thread::scope(|s| {
        for t in 0..4u32 {
            s.spawn(move || {
                for i in 0..60u32 {
                    let v = (t * 100 + i) as f32;
                    let got = with_device(Device::Gpu, || {
                        let x = Array::full(&[n], v as f64, Dtype::F32);
                        let y = x.add_scalar(1.0)?.mul_scalar(2.0)?;
                        // y's mean (a reduction), broadcast back: 2(v + 1).
                        let z = y.sub(&y.mean_all()?)?.add(&y)?;
                        z.sum_all()
                    })
                    .and_then(|z| z.to_device(Device::Cpu).item::<f32>())
                    .unwrap();
                    let want = n as f32 * 2.0 * (v + 1.0);
                    assert_eq!(got, want, "thread {t}, iteration {i}");
                }
            });
        }
    });
}
