//! Conformance specification of the grouped fused Adam(W) step
//! (`fused_adam_group`, `group.rs`): several parameters' steps in one node.
//!
//! Values: each parameter's `p'`, `m'`, `v'` and half-precision copy equal
//! the single-parameter fused step's (itself held to the f64 formula and
//! the op-by-op graph by the `fused_adam` spec): bit for bit on the CPU,
//! within float32 rounding on the GPU against the CPU. The copies equal
//! `astype` of the new parameter bit for bit on the device. Cases mix
//! shapes (empty, one element, odd lengths, several workgroups), float32
//! and widened half-precision gradients, copies in f16 and bf16 or none,
//! and ungated, applied and skipped gated steps; a second step feeds half
//! of the parameters the first step's outputs with no other handle (they
//! must step in their own buffer) and the rest fresh arrays, so that one
//! dispatch mixes both kinds of binding. One case has enough parameters
//! that the GPU must split them over several dispatches, and every case
//! with three or more non-empty parameters must run fewer kernels than
//! parameters on the GPU.

use std::sync::Arc;

use mlx_array::conformance::*;
use mlx_array::{Array, Device, Dtype};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::{AdamCoefficients, FusedAdamGroup, StepCoefficients, adam_group_with, adam_step_with};
use crate::{AdamW, StepContext};

/// The spec.
pub(crate) fn spec() -> Spec {
    Spec::new::<FusedAdamGroup>("fused_adam_group", group_values, || {
        let p = [
            uniform(31, &[2, 3], -1.0, 1.0),
            uniform(32, &[2, 3], -1.0, 1.0),
            uniform(33, &[2, 3], -1.0, 1.0),
            uniform(34, &[2, 3], 0.0, 1.0),
        ];
        let q: Vec<Array> = p.iter().map(|a| a.mul_scalar(0.5).expect("q")).collect();
        let c = StepCoefficients::always(coefficients(0.01, (0.9, 0.999), 1e-8, 0.01, true, 3));
        GradCase::new(p.to_vec(), &[0, 1], move |a| {
            let steps = adam_group_with(
                c.clone(),
                None,
                None,
                &[[&a[0], &a[1], &a[2], &a[3]], [&q[0], &q[1], &q[2], &q[3]]],
            )?;
            Ok(steps[0].0.clone())
        })
        .refused()
    })
}

/// AdamW's float32 coefficients of a step (Adam with `wd` 0), as the
/// optimizer computes them.
fn coefficients(
    lr: f64,
    (b1, b2): (f64, f64),
    eps: f64,
    wd: f64,
    bias_correction: bool,
    step: u64,
) -> AdamCoefficients {
    let opt = AdamW::new(lr)
        .betas(b1, b2)
        .eps(eps)
        .weight_decay(wd)
        .bias_correction(bias_correction);
    let ctx = StepContext {
        learning_rate: lr,
        step,
        parameter_apart: false,
    };
    crate::adam::coefficients(opt.config(), opt.decay(&ctx), &ctx)
}

/// How a case's step is gated.
#[derive(Clone, Copy, Debug)]
enum Gating {
    None,
    /// Gated with two candidates; the control picks the second.
    Applied,
    /// Gated; the control keeps the state.
    Skipped,
}

/// One group case.
#[derive(Clone, Debug)]
struct GroupCase {
    shapes: Vec<Vec<usize>>,
    lr: f64,
    wd: f64,
    bias_correction: bool,
    step: u64,
    copy: Option<Dtype>,
    gating: Gating,
    seed: u64,
}

impl GroupCase {
    /// The step's coefficients and, gated, its control (built on the
    /// current default device).
    fn step(&self, step: u64) -> (StepCoefficients, Option<Array>) {
        let c = |t| {
            coefficients(
                self.lr,
                (0.9, 0.999),
                1e-8,
                self.wd,
                self.bias_correction,
                t,
            )
        };
        let candidates = vec![c(step), c(step + 1)];
        let control = |v: f64| Some(Array::full(&[], v, Dtype::F32));
        match self.gating {
            Gating::None => (StepCoefficients::always(c(step)), None),
            Gating::Applied => (
                StepCoefficients {
                    candidates,
                    gated: true,
                },
                control(2.0),
            ),
            Gating::Skipped => (
                StepCoefficients {
                    candidates,
                    gated: true,
                },
                control(0.0),
            ),
        }
    }

