//! Conformance specifications of the fused Adam(W) primitives.
//!
//! Values: one Adam(W) step through the optimizer's own rule (with and
//! without weight decay and bias correction, over drawn hyper-parameters,
//! shapes with empty and 1-long axes, and non-contiguous inputs) against
//! the f64 update formula, and against the op-by-op graph it replaces
//! (`AdamConfig::fused` off); then a second step fed the first one's
//! outputs with no other handle on them, which must update the moments
//! (and, with the parameter kept with them, the parameter) in their own
//! buffer.
//!
//! Devices: the CPU and the GPU. On the CPU the fused step equals the
//! op-by-op graph bit for bit. On the GPU (inputs built on the host reach
//! it through transfers) it must stay on the GPU, follow the f64 formula
//! within the GPU's slack, and match the CPU's fused step within float32
//! rounding (WGSL's division and square root need not be correctly
//! rounded, and drivers may contract a multiply-add).
//!
//! Gated steps (see [`crate::Gate`]): a skipped step returns its inputs bit
//! for bit, also when it works in place on the previous step's buffer, and
//! an applied one equals the ungated step, with the coefficients of the
//! candidate the device's control picks (a wrong pick shows with bias
//! correction, whose coefficients follow the step count).
//!
//! A gradient that is a pending widening of a half-precision one (read in
//! half precision by the kernel) gives the step of its float32 values bit
//! for bit.
//!
//! Gradients: an optimizer step is not differentiated; differentiating
//! through one is refused, naming the primitive.

use mlx_array::conformance::*;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::group_spec::{bits, buffer};
use super::{
    AdamCoefficients, FusedAdam, FusedAdamMoments, FusedAdamParameter, adam_step, adam_step_apart,
    applies,
};
use crate::{AdamW, Gate, Optimizer, StepContext};

/// Every fused Adam primitive's specification.
pub(crate) fn specs() -> Vec<Spec> {
    vec![
        Spec::new::<FusedAdam>(
            "fused_adam",
            |cx: &Ctx| step_values(cx, false),
            || refused(|c, a| Ok(adam_step(c, None, &a[0], &a[1], &a[2], &a[3])?.0)),
        ),
        Spec::new::<FusedAdamMoments>(
            "fused_adam_moments",
            |cx: &Ctx| step_values(cx, true),
            || refused(|c, a| Ok(adam_step_apart(c, &a[0], &a[1], &a[2], &a[3])?.1)),
        ),
        Spec::new::<FusedAdamParameter>(
            "fused_adam_parameter",
            |cx: &Ctx| step_values(cx, true),
            || refused(|c, a| Ok(adam_step_apart(c, &a[0], &a[1], &a[2], &a[3])?.0)),
        ),
        super::group_spec::spec(),
    ]
}

/// A gradient case that must be refused: `f` of a step's coefficients and
/// `[p, g, m, v]`, differentiated with respect to `p` and `g`.
fn refused(
    f: impl Fn(AdamCoefficients, &[Array]) -> mlx_array::Result<Array> + 'static,
) -> GradCase {
    let c = AdamCoefficients {
        decay: Some(0.999),
        b1: 0.9,
        one_minus_b1: 0.1,
        b2: 0.999,
        one_minus_b2: 0.001,
        numerator: 0.01,
        denominator: Some(0.5),
        eps: 1e-8,
    };
    let inputs = vec![
        uniform(21, &[2, 3], -1.0, 1.0),
        uniform(22, &[2, 3], -1.0, 1.0),
        uniform(23, &[2, 3], -1.0, 1.0),
        uniform(24, &[2, 3], 0.0, 1.0),
    ];
    GradCase::new(inputs, &[0, 1], move |a| f(c, a)).refused()
}

// ---------------------------------------------------------------- one step

/// The hyper-parameters of a step.
#[derive(Clone, Debug)]
struct Hyper {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    bias_correction: bool,
    /// The step count including this update.
    step: u64,
}

impl Hyper {
    fn strategy() -> impl Strategy<Value = Hyper> {
        (
            1e-3f64..0.2,
            prop::sample::select(vec![(0.9, 0.999), (0.5, 0.9), (0.0, 0.0)]),
            prop::sample::select(vec![1e-8, 1e-3]),
            prop::sample::select(vec![0.0, 0.01, 0.3]),
            any::<bool>(),
            1u64..20,
        )
            .prop_map(
                |(lr, betas, eps, weight_decay, bias_correction, step)| Hyper {
                    lr,
                    betas,
                    eps,
                    weight_decay,
                    bias_correction,
                    step,
                },
            )
    }

    /// The optimizer; AdamW with weight decay 0 is Adam.
    fn optimizer(&self, fused: bool) -> AdamW {
        AdamW::new(self.lr)
            .betas(self.betas.0, self.betas.1)
            .eps(self.eps)
            .weight_decay(self.weight_decay)
            .bias_correction(self.bias_correction)
            .fused(fused)
    }

