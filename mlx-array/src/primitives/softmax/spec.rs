//! Conformance specification of the softmax over the last axis: an f64
//! reference over the float dtypes and views taken on the device under
//! test, rows wider than a GPU workgroup, `-inf` logits and no rows; over
//! another axis the composite graph must agree with the primitive.

use proptest::prelude::*;

use super::Softmax;
use crate::conformance::*;
use crate::primitives::reduce::spec::{View, view_on};
use crate::{Array, Dtype};

/// The softmax's specification.
pub fn specs() -> Vec<Spec> {
    vec![Spec::new::<Softmax>("softmax", softmax_values, || {
        GradCase::new(vec![uniform(21, &[2, 3, 5], -2.0, 2.0)], &[0], |a| {
            // Weighted so that the gradient is not zero (a softmax sums to one).
            let w = Array::from_slice(&[0.5f32, -1.0, 2.0, 0.25, 1.5], &[5])?;
            a[0].softmax(&[-1])?.multiply(&w)?.square()?.sum_all()
        })
    })]
}

/// The f64 reference: `exp(x - max) / sum(exp(x - max))` per row, in `dtype`.
fn softmax_reference(x: &Nd, dtype: Dtype) -> Nd {
    let v = *x.shape.last().expect("a last axis");
    let stats = std::cell::RefCell::new(std::collections::HashMap::new());
    Nd::from_fn(&x.shape, |i| {
        let (row, c) = i.split_at(i.len() - 1);
        let at = |k: usize| {
            let mut j = row.to_vec();
            j.push(k);
            x.at(&j)
        };
        // Each row's maximum and sum, once per row (rows of thousands).
        let (m, s) = *stats.borrow_mut().entry(row.to_vec()).or_insert_with(|| {
            let m = (0..v).map(at).fold(f64::NEG_INFINITY, f64::max);
            (m, (0..v).map(|k| (at(k) - m).exp()).sum::<f64>())
        });
        quantize((at(c[0]) - m).exp() / s, dtype)
    })
}

/// The softmax of `a` (holding `x`) on the device under test against the
/// reference.
fn check_softmax(cx: &Ctx, (a, x): &(Array, Nd), dtype: Dtype, what: &str) {
    let what = format!("softmax {dtype} {:?}: {what}", x.shape);
    let got = cx
        .on(|| a.softmax(&[-1]))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cx.check(
        &got,
        &softmax_reference(x, dtype),
        dtype,
        tol(dtype) * 4.0,
        &what,
    );
}

fn softmax_values(cx: &Ctx) {
    for dtype in FLOATS {
        cx.runner()
            .run(
                &(
                    prop::collection::vec(1usize..4, 0..3),
                    1usize..9,
                    layout(),
                    any::<u64>(),
                ),
                |(rows, v, l, seed)| {
                    let mut shape = rows.clone();
                    shape.push(v);
                    let x = fill(&shape, dtype, -6.0, 6.0, seed);
                    check_softmax(
                        cx,
                        &view_on(cx, &x, dtype, View::Laid(l)),
                        dtype,
                        &format!("{l:?}"),
                    );
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        // Rows wider than one GPU workgroup, and narrow ones; long rows of a
        // multiple of 4 (vec4 loads on the GPU) and of odd length, fewer
        // than a workgroup's rows.
        for layout in LAYOUTS {
            for shape in [[2, 300], [5, 3], [3, 4100], [7, 333]] {
                let x = fill(&shape, dtype, -4.0, 4.0, 35);
                let what = format!("{layout:?}");
                check_softmax(
                    cx,
                    &view_on(cx, &x, dtype, View::Laid(layout)),
                    dtype,
                    &what,
                );
            }
        }
    }
    let inf = Nd::new(&[2, 3], vec![f64::NEG_INFINITY, 0.0, 1.0, 2.0, -1.0, 0.5]);
    check_softmax(
        cx,
        &view_on(cx, &inf, Dtype::F32, View::Laid(Layout::Dense)),
        Dtype::F32,
        "-inf",
    );
    // A row of -inf alone (NaN, as on the CPU) beside a finite one, four wide.
    let mut rows = vec![f64::NEG_INFINITY; 4];
    rows.extend([0.5, -3.0, 2.0, 1.0]);
    let all_inf = Nd::new(&[2, 4], rows);
    check_softmax(
        cx,
        &view_on(cx, &all_inf, Dtype::F32, View::Laid(Layout::Dense)),
        Dtype::F32,
        "a row of -inf",
    );
    let none = Nd::new(&[0, 4], vec![]);
    check_softmax(
        cx,
        &view_on(cx, &none, Dtype::F32, View::Laid(Layout::Dense)),
        Dtype::F32,
        "no rows",
    );
    // Over a leading axis the composite graph runs; it must agree with the
    // primitive over the same values moved last.
    let x = Array::from_slice(&[1.0f32, -2.0, 0.5, 3.0, 0.0, -1.0], &[2, 3]).expect("x");
    let (first, last) = cx
        .on(|| -> crate::Result<(Array, Array)> {
            Ok((x.softmax(&[0])?, x.t()?.softmax(&[-1])?.t()?))
        })
        .expect("softmax");
    let last = Nd::new(&[2, 3], values(&last));
    cx.check(&first, &last, Dtype::F32, 1e-6, "softmax over axis 0");
}
