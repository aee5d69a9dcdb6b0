//! Conformance specification of the unscale-and-check primitive.
//!
//! Values: groups of gradients of every float dtype, shape (empty, 0-d,
//! 1-long axes) and layout, times an inverse loss scale, against products
//! computed here in float32, bit for bit (one multiply is correctly rounded,
//! and the values stay clear of subnormals); the flag is 0. Then poisoned
//! gradients (an infinity, a NaN, or a finite value whose product
//! overflows) raise their group's flag to exactly 1 and leave the other
//! products as they were, and over more than one group the flags add up;
//! a half-precision gradient widened by a pending cast gives the cast's
//! products. On the device under test, for the CPU and the GPU.
//!
//! Gradients: the check is not differentiated; differentiating through it
//! is refused, naming the primitive.

use mlx_array::conformance::*;
use mlx_array::{Array, Dtype};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::{UnscaleCheck, group_size, unscale_and_check};

/// The primitive's specification.
pub(crate) fn specs() -> Vec<Spec> {
    vec![Spec::new::<UnscaleCheck>(
        "unscale_check",
        check_values,
        || {
            let inputs = vec![
                uniform(31, &[2, 3], -1.0, 1.0),
                Array::full(&[], 0.25, Dtype::F32),
            ];
            GradCase::new(inputs, &[0], |a| {
                let (g, _) = unscale_and_check(&a[..1], &a[1])?;
                Ok(g[0].clone())
            })
            .refused()
        },
    )]
}

/// How a gradient is spoiled.
#[derive(Clone, Copy, Debug)]
enum Poison {
    Infinity,
    NegativeInfinity,
    NaN,
    /// The largest finite value of the dtype: its product overflows
    /// float32 with the case's inverse scale of 2^120.
    Overflow,
}

/// One gradient: its values' shape, dtype, layout and seed.
#[derive(Clone, Debug)]
struct Grad {
    shape: Vec<usize>,
    dtype: Dtype,
    layout: Layout,
    seed: u64,
}

impl Grad {
    /// Its values in [-4, 4], rounded to its dtype.
    fn nd(&self) -> Nd {
        fill(&self.shape, self.dtype, -4.0, 4.0, self.seed)
    }
}

const GRADIENT_DTYPES: [Dtype; 3] = [Dtype::F32, Dtype::F16, Dtype::BF16];

fn check_values(cx: &Ctx) {
    // Gradients per primitive on the device under test (the adapter's
    // binding limit decides it on the GPU).
    let per_group = cx.on(group_size);
    if cx.device() == mlx_array::Device::Gpu {
        let limit = mlx_array::backend::gpu::custom::storage_buffer_limit().expect("a GPU");
        assert!(
            per_group >= 5 && per_group + 3 <= limit,
            "{per_group} gradients and 3 more buffers within the adapter's {limit}"
        );
    }
    let fixed: Vec<Vec<usize>> = vec![
        vec![],
        vec![0],
        vec![1],
        vec![5],
        vec![3, 0],
        vec![2, 1, 3],
        vec![7, 9],
        vec![130, 33],
    ];
    let grads: Vec<Grad> = fixed
        .into_iter()
        .enumerate()
        .map(|(i, shape)| Grad {
            shape,
            dtype: GRADIENT_DTYPES[i % 3],
            layout: LAYOUTS[i % 4],
            seed: i as u64,
        })
        .collect();
    for inverse in [1.0 / 65536.0, 0.75, 3.0] {
        for group in grads.chunks(per_group) {
            finite_group(cx, group, inverse);
        }
    }
    let mut runner = cx.runner();
    let strategy = (
        prop::collection::vec(
            (
                shape(3),
                prop::sample::select(GRADIENT_DTYPES.to_vec()),
                layout(),
                any::<u64>(),
            ),
            1..=per_group,
        ),
        prop::sample::select(vec![1.0 / 1024.0, 0.5, 2.0, 1.0 / 3.0]),
    );
    for _ in 0..runner.config().cases {
        let (drawn, inverse) = strategy.new_tree(&mut runner).expect("a case").current();
        let group: Vec<Grad> = drawn
            .into_iter()
            .map(|(shape, dtype, layout, seed)| Grad {
                shape,
                dtype,
                layout,
                seed,
            })
            .collect();
        finite_group(cx, &group, inverse);
    }
    poisoned(cx, per_group);
    widened(cx);
}

/// The float32 product of `x` (a value of its dtype) and `inverse`.
fn product(x: f64, inverse: f32) -> f32 {
    x as f32 * inverse
}

/// Runs the check of `grads` on the device under test: the products and
/// the flag, evaluated.
fn run(cx: &Ctx, grads: &[Array], inverse: f32) -> (Vec<Array>, Array) {
    cx.on(|| {
        let device = cx.device();
        let grads: Vec<Array> = grads.iter().map(|g| g.to_device(device)).collect();
        let inverse = Array::full(&[], f64::from(inverse), Dtype::F32).to_device(device);
        let (products, flag) = unscale_and_check(&grads, &inverse).expect("unscale_and_check");
        for p in &products {
            p.eval().expect("products evaluate");
        }
        flag.eval().expect("flag evaluates");
        (products, flag)
    })
}

