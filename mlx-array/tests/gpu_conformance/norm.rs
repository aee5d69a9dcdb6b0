//! RMS norm and its gradient at sizes the row kernels split unevenly: rows
//! shared by a workgroup (narrow rows), rows wider than a workgroup, and
//! more rows than one column-sum chunk of the weight's gradient.

use mlx_array::{Array, Dtype};

use crate::elementwise::values_in;
use crate::harness::{bits, compare, gpu};
use mlx_array::conformance::{Layout, make};

#[test]
fn rms_norm_and_its_gradient_agree_with_the_cpu_at_uneven_sizes() {
    let Some(_gpu) = gpu() else { return };
    // width 7: 32 lanes a row, 8 rows a workgroup, 3 chunks of rows;
    // 130: 64 lanes, a ragged last pass; 1000: 256 lanes, 4 values each.
    // 1,100 rows: 35 chunks of 32 for the weight's column sums (the last of
    // 12 rows), folded in rounds of 16 partials, the last round partial.
    for (rows, width) in [(70usize, 7usize), (111, 130), (5, 1000), (1, 3), (1100, 20)] {
        let x = make(
            &values_in(&[rows, width], 60, -2.0, 2.0, false),
            Dtype::F32,
            Layout::Dense,
        );
        let w = make(
            &values_in(&[width], 61, 0.5, 1.5, false),
            Dtype::F32,
            Layout::Dense,
        );
        let c = make(
            &values_in(&[rows, width], 62, -1.0, 1.0, false),
            Dtype::F32,
            Layout::Dense,
        );
        let what = format!("[{rows}, {width}]");
        compare(
            &format!("rms_norm {what}"),
            &[x.clone(), w.clone()],
            |v| mlx_array::rms_norm(&v[0], Some(&v[1]), 1e-5),
            1e-5,
        );
        // d/dx and d/dw of sum(rms_norm(x, w) * c), concatenated.
        let grads = |v: &[Array]| {
            let c = v[2].clone();
            let g = mlx_array::grad(
                move |a: &[Array]| {
                    mlx_array::rms_norm(&a[0], Some(&a[1]), 1e-5)?
                        .mul(&c)?
                        .sum_all()
                },
                &[0, 1],
            )(&[v[0].clone(), v[1].clone()])?;
            mlx_array::concatenate(&[g[0].reshape(&[-1])?, g[1].clone()], 0)
        };
        compare(&format!("rms_norm grad {what}"), &[x, w, c], grads, 1e-4);
    }
}

/// A residual's gradient, `x + rms_norm(x, w)`: the cotangent that reaches
/// `x` through the add is added to the norm's `dx` in the gradient's own
/// kernels (`Primitive::vjp_accumulating`), so the gradients take exactly
/// the kernels of the norm's alone, with the bits of the cotangent added
/// after them.
#[test]
fn a_residuals_cotangent_is_added_in_the_norms_gradient_kernel() {
    let Some(_gpu) = gpu() else { return };
    let (rows, width) = (6, 40);
    let on_gpu = |v: Array| {
        let v = v.to_device(mlx_array::Device::Gpu);
        v.eval().unwrap();
        v
    };
    let x = on_gpu(make(
        &values_in(&[rows, width], 63, -2.0, 2.0, false),
        Dtype::F32,
        Layout::Dense,
    ));
    let w = on_gpu(make(
        &values_in(&[width], 64, 0.5, 1.5, false),
        Dtype::F32,
        Layout::Dense,
    ));
    let ct = on_gpu(make(
        &values_in(&[rows, width], 65, -1.0, 1.0, false),
        Dtype::F32,
        Layout::Dense,
    ));
    let grads = |residual: bool| {
        let (_, g) = mlx_array::device::with_device(mlx_array::Device::Gpu, || {
            mlx_array::vjp(
                |a: &[Array]| {
                    let y = mlx_array::rms_norm(&a[0], Some(&a[1]), 1e-5)?;
                    Ok(vec![if residual { a[0].add(&y)? } else { y }])
                },
                &[x.clone(), w.clone()],
                std::slice::from_ref(&ct),
            )
        })
        .unwrap();
        let before = mlx_array::backend::gpu::dispatch_count();
        mlx_array::eval(&g).unwrap();
        (g, mlx_array::backend::gpu::dispatch_count() - before)
    };
    let ((fused, kernels), (alone, alone_kernels)) = (grads(true), grads(false));
    assert_eq!(kernels, alone_kernels, "no kernel for the residual's add");
    let added =
        mlx_array::device::with_device(mlx_array::Device::Gpu, || ct.add(&alone[0])).unwrap();
    assert_eq!(bits(&fused[0]), bits(&added), "dx");
    assert_eq!(bits(&fused[1]), bits(&alone[1]), "dw");
}
