//! Reductions, arg-reductions, cumulative sums and matrix products.
//!
//! Inputs reach the GPU dense (a transfer copies whatever CPU layout), so
//! each layout from `LAYOUTS` is paired with a view taken on the GPU
//! (transpose, strided or reversed slice, broadcast): the kernels see real
//! strides. Most values are small integers (or quarters, for matmul) so
//! that sums are exact in every float type and the comparison can be tight
//! whatever order the GPU adds in.

use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Result, SliceArg};

use crate::common::{LAYOUTS, Layout, make};
use crate::elementwise::values_in;
use crate::harness::{compare, compare_grad, gpu};

/// The primitives this module checks on the GPU.
pub const NAMES: &[&str] = &[
    "sum", "prod", "max", "min", "argmax", "argmin", "cumsum", "matmul",
];

const ALL: [Dtype; 6] = [
    Dtype::F32,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::Bool,
];

/// Integer values in a range each dtype holds (bools 0/1).
fn ints(shape: &[usize], seed: u64, d: Dtype, layout: Layout) -> Array {
    let (lo, hi) = match d {
        Dtype::U32 => (0.0, 9.0),
        Dtype::Bool => (0.0, 2.0),
        _ => (-4.0, 5.0),
    };
    make(&values_in(shape, seed, lo, hi, true), d, layout)
}

/// A view taken on the device the op runs on, one per layout, so GPU
/// kernels read transposed, strided, reversed and broadcast inputs. The
/// `Transposed` reverses the axes, `Strided` reverses the first and takes
/// every other element of the last, `Reversed` broadcasts a new axis 1.
fn view(x: &Array, layout: Layout) -> Result<Array> {
    let n = x.ndim();
    match layout {
        Layout::Dense => Ok(x.clone()),
        Layout::Transposed => {
            let perm: Vec<i32> = (0..n as i32).rev().collect();
            x.transpose(&perm)
        }
        Layout::Strided => {
            let mut args = vec![SliceArg::FULL; n];
            args[0] = SliceArg::FULL.step(-1);
            args[n - 1] = SliceArg::FULL.step(2);
            x.slice(&args)
        }
        Layout::Reversed => {
            // A broadcast (stride 0) middle axis.
            let mut s: Vec<usize> = x.shape().to_vec();
            s.insert(1, 1);
            let mut b = s.clone();
            b[1] = 2;
            let y = x.reshape(&s.iter().map(|&d| d as i64).collect::<Vec<_>>())?;
            y.broadcast_to(&b)
        }
    }
}

fn reduce(op: &str, x: &Array, axes: &[i32], keep: bool) -> Result<Array> {
    match op {
        "sum" => x.sum(axes, keep),
        "prod" => x.prod(axes, keep),
        "max" => x.max(axes, keep),
        _ => x.min(axes, keep),
    }
}

#[test]
fn reductions_match_the_cpu_over_dtypes_views_and_axis_sets() {
    let Some(_gpu) = gpu() else { return };
    let axis_sets: &[&[i32]] = &[&[], &[0], &[1], &[-1], &[0, 2], &[1, 2], &[0, 1, 2]];
    for op in ["sum", "prod", "max", "min"] {
        for d in ALL {
            for (li, layout) in LAYOUTS.into_iter().enumerate() {
                let x = ints(&[3, 4, 6], 20 + li as u64, d, layout);
                for (k, axes) in axis_sets.iter().enumerate() {
                    let keep = k % 2 == 1;
                    compare(
                        &format!("{op} {d} {layout:?} axes {axes:?} keepdims {keep}"),
                        std::slice::from_ref(&x),
                        |a| reduce(op, &view(&a[0], layout)?, axes, keep),
                        0.0,
                    );
                }
            }
        }
    }
}

