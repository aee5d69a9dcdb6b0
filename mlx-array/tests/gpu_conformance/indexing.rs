//! Gathers, scatters and placements on the GPU against the CPU: every dtype,
//! strided/transposed/reversed inputs, negative and repeated indices, zero
//! sizes, and gradients through each op.

use mlx_array::device::with_device;
use mlx_array::primitives::indexing::ScatterAdd;
use mlx_array::{Array, Device, Dtype, SliceArg};

use crate::common::{LAYOUTS, Layout, make};
use crate::elementwise::values_in;
use crate::harness::{CpuSum, compare, compare_grad, gpu};

/// The primitives this module checks on the GPU.
pub const NAMES: &[&str] = &[
    "take",
    "take_along_axis",
    "concatenate",
    "pad",
    "scatter_add",
    "slice_update",
];

const DTYPES: [Dtype; 6] = [
    Dtype::F32,
    Dtype::F16,
    Dtype::BF16,
    Dtype::I32,
    Dtype::U32,
    Dtype::Bool,
];

fn input(shape: &[usize], seed: u64, d: Dtype, layout: Layout) -> Array {
    let (lo, hi) = match d {
        Dtype::U32 => (0.0, 50.0),
        Dtype::I32 => (-20.0, 20.0),
        Dtype::Bool => (0.0, 2.0),
        _ => (-3.0, 3.0),
    };
    make(&values_in(shape, seed, lo, hi, !d.is_float()), d, layout)
}

fn idx_i32(v: &[i32], shape: &[usize]) -> Array {
    Array::from_slice(v, shape).unwrap()
}

#[test]
fn take_matches_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    // Negative, repeated, first and last indices, as i32 and u32.
    let signed = idx_i32(&[2, -1, 0, -4, 3, 2], &[2, 3]);
    let unsigned = Array::from_slice(&[3u32, 0, 0, 1], &[4]).unwrap();
    for d in DTYPES {
        for layout in LAYOUTS {
            let x = input(&[4, 5], 1, d, layout);
            for axis in [0, 1, -1] {
                for idx in [&signed, &unsigned] {
                    compare(
                        &format!("take {d} {layout:?} axis {axis} {}", idx.dtype()),
                        &[x.clone(), idx.clone()],
                        |a| a[0].take(&a[1], axis),
                        0.0,
                    );
                }
            }
            // Indices in a strided layout too.
            let strided = make(
                &values_in(&[3, 2], 2, -4.0, 4.0, true),
                Dtype::I32,
                Layout::Transposed,
            );
            compare(
                &format!("take {d} {layout:?} strided indices"),
                &[x.clone(), strided],
                |a| a[0].take(&a[1], 0),
                0.0,
            );
        }
    }
    // Zero sizes: no indices, and an empty trailing axis.
    let x = input(&[3, 4], 3, Dtype::F32, Layout::Dense);
    let none = Array::from_slice::<i32>(&[], &[0]).unwrap();
    compare(
        "take no indices",
        &[x.clone(), none],
        |a| a[0].take(&a[1], 1),
        0.0,
    );
    let empty = input(&[3, 0], 4, Dtype::F16, Layout::Dense);
    compare(
        "take from [3, 0]",
        &[empty, idx_i32(&[1, -1], &[2])],
        |a| a[0].take(&a[1], 0),
        0.0,
    );
    // A 0-d index drops the axis.
    compare(
        "take scalar index",
        &[x, Array::from_slice(&[-2i32], &[]).unwrap()],
        |a| a[0].take(&a[1], 0),
        0.0,
    );
}

#[test]
fn out_of_range_indices_read_zero_on_the_gpu() {
    let Some(_gpu) = gpu() else { return };
    // The CPU fails at eval; the GPU never reads outside the array.
    let x = Array::from_slice(&[1.0f32, 2.0, 3.0], &[3]).unwrap();
    let i = idx_i32(&[1, 3, -4, -3], &[4]);
    let y = with_device(Device::Gpu, || x.take(&i, 0)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 0.0, 1.0]);
    assert!(
        with_device(Device::Cpu, || x.take(&i, 0))
            .unwrap()
            .eval()
            .is_err()
    );
}

