//! Elementwise primitives, casts and gradients through them (the views and
//! transfers are checked on the GPU by their specifications).

use mlx_array::device::with_device;
use mlx_array::primitives::elementwise::{BinaryOp, UnaryOp};
use mlx_array::{Array, Device, Dtype, memory};

use crate::common::{LAYOUTS, Nd, make, values};
use crate::harness::{CpuSum, compare, compare_grad, gpu, tol};

/// The primitives this module checks on the GPU.
pub const NAMES: &[&str] = &[
    "negative",
    "abs",
    "exp",
    "log",
    "log1p",
    "sqrt",
    "rsqrt",
    "square",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "sign",
    "floor",
    "logical_not",
    "add",
    "subtract",
    "multiply",
    "divide",
    "power",
    "maximum",
    "minimum",
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "bitwise_and",
    "bitwise_or",
    "bitwise_xor",
    "left_shift",
    "right_shift",
    "where",
    "astype",
    "stop_gradient",
];

const FLOATS: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];
const INTS: [Dtype; 2] = [Dtype::I32, Dtype::U32];

/// Deterministic values in `[lo, hi)` (a small LCG), rounded when `int`.
pub fn values_in(shape: &[usize], seed: u64, lo: f64, hi: f64, int: bool) -> Nd {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    Nd::from_fn(shape, |_| {
        s = s
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = (s >> 11) as f64 / (1u64 << 53) as f64;
        let v = lo + u * (hi - lo);
        if int { v.floor() } else { v }
    })
}

fn range_for(d: Dtype) -> (f64, f64) {
    match d {
        Dtype::U32 => (0.0, 20.0),
        Dtype::I32 => (-10.0, 10.0),
        Dtype::Bool => (0.0, 2.0),
        _ => (-3.0, 3.0),
    }
}

fn input(shape: &[usize], seed: u64, d: Dtype, layout: crate::common::Layout) -> Array {
    let (lo, hi) = range_for(d);
    make(&values_in(shape, seed, lo, hi, !d.is_float()), d, layout)
}

/// Tolerance for results of dtype `d` (ints promoted to f32 included):
/// WGSL's transcendentals differ from ours by a few ulps.
fn rel(d: Dtype) -> f64 {
    if d.is_float() { tol(d).max(1e-4) } else { 1e-4 }
}

#[test]
fn unary_ops_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    for &op in UnaryOp::ALL {
        for d in FLOATS.into_iter().chain(INTS).chain([Dtype::Bool]) {
            for layout in LAYOUTS {
                let x = input(&[3, 5], 1, d, layout);
                let probe = with_device(Device::Cpu, || mlx_array::unary(op, &x));
                if probe.and_then(|p| p.eval()).is_err() {
                    continue; // no kernel for this dtype on either backend
                }
                compare(
                    &format!("{} {d} {layout:?}", op.name()),
                    &[x],
                    |a| mlx_array::unary(op, &a[0]),
                    rel(d),
                );
            }
        }
    }
}

#[test]
fn binary_ops_match_the_cpu_with_broadcasting() {
    let Some(_gpu) = gpu() else { return };
    for &op in BinaryOp::ALL {
        for d in FLOATS.into_iter().chain(INTS).chain([Dtype::Bool]) {
            for layout in LAYOUTS {
                let a = input(&[4, 3], 2, d, layout);
                let b = input(&[3], 3, d, crate::common::Layout::Dense);
                let probe = with_device(Device::Cpu, || mlx_array::binary(op, &a, &b));
                if probe.and_then(|p| p.eval()).is_err() {
                    continue; // rejected for this dtype on the CPU too
                }
                compare(
                    &format!("{} {d} {layout:?}", op.name()),
                    &[a, b],
                    |x| mlx_array::binary(op, &x[0], &x[1]),
                    rel(d),
                );
            }
        }
    }
}

#[test]
fn where_and_every_cast_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    let all = [
        Dtype::F32,
        Dtype::F16,
        Dtype::BF16,
        Dtype::I32,
        Dtype::U32,
        Dtype::Bool,
    ];
    for from in all {
        for to in all {
            let x = input(&[2, 7], 4, from, crate::common::Layout::Strided);
            compare(
                &format!("astype {from}->{to}"),
                &[x],
                |a| a[0].astype(to),
                rel(to),
            );
        }
        let c = input(&[2, 7], 5, Dtype::Bool, crate::common::Layout::Transposed);
        let a = input(&[2, 7], 6, from, crate::common::Layout::Dense);
        let b = input(&[7], 7, from, crate::common::Layout::Dense);
        compare(
            &format!("where {from}"),
            &[c, a, b],
            |x| mlx_array::where_(&x[0], &x[1], &x[2]),
            0.0,
        );
    }
    // Float to integer casts saturate and send NaN to zero, as on the CPU.
    let x = Array::from_slice(&[f32::NAN, 1e20, -1e20, -2.7, 2.7], &[5]).unwrap();
    for to in [Dtype::I32, Dtype::U32, Dtype::Bool] {
        compare(
            &format!("astype edge f32->{to}"),
            std::slice::from_ref(&x),
            |a| a[0].astype(to),
            0.0,
        );
    }
}

