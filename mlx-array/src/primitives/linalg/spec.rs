//! Conformance specification of the matrix product: an f64 reference with
//! NumPy semantics (broadcast batches, 1-d operands) over the float dtypes,
//! operand views taken on the device under test, sizes around the GPU's
//! tiles, empty products and mixed dtypes.

use proptest::prelude::*;

use super::Matmul;
use crate::conformance::*;
use crate::primitives::reduce::spec::{View, view_on};
use crate::{Array, Dtype, SliceArg};

/// The matrix product's specification.
pub fn specs() -> Vec<Spec> {
    vec![Spec::new::<Matmul>("matmul", matmul_values, || {
        // A batch times a matrix (one GEMM over all rows), and the same
        // batch against a broadcast batch of matrices.
        GradCase::new(
            vec![
                uniform(16, &[2, 2, 3], -1.0, 1.0),
                uniform(17, &[3, 4], -1.0, 1.0),
                uniform(18, &[3, 1, 3, 2], -1.0, 1.0),
            ],
            &[0, 1, 2],
            |a| {
                crate::concatenate(
                    &[
                        a[0].matmul(&a[1])?.reshape(&[-1])?,
                        a[0].matmul(&a[2])?.reshape(&[-1])?,
                    ],
                    0,
                )
            },
        )
    })]
}

/// The f64 reference of `x @ y` (NumPy semantics) rounded to `dtype`, and
/// the scale of its rounding error (the largest |product| times the depth).
fn matmul_reference(x: &Nd, y: &Nd, dtype: Dtype) -> (Nd, f64) {
    let (sa, sb) = (&x.shape, &y.shape);
    // Promote 1-d operands, broadcast batches, sum products.
    let xa = if sa.len() == 1 {
        Nd::new(&[1, sa[0]], x.v.clone())
    } else {
        x.clone()
    };
    let yb = if sb.len() == 1 {
        Nd::new(&[sb[0], 1], y.v.clone())
    } else {
        y.clone()
    };
    let (bx, by) = (
        &xa.shape[..xa.shape.len() - 2],
        &yb.shape[..yb.shape.len() - 2],
    );
    let batch = broadcast(bx, by).expect("batches broadcast");
    let k = xa.shape[xa.shape.len() - 1];
    let (mm, nn) = (xa.shape[xa.shape.len() - 2], yb.shape[yb.shape.len() - 1]);
    let mut full = batch.clone();
    full.extend([mm, nn]);
    let mut scale = 1.0f64;
    let want = Nd::from_fn(&full, |i| {
        let nb = batch.len();
        let (r, c) = (i[nb], i[nb + 1]);
        let pick = |bs: &[usize], rest: [usize; 2]| -> Vec<usize> {
            let lead = nb - bs.len();
            let mut v: Vec<usize> = bs
                .iter()
                .enumerate()
                .map(|(d, &s)| if s == 1 { 0 } else { i[lead + d] })
                .collect();
            v.extend(rest);
            v
        };
        let mut acc = 0.0;
        for kk in 0..k {
            let p = xa.at(&pick(bx, [r, kk])) * yb.at(&pick(by, [kk, c]));
            scale = scale.max(p.abs() * k as f64);
            acc += p;
        }
        quantize(acc, dtype)
    });
    let mut shape = want.shape.clone();
    if sb.len() == 1 {
        shape.pop();
    }
    if sa.len() == 1 {
        shape.remove(shape.len() - 1 - (sb.len() != 1) as usize);
    }
    (Nd::new(&shape, want.v), scale)
}

/// Multiplies `a` (holding `x`) by `b` (holding `y`) on the device under
/// test and checks the product, in `dtype`, against the reference.
fn check_matmul(cx: &Ctx, (a, x): &(Array, Nd), (b, y): &(Array, Nd), dtype: Dtype, what: &str) {
    let what = format!("matmul {:?} @ {:?} {dtype}: {what}", x.shape, y.shape);
    let (want, scale) = matmul_reference(x, y, dtype);
    let got = cx
        .on(|| a.matmul(b))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    cx.check(&got, &want, dtype, tol(dtype) * scale.max(1.0), &what);
}

/// Quarters in [-2, 2]: products and their sums are exact in f32, and the
/// inputs in f16 and bf16.
fn quarters(shape: &[usize], seed: u64) -> Nd {
    fill(shape, Dtype::I32, -8.0, 8.0, seed).map(|v| v / 4.0)
}