    /// Parameter `j`'s `[p, g, m, v]` values at step `k`; the gradients of
    /// odd parameters are half precision widened to float32 (read in half
    /// precision by the kernel).
    fn inputs(&self, j: usize, k: u64) -> [Array; 4] {
        let shape = &self.shapes[j];
        let s = self.seed.wrapping_add(16 * j as u64 + 4 * k);
        let f = |i: u64, lo: f64, hi: f64| fill(shape, Dtype::F32, lo, hi, s + i);
        let g = if j % 2 == 1 {
            let half = if j % 4 == 1 { Dtype::F16 } else { Dtype::BF16 };
            make(&f(1, -1.0, 1.0), half, Layout::Dense)
                .astype(Dtype::F32)
                .expect("widened")
        } else {
            make(&f(1, -1.0, 1.0), Dtype::F32, Layout::Dense)
        };
        [
            make(&f(0, -1.0, 1.0), Dtype::F32, Layout::Dense),
            g,
            make(&f(2, -1.0, 1.0), Dtype::F32, Layout::Dense),
            make(&f(3, 0.0, 2.0), Dtype::F32, Layout::Dense),
        ]
    }
}

/// The cases: fixed ones (every edge shape in one group; a group large
/// enough to split on any adapter), then the runner's draws.
fn draw_cases(cx: &Ctx) -> Vec<GroupCase> {
    let base = GroupCase {
        shapes: vec![
            vec![],
            vec![0],
            vec![1],
            vec![3, 5],
            vec![700],
            vec![2, 1, 3],
        ],
        lr: 1e-2,
        wd: 0.01,
        bias_correction: true,
        step: 2,
        copy: Some(Dtype::BF16),
        gating: Gating::None,
        seed: 1,
    };
    let many = GroupCase {
        shapes: (0..40).map(|j| vec![1 + (j * 7) % 33]).collect(),
        copy: Some(Dtype::F16),
        gating: Gating::Applied,
        seed: 2,
        ..base.clone()
    };
    let mut out = vec![base, many];
    let mut runner = cx.runner();
    let strategy = (
        prop::collection::vec(shape(3), 2..7),
        1e-3f64..0.2,
        prop::sample::select(vec![0.0, 0.1]),
        any::<bool>(),
        1u64..20,
        prop::sample::select(vec![None, Some(Dtype::F16), Some(Dtype::BF16)]),
        prop::sample::select(vec![Gating::None, Gating::Applied, Gating::Skipped]),
        any::<u64>(),
    );
    for _ in 0..runner.config().cases {
        let (shapes, lr, wd, bias_correction, step, copy, gating, seed) =
            strategy.new_tree(&mut runner).expect("a case").current();
        out.push(GroupCase {
            shapes,
            lr,
            wd,
            bias_correction,
            step,
            copy,
            gating,
            seed,
        });
    }
    out
}

/// A fresh dense float32 array (on the host) with `a`'s values.
fn fresh(a: &Array) -> Array {
    make(&Nd::new(a.shape(), values(a)), Dtype::F32, Layout::Dense)
}

/// Each parameter's single fused step on the CPU: `[p', m', v']` and the copy.
fn reference(
    case: &GroupCase,
    step: u64,
    inputs: &[[Array; 4]],
) -> Vec<(Vec<Array>, Option<Array>)> {
    with_cpu(|| {
        let (c, control) = case.step(step);
        inputs
            .iter()
            .map(|[p, g, m, v]| {
                let (p2, m2, v2) =
                    adam_step_with(c.clone(), control.as_ref(), case.copy, p, g, m, v)
                        .expect("a single step");
                let copy = case.copy.map(|d| p2.astype(d).expect("the copy"));
                let out = vec![p2, m2, v2];
                mlx_array::eval((&out[..], &copy)).expect("the reference");
                (out, copy)
            })
            .collect()
    })
}

fn with_cpu<T>(f: impl FnOnce() -> T) -> T {
    mlx_array::device::with_device(Device::Cpu, f)
}

/// The group's step on the device under test, evaluated; checked against
/// the single steps, the copies against `astype`; returns the outputs.
fn check_group_step(
    cx: &Ctx,
    case: &GroupCase,
    step: u64,
    inputs: &[[Array; 4]],
    what: &str,
) -> Vec<(Array, Array, Array)> {
    let want = reference(case, step, inputs);
    let refs: Vec<[&Array; 4]> = inputs.iter().map(|[p, g, m, v]| [p, g, m, v]).collect();
    let got = cx.on(|| {
        let (c, control) = case.step(step);
        adam_group_with(c, control.as_ref(), case.copy, &refs).expect("a group step")
    });
    check_outputs(cx, case, &got, &want, what);
    got
}