    /// `(p', m', v')` of one step, in f64 from the exact hyper-parameters:
    ///
    /// ```text
    /// m' = b1 m + (1 - b1) g            v' = b2 v + (1 - b2) g^2
    /// p' = p (1 - lr wd) - lr m' / (sqrt(v') + eps)
    /// p' = p (1 - lr wd) - lr / (1 - b1^t) m' / (sqrt(v') / sqrt(1 - b2^t) + eps)   (bias correction)
    /// ```
    fn reference(&self, [p, g, m, v]: [&Nd; 4]) -> [Nd; 3] {
        let (b1, b2) = self.betas;
        let t = self.step as i32;
        let m2 = zip(m, g, |m, g| b1 * m + (1.0 - b1) * g);
        let v2 = zip(v, g, |v, g| b2 * v + (1.0 - b2) * g * g);
        let (num, den) = if self.bias_correction {
            (self.lr / (1.0 - b1.powi(t)), (1.0 - b2.powi(t)).sqrt())
        } else {
            (self.lr, 1.0)
        };
        let decay = 1.0 - self.lr * self.weight_decay;
        let update = zip(&m2, &v2, |m, v| num * m / (v.sqrt() / den + self.eps));
        let p2 = zip(p, &update, |p, u| p * decay - u);
        [p2, m2, v2]
    }
}

/// One value case: a shape, each input's layout, hyper-parameters, a seed.
#[derive(Clone, Debug)]
struct Case {
    shape: Vec<usize>,
    layouts: [Layout; 4],
    hyper: Hyper,
    seed: u64,
}

impl Case {
    /// `[p, g, m, v]` for step `k` (0 or 1): `v` is not negative.
    fn values(&self, k: u64) -> [Nd; 4] {
        let s = self.seed.wrapping_mul(4).wrapping_add(8 * k);
        let f = |i: u64, lo: f64, hi: f64| fill(&self.shape, Dtype::F32, lo, hi, s + i);
        [
            f(0, -1.0, 1.0),
            f(1, -1.0, 1.0),
            f(2, -1.0, 1.0),
            f(3, 0.0, 2.0),
        ]
    }
}

/// The cases: edge shapes with MLX's defaults (with and without bias
/// correction), then the runner's draws.
fn draw_cases(cx: &Ctx) -> Vec<Case> {
    let default = Hyper {
        lr: 1e-2,
        betas: (0.9, 0.999),
        eps: 1e-8,
        weight_decay: 0.01,
        bias_correction: false,
        step: 1,
    };
    let fixed = [
        vec![],
        vec![0],
        vec![1],
        vec![3, 0],
        vec![1, 1],
        vec![2, 1, 3],
    ];
    let mut out: Vec<Case> = fixed
        .into_iter()
        .enumerate()
        .map(|(i, shape)| Case {
            shape,
            layouts: [
                LAYOUTS[i % 4],
                LAYOUTS[(i + 1) % 4],
                LAYOUTS[(i + 2) % 4],
                LAYOUTS[(i + 3) % 4],
            ],
            hyper: Hyper {
                bias_correction: i % 2 == 1,
                step: 1 + i as u64,
                ..default.clone()
            },
            seed: i as u64,
        })
        .collect();
    let mut runner = cx.runner();
    let strategy = (
        shape(3),
        prop::array::uniform4(layout()),
        Hyper::strategy(),
        any::<u64>(),
    );
    for _ in 0..runner.config().cases {
        let (shape, layouts, hyper, seed) =
            strategy.new_tree(&mut runner).expect("a case").current();
        out.push(Case {
            shape,
            layouts,
            hyper,
            seed,
        });
    }
    out
}

/// One step of `hyper`'s optimizer (fused or op by op) on `[p, g, m, v]`,
/// built on the default device, not evaluated: `[p', m', v']`.
fn build(hyper: &Hyper, fused: bool, apart: bool, [p, g, m, v]: [&Array; 4]) -> [Array; 3] {
    let ctx = StepContext {
        learning_rate: hyper.lr,
        step: hyper.step,
        parameter_apart: apart,
    };
    let slots = [m.clone(), v.clone()];
    let (p2, slots) = hyper
        .optimizer(fused)
        .apply_single(g, p, &slots, &ctx)
        .unwrap_or_else(|e| panic!("{hyper:?}: {e}"));
    let [m2, v2]: [Array; 2] = slots.try_into().expect("two slots");
    [p2, m2, v2]
}

/// [`build`] on `device`, evaluated.
fn step(
    device: Device,
    hyper: &Hyper,
    fused: bool,
    apart: bool,
    inputs: [&Array; 4],
) -> [Array; 3] {
    let out = with_device(device, || build(hyper, fused, apart, inputs));
    mlx_array::eval(&out[..]).unwrap_or_else(|e| panic!("{hyper:?}: {e}"));
    out
}