#[test]
fn gradients_through_elementwise_ops_and_views_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    let x = input(&[3, 4], 9, Dtype::F32, crate::common::Layout::Transposed);
    // (Same shapes: un-broadcasting a cotangent needs `sum`, checked in reduce.rs.)
    let y = input(&[3, 4], 10, Dtype::F32, crate::common::Layout::Dense);
    // The scalar reduction happens on the CPU (the transfer's VJP brings
    // the cotangent back to the GPU), so only elementwise kernels run there.
    compare_grad(
        "tanh(x*y) + sigmoid(x)^2 / (1 + y^2)",
        &[x, y],
        |a| {
            let t = a[0].mul(&a[1])?.tanh()?;
            let s = a[0].sigmoid()?.square()?;
            let q = s.div(&a[1].square()?.add_scalar(1.0)?)?;
            t.add(&q)?.transpose(&[1, 0])?.cpu_sum(&[0, 1])
        },
        1e-4,
    );
}

#[test]
fn gpu_buffers_are_pooled_and_counted() {
    let Some(_gpu) = gpu() else { return };
    let x = input(&[1000], 12, Dtype::F32, crate::common::Layout::Dense);
    let make = || with_device(Device::Gpu, || x.exp()).unwrap();
    let y = make();
    y.eval().unwrap();
    assert!(memory::active() >= 4000);
    let before = memory::cache();
    drop(y);
    assert!(
        memory::cache() >= before + 4000,
        "a freed GPU buffer went to the cache"
    );
    let z = make();
    z.eval().unwrap();
    assert!(
        memory::cache() < before + 4000 + 4096,
        "the cached buffer was not reused"
    );
}

#[test]
fn i64_on_the_gpu_is_a_clear_error() {
    let Some(_gpu) = gpu() else { return };
    let x = Array::from_slice(&[1i64, 2, 3], &[3]).unwrap();
    let y = with_device(Device::Gpu, || x.add(&x)).unwrap();
    let err = y.eval().unwrap_err().to_string();
    assert!(err.contains("i64") && err.contains("shader-int64"), "{err}");
}

#[test]
fn elementwise_chains_fuse_into_one_kernel_with_unfused_results() {
    let Some(_gpu) = gpu() else { return };
    for d in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        let x = input(&[6, 5], 13, d, crate::common::Layout::Transposed);
        let y = input(&[6, 5], 14, d, crate::common::Layout::Dense);
        let (xg, yg) = (x.to_device(Device::Gpu), y.to_device(Device::Gpu));
        mlx_array::eval((&xg, &yg)).unwrap();
        let chain = |keep: &mut Vec<Array>| {
            with_device(Device::Gpu, || -> mlx_array::Result<Array> {
                let a = xg.mul(&yg)?;
                let b = a.exp()?;
                let c = b.add(&xg)?;
                let e = c.sigmoid()?.maximum(&yg)?;
                keep.extend([a, b, c]);
                Ok(e)
            })
            .unwrap()
        };
        // Unfused: the intermediates are held, so each op runs on its own.
        let mut held = Vec::new();
        let unfused = chain(&mut held);
        let before = mlx_array::backend::gpu::dispatch_count();
        mlx_array::eval((&unfused, &held)).unwrap();
        let unfused_dispatches = mlx_array::backend::gpu::dispatch_count() - before;
        // Fused: nobody holds the intermediates.
        let mut dropped = Vec::new();
        let fused = chain(&mut dropped);
        dropped.clear();
        let before = mlx_array::backend::gpu::dispatch_count();
        fused.eval().unwrap();
        let fused_dispatches = mlx_array::backend::gpu::dispatch_count() - before;
        // a, b and c run alone; sigmoid (held by nobody) still fuses into maximum.
        assert_eq!(unfused_dispatches, 4, "{d}");
        assert_eq!(fused_dispatches, 1, "{d}: the chain did not fuse");
        // Bit for bit: intermediates keep their dtype's rounding when fused.
        let bits = |a: &Array| values(&a.astype(Dtype::F32).unwrap());
        assert_eq!(bits(&fused), bits(&unfused), "{d}");
        compare(
            &format!("fused chain {d}"),
            &[x, y],
            |v| {
                v[0].mul(&v[1])?
                    .exp()?
                    .add(&v[0])?
                    .sigmoid()?
                    .maximum(&v[1])
            },
            rel(d),
        );
    }
}