#[test]
fn take_along_axis_matches_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    for d in DTYPES {
        for layout in LAYOUTS {
            let x = input(&[4, 5], 5, d, layout);
            let i0 = make(&values_in(&[3, 5], 6, -4.0, 4.0, true), Dtype::I32, layout);
            compare(
                &format!("take_along_axis {d} {layout:?} axis 0"),
                &[x.clone(), i0],
                |a| a[0].take_along_axis(&a[1], 0),
                0.0,
            );
            // Broadcast indices ([4, 1] against [1, 5]... here [1, 2]).
            let i1 = Array::from_slice(&[4u32, 0], &[1, 2]).unwrap();
            compare(
                &format!("take_along_axis {d} {layout:?} axis 1 broadcast"),
                &[x.clone(), i1],
                |a| a[0].take_along_axis(&a[1], -1),
                0.0,
            );
        }
    }
    let x = input(&[2, 3, 4], 7, Dtype::BF16, Layout::Reversed);
    let i = make(
        &values_in(&[2, 3, 6], 8, -4.0, 4.0, true),
        Dtype::I32,
        Layout::Strided,
    );
    compare(
        "take_along_axis 3-d",
        &[x.clone(), i],
        |a| a[0].take_along_axis(&a[1], 2),
        0.0,
    );
    let none = Array::from_slice::<i32>(&[], &[2, 3, 0]).unwrap();
    compare(
        "take_along_axis empty",
        &[x, none],
        |a| a[0].take_along_axis(&a[1], 2),
        0.0,
    );
}

#[test]
fn scatter_add_matches_the_cpu_with_collisions() {
    let Some(_gpu) = gpu() else { return };
    // Many collisions: every index hits one of two rows.
    let idx = idx_i32(&[1, -3, 1, 0, -2, 1, 0, 1], &[2, 4]);
    for d in DTYPES {
        for layout in LAYOUTS {
            let ct = input(&[3, 2, 4, 5], 9, d, layout);
            compare(
                &format!("scatter_add {d} {layout:?}"),
                &[ct, idx.clone()],
                |a| {
                    Ok(Array::from_primitive(
                        ScatterAdd {
                            axis: 1,
                            along_axis: false,
                        },
                        vec![a[0].clone(), a[1].clone()],
                        vec![3, 3, 5],
                        a[0].dtype(),
                    ))
                },
                1e-5,
            );
            let ct = input(&[4, 6], 10, d, layout);
            let along = make(&values_in(&[4, 6], 11, -3.0, 3.0, true), Dtype::I32, layout);
            compare(
                &format!("scatter_add along axis {d} {layout:?}"),
                &[ct, along],
                |a| {
                    Ok(Array::from_primitive(
                        ScatterAdd {
                            axis: 1,
                            along_axis: true,
                        },
                        vec![a[0].clone(), a[1].clone()],
                        vec![4, 3],
                        a[0].dtype(),
                    ))
                },
                1e-5,
            );
        }
    }
    // No updates: zeros.
    let ct = Array::from_slice::<f32>(&[], &[0, 5]).unwrap();
    compare(
        "scatter_add nothing",
        &[ct, Array::from_slice::<i32>(&[], &[0]).unwrap()],
        |a| {
            Ok(Array::from_primitive(
                ScatterAdd {
                    axis: 0,
                    along_axis: false,
                },
                vec![a[0].clone(), a[1].clone()],
                vec![4, 5],
                Dtype::F32,
            ))
        },
        0.0,
    );
}

