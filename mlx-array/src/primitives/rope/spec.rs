//! Conformance specification of the rotary position embedding: the
//! rotation computed in f64 over the float dtypes, views taken on the
//! device under test, both pairings, offsets and features that pass
//! through; the inverse rotation (its gradient) undoes it. The same for
//! explicit inverse frequencies ([`crate::rope_with_freqs`]), against
//! cosines and sines of the table's angles taken on the host in f64.

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
            // Explicit frequencies: halves with a pass-through pair, offset.
            let table = crate::rope_with_freqs(&a[0], &[0.9, 0.3], false, 1)?;
            crate::stack(&[halves, pairs.swapaxes(0, 1)?, table], 0)
        })
    })]
}

/// How one check rotates: by `base`'s frequencies and `scale`, or with
/// `freqs` by those inverse frequencies ([`crate::rope_with_freqs`];
/// `base` and `scale` unused, `dims` twice the table's length).
#[derive(Clone, Debug)]
struct Rotation {
    dims: usize,
    traditional: bool,
    base: f64,
    scale: f64,
    offset: usize,
    freqs: Option<Vec<f32>>,
}

impl Rotation {
    /// Rotates `dims` features by `freqs` at positions from `offset`.
    fn with_freqs(freqs: Vec<f32>, traditional: bool, offset: usize) -> Rotation {
        Rotation {
            dims: 2 * freqs.len(),
            traditional,
            base: 0.0,
            scale: 1.0,
            offset,
            freqs: Some(freqs),
        }
    }
}

/// The f64 reference of rotating `x` (`[b, l, width]`), in `dtype`.
fn rope_reference(x: &Nd, r: &Rotation, dtype: Dtype) -> Nd {
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
        let freq = match &r.freqs {
            Some(f) => f64::from(f[pair]),
            None => r.base.powf(-2.0 * pair as f64 / dims as f64),
        };
        let theta = (r.offset + i[1]) as f64 * r.scale * freq;
        let (own, other) = (x.at(i), x.at(&[i[0], i[1], partner]));
        let v = if first {
            own * theta.cos() - other * theta.sin()
        } else {
            other * theta.sin() + own * theta.cos()
        };
        quantize(v, dtype)
    })
}

fn check_rope(cx: &Ctx, x: &Nd, r: &Rotation, dtype: Dtype, layout: Layout) {
    let what = format!("rope {dtype} {:?} {layout:?} {r:?}", x.shape);
    let (a, _) = view_on(cx, x, dtype, View::Laid(layout));
    let got = cx
        .on(|| match &r.freqs {
            Some(f) => crate::rope_with_freqs(&a, f, r.traditional, r.offset),
            None => crate::rope(&a, r.dims, r.traditional, r.base, r.scale, r.offset),
        })
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
                        freqs: None,
                    };
                    check_rope(cx, &x, &r, dtype, lay);
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
                    freqs: None,
                };
                check_rope(cx, &x, &r, dtype, layout);
            }
        }
        freq_table_values(cx, dtype);
    }
    freq_table_gradient(cx);
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
    let table = |f: &[f32]| cx.on(|| crate::rope_with_freqs(&x, f, false, 0));
    for (freqs, message) in [
        (&[][..], "cannot rotate 0 features"),
        (&[1.0, 0.5][..], "cannot rotate 4 features"),
        (&[f32::NAN][..], "must be finite"),
        (&[f32::INFINITY][..], "must be finite"),
    ] {
        let e = err(table(freqs));
        assert!(e.contains(message), "{e}");
    }
}