/// Asserts the products of a group of finite gradients bit for bit, and a
/// zero flag.
fn finite_group(cx: &Ctx, group: &[Grad], inverse: f64) {
    let inverse = inverse as f32;
    let nds: Vec<Nd> = group.iter().map(Grad::nd).collect();
    let arrays: Vec<Array> = group
        .iter()
        .zip(&nds)
        .map(|(g, nd)| make(nd, g.dtype, g.layout))
        .collect();
    let (products, flag) = run(cx, &arrays, inverse);
    let what = format!("{group:?} times {inverse} on {}", cx.device());
    for ((p, nd), g) in products.iter().zip(&nds).zip(group) {
        assert_eq!(p.device(), cx.device(), "{what}: placed on {}", p.device());
        assert_eq!((p.shape(), p.dtype()), (&g.shape[..], Dtype::F32), "{what}");
        let want: Vec<u32> =
            nd.v.iter()
                .map(|&x| product(x, inverse).to_bits())
                .collect();
        let got: Vec<u32> = p
            .to_vec::<f32>()
            .expect("values")
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(got, want, "{what}: the products of {g:?}");
    }
    assert_eq!(flag.shape(), &[] as &[usize], "{what}: the flag is 0-d");
    assert_eq!(
        flag.item::<f32>().expect("flag"),
        0.0,
        "{what}: finite, flag 0"
    );
}

/// Poisoned gradients raise their group's flag to 1 and leave the other
/// products alone; over two groups the flags add up.
fn poisoned(cx: &Ctx, per_group: usize) {
    let inverse = 2f32.powi(120);
    let grads: Vec<Grad> = (0..per_group + 2)
        .map(|i| Grad {
            shape: vec![3 + i, 5],
            dtype: GRADIENT_DTYPES[i % 3],
            layout: LAYOUTS[i % 4],
            seed: 100 + i as u64,
        })
        .collect();
    // Small values: no product overflows but the poisoned one.
    let clean: Vec<Nd> = grads
        .iter()
        .map(|g| fill(&g.shape, g.dtype, -1e-30, 1e-30, g.seed))
        .collect();
    let poisons = [
        Poison::Infinity,
        Poison::NegativeInfinity,
        Poison::NaN,
        Poison::Overflow,
    ];
    for (k, poison) in poisons.into_iter().enumerate() {
        // One gradient of the first group, then one of each group.
        let spoiled: Vec<usize> = if k % 2 == 0 {
            vec![k % per_group]
        } else {
            vec![k % per_group, per_group + k % 2]
        };
        let what = format!("{poison:?} in gradients {spoiled:?} on {}", cx.device());
        let mut nds = clean.clone();
        let at = 7 + k;
        for &s in &spoiled {
            nds[s].v[at] = match poison {
                Poison::Infinity => f64::INFINITY,
                Poison::NegativeInfinity => f64::NEG_INFINITY,
                Poison::NaN => f64::NAN,
                Poison::Overflow => match grads[s].dtype {
                    Dtype::F16 => 65504.0,
                    Dtype::BF16 => 3.3895313892515355e38,
                    _ => f64::from(f32::MAX),
                },
            };
        }
        let arrays: Vec<Array> = grads
            .iter()
            .zip(&nds)
            .map(|(g, nd)| make(nd, g.dtype, g.layout))
            .collect();
        let (products, flag) = run(cx, &arrays, inverse);
        assert_eq!(
            flag.item::<f32>().expect("flag"),
            spoiled.len() as f32,
            "{what}: one per group holding a non-finite product"
        );
        for (i, (p, nd)) in products.iter().zip(&nds).enumerate() {
            let got = p.to_vec::<f32>().expect("values");
            for (j, (&x, &y)) in nd.v.iter().zip(&got).enumerate() {
                if spoiled.contains(&i) && j == at {
                    assert!(!y.is_finite(), "{what}: gradient {i}'s element {j} is {y}");
                } else {
                    assert_eq!(
                        y.to_bits(),
                        product(x, inverse).to_bits(),
                        "{what}: gradient {i}'s element {j}"
                    );
                }
            }
        }
    }
}

/// A float32 gradient that is a pending cast of a half-precision one gives
/// the cast's products.
fn widened(cx: &Ctx) {
    for dtype in [Dtype::F16, Dtype::BF16] {
        let nd = fill(&[6, 7], dtype, -4.0, 4.0, 9);
        let half = make(&nd, dtype, Layout::Transposed);
        let (products, flag) = cx.on(|| {
            let half = half.to_device(cx.device());
            let wide = half.astype(Dtype::F32).expect("astype");
            let inverse = Array::full(&[], 0.125, Dtype::F32).to_device(cx.device());
            let (p, f) = unscale_and_check(&[wide], &inverse).expect("unscale_and_check");
            p[0].eval().expect("evaluates");
            (p, f)
        });
        let want: Vec<u32> = nd.v.iter().map(|&x| product(x, 0.125).to_bits()).collect();
        let got: Vec<u32> = products[0]
            .to_vec::<f32>()
            .expect("values")
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert_eq!(got, want, "{dtype:?} widened, on {}", cx.device());
        assert_eq!(flag.item::<f32>().expect("flag"), 0.0);
    }
}
