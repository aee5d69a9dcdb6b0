//! Elementwise primitives, casts and gradients through them (the views and
//! transfers are checked on the GPU by their specifications).

use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, memory};

use crate::harness::{compare, gpu, tol};
use mlx_array::conformance::{Nd, make, values};

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

fn input(shape: &[usize], seed: u64, d: Dtype, layout: mlx_array::conformance::Layout) -> Array {
    let (lo, hi) = range_for(d);
    make(&values_in(shape, seed, lo, hi, !d.is_float()), d, layout)
}

/// Tolerance for results of dtype `d` (ints promoted to f32 included):
/// WGSL's transcendentals differ from ours by a few ulps.
fn rel(d: Dtype) -> f64 {
    if d.is_float() { tol(d).max(1e-4) } else { 1e-4 }
}

#[test]
fn gpu_buffers_are_pooled_and_counted() {
    let Some(_gpu) = gpu() else { return };
    let x = input(
        &[1000],
        12,
        Dtype::F32,
        mlx_array::conformance::Layout::Dense,
    );
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
    // Clearing the cache returns the GPU's pooled buffers to the driver too
    // (through the hook the backend registered with memory).
    drop(z);
    assert!(memory::cache() >= 4000, "the freed buffer went to the pool");
    memory::clear_cache();
    assert_eq!(memory::cache(), 0, "clear_cache left pooled GPU buffers");
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
        let x = input(&[6, 5], 13, d, mlx_array::conformance::Layout::Transposed);
        let y = input(&[6, 5], 14, d, mlx_array::conformance::Layout::Dense);
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
        // Bit for bit (fusion's promise, `backend::gpu::fusion`): half
        // intermediates are rounded exactly as storing them would, and no
        // multiply here feeds an add that a driver could contract.
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

/// A chain reading more arrays than one kernel binds (six) is split: the
/// evaluator fuses the longest prefix that fits and computes the rest node
/// by node, with the same values as the unfused chain.
#[test]
fn elementwise_chains_wider_than_a_kernel_split_into_fused_parts() {
    let Some(_gpu) = gpu() else { return };
    let xs: Vec<Array> = (0..8)
        .map(|k| {
            input(
                &[4, 5],
                60 + k,
                Dtype::F32,
                mlx_array::conformance::Layout::Dense,
            )
        })
        .collect();
    let gs: Vec<Array> = xs.iter().map(|x| x.to_device(Device::Gpu)).collect();
    mlx_array::eval(&gs).unwrap();
    // ((x0 + x1) + x2) + ... + x7: seven adds, each intermediate read once.
    let chain = |keep: &mut Vec<Array>| {
        with_device(Device::Gpu, || -> mlx_array::Result<Array> {
            let mut s = gs[0].add(&gs[1])?;
            for g in &gs[2..] {
                keep.push(s.clone());
                s = s.add(g)?;
            }
            Ok(s)
        })
        .unwrap()
    };
    let mut held = Vec::new();
    let unfused = chain(&mut held);
    let before = mlx_array::backend::gpu::dispatch_count();
    mlx_array::eval((&unfused, &held)).unwrap();
    assert_eq!(mlx_array::backend::gpu::dispatch_count() - before, 7);
    let mut dropped = Vec::new();
    let fused = chain(&mut dropped);
    dropped.clear();
    let before = mlx_array::backend::gpu::dispatch_count();
    fused.eval().unwrap();
    // The first five adds read x0..x5, six arrays: one kernel. The sixth
    // and seventh would make it seven and eight, so they run on their own.
    assert_eq!(mlx_array::backend::gpu::dispatch_count() - before, 3);
    // Additions only: no contraction, so equal bit for bit.
    assert_eq!(values(&fused), values(&unfused));
    compare(
        "a chain of eight inputs",
        &xs,
        |v| {
            let mut s = v[0].add(&v[1])?;
            for x in &v[2..] {
                s = s.add(x)?;
            }
            Ok(s)
        },
        rel(Dtype::F32),
    );
}

/// A multiply feeding an add, fused and not: bit for bit in half dtypes
/// (the product is rounded to the dtype between the two, in both kernels);
/// in `f32` WGSL lets a driver contract the pair into one FMA inside the
/// fused kernel, so there the promise is one rounding of the product.
#[test]
fn fused_multiply_adds_keep_the_promise_of_fusion() {
    let Some(_gpu) = gpu() else { return };
    for d in [Dtype::F32, Dtype::BF16, Dtype::F16] {
        // 7 x 37: not a multiple of any vector width or workgroup.
        let x = input(&[7, 37], 21, d, mlx_array::conformance::Layout::Dense);
        let y = input(&[7, 37], 22, d, mlx_array::conformance::Layout::Transposed);
        let (xg, yg) = (x.to_device(Device::Gpu), y.to_device(Device::Gpu));
        mlx_array::eval((&xg, &yg)).unwrap();
        // y - x * y, then times x: order matters in both steps.
        let chain = |keep: &mut Vec<Array>| {
            with_device(Device::Gpu, || -> mlx_array::Result<Array> {
                let p = xg.mul(&yg)?;
                let q = yg.sub(&p)?;
                let r = q.mul(&xg)?;
                keep.extend([p, q]);
                Ok(r)
            })
            .unwrap()
        };
        let mut held = Vec::new();
        let unfused = chain(&mut held);
        mlx_array::eval((&unfused, &held)).unwrap();
        let mut dropped = Vec::new();
        let fused = chain(&mut dropped);
        dropped.clear();
        let before = mlx_array::backend::gpu::dispatch_count();
        fused.eval().unwrap();
        assert_eq!(
            mlx_array::backend::gpu::dispatch_count() - before,
            1,
            "{d}: the chain did not fuse"
        );
        let f = values(&fused.astype(Dtype::F32).unwrap());
        let u = values(&unfused.astype(Dtype::F32).unwrap());
        if d == Dtype::F32 {
            // One rounding of x * y (|x y| < 9) carried through times |x| < 3.
            let (xs, ys) = (values(&x), values(&y));
            for k in 0..f.len() {
                let bound = (xs[k] * ys[k]).abs() * xs[k].abs() * 1.2e-7 + u[k].abs() * 2.4e-7;
                assert!(
                    (f[k] - u[k]).abs() <= bound,
                    "{d} [{k}]: fused {} unfused {}",
                    f[k],
                    u[k]
                );
            }
        } else {
            assert_eq!(f, u, "{d}");
        }
        compare(
            &format!("fused multiply-add {d}"),
            &[x, y],
            |v| v[1].sub(&v[0].mul(&v[1])?)?.mul(&v[0]),
            rel(d),
        );
    }
}

/// The elementwise kernel (4 quads per invocation, 256 apart) at every
/// edge: lengths that are not multiples of 4, of a quad round's 1,024 or
/// of a workgroup's 16,384 (several workgroups, the last one partial, one
/// exactly a workgroup), a dense view at an unaligned
/// offset (element by element) beside an aligned one (a vector per quad),
/// a broadcast scalar, a transposed view, and every output dtype's whole-word
/// stores (packed `bf16`, `f16`, `bool`) with a partial last quad.
#[test]
fn elementwise_kernels_handle_every_length_and_layout() {
    let Some(_gpu) = gpu() else { return };
    use mlx_array::SliceArg;
    for d in [Dtype::F32, Dtype::I32, Dtype::BF16, Dtype::F16] {
        for n in [1usize, 3, 5, 1023, 1025, 4099, 16384, 36869] {
            let base = input(
                &[n + 1],
                40 + n as u64,
                d,
                mlx_array::conformance::Layout::Dense,
            );
            let other = input(
                &[n],
                41 + n as u64,
                d,
                mlx_array::conformance::Layout::Dense,
            );
            let what = format!("{d} n={n}");
            // v[0][1..] is dense from offset 1; v[1] is aligned.
            let f = |v: &[Array]| {
                let x = v[0].slice(&[SliceArg::range(1, n as i64 + 1)])?;
                x.mul_scalar(2.0)?.sub(&v[1])
            };
            compare(
                &format!("unaligned, scalar, aligned {what}"),
                &[base.clone(), other.clone()],
                f,
                rel(d),
            );
            compare(
                &format!("copy {what}"),
                std::slice::from_ref(&other),
                |v| v[0].add_scalar(1.0),
                rel(d),
            );
            compare(
                &format!("to bool {what}"),
                &[base.clone(), other.clone()],
                |v| v[0].slice(&[SliceArg::range(0, n as i64)])?.greater(&v[1]),
                0.0,
            );
            for to in [Dtype::F32, Dtype::BF16, Dtype::F16, Dtype::I32] {
                compare(
                    &format!("astype {to} {what}"),
                    std::slice::from_ref(&other),
                    |v| v[0].astype(to),
                    rel(to),
                );
            }
        }
        // A transposed operand (through `loc`) with 3 x 343 elements.
        let t = input(&[3, 343], 50, d, mlx_array::conformance::Layout::Transposed);
        let u = input(&[3, 343], 51, d, mlx_array::conformance::Layout::Dense);
        compare(
            &format!("transposed {d}"),
            &[t, u],
            |v| v[0].add(&v[1]),
            rel(d),
        );
    }
}

/// An op on views of its inputs, as the CPU and the GPU both run it.
type ViewOp = fn(&[Array]) -> mlx_array::Result<Array>;

/// Strided views whose rows are dense and aligned read a quad per `loc`:
/// the heads of a `[B, L, H, d]` array viewed as `[B, H, L, d]`, rows
/// reversed (negative strides), an aligned window of the last axis, a
/// row broadcast along the first axis, in every dtype's vector loads
/// (f32, i32, packed and native halves); an unaligned window, a row
/// length off the quads and a strided last axis keep the per-element
/// reads. The CPU's values either way.
#[test]
fn views_with_dense_aligned_rows_read_a_quad_at_a_time() {
    let Some(_gpu) = gpu() else { return };
    use mlx_array::SliceArg;
    for d in [Dtype::F32, Dtype::I32, Dtype::BF16, Dtype::F16] {
        let x = input(&[2, 5, 3, 8], 60, d, mlx_array::conformance::Layout::Dense);
        let y = input(&[2, 3, 5, 8], 61, d, mlx_array::conformance::Layout::Dense);
        let m = input(&[6, 16], 62, d, mlx_array::conformance::Layout::Dense);
        let r = input(&[1, 12], 63, d, mlx_array::conformance::Layout::Dense);
        let before = mlx_array::backend::gpu::row_view_reads();
        let rows_cases: [(&str, &[Array], ViewOp); 5] = [
            ("heads", &[x.clone(), y.clone()], |v| {
                v[0].swapaxes(1, 2)?.add(&v[1])
            }),
            ("heads copied", std::slice::from_ref(&x), |v| {
                v[0].swapaxes(1, 2)?.contiguous()
            }),
            ("rows reversed", std::slice::from_ref(&m), |v| {
                v[0].slice(&[SliceArg::FULL.step(-1), SliceArg::FULL])?
                    .add_scalar(1.0)
            }),
            ("aligned window", std::slice::from_ref(&m), |v| {
                v[0].slice(&[SliceArg::range(1, 5), SliceArg::range(4, 12)])?
                    .mul_scalar(3.0)
            }),
            ("row broadcast", &[r.clone(), m.clone()], |v| {
                v[0].broadcast_to(&[6, 12])?
                    .add(&v[1].slice(&[SliceArg::range(0, 6), SliceArg::range(0, 12)])?)
            }),
        ];
        for (what, inputs, f) in rows_cases {
            compare(&format!("{what} {d}"), inputs, f, rel(d));
        }
        let row_reads = mlx_array::backend::gpu::row_view_reads() - before;
        assert!(row_reads >= 5, "{d}: {row_reads} row reads");
        let before = mlx_array::backend::gpu::row_view_reads();
        let element_cases: [(&str, ViewOp); 3] = [
            ("unaligned window", |v| {
                v[0].slice(&[SliceArg::range(1, 5), SliceArg::range(1, 9)])?
                    .add_scalar(1.0)
            }),
            ("rows of 6", |v| {
                v[0].slice(&[SliceArg::range(0, 6), SliceArg::range(4, 10)])?
                    .add_scalar(1.0)
            }),
            ("strided rows", |v| {
                v[0].slice(&[SliceArg::FULL, SliceArg::FULL.step(2)])?
                    .add_scalar(1.0)
            }),
        ];
        for (what, f) in element_cases {
            compare(&format!("{what} {d}"), std::slice::from_ref(&m), f, rel(d));
        }
        assert_eq!(mlx_array::backend::gpu::row_view_reads(), before, "{d}");
    }
}
