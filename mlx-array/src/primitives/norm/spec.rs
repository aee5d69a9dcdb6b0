//! Conformance specifications of the RMS norm and of its fused gradient:
//! f64 references over the float dtypes, views taken on the device under
//! test, empty and one-wide rows, with and without a weight. The gradient
//! primitive is built by the norm's vector-Jacobian product.
//!
//! Mixed precision (a float32 input, a half-precision weight, the result in
//! half precision: `rms_norm_as`): the value and both gradients equal, bit
//! for bit, those of the casts it replaces (the weight cast to float32,
//! the float32 result cast to half precision) on the same device, and the
//! weight's gradient comes back in the weight's dtype.

use proptest::prelude::*;

use super::{RmsNorm, RmsNormGrad};
use crate::conformance::*;
use crate::primitives::reduce::spec::{View, view_on};
use crate::{Array, Dtype};

/// The RMS norm's and its gradient's specifications.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec::new::<RmsNorm>("rms_norm", rms_norm_values, || {
            GradCase::new(
                vec![
                    uniform(31, &[2, 3, 5], -2.0, 2.0),
                    uniform(32, &[5], 0.5, 1.5),
                ],
                &[0, 1],
                |a| crate::rms_norm(&a[0].swapaxes(0, 1)?, Some(&a[1]), 1e-5),
            )
        }),
        Spec::new::<RmsNormGrad>("rms_norm_grad", rms_norm_grad_values, || {
            // The first derivative's dx comes from `rms_norm_grad`, which has
            // no vector-Jacobian product: a second derivative is refused.
            let w = uniform(32, &[5], 0.5, 1.5);
            GradCase::new(vec![uniform(31, &[2, 5], -2.0, 2.0)], &[0], move |a| {
                let dx = crate::grad(
                    |y: &[Array]| {
                        crate::rms_norm(&y[0], Some(&y[1]), 1e-5)?
                            .square()?
                            .sum_all()
                    },
                    &[0],
                )(&[a[0].clone(), w.clone()])?;
                Ok(dx[0].clone())
            })
            .refused()
        }),
    ]
}

/// The inputs of one check and the f64 reference of the norm and its
/// gradients.
struct Case {
    x: Nd,
    w: Nd,
    ct: Nd,
    weighted: bool,
    eps: f64,
}

impl Case {
    fn new(rows: &[usize], width: usize, dtype: Dtype, weighted: bool, seed: u64) -> Case {
        let mut shape = rows.to_vec();
        shape.push(width);
        Case {
            x: fill(&shape, dtype, -3.0, 3.0, seed),
            w: fill(&[width], Dtype::F32, -2.0, 2.0, seed ^ 7),
            ct: fill(&shape, Dtype::F32, -1.0, 1.0, seed ^ 9),
            weighted,
            eps: 1e-3,
        }
    }

    fn width(&self) -> usize {
        self.w.v.len()
    }

    /// The row of `nd` holding the element at `i`.
    fn row(&self, nd: &Nd, i: &[usize]) -> Vec<f64> {
        (0..self.width())
            .map(|c| {
                let mut j = i[..i.len() - 1].to_vec();
                j.push(c);
                nd.at(&j)
            })
            .collect()
    }

    fn wv(&self, c: usize) -> f64 {
        if self.weighted { self.w.at(&[c]) } else { 1.0 }
    }

    /// The inverse RMS of a row.
    fn r_of(&self, xs: &[f64]) -> f64 {
        1.0 / (xs.iter().map(|v| v * v).sum::<f64>() / self.width() as f64 + self.eps).sqrt()
    }

    fn want(&self, dtype: Dtype) -> Nd {
        Nd::from_fn(&self.x.shape, |i| {
            let c = i[i.len() - 1];
            quantize(
                self.x.at(i) * self.r_of(&self.row(&self.x, i)) * self.wv(c),
                dtype,
            )
        })
    }

