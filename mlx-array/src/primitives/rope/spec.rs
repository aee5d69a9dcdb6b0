//! Conformance specification of the rotary position embedding: the
//! rotation computed in f64 over the float dtypes, views taken on the
//! device under test, both pairings, offsets and features that pass
//! through; the inverse rotation (its gradient) undoes it.

use proptest::prelude::*;

use super::Rope;
use crate::conformance::*;
use crate::primitives::reduce::spec::{View, view_on};
use crate::{Array, Dtype};

/// The rotary embedding's specification.
pub fn specs() -> Vec<Spec> {
    vec![Spec::new::<Rope>("rope", rope_values, || {
        GradCase::new(vec![uniform(28, &[2, 3, 6], -1.0, 1.0)], &[0], |a| {
            // Halves with a pass-through feature, then pairs of a transposed view.
            let halves = crate::rope(&a[0], 4, false, 100.0, 1.0, 2)?;
            let pairs = crate::rope(&a[0].swapaxes(0, 1)?, 6, true, 10.0, 0.5, 0)?;
            crate::stack(&[halves, pairs.swapaxes(0, 1)?], 0)
        })
    })]
}

/// How one check rotates.
#[derive(Clone, Copy, Debug)]
struct Rotation {
    dims: usize,
    traditional: bool,
    base: f64,
    scale: f64,
    offset: usize,
}

/// The f64 reference of rotating `x` (`[b, l, width]`), in `dtype`.
fn rope_reference(x: &Nd, r: Rotation, dtype: Dtype) -> Nd {
    let dims = r.dims;
    Nd::from_fn(&x.shape, |i| {
        let c = i[2];
        if c >= dims {
            return x.at(i);
        }
        let half = dims / 2;
        let (pair, first, partner) = if r.traditional {
            (c / 2, c % 2 == 0, c ^ 1)
        } else if c < half {
            (c, true, c + half)
        } else {
            (c - half, false, c - half)
        };
        let theta =
            (r.offset + i[1]) as f64 * r.scale * r.base.powf(-2.0 * pair as f64 / dims as f64);
        let (own, other) = (x.at(i), x.at(&[i[0], i[1], partner]));
        let v = if first {
            own * theta.cos() - other * theta.sin()
        } else {
            other * theta.sin() + own * theta.cos()
        };
        quantize(v, dtype)
    })
}

fn check_rope(cx: &Ctx, x: &Nd, r: Rotation, dtype: Dtype, layout: Layout) {
    let what = format!("rope {dtype} {:?} {layout:?} {r:?}", x.shape);
    let (a, _) = view_on(cx, x, dtype, View::Laid(layout));
    let got = cx
        .on(|| crate::rope(&a, r.dims, r.traditional, r.base, r.scale, r.offset))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    let want = rope_reference(x, r, dtype);
    cx.check(&got, &want, dtype, tol(dtype) * 4.0 + 1e-5, &what);
}

fn rope_values(cx: &Ctx) {
    let strategy = (
        (1usize..3, 1usize..5, 1usize..4),
        0usize..3,
        any::<bool>(),
        0usize..6,
        layout(),
        any::<u64>(),
    );
    for dtype in FLOATS {
        cx.runner()
            .run(
                &strategy,
                |((b, l, pairs), extra, traditional, offset, lay, seed)| {
                    let x = fill(&[b, l, 2 * pairs + extra], dtype, -2.0, 2.0, seed);
                    let r = Rotation {
                        dims: 2 * pairs,
                        traditional,
                        base: 500.0,
                        scale: 0.75,
                        offset,
                    };
                    check_rope(cx, &x, r, dtype, lay);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        // Both pairings with a pass-through pair, over every layout.
        for layout in LAYOUTS {
            for traditional in [true, false] {
                let x = fill(&[2, 5, 6], dtype, -2.0, 2.0, 47);
                let r = Rotation {
                    dims: 4,
                    traditional,
                    base: 1000.0,
                    scale: 0.5,
                    offset: 3,
                };
                check_rope(cx, &x, r, dtype, layout);
            }
        }
    }
    // The gradient of a rotation is its inverse: rotating a cotangent back.
    let x = Array::from_slice(&[0.3f32, -1.2, 0.8, 2.0, -0.5, 0.1], &[3, 2]).expect("x");
    let rotate = |a: &Array| crate::rope(a, 2, false, 10.0, 1.0, 4);
    // In every float dtype the rotation and its gradient keep the input's
    // dtype (computed in f32 inside, no conversions around it).
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let xd = x.astype(dtype).expect("cast");
        let back = cx
            .on(|| -> crate::Result<Array> {
                let (out, g) = crate::vjp(
                    |a: &[Array]| Ok(vec![rotate(&a[0])?]),
                    std::slice::from_ref(&xd),
                    &[rotate(&xd)?],
                )?;
                assert_eq!(out[0].dtype(), dtype, "rope of {dtype}");
                Ok(g[0].clone())
            })
            .expect("vjp");
        assert_eq!(back.dtype(), dtype, "the gradient of rope of {dtype}");
        let held = Nd::new(&[3, 2], values(&xd));
        let rel = if dtype == Dtype::F32 {
            1e-6
        } else {
            tol(dtype) * 4.0
        };
        cx.check(
            &back,
            &held,
            dtype,
            rel,
            &format!("the inverse rotation undoes the rotation in {dtype}"),
        );
    }
    let err = |r: crate::Result<Array>| r.expect_err("refused").to_string();
    let rope =
        |x: &Array, dims: usize, base: f64| cx.on(|| crate::rope(x, dims, false, base, 1.0, 0));
    for (dims, base, message) in [
        (3, 10.0, "cannot rotate 3 features"),
        (4, 10.0, "cannot rotate 4 features"),
        (2, 0.0, "base must be positive"),
    ] {
        let e = err(rope(&x, dims, base));
        assert!(e.contains(message), "{e}");
    }
    let e = err(rope(&x.astype(Dtype::I32).expect("ints"), 2, 10.0));
    assert!(e.contains("floating point"), "{e}");
}
