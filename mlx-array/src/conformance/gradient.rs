//! Gradient checks: a primitive's vector-Jacobian product against central
//! finite differences of a random projection of its output.

use crate::{Array, Device, Dtype, Result, device::with_device, random, value_and_grad};

/// A function of the primitive's inputs.
pub type Apply = Box<dyn Fn(&[Array]) -> Result<Array>>;

/// What differentiating through the primitive must give.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Gradients equal to finite differences.
    FiniteDifferences,
    /// Exactly zero gradients: no gradient flows (comparisons, casts to
    /// integers, `stop_gradient`).
    Zero,
    /// An error naming the primitive: it has no vector-Jacobian product.
    Refused,
}

/// How a primitive is differentiated: CPU inputs, which of them are
/// differentiated, and a function that applies the primitive to them.
pub struct GradCase {
    /// The inputs (f32 or another float, on the CPU).
    pub inputs: Vec<Array>,
    /// The positions of the inputs to differentiate.
    pub diff: Vec<usize>,
    /// Applies the primitive (and whatever views make the case interesting).
    pub f: Apply,
    /// What the gradient must be.
    pub expect: Expect,
}

impl GradCase {
    /// A case whose gradients must match finite differences.
    pub fn new(
        inputs: Vec<Array>,
        diff: &[usize],
        f: impl Fn(&[Array]) -> Result<Array> + 'static,
    ) -> GradCase {
        GradCase {
            inputs,
            diff: diff.to_vec(),
            f: Box::new(f),
            expect: Expect::FiniteDifferences,
        }
    }

    /// The same case, whose gradients must be exactly zero.
    pub fn zero(mut self) -> GradCase {
        self.expect = Expect::Zero;
        self
    }

    /// The same case, where differentiating must fail naming the primitive.
    pub fn refused(mut self) -> GradCase {
        self.expect = Expect::Refused;
        self
    }

    /// Runs the check for primitive `name`, differentiating on `device`;
    /// finite differences are taken on the CPU. Panics with what differs.
    pub fn check(self, name: &str, device: Device) {
        let c = self;
        let what = format!("{name} gradient on {device}");
        let w = with_device(Device::Cpu, || {
            let shape = (c.f)(&c.inputs).map(|o| o.shape().to_vec());
            let shape = shape.unwrap_or_else(|e| panic!("{what}: forward: {e}"));
            let w = random::normal(&random::key(99), &shape, Dtype::F32).expect("projection");
            w.eval().expect("projection evaluates");
            w
        });
        let f = &c.f;
        let loss = |xs: &[Array]| (f)(xs)?.astype(Dtype::F32)?.multiply(&w)?.sum_all();
        let got = with_device(device, || value_and_grad(loss, &c.diff)(&c.inputs));
        if c.expect == Expect::Refused {
            let err = match got {
                Ok(_) => panic!("{what}: differentiating must fail: `{name}` has no VJP"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains(name),
                "{what}: the error must name `{name}`: {err}"
            );
            return;
        }
        let (_, grads) = got.unwrap_or_else(|e| panic!("{what}: {e}"));
        for (k, &i) in c.diff.iter().enumerate() {
            assert_eq!(
                grads[k].shape(),
                c.inputs[i].shape(),
                "{what}: gradient shape for input {i}"
            );
            if device == Device::Gpu && c.expect == Expect::FiniteDifferences {
                assert_eq!(grads[k].device(), device, "{what}: gradient {i} placed");
            }
            let g = with_device(Device::Cpu, || -> Result<Vec<f32>> {
                grads[k]
                    .to_device(Device::Cpu)
                    .astype(Dtype::F32)?
                    .to_vec::<f32>()
            })
            .unwrap_or_else(|e| panic!("{what}: reading gradient {i}: {e}"));
            if c.expect == Expect::Zero {
                assert!(
                    g.iter().all(|&v| v == 0.0),
                    "{what}: expected no gradient, got {g:?}"
                );
                continue;
            }
            let fd = finite_differences(&loss, &c.inputs, i);
            for (j, (&g, &fd)) in g.iter().zip(&fd).enumerate() {
                let tol = 5e-3 + 1e-2 * fd.abs();
                assert!(
                    (g as f64 - fd).abs() <= tol,
                    "{what}: d/dx{i}[{j}] autodiff {g} vs finite difference {fd}"
                );
            }
        }
    }
}

/// Central differences of `loss` along every element of input `i`, on the CPU.
fn finite_differences(
    loss: &dyn Fn(&[Array]) -> Result<Array>,
    inputs: &[Array],
    i: usize,
) -> Vec<f64> {
    with_device(Device::Cpu, || {
        let dtype = inputs[i].dtype();
        let x = inputs[i]
            .astype(Dtype::F32)
            .and_then(|x| x.to_vec::<f32>())
            .expect("input values");
        let eps = if dtype == Dtype::F32 { 1e-2 } else { 0.125 };
        (0..x.len())
            .map(|j| {
                let at = |d: f32| -> f64 {
                    let mut v = x.clone();
                    v[j] += d;
                    let mut xs = inputs.to_vec();
                    xs[i] = Array::from_slice(&v, inputs[i].shape())
                        .and_then(|a| a.astype(dtype))
                        .expect("perturbed input");
                    loss(&xs).and_then(|l| l.item::<f32>()).expect("loss") as f64
                };
                (at(eps) - at(-eps)) / (2.0 * eps as f64)
            })
            .collect()
    })
}