/// Explicit inverse frequencies in `dtype`: random tables over random
/// shapes, pairings, offsets and layouts; then whole rows a multiple of 8
/// wide (the GPU's kernel by quads, where a view's rows are dense) and a
/// table with a pass-through tail (its element kernel), in every layout;
/// and Llama 3.1's frequencies at positions near the context's end.
fn freq_table_values(cx: &Ctx, dtype: Dtype) {
    let strategy = (
        (1usize..3, 1usize..5),
        prop::collection::vec(0.0f32..1.5, 1..5),
        0usize..3,
        any::<bool>(),
        0usize..6,
        layout(),
        any::<u64>(),
    );
    cx.runner()
        .run(
            &strategy,
            |((b, l), freqs, extra, traditional, offset, lay, seed)| {
                let x = fill(&[b, l, 2 * freqs.len() + extra], dtype, -2.0, 2.0, seed);
                let r = Rotation::with_freqs(freqs, traditional, offset);
                check_rope(cx, &x, &r, dtype, lay);
                Ok(())
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
    let table = |n: usize| -> Vec<f32> { (0..n).map(|i| 1.3 / (1.0 + i as f32)).collect() };
    for layout in LAYOUTS {
        for traditional in [true, false] {
            for (shape, pairs) in [([2, 3, 8], 4), ([1, 2, 16], 8), ([2, 5, 10], 3)] {
                let x = fill(&shape, dtype, -2.0, 2.0, 53);
                let r = Rotation::with_freqs(table(pairs), traditional, 2);
                check_rope(cx, &x, &r, dtype, layout);
            }
        }
    }
    // Llama 3.1's 64-wide heads (the low-frequency band divided by 8, its
    // smoothing between), at positions 8190 and on: the angle is the f32
    // product of the position and the frequency on every device, which the
    // f64 reference's cosines take within a few f32 ulps of the angle.
    let llama: Vec<f32> = (0..32)
        .map(|i| {
            let f = 500_000f64.powf(-(2 * i) as f64 / 64.0);
            let wavelen = 2.0 * std::f64::consts::PI / f;
            let smooth = (8192.0 / wavelen - 1.0) / 3.0;
            (if wavelen < 2048.0 {
                f
            } else if wavelen > 8192.0 {
                f / 8.0
            } else {
                (1.0 - smooth) * f / 8.0 + smooth * f
            }) as f32
        })
        .collect();
    let x = fill(&[1, 3, 64], dtype, -1.0, 1.0, 61);
    let r = Rotation::with_freqs(llama, false, 8190);
    let what = format!("rope {dtype} Llama 3.1's frequencies at 8190");
    let (a, _) = view_on(cx, &x, dtype, View::Laid(Layout::Dense));
    let freqs = r.freqs.as_deref().expect("a table");
    let got = cx
        .on(|| crate::rope_with_freqs(&a, freqs, false, r.offset))
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    // An f32 angle of about 8192 radians is off the exact one by up to
    // half an ulp (5e-4), and a GPU's sine reduces such an argument in f32
    // (a few ulps of it more): absolute, not relative, error. A wrong
    // table entry is off by far more.
    let want = rope_reference(&x, &r, dtype);
    let got = values(&got);
    for (k, (g, w)) in got.iter().zip(&want.v).enumerate() {
        let bound = 8e-3 + tol(dtype) * 4.0 * w.abs().max(1.0);
        assert!((g - w).abs() <= bound, "{what}: element {k}: {g} vs {w}");
    }
}

/// With explicit frequencies the gradient (the inverse rotation, by the
/// same table) undoes the rotation in every float dtype, keeping it.
fn freq_table_gradient(cx: &Ctx) {
    let x = Array::from_slice(
        &[
            0.3f32, -1.2, 0.8, 2.0, -0.5, 0.1, 1.1, 0.4, -0.7, 0.9, 0.2, -1.5,
        ],
        &[3, 4],
    )
    .expect("x");
    let rotate = |a: &Array| crate::rope_with_freqs(a, &[0.7, 0.05], true, 5);
    for dtype in [Dtype::F32, Dtype::F16, Dtype::BF16] {
        let xd = x.astype(dtype).expect("cast");
        let back = cx
            .on(|| -> crate::Result<Array> {
                let (out, g) = crate::vjp(
                    |a: &[Array]| Ok(vec![rotate(&a[0])?]),
                    std::slice::from_ref(&xd),
                    &[rotate(&xd)?],
                )?;
                assert_eq!(out[0].dtype(), dtype, "rope_with_freqs of {dtype}");
                Ok(g[0].clone())
            })
            .expect("vjp");
        assert_eq!(back.dtype(), dtype, "the gradient of rope_with_freqs");
        let rel = if dtype == Dtype::F32 {
            1e-6
        } else {
            tol(dtype) * 4.0
        };
        cx.check(
            &back,
            &Nd::new(&[3, 4], values(&xd)),
            dtype,
            rel,
            &format!("the inverse rotation by a table undoes it in {dtype}"),
        );
    }
}