#[test]
fn long_short_and_empty_reductions_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    // (shape, axes): one workgroup per output over a dense run, over a
    // strided run of few outputs, over all axes of a non-collapsible view;
    // one invocation per output over a leading axis; empty reduced axes
    // (the identity) and empty outputs.
    let cases: &[(&[usize], &[i32])] = &[
        (&[3, 700], &[1]),
        (&[700, 3], &[0]),
        (&[40, 2100], &[0]),
        (&[2, 3, 300], &[0, 2]),
        (&[0, 4], &[0]),
        (&[0, 4], &[1]),
        (&[3, 0, 2], &[1, 2]),
    ];
    for op in ["sum", "max", "min"] {
        for d in [Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::U32, Dtype::Bool] {
            for (shape, axes) in cases {
                let x = ints(shape, 30, d, Layout::Dense);
                compare(
                    &format!("{op} {d} {shape:?} axes {axes:?}"),
                    &[x],
                    |a| reduce(op, &a[0], axes, false),
                    0.0,
                );
            }
            // Every other column of a [60, 80] array: the run over both
            // axes cannot collapse into one strided dimension.
            let x = ints(&[60, 80], 31, d, Layout::Dense);
            compare(
                &format!("{op} {d} all of a strided view"),
                &[x],
                |a| {
                    let v = a[0].slice(&[SliceArg::FULL, SliceArg::FULL.step(2)])?;
                    reduce(op, &v, &[0, 1], false)
                },
                0.0,
            );
        }
    }
    // Integer products wrap, the same in any order.
    for d in [Dtype::I32, Dtype::U32] {
        let x = ints(&[5, 90], 32, d, Layout::Dense);
        compare(
            &format!("prod {d} wraps"),
            &[x],
            |a| a[0].prod(&[1], false),
            0.0,
        );
    }
    // Float products of values near one, over a long run.
    let x = make(
        &values_in(&[4, 500], 33, 0.9, 1.1, false),
        Dtype::F32,
        Layout::Dense,
    );
    compare("prod f32 long", &[x], |a| a[0].prod(&[1], false), 1e-4);
}

#[test]
fn max_and_min_propagate_nan_and_argmax_finds_the_first_nan_or_extreme() {
    let Some(_gpu) = gpu() else { return };
    let nan = f32::NAN;
    let mut v = vec![1.0f32; 2 * 600];
    v[5] = 3.0;
    v[400] = 3.0; // a tie: the first index wins
    v[600 + 7] = nan;
    v[600 + 300] = nan;
    v[600 + 2] = 9.0;
    let x = Array::from_slice(&v, &[2, 600]).unwrap();
    for d in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let xd = x.astype(d).unwrap();
        compare(
            &format!("max nan {d}"),
            std::slice::from_ref(&xd),
            |a| a[0].max(&[1], false),
            0.0,
        );
        compare(
            &format!("min nan {d}"),
            std::slice::from_ref(&xd),
            |a| a[0].min(&[1], false),
            0.0,
        );
        compare(
            &format!("argmax nan {d}"),
            std::slice::from_ref(&xd),
            |a| a[0].argmax(1, false),
            0.0,
        );
        compare(
            &format!("argmin nan {d}"),
            std::slice::from_ref(&xd),
            |a| a[0].argmin(1, false),
            0.0,
        );
        // Short runs (one invocation per output) too.
        compare(
            &format!("argmax nan short {d}"),
            std::slice::from_ref(&xd),
            |a| a[0].reshape(&[60, 20])?.argmax(1, false),
            0.0,
        );
    }
    let y = Array::from_slice(&[2.0f32, nan, 5.0, nan, 1.0], &[5]).unwrap();
    compare(
        "argmin first nan",
        std::slice::from_ref(&y),
        |a| a[0].argmin(0, true),
        0.0,
    );
    compare("max nan all", &[y], |a| a[0].max_all(), 0.0);
}