    fn want_dx(&self, dtype: Dtype) -> Nd {
        let width = self.width();
        Nd::from_fn(&self.x.shape, |i| {
            let (xs, cts, c) = (self.row(&self.x, i), self.row(&self.ct, i), i[i.len() - 1]);
            let r = self.r_of(&xs);
            let xg: f64 =
                (0..width).map(|k| xs[k] * cts[k] * self.wv(k)).sum::<f64>() / width as f64;
            quantize(r * self.wv(c) * cts[c] - xs[c] * r * r * r * xg, dtype)
        })
    }

    fn want_dw(&self) -> Nd {
        let mut dw = vec![0.0; self.width()];
        for_each_index(&self.x.shape, |i| {
            let c = i[i.len() - 1];
            dw[c] += self.ct.at(i) * self.x.at(i) * self.r_of(&self.row(&self.x, i));
        });
        Nd::new(&[self.width()], dw)
    }
}

/// The norm alone, built by the op on the device under test.
fn check_forward(cx: &Ctx, c: &Case, dtype: Dtype, layout: Layout) {
    let what = format!(
        "rms_norm {dtype} {:?} {layout:?} weighted {}",
        c.x.shape, c.weighted
    );
    let (x, _) = view_on(cx, &c.x, dtype, View::Laid(layout));
    let w = make(&c.w, Dtype::F32, Layout::Dense);
    let got = cx
        .on(|| crate::rms_norm(&x, c.weighted.then_some(&w), c.eps))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cx.check(&got, &c.want(dtype), dtype, tol(dtype) * 8.0, &what);
}