const NAMES: [&str; 3] = ["p'", "m'", "v'"];

/// Asserts `got` (`[p', m', v']`, computed on the device under test)
/// against the f64 reference `want`, and against `other`: on the CPU the
/// op-by-op graph, bit for bit; on the GPU the CPU's fused step, within
/// float32 rounding.
fn check_step(cx: &Ctx, got: &[Array; 3], want: &[Nd; 3], other: &[Array; 3], what: &str) {
    for k in 0..3 {
        let what = format!("{what}: {}", NAMES[k]);
        cx.check(&got[k], &want[k], Dtype::F32, tol(Dtype::F32), &what);
        match cx.device() {
            Device::Cpu => assert_eq!(
                bits(&got[k]),
                bits(&other[k]),
                "{what}: must equal the op-by-op graph bit for bit"
            ),
            Device::Gpu => {
                let cpu = Nd::new(got[k].shape(), values(&other[k]));
                assert_close(&got[k], &cpu, Dtype::F32, tol(Dtype::F32), &what);
            }
        }
    }
}

/// Two steps, fused (with the parameter `apart` from its moments or not)
/// and op by op, checked as the module says.
fn step_values(cx: &Ctx, apart: bool) {
    let fused_for = |dtype: Dtype, device: Device| {
        let x = make(
            &fill(&[2], Dtype::F32, -1.0, 1.0, 1),
            Dtype::F32,
            Layout::Dense,
        );
        let y = x.astype(dtype).expect("astype").to_device(device);
        applies(&[&x, &x, &y, &x])
    };
    assert!(
        fused_for(Dtype::F32, Device::Cpu),
        "float32 on the CPU is fused"
    );
    assert!(
        fused_for(Dtype::F32, Device::Gpu),
        "float32 on the GPU is fused"
    );
    assert!(
        !fused_for(Dtype::BF16, Device::Cpu),
        "only float32 is fused"
    );

    for case in draw_cases(cx) {
        let what = format!("{case:?}, parameter apart {apart}");
        let h = &case.hyper;
        let nd = case.values(0);
        let inputs: Vec<Array> = (0..4)
            .map(|i| make(&nd[i], Dtype::F32, case.layouts[i]))
            .collect();
        let ins = [&inputs[0], &inputs[1], &inputs[2], &inputs[3]];
        let want = h.reference([&nd[0], &nd[1], &nd[2], &nd[3]]);
        // Compared on the CPU with the op-by-op graph, on the GPU with the
        // CPU's fused step.
        let other = cx.device() == Device::Gpu;
        let slow = step(Device::Cpu, h, other, apart, ins);
        let fast = step(cx.device(), h, true, apart, ins);
        check_step(cx, &fast, &want, &slow, &format!("{what}, step 1"));
        for (k, x) in inputs.iter().enumerate() {
            assert_eq!(
                values(x),
                nd[k].v,
                "{what}: input {k} must be left alone (the caller keeps it)"
            );
        }

        // Step 2 on step 1's outputs, with no other handle on them.
        let g2 = make(&case.values(1)[1], Dtype::F32, Layout::Dense);
        let want2 = {
            let [p1, m1, v1] = &want;
            let g = &case.values(1)[1];
            h.reference([p1, g, m1, v1])
        };
        let slow2 = step(
            Device::Cpu,
            h,
            other,
            apart,
            [&slow[0], &g2, &slow[1], &slow[2]],
        );
        let moments = buffer(&fast[1]);
        assert_eq!(
            moments,
            buffer(&fast[2]),
            "{what}: m' and v' share a buffer"
        );
        if apart {
            assert_ne!(
                buffer(&fast[0]),
                moments,
                "{what}: p' has a buffer of its own"
            );
        } else {
            assert_eq!(
                buffer(&fast[0]),
                moments,
                "{what}: p', m' and v' share a buffer"
            );
        }
        gated_values(cx, &case, apart, ins, &want, &slow, &g2, &what);
        widened_gradient(cx, &case, apart, ins, &what);
        let [p1, m1, v1] = fast;
        let fast2 = cx.on(|| build(h, true, apart, [&p1, &g2, &m1, &v1]));
        // The graph built, only it still sees step 1's outputs.
        drop((p1, m1, v1));
        mlx_array::eval(&fast2[..]).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_step(cx, &fast2, &want2, &slow2, &format!("{what}, step 2"));
        if size(&case.shape) > 0 {
            assert_eq!(
                buffer(&fast2[1]),
                moments,
                "{what}: the second step must update the moments in their buffer"
            );
        }
    }
}