#[test]
fn arg_reductions_match_the_cpu_with_ties() {
    let Some(_gpu) = gpu() else { return };
    for is_max in [true, false] {
        let f = |x: &Array, axis: i32, keep: bool| {
            if is_max {
                x.argmax(axis, keep)
            } else {
                x.argmin(axis, keep)
            }
        };
        for d in ALL {
            for (li, layout) in LAYOUTS.into_iter().enumerate() {
                // Few distinct values: many ties.
                let x = ints(&[3, 4, 6], 40 + li as u64, d, layout);
                for axis in [0, 1, 2, -1] {
                    let keep = axis == 1;
                    compare(
                        &format!("arg is_max={is_max} {d} {layout:?} axis {axis}"),
                        std::slice::from_ref(&x),
                        |a| f(&view(&a[0], layout)?, axis, keep),
                        0.0,
                    );
                }
            }
            for (shape, axis) in [
                (&[2usize, 900][..], 1),
                (&[700, 3][..], 0),
                (&[40, 2100][..], 0),
            ] {
                let x = ints(shape, 41, d, Layout::Dense);
                compare(
                    &format!("arg is_max={is_max} {d} {shape:?} axis {axis}"),
                    &[x],
                    |a| f(&a[0], axis, false),
                    0.0,
                );
            }
        }
    }
}

#[test]
fn cumsum_matches_the_cpu_in_every_direction() {
    let Some(_gpu) = gpu() else { return };
    for d in ALL {
        for (li, layout) in LAYOUTS.into_iter().enumerate() {
            let x = ints(&[3, 4, 6], 50 + li as u64, d, layout);
            for axis in [0, 1, 2] {
                for reverse in [false, true] {
                    for inclusive in [true, false] {
                        compare(
                            &format!(
                                "cumsum {d} {layout:?} axis {axis} rev {reverse} incl {inclusive}"
                            ),
                            std::slice::from_ref(&x),
                            |a| view(&a[0], layout)?.cumsum(axis, reverse, inclusive),
                            0.0,
                        );
                    }
                }
            }
        }
        // Rows longer than a workgroup (several values per invocation, the
        // last chunks short or empty), and empty arrays.
        for (shape, axis) in [
            (&[2usize, 1000][..], 1),
            (&[300, 2][..], 0),
            (&[0, 3][..], 1),
            (&[3, 0][..], 1),
        ] {
            for (reverse, inclusive) in [(false, true), (true, false)] {
                let x = ints(shape, 51, d, Layout::Dense);
                compare(
                    &format!("cumsum {d} {shape:?} axis {axis} rev {reverse} incl {inclusive}"),
                    &[x],
                    |a| a[0].cumsum(axis, reverse, inclusive),
                    0.0,
                );
            }
        }
    }
}

/// Quarters in [-2, 2): products and their sums are exact in f32, and the
/// inputs in f16 and bf16.
fn quarters(shape: &[usize], seed: u64, d: Dtype) -> Array {
    let v = values_in(shape, seed, -8.0, 8.0, true).map(|x| x / 4.0);
    make(&v, d, Layout::Dense)
}