fn rms_norm_values(cx: &Ctx) {
    let strategy = (
        prop::collection::vec(0usize..4, 0..3),
        1usize..9,
        layout(),
        any::<bool>(),
        any::<u64>(),
    );
    for dtype in FLOATS {
        cx.runner()
            .run(&strategy, |(rows, width, lay, weighted, seed)| {
                check_forward(
                    cx,
                    &Case::new(&rows, width, dtype, weighted, seed),
                    dtype,
                    lay,
                );
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        for layout in LAYOUTS {
            let mut c = Case::new(&[4], 6, dtype, true, 54);
            c.w = fill(&[6], Dtype::F32, 0.5, 1.5, 53);
            c.eps = 1e-5;
            check_forward(cx, &c, dtype, layout);
        }
    }
    for (w, out) in [
        (Dtype::F16, Dtype::F16),
        (Dtype::BF16, Dtype::BF16),
        (Dtype::F32, Dtype::F16),
    ] {
        for (rows, width, seed) in [(&[3, 5][..], 7, 61), (&[2][..], 300, 62), (&[0][..], 4, 63)] {
            check_mixed(cx, &Case::new(rows, width, Dtype::F32, true, seed), w, out);
        }
    }
    let x = Array::zeros(&[2, 3], Dtype::F32);
    let err = |r: crate::Result<Array>| r.expect_err("refused").to_string();
    let two = Array::ones(&[2], Dtype::F32);
    let e = err(cx.on(|| crate::rms_norm(&x, Some(&two), 1e-5)));
    assert!(e.contains("shape [3]"), "{e}");
    let e = err(cx.on(|| crate::rms_norm(&x, None, -1.0)));
    assert!(e.contains("eps"), "{e}");
    let xi = x.astype(Dtype::I32).expect("ints");
    let e = err(cx.on(|| crate::rms_norm(&xi, None, 1e-5)));
    assert!(e.contains("floating point"), "{e}");
    let e = err(cx.on(|| crate::rms_norm_as(&x, None, 1e-5, Dtype::I32)));
    assert!(e.contains("float dtype"), "{e}");
}

/// The bits of `a` read as f32 (exact for every float dtype).
fn bits(a: &Array) -> Vec<u32> {
    a.astype(Dtype::F32)
        .and_then(|a| a.to_vec::<f32>())
        .expect("values")
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

/// `rms_norm_as` of a float32 `x` and a weight of `w_dtype` into `out`,
/// value and gradients, against the casts it stands for on the same
/// device, and its value against the f64 reference.
fn check_mixed(cx: &Ctx, c: &Case, w_dtype: Dtype, out: Dtype) {
    let what = format!("rms_norm_as {:?} weight {w_dtype} into {out}", c.x.shape);
    let x = make(&c.x, Dtype::F32, Layout::Dense);
    let w = make(&c.w, w_dtype, Layout::Dense);
    let ct = make(&c.ct, out, Layout::Dense);
    let eps = c.eps;
    let run = |fused: bool| {
        cx.on(|| {
            crate::vjp(
                |a: &[Array]| {
                    Ok(vec![if fused {
                        crate::rms_norm_as(&a[0], Some(&a[1]), eps, out)?
                    } else {
                        crate::rms_norm(&a[0], Some(&a[1].astype(Dtype::F32)?), eps)?.astype(out)?
                    }])
                },
                &[x.clone(), w.clone()],
                std::slice::from_ref(&ct),
            )
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"))
    };
    let ((outs, grads), (want_outs, want_grads)) = (run(true), run(false));
    assert_eq!(outs[0].dtype(), out, "{what}");
    assert_eq!(bits(&outs[0]), bits(&want_outs[0]), "{what}: value");
    assert_eq!(bits(&grads[0]), bits(&want_grads[0]), "{what}: dx");
    assert_eq!(grads[1].dtype(), w_dtype, "{what}: dw's dtype");
    assert_eq!(bits(&grads[1]), bits(&want_grads[1]), "{what}: dw");
    let mut reference = Case::new(&[], 1, Dtype::F32, true, 0);
    reference.x = c.x.clone();
    reference.w = Nd::from_fn(&c.w.shape, |i| quantize(c.w.at(i), w_dtype));
    reference.eps = c.eps;
    cx.check(&outs[0], &reference.want(out), out, tol(out) * 8.0, &what);
}

/// The norm and its gradients through `vjp` on the device under test: the
/// gradients come out of one `rms_norm_grad` node.
fn check_grads(cx: &Ctx, c: &Case, dtype: Dtype, layout: Layout) {
    let what = format!(
        "rms_norm_grad {dtype} {:?} {layout:?} weighted {}",
        c.x.shape, c.weighted
    );
    let (x, _) = view_on(cx, &c.x, dtype, View::Laid(layout));
    let w = make(&c.w, Dtype::F32, Layout::Dense);
    let ct = make(&c.ct, Dtype::F32, Layout::Dense)
        .astype(dtype)
        .expect("cotangent");
    let (outs, grads) = cx
        .on(|| {
            crate::vjp(
                |a: &[Array]| {
                    Ok(vec![crate::rms_norm(
                        &a[0],
                        c.weighted.then_some(&a[1]),
                        c.eps,
                    )?])
                },
                &[x, w],
                &[ct],
            )
        })
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let rel = tol(dtype) * 8.0;
    cx.check(
        &outs[0],
        &c.want(dtype),
        dtype,
        rel,
        &format!("{what}: value"),
    );
    cx.check(
        &grads[0],
        &c.want_dx(dtype),
        dtype,
        rel * 2.0,
        &format!("{what}: dx"),
    );
    if c.weighted {
        cx.check(
            &grads[1],
            &c.want_dw(),
            Dtype::F32,
            (rel * 2.0).max(1e-5),
            &format!("{what}: dw"),
        );
    }
}

fn rms_norm_grad_values(cx: &Ctx) {
    let strategy = (
        prop::collection::vec(0usize..4, 0..3),
        1usize..9,
        layout(),
        any::<bool>(),
        any::<u64>(),
    );
    for dtype in FLOATS {
        cx.runner()
            .run(&strategy, |(rows, width, lay, weighted, seed)| {
                check_grads(
                    cx,
                    &Case::new(&rows, width, dtype, weighted, seed),
                    dtype,
                    lay,
                );
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
    // Batched rows through a transposed view, and no rows at all (the
    // weight's gradient is zero).
    for rows in [&[3, 4][..], &[0][..]] {
        let mut c = Case::new(rows, 6, Dtype::F32, true, 55);
        c.w = fill(&[6], Dtype::F32, 0.5, 1.5, 53);
        c.eps = 1e-5;
        check_grads(cx, &c, Dtype::F32, Layout::Transposed);
    }
    for (rows, width, seed) in [(&[3, 5][..], 7, 71), (&[2][..], 300, 72), (&[0][..], 4, 73)] {
        for layout in LAYOUTS {
            check_residual(cx, &Case::new(rows, width, Dtype::F32, true, seed), layout);
        }
        for half in [Dtype::F16, Dtype::BF16] {
            check_half_dx(cx, &Case::new(rows, width, Dtype::F32, true, seed), half);
        }
    }
}

/// A float32 `x` normed into a half-precision `half` (a residual stream
/// feeding a half-precision model): its gradient's kernel stores `dx` in
/// `half` too, remembered as `dx`'s cast, so casting `dx` to `half` runs no
/// kernel and gives the bits of casting its float32 values. Other dtype
/// pairs keep the plain cast.
fn check_half_dx(cx: &Ctx, c: &Case, half: Dtype) {
    let what = format!("rms_norm_grad {:?} f32 -> {half}", c.x.shape);
    let x = make(&c.x, Dtype::F32, Layout::Dense);
    let w = make(&c.w, half, Layout::Dense);
    let ct = make(&c.ct, half, Layout::Dense);
    let eps = c.eps;
    let dx = |out: Dtype| {
        cx.on(|| {
            let (_, grads) = crate::vjp(
                |a: &[Array]| Ok(vec![crate::rms_norm_as(&a[0], Some(&a[1]), eps, out)?]),
                &[x.clone(), w.clone()],
                std::slice::from_ref(&ct),
            )?;
            let dx = grads[0].clone();
            let cast = dx.astype(half)?;
            Ok((dx, cast))
        })
        .unwrap_or_else(|e: crate::Error| panic!("{what}: {e}"))
    };
    let (f32_dx, cast) = dx(half);
    assert_eq!(
        cast.primitive_name(),
        Some("remembered_cast"),
        "{what}: dx's cast is the kernel's copy"
    );
    crate::eval((&f32_dx, &cast)).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!((cast.dtype(), cast.shape()), (half, f32_dx.shape()));
    let values = f32_dx.to_vec::<f32>().expect("values");
    let want = Array::from_slice(&values, f32_dx.shape())
        .and_then(|a| a.astype(half))
        .expect("cast on the CPU");
    assert_eq!(bits(&cast), bits(&want), "{what}: the f32 dx rounded");
    // A norm into float32 leaves `dx`'s cast a cast.
    let (_, plain) = dx(Dtype::F32);
    assert_eq!(plain.primitive_name(), Some("astype"), "{what}: into f32");
}

/// A residual, `x + rms_norm(x, w)`: `x`'s gradient is the cotangent
/// plus the norm's `dx`, which the gradient's row pass adds as it stores
/// `dx` (the cotangent that reached `x` first is its fourth input). Against
/// the f64 reference, and bit for bit against the norm's gradient alone
/// with the cotangent added after it, on the device under test.
fn check_residual(cx: &Ctx, c: &Case, layout: Layout) {
    let what = format!("residual rms_norm_grad {:?} {layout:?}", c.x.shape);
    let (x, _) = view_on(cx, &c.x, Dtype::F32, View::Laid(layout));
    let w = make(&c.w, Dtype::F32, Layout::Dense);
    let ct = make(&c.ct, Dtype::F32, Layout::Dense);
    let eps = c.eps;
    let grads = |residual: bool| {
        cx.on(|| {
            let (_, grads) = crate::vjp(
                |a: &[Array]| {
                    let y = crate::rms_norm(&a[0], Some(&a[1]), eps)?;
                    Ok(vec![if residual { a[0].add(&y)? } else { y }])
                },
                &[x.clone(), w.clone()],
                std::slice::from_ref(&ct),
            )?;
            Ok(grads)
        })
        .unwrap_or_else(|e: crate::Error| panic!("{what}: {e}"))
    };
    let (fused, alone) = (grads(true), grads(false));
    let added = cx
        .on(|| ct.add(&alone[0]))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(bits(&fused[0]), bits(&added), "{what}: dx");
    assert_eq!(bits(&fused[1]), bits(&alone[1]), "{what}: dw");
    let dx = c.want_dx(Dtype::F32);
    let want = Nd::from_fn(&c.x.shape, |i| dx.at(i) + c.ct.at(i));
    cx.check(&fused[0], &want, Dtype::F32, tol(Dtype::F32) * 16.0, &what);
}