fn matmul_values(cx: &Ctx) {
    for dtype in FLOATS {
        cx.runner()
            .run(
                &(
                    0usize..4,
                    0usize..5,
                    0usize..5,
                    0usize..5,
                    any::<u8>(),
                    layout(),
                    layout(),
                    any::<u64>(),
                ),
                |(b, m, k, n, form, la, lb, seed)| {
                    let (sa, sb): (Vec<usize>, Vec<usize>) = match form % 5 {
                        0 => (vec![m, k], vec![k, n]),
                        1 => (vec![b, m, k], vec![k, n]),
                        2 => (vec![b, 1, m, k], vec![2, k, n]),
                        3 => (vec![k], vec![b, k, n]),
                        _ => (vec![b, m, k], vec![k]),
                    };
                    let x = fill(&sa, dtype, -2.0, 2.0, seed);
                    let y = fill(&sb, dtype, -2.0, 2.0, seed ^ 7);
                    let a = view_on(cx, &x, dtype, View::Laid(la));
                    let b = view_on(cx, &y, dtype, View::Laid(lb));
                    check_matmul(cx, &a, &b, dtype, &format!("{la:?} {lb:?}"));
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
    }
    let dense = View::Laid(Layout::Dense);
    let transposed = View::Laid(Layout::Transposed);
    for dtype in FLOATS {
        // Sizes below, at and past the GPU's 64 x 64 tile and depth-16
        // slice, empty depths and rows; operands stored transposed (views
        // with unit row strides).
        for (m, k, n) in [
            (1, 1, 1),
            (5, 7, 3),
            (64, 16, 64),
            (70, 33, 65),
            (130, 20, 9),
            (3, 0, 4),
            (0, 5, 4),
        ] {
            let (x, y) = (quarters(&[m, k], 60), quarters(&[k, n], 61));
            for (va, vb) in [
                (dense, dense),
                (transposed, transposed),
                (transposed, dense),
            ] {
                let a = view_on(cx, &x, dtype, va);
                let b = view_on(cx, &y, dtype, vb);
                check_matmul(cx, &a, &b, dtype, &format!("{va:?} {vb:?}"));
            }
        }
        // Batched, broadcast batch axes, a matrix shared by a batch, vectors.
        let shapes: [(&[usize], &[usize]); 7] = [
            (&[2, 3, 5, 7], &[2, 3, 7, 4]),
            (&[2, 1, 5, 7], &[3, 7, 4]),
            (&[4, 70, 9], &[9, 66]),
            (&[5, 7], &[3, 7, 2]),
            (&[7], &[2, 7, 3]),
            (&[3, 7], &[7]),
            (&[7], &[7]),
        ];
        for (sa, sb) in shapes {
            let a = view_on(cx, &quarters(sa, 65), dtype, dense);
            let b = view_on(cx, &quarters(sb, 66), dtype, dense);
            check_matmul(cx, &a, &b, dtype, "batched");
        }
        // A reversed, strided operand times a broadcast one (stride-0 batch).
        let base = quarters(&[6, 10], 67);
        let x = Nd::from_fn(&[6, 5], |i| base.at(&[5 - i[0], 2 * i[1]]));
        let y = quarters(&[5, 8], 68);
        let (ab, bb) = (
            make(&base, dtype, Layout::Dense),
            make(&y, dtype, Layout::Dense),
        );
        let views = cx.on(|| -> crate::Result<(Array, Array)> {
            let av = ab.slice(&[SliceArg::FULL.step(-1), SliceArg::FULL.step(2)])?;
            let bv = bb.reshape(&[1, 5, 8])?.broadcast_to(&[3, 5, 8])?;
            Ok((av, bv))
        });
        let (av, bv) = views.expect("views");
        let yb = Nd::from_fn(&[3, 5, 8], |i| y.at(&i[1..]));
        check_matmul(
            cx,
            &(av, x),
            &(bv, yb),
            dtype,
            "strided and broadcast views",
        );
    }
    // Mixed dtypes promote before the product.
    let a = view_on(cx, &quarters(&[4, 6], 69), Dtype::BF16, dense);
    let b = view_on(cx, &quarters(&[6, 3], 70), Dtype::F32, dense);
    check_matmul(cx, &a, &b, Dtype::F32, "bf16 @ f32");
    // Integers are refused.
    let i = ints(&[1], &[1, 1]);
    let err = cx
        .on(|| i.matmul(&i))
        .expect_err("integer matmul is refused")
        .to_string();
    assert!(err.contains("floating point"), "{err}");
}