#[test]
fn matmul_matches_the_cpu_batched_broadcast_transposed_and_ragged() {
    let Some(_gpu) = gpu() else { return };
    let t = |x: &Array| x.swapaxes(-1, -2);
    for d in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        // Sizes below, at and past the 64 x 64 tile and the depth-16 slice.
        for (m, k, n) in [
            (1, 1, 1),
            (5, 7, 3),
            (64, 16, 64),
            (70, 33, 65),
            (130, 20, 9),
            (3, 0, 4),
            (0, 5, 4),
        ] {
            let a = quarters(&[m, k], 60, d);
            let b = quarters(&[k, n], 61, d);
            compare(
                &format!("matmul {d} {m}x{k}x{n}"),
                &[a, b],
                |x| x[0].matmul(&x[1]),
                0.0,
            );
            // Operands stored transposed: views with unit row strides.
            let at = quarters(&[k, m], 62, d);
            let bt = quarters(&[n, k], 63, d);
            compare(
                &format!("matmul {d} {m}x{k}x{n} a^T b^T"),
                &[at.clone(), bt.clone()],
                |x| t(&x[0])?.matmul(&t(&x[1])?),
                0.0,
            );
            compare(
                &format!("matmul {d} {m}x{k}x{n} a^T b"),
                &[at, quarters(&[k, n], 64, d)],
                |x| t(&x[0])?.matmul(&x[1]),
                0.0,
            );
        }
        // Batched, broadcast batch axes, a matrix shared by a batch, vectors.
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 5, 7], &[2, 3, 7, 4]),
            (&[2, 1, 5, 7], &[3, 7, 4]),
            (&[4, 70, 9], &[9, 66]),
            (&[5, 7], &[3, 7, 2]),
            (&[7], &[2, 7, 3]),
            (&[3, 7], &[7]),
            (&[7], &[7]),
        ];
        for (sa, sb) in cases {
            let a = quarters(sa, 65, d);
            let b = quarters(sb, 66, d);
            compare(
                &format!("matmul {d} {sa:?} @ {sb:?}"),
                &[a, b],
                |x| x[0].matmul(&x[1]),
                0.0,
            );
        }
        // Strided, reversed and broadcast operand views.
        let a = quarters(&[6, 10], 67, d);
        let b = quarters(&[5, 8], 68, d);
        compare(
            &format!("matmul {d} strided views"),
            &[a, b],
            |x| {
                let av = x[0].slice(&[SliceArg::FULL.step(-1), SliceArg::FULL.step(2)])?;
                let bv = x[1].reshape(&[1, 5, 8])?.broadcast_to(&[3, 5, 8])?;
                av.matmul(&bv)
            },
            0.0,
        );
    }
    // Mixed dtypes promote before the product.
    let a = quarters(&[4, 6], 69, Dtype::BF16);
    let b = quarters(&[6, 3], 70, Dtype::F32);
    compare("matmul bf16 @ f32", &[a, b], |x| x[0].matmul(&x[1]), 0.0);
}

#[test]
fn gradients_through_reductions_scans_and_matmul_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    let x = make(
        &values_in(&[3, 4], 80, -2.0, 2.0, false),
        Dtype::F32,
        Layout::Transposed,
    );
    let y = make(
        &values_in(&[4], 81, -2.0, 2.0, false),
        Dtype::F32,
        Layout::Dense,
    );
    compare_grad(
        "sum of a broadcast product, squared",
        &[x.clone(), y.clone()],
        |a| a[0].mul(&a[1])?.sum(&[0], false)?.square()?.sum_all(),
        1e-4,
    );
    compare_grad(
        "max and min over rows",
        std::slice::from_ref(&x),
        |a| {
            a[0].max(&[1], false)?
                .sub(&a[0].min(&[0], true)?.sum_all()?)?
                .sum_all()
        },
        1e-4,
    );
    compare_grad(
        "cumsum both ways",
        std::slice::from_ref(&x),
        |a| {
            let f = a[0].cumsum(1, false, true)?.square()?;
            let r = a[0].cumsum(0, true, false)?.sin()?;
            f.add(&r)?.sum_all()
        },
        1e-4,
    );
    compare_grad(
        "logsumexp and softmax",
        std::slice::from_ref(&x),
        |a| {
            a[0].logsumexp(&[1], false)?
                .add(&a[0].softmax(&[0])?.mul(&a[0])?.sum(&[1], false)?)?
                .sum_all()
        },
        1e-4,
    );
    let a = make(
        &values_in(&[2, 5, 7], 82, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Dense,
    );
    let b = make(
        &values_in(&[7, 3], 83, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Transposed,
    );
    compare_grad(
        "tanh(a @ b)",
        &[a, b],
        |x| x[0].matmul(&x[1])?.tanh()?.sum_all(),
        1e-4,
    );
    let a = make(
        &values_in(&[2, 1, 5, 7], 84, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Dense,
    );
    let b = make(
        &values_in(&[3, 7, 4], 85, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Dense,
    );
    compare_grad(
        "broadcast batched matmul",
        &[a, b],
        |x| x[0].matmul(&x[1])?.square()?.mean_all(),
        1e-4,
    );
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