/// A gradient widened from half precision (a pending cast, read by the
/// kernel in half precision) steps exactly as the same values in float32.
fn widened_gradient(cx: &Ctx, case: &Case, apart: bool, ins: [&Array; 4], what: &str) {
    let half = if case.seed.is_multiple_of(2) {
        Dtype::F16
    } else {
        Dtype::BF16
    };
    let g = make(&case.values(0)[1], half, case.layouts[1]);
    let plain = g.astype(Dtype::F32).expect("widened");
    plain.eval().expect("evaluated");
    let [p, _, m, v] = ins;
    let (widened, want) = cx.on(|| {
        let w = g.astype(Dtype::F32).expect("widened");
        (
            build(&case.hyper, true, apart, [p, &w, m, v]),
            build(&case.hyper, true, apart, [p, &plain, m, v]),
        )
    });
    mlx_array::eval((&widened[..], &want[..])).unwrap_or_else(|e| panic!("{what}: {e}"));
    for k in 0..3 {
        assert_eq!(
            bits(&widened[k]),
            bits(&want[k]),
            "{what}: {} from a gradient widened from {half}",
            NAMES[k]
        );
    }
}

// ---------------------------------------------------------------- gated steps

/// `hyper`'s optimizer at the state before its step, with `pending` gated
/// steps not settled, and the gate of its next step (`apply` 1 or 0),
/// built on the default device: the control then picks the candidate of
/// step count `hyper.step` when every pending step applied.
fn gated_optimizer(hyper: &Hyper, apart: bool, apply: bool, pending: usize) -> (AdamW, Gate) {
    let mut opt = hyper.optimizer(true);
    let known = hyper.step - 1 - pending as u64;
    opt.state_mut().set_step(known);
    let one = || Array::full(&[], 1.0, Dtype::F32);
    for _ in 0..pending {
        opt.state_mut().push_pending(one());
    }
    let flag = Array::full(&[], f64::from(u8::from(apply)), Dtype::F32);
    let gate = Gate::next(&opt, &flag, apart).expect("a gate");
    (opt, gate)
}

/// One gated step of `hyper` on `[p, g, m, v]` on the default device, not
/// evaluated.
fn build_gated(
    hyper: &Hyper,
    apart: bool,
    apply: bool,
    pending: usize,
    [p, g, m, v]: [&Array; 4],
) -> [Array; 3] {
    let (opt, gate) = gated_optimizer(hyper, apart, apply, pending);
    let (p2, slots) = opt
        .apply_single_gated(g, p, &[m.clone(), v.clone()], &gate)
        .unwrap_or_else(|e| panic!("{hyper:?}: {e}"));
    let [m2, v2]: [Array; 2] = slots.try_into().expect("two slots");
    [p2, m2, v2]
}

/// The gated cases of one value case: skipped steps keep their inputs (in
/// a new buffer, and in place on step 1's outputs), applied ones equal the
/// ungated step `slow` (checked as [`check_step`] does), with 0 and 1
/// pending steps before them.
#[allow(clippy::too_many_arguments)]
fn gated_values(
    cx: &Ctx,
    case: &Case,
    apart: bool,
    ins: [&Array; 4],
    want: &[Nd; 3],
    slow: &[Array; 3],
    g2: &Array,
    what: &str,
) {
    let h = &case.hyper;
    for pending in 0..h.step.min(3) as usize {
        let applied = cx.on(|| build_gated(h, apart, true, pending, ins));
        mlx_array::eval(&applied[..]).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_step(
            cx,
            &applied,
            want,
            slow,
            &format!("{what}, gated, {pending} pending"),
        );
        let kept = cx.on(|| build_gated(h, apart, false, pending, ins));
        mlx_array::eval(&kept[..]).unwrap_or_else(|e| panic!("{what}: {e}"));
        for (k, i) in [0, 2, 3].into_iter().enumerate() {
            assert_eq!(
                bits(&kept[k]),
                bits(ins[i]),
                "{what}, skipped, {pending} pending: {} must be the input",
                NAMES[k]
            );
        }
    }
    // In place: a skipped step on step 1's outputs, with no other handle on
    // them, leaves them in their buffer as they were.
    let [p1, m1, v1] = step(cx.device(), h, true, apart, ins);
    let before = [bits(&p1), bits(&m1), bits(&v1)];
    let moments = buffer(&m1);
    let kept = cx.on(|| build_gated(h, apart, false, 0, [&p1, g2, &m1, &v1]));
    drop((p1, m1, v1));
    mlx_array::eval(&kept[..]).unwrap_or_else(|e| panic!("{what}: {e}"));
    for k in 0..3 {
        assert_eq!(
            bits(&kept[k]),
            before[k],
            "{what}, skipped in place: {}",
            NAMES[k]
        );
    }
    if size(&case.shape) > 0 {
        assert_eq!(
            buffer(&kept[1]),
            moments,
            "{what}: a skipped step keeps the moments' buffer"
        );
    }
}