/// Asserts the group's outputs `got` against the single steps' `want`.
fn check_outputs(
    cx: &Ctx,
    case: &GroupCase,
    got: &[(Array, Array, Array)],
    want: &[(Vec<Array>, Option<Array>)],
    what: &str,
) {
    assert_eq!(got.len(), want.len(), "{what}: one result per parameter");
    for (j, ((p, m, v), (w, wcopy))) in got.iter().zip(want).enumerate() {
        for (k, (a, b)) in [p, m, v].into_iter().zip(w).enumerate() {
            let what = format!("{what}, parameter {j} {:?}, output {k}", case.shapes[j]);
            assert_eq!(a.device(), cx.device(), "{what}: placed");
            match cx.device() {
                Device::Cpu => assert_eq!(bits(a), bits(b), "{what}: the single step's bits"),
                Device::Gpu => assert_close(
                    a,
                    &Nd::new(b.shape(), values(b)),
                    Dtype::F32,
                    tol(Dtype::F32),
                    &what,
                ),
            }
        }
        if let Some(d) = case.copy {
            let what = format!("{what}, parameter {j}'s {d} copy");
            let copy = p.astype(d).expect("the copy");
            assert_eq!(
                copy.primitive_name(),
                Some("remembered_cast"),
                "{what}: recorded as the parameter's cast"
            );
            let cast = cx.on(|| fresh(p).astype(d).expect("astype"));
            let as_f32 = |a: &Array| bits(&a.astype(Dtype::F32).expect("widened"));
            assert_eq!(as_f32(&copy), as_f32(&cast), "{what}: astype's bits");
            if cx.device() == Device::Cpu {
                let wc = wcopy.as_ref().expect("the reference copy");
                assert_eq!(as_f32(&copy), as_f32(wc), "{what}: the single step's copy");
            }
        }
    }
}

/// Two group steps per case, as the module says.
fn group_values(cx: &Ctx) {
    for case in draw_cases(cx) {
        let what = format!("{case:?}");
        let inputs: Vec<[Array; 4]> = (0..case.shapes.len()).map(|j| case.inputs(j, 0)).collect();
        mlx_array::eval(inputs.iter().flatten().cloned().collect::<Vec<_>>()).expect("inputs");
        let before: Vec<Vec<u32>> = inputs.iter().map(|i| bits(&i[0])).collect();
        let first = check_group_step(cx, &case, case.step, &inputs, &format!("{what}, step 1"));
        for (j, i) in inputs.iter().enumerate() {
            assert_eq!(
                bits(&i[0]),
                before[j],
                "{what}: parameter {j} must be left alone"
            );
        }

        // Step 2: even parameters on step 1's outputs (in place), odd ones
        // on fresh arrays of the same values.
        let mut kept_buffers = Vec::new();
        let mut second_inputs = Vec::new();
        let mut reference_inputs = Vec::new();
        for (j, (p, m, v)) in first.into_iter().enumerate() {
            let g = case.inputs(j, 1)[1].clone();
            g.eval().expect("gradient");
            reference_inputs.push([fresh(&p), g.clone(), fresh(&m), fresh(&v)]);
            if j % 2 == 0 {
                kept_buffers.push((j, buffer(&m)));
                second_inputs.push([p, g, m, v]);
            } else {
                second_inputs.push([fresh(&p), g, fresh(&m), fresh(&v)]);
            }
        }
        let want = reference(&case, case.step + 1, &reference_inputs);
        let refs: Vec<[&Array; 4]> = second_inputs
            .iter()
            .map(|[p, g, m, v]| [p, g, m, v])
            .collect();
        let got = cx.on(|| {
            let (c, control) = case.step(case.step + 1);
            adam_group_with(c, control.as_ref(), case.copy, &refs).expect("a group step")
        });
        // The graph built, only it still sees step 1's outputs.
        drop(refs);
        drop(second_inputs);
        let dispatches = gpu_dispatches(cx);
        mlx_array::eval(
            got.iter()
                .flat_map(|(p, m, v)| [p.clone(), m.clone(), v.clone()])
                .collect::<Vec<_>>(),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let dispatched = gpu_dispatches(cx) - dispatches;
        check_outputs(cx, &case, &got, &want, &format!("{what}, step 2"));
        for (j, moments) in kept_buffers {
            if size(&case.shapes[j]) > 0 {
                assert_eq!(
                    buffer(&got[j].1),
                    moments,
                    "{what}: parameter {j} must step in its own buffer"
                );
            }
        }
        let live = case.shapes.iter().filter(|s| size(s) > 0).count();
        if cx.device() == Device::Gpu && live >= 3 {
            assert!(
                (1..live).contains(&dispatched),
                "{what}: {dispatched} kernels for {live} parameters"
            );
        }
        if cx.device() == Device::Gpu && live >= 40 {
            assert!(dispatched >= 2, "{what}: {live} parameters must split");
        }
    }
}

/// GPU kernels dispatched so far (0 on the CPU).
fn gpu_dispatches(cx: &Ctx) -> usize {
    match cx.device() {
        Device::Cpu => 0,
        Device::Gpu => mlx_array::backend::gpu::dispatch_count(),
    }
}

/// The bits of a float32 array (also `spec.rs`'s, which registers this
/// specification).
pub(super) fn bits(a: &Array) -> Vec<u32> {
    let v = a.to_vec::<f32>().expect("float32 values");
    v.iter().map(|x| x.to_bits()).collect()
}

/// The address of the buffer an evaluated array views.
pub(super) fn buffer(a: &Array) -> usize {
    Arc::as_ptr(a.data().expect("evaluated").storage()) as usize
}