#[test]
fn concatenate_pad_and_slice_update_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    for d in DTYPES {
        for layout in LAYOUTS {
            let a = input(&[3, 4], 12, d, layout);
            let b = input(&[3, 1], 13, d, Layout::Dense);
            let c = input(&[3, 3], 14, d, Layout::Reversed);
            let e = input(&[3, 0], 15, d, Layout::Dense);
            compare(
                &format!("concatenate axis 1 {d} {layout:?}"),
                &[e.clone(), a.clone(), b, e, c],
                |x| mlx_array::concatenate(x, 1),
                0.0,
            );
            let r = input(&[2, 4], 16, d, Layout::Strided);
            compare(
                &format!("concatenate axis 0 {d} {layout:?}"),
                &[a.clone(), r.clone(), a.clone()],
                |x| mlx_array::concatenate(x, 0),
                0.0,
            );
            for value in [0.0, -2.5, 7.0] {
                compare(
                    &format!("pad {d} {layout:?} {value}"),
                    std::slice::from_ref(&a),
                    |x| x[0].pad(&[(1, 2), (0, 3)], value),
                    0.0,
                );
            }
            compare(
                &format!("slice_update {d} {layout:?}"),
                &[a.clone(), r.clone()],
                |x| x[0].slice_update(&x[1], &[SliceArg::range(1, 3), SliceArg::FULL]),
                0.0,
            );
            let u = input(&[2, 2], 17, d, layout);
            compare(
                &format!("slice_update negative step {d} {layout:?}"),
                &[a.clone(), u],
                |x| {
                    x[0].slice_update(
                        &x[1],
                        &[SliceArg::FULL.step(-2), SliceArg::range(0, 4).step(3)],
                    )
                },
                0.0,
            );
            // A broadcast update.
            compare(
                &format!("slice_update broadcast {d} {layout:?}"),
                &[a, input(&[1], 18, d, Layout::Dense)],
                |x| x[0].slice_update(&x[1], &[SliceArg::FULL, SliceArg::range(1, 3)]),
                0.0,
            );
        }
    }
    // Zero sizes: padding an empty array, an empty window.
    let e = input(&[0, 3], 19, Dtype::BF16, Layout::Dense);
    compare("pad empty", &[e], |x| x[0].pad(&[(2, 1), (1, 0)], 1.5), 0.0);
    let a = input(&[3, 4], 20, Dtype::I32, Layout::Dense);
    let none = input(&[0, 4], 21, Dtype::I32, Layout::Dense);
    compare(
        "slice_update empty window",
        &[a, none],
        |x| x[0].slice_update(&x[1], &[SliceArg::range(2, 2)]),
        0.0,
    );
}

#[test]
fn gradients_through_gathers_and_placements_match_the_cpu() {
    let Some(_gpu) = gpu() else { return };
    let x = input(&[4, 3], 22, Dtype::F32, Layout::Transposed);
    let w = input(&[3, 3], 23, Dtype::F32, Layout::Dense);
    // Weighted, so each gradient entry says which output it came from; the
    // scalar reduction runs on the CPU.
    compare_grad(
        "take (repeated indices)",
        std::slice::from_ref(&x),
        |a| {
            let i = Array::from_slice(&[1i32, -1, 1], &[3]).unwrap();
            let w = Array::from_slice(
                &[1.0f32, -2.0, 3.0, 0.5, 4.0, -1.5, 2.0, 1.0, -3.0],
                &[3, 3],
            )
            .unwrap();
            a[0].take(&i, 0)?.mul(&w)?.cpu_sum(&[0, 1])
        },
        1e-5,
    );
    compare_grad(
        "take_along_axis",
        std::slice::from_ref(&x),
        |a| {
            let i = Array::from_slice(&[0i32, 2, 2, -1, 1, 0, 0, 0], &[4, 2]).unwrap();
            a[0].take_along_axis(&i, 1)?.square()?.cpu_sum(&[0, 1])
        },
        1e-5,
    );
    compare_grad(
        "concatenate",
        &[x.clone(), w.clone()],
        |a| {
            mlx_array::concatenate(&[a[0].clone(), a[1].clone()], 0)?
                .tanh()?
                .cpu_sum(&[0, 1])
        },
        1e-5,
    );
    compare_grad(
        "pad",
        std::slice::from_ref(&x),
        |a| a[0].pad(&[(1, 0), (2, 1)], 0.5)?.sin()?.cpu_sum(&[0, 1]),
        1e-5,
    );
    compare_grad(
        "slice_update",
        &[x, w],
        |a| {
            a[0].slice_update(&a[1].exp()?, &[SliceArg::range(0, 3)])?
                .square()?
                .cpu_sum(&[0, 1])
        },
        1e-5,
    );
}
