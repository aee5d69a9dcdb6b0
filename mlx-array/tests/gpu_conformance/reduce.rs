//! Reductions and matrix products on the GPU beyond their values: a chain
//! of GPU nodes stays on the GPU. Their values, views, long, empty and
//! NaN runs, ties and gradients on the GPU are checked by their
//! specifications (`tests/conformance.rs`, `sum::gpu`, `matmul::gpu`, ...).

use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype};

use crate::elementwise::values_in;
use crate::harness::gpu;
use mlx_array::conformance::{Layout, make};

/// Quarters in [-2, 2): products and their sums are exact in f32, and the
/// inputs in f16 and bf16.
fn quarters(shape: &[usize], seed: u64, d: Dtype) -> Array {
    let v = values_in(shape, seed, -8.0, 8.0, true).map(|x| x / 4.0);
    make(&v, d, Layout::Dense)
}

#[test]
fn a_reduction_of_a_gpu_product_stays_on_the_gpu() {
    let Some(_gpu) = gpu() else { return };
    let a = quarters(&[8, 8], 90, Dtype::F32);
    let s = with_device(Device::Gpu, || a.matmul(&a)?.sum_all()).unwrap();
    assert_eq!(s.device(), Device::Gpu);
    let c = with_device(Device::Cpu, || a.matmul(&a)?.sum_all()).unwrap();
    assert_eq!(s.item::<f32>().unwrap(), c.item::<f32>().unwrap());
}

/// Rows of `f16` and `bf16` go through the row kernels as quads (8 bytes a
/// load) when their length and start are multiples of 4, and through the
/// general kernels otherwise: both agree with the CPU, on dense arrays
/// and on column windows that start on and off a quad.
#[test]
fn half_rows_reduce_and_softmax_as_quads_or_singly_as_the_cpu_does() {
    use crate::harness::compare;
    use mlx_array::SliceArg;
    let Some(_gpu) = gpu() else { return };
    for d in [Dtype::F16, Dtype::BF16] {
        for (cols, from) in [(64, 0), (66, 0), (72, 4), (72, 2), (1028, 0)] {
            // Sliced on the device, so the kernels see the window's offset.
            let x = quarters(&[6, cols], cols as u64, d);
            let window =
                move |x: &Array| x.slice(&[SliceArg::FULL, SliceArg::range(from, cols as i64)]);
            let what = |op: &str| format!("{op} of {d} rows [6, {cols}] from column {from}");
            compare(
                &what("sum"),
                std::slice::from_ref(&x),
                |x| window(&x[0])?.sum(&[-1], false),
                0.0,
            );
            compare(
                &what("max"),
                std::slice::from_ref(&x),
                |x| window(&x[0])?.max(&[-1], false),
                0.0,
            );
            compare(
                &what("softmax"),
                &[x],
                |x| window(&x[0])?.softmax(&[-1]),
                0.0,
            );
        }
    }
}

/// The row kernels walk a row in unrolled rounds of up to 16 loads per
/// invocation, 256 invocations a row: rows longer than one round (read
/// as quads, or element by element where the length is not a multiple
/// of 4), with a short last round, and rows shorter than a team's first
/// round, sum, max and softmax as the CPU does. 70 rows: enough that the
/// long ones are not split into pieces (see the next test).
#[test]
fn f32_rows_of_several_unrolled_rounds_reduce_and_softmax_as_the_cpu_does() {
    use crate::harness::compare;
    let Some(_gpu) = gpu() else { return };
    // 16,385 quads (5 rounds of 4,096, the last of one), 70,001 (prime)
    // (18 rounds), 1,028 (257 quads: a team of 32, one round of 9 loads,
    // all but one invocation's last past the row) and 37 (a team of 8, one
    // round of 5).
    for cols in [65540, 70001, 1028, 37] {
        let x = quarters(&[70, cols], cols as u64, Dtype::F32);
        let what = |op: &str| format!("{op} of f32 rows [70, {cols}]");
        // Quarters: every partial sum is exact in f32, in any order.
        compare(
            &what("sum"),
            std::slice::from_ref(&x),
            |x| x[0].sum(&[-1], false),
            0.0,
        );
        compare(
            &what("max"),
            std::slice::from_ref(&x),
            |x| x[0].max(&[-1], false),
            0.0,
        );
        compare(&what("softmax"), &[x], |x| x[0].softmax(&[-1]), 0.0);
    }
}

/// A reduction with few outputs and long contiguous runs (a whole-array
/// sum of a gradient, the loss scale's overflow check) runs in two passes:
/// each run cut into pieces that divide it, a workgroup's partial result
/// per piece (in f32), then the pieces of each output; it agrees with the
/// CPU in every float dtype, on a window that starts inside its buffer,
/// and a run no piece size divides (a prime length), or whose values are
/// not contiguous, stays in one pass.
#[test]
fn long_reductions_with_few_outputs_run_in_two_passes_as_the_cpu_does() {
    use mlx_array::SliceArg;
    let Some(_gpu) = gpu() else { return };
    let dispatches = |x: &Array, f: &dyn Fn(&Array) -> mlx_array::Result<Array>| {
        let before = mlx_array::backend::gpu::dispatch_count();
        let g = with_device(Device::Gpu, || f(x)).unwrap();
        g.eval().unwrap();
        let n = mlx_array::backend::gpu::dispatch_count() - before;
        let c = with_device(Device::Cpu, || f(x)).unwrap();
        (n, g, c)
    };
    let reduce = |op: &str, x: &Array| match op {
        "sum" => x.sum_all(),
        "max" => x.max_all(),
        "min" => x.min_all(),
        // Rows 1..257 of [258, 256]: the window starts 256 values in.
        "sum of a window" => x
            .slice(&[SliceArg::range(1, 257), SliceArg::FULL])?
            .sum_all(),
        "row sums" => x.sum(&[-1], false),
        "column sums" => x.sum(&[0], false),
        other => unreachable!("no reduction {other}"),
    };
    // (reduction, shape, dtype, dispatches)
    let cases: [(&str, &[usize], Dtype, usize); 10] = [
        // 65,536 values: 16 pieces of 4,096.
        ("sum", &[256, 256], Dtype::F32, 2),
        ("max", &[256, 256], Dtype::F32, 2),
        ("min", &[256, 256], Dtype::F32, 2),
        // 90,000 halves: 20 pieces of 4,500, an f16 or bf16 result.
        ("sum", &[300, 300], Dtype::F16, 2),
        ("sum", &[300, 300], Dtype::BF16, 2),
        ("sum of a window", &[258, 256], Dtype::F32, 2),
        // Three runs of 70,000: 16 pieces of 4,375 each.
        ("row sums", &[3, 70000], Dtype::F32, 2),
        // 65,537 is prime: one pass.
        ("sum", &[65537], Dtype::F32, 1),
        // Runs of stride 2: one pass.
        ("column sums", &[70000, 2], Dtype::F32, 1),
        // No outputs at all: nothing to run.
        ("row sums", &[0, 70000], Dtype::F32, 0),
    ];
    for (op, shape, d, want) in cases {
        let what = format!("{op} of {d} {shape:?}");
        let x = quarters(shape, shape.iter().product::<usize>() as u64, d);
        let (n, g, c) = dispatches(&x, &|x: &Array| reduce(op, x));
        assert_eq!(n, want, "{what}: dispatches");
        assert_eq!(g.dtype(), c.dtype(), "{what}: dtype");
        // Quarters: every partial sum is exact in f32, in any order.
        let as_f32 = |a: &Array| a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(as_f32(&g), as_f32(&c), "{what}");
    }
}
