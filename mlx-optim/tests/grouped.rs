//! Adam(W)'s grouped steps on the GPU ([`Optimizer::apply_many`]): from
//! the second step on, when every parameter's state is the rows of its
//! previous step's buffer, the fused kernel steps several parameters per
//! node and per dispatch.
//!
//! The independent expectation is each parameter stepped alone
//! ([`Optimizer::apply_single`]) from fresh arrays holding the same values.
//! Against it, with weight decay and bias correction, ungated, gated and
//! applied, and gated and skipped: the grouped step gives the same
//! parameters and moments (within float32 rounding on the GPU, bit for
//! bit on the CPU, where nothing is grouped), writes them in place, and
//! on the GPU runs fewer kernels than there are parameters. The first
//! step, whose state is new, steps each parameter alone.

use mlx_array::backend::gpu;
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype, Tree, eval};
use mlx_optim::{AdamW, Optimizer, StepContext};

/// 24 parameters of 15 elements, a larger one and a scalar.
fn shapes() -> Vec<(String, Vec<usize>)> {
    let mut s: Vec<(String, Vec<usize>)> = (0..24)
        .map(|k| (format!("layers.{k:02}.w"), vec![3, 5]))
        .collect();
    s.push(("embedding".into(), vec![40, 9]));
    s.push(("scale".into(), vec![]));
    s
}

/// A tree of `shapes` with values from `seed`.
fn tree(seed: u64) -> Tree {
    Tree::unflatten(shapes().into_iter().enumerate().map(|(k, (path, shape))| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| (((seed * 31 + k as u64 * 7 + i as u64) as f32) * 0.37).sin())
            .collect();
        (path, Array::from_slice(&v, &shape).unwrap())
    }))
    .unwrap()
}

fn optimizer() -> AdamW {
    AdamW::new(1e-2).weight_decay(0.1).bias_correction(true)
}

/// `a`'s values as a fresh array on the current device.
fn fresh(a: &Array) -> Array {
    a.eval().unwrap();
    let v = a.to_vec::<f32>().unwrap();
    Array::from_slice(&v, a.shape())
        .unwrap()
        .to_device(mlx_array::device::default_device())
}

/// The primitive of the node that computes `a` (through a multi-output
/// node's `output` view).
fn producer(a: &Array) -> Option<&'static str> {
    match a.primitive_name() {
        Some("output") => a.pending_inputs().first()?.primitive_name(),
        name => name,
    }
}

fn bits(a: &Array) -> Vec<u32> {
    a.to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect()
}

fn storage_at(a: &Array) -> usize {
    std::sync::Arc::as_ptr(a.data().unwrap().storage()) as *const u8 as usize
}

/// Asserts `got` against `want` (bit for bit on the CPU, within float32
/// rounding on the GPU).
fn assert_same(device: Device, got: &Array, want: &Array, what: &str) {
    let (g, w) = (got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    assert_eq!(g.len(), w.len(), "{what}: length");
    for (i, (a, b)) in g.iter().zip(&w).enumerate() {
        match device {
            Device::Cpu => assert_eq!(a.to_bits(), b.to_bits(), "{what}[{i}]: {a} against {b}"),
            Device::Gpu => assert!(
                (a - b).abs() <= 4.0 * f32::EPSILON * b.abs().max(1e-6),
                "{what}[{i}]: {a} against {b}"
            ),
        }
    }
}

/// What stepping each parameter alone from fresh copies of `params`,
/// `grads` and `opt`'s state gives: `(path, p', m', v')`; `gate`: the
/// gated step's flag and pending count as `opt` has them.
fn alone(
    opt: &AdamW,
    params: &Tree,
    grads: &Tree,
    apply: Option<f64>,
) -> Vec<(String, [Array; 3])> {
    let step = opt.step();
    let ctx = StepContext {
        learning_rate: opt.next_learning_rate(),
        step: step + 1,
        parameter_apart: false,
    };
    grads
        .flatten()
        .into_iter()
        .map(|(path, g)| {
            let p = fresh(params.get_array(&path).unwrap());
            let m = fresh(opt.state().get(&path, "m").unwrap());
            let v = fresh(opt.state().get(&path, "v").unwrap());
            let (p2, s) = match apply {
                Some(0.0) => (p, vec![m, v]),
                _ => opt.apply_single(&fresh(&g), &p, &[m, v], &ctx).unwrap(),
            };
            let out = [p2, s[0].clone(), s[1].clone()];
            eval(&out[..]).unwrap();
            (path, out)
        })
        .collect()
}

fn grouped_steps_equal_single_steps(device: Device) {
    with_device(device, || {
        let what = format!("{device:?}");
        let mut params = tree(1);
        let mut opt = optimizer();

        // Step 1: new state, each parameter alone.
        let new = opt.apply_gradients(&tree(2), &params).unwrap();
        for (path, p) in new.flatten() {
            assert_eq!(producer(&p), Some("fused_adam"), "{what}: {path} at step 1");
        }
        params = new;
        eval((&params, opt.state())).unwrap();

        for (k, apply) in [None, Some(1.0), Some(0.0)].into_iter().enumerate() {
            let what = format!("{what}, step {} (gate {apply:?})", k + 2);
            let grads = tree(3 + k as u64);
            eval(&grads).unwrap();
            let want = alone(&opt, &params, &grads, apply);
            let before = storage_at(params.get_array("layers.00.w").unwrap());
            let new = match apply {
                None => opt.apply_gradients(&grads, &params).unwrap(),
                Some(a) => {
                    let flag = Array::full(&[], a, Dtype::F32);
                    opt.apply_gradients_gated(&grads, &params, &flag).unwrap()
                }
            };
            let grouped = new
                .flatten()
                .iter()
                .filter(|(_, p)| producer(p) == Some("fused_adam_group"))
                .count();
            match device {
                Device::Cpu => assert_eq!(grouped, 0, "{what}: the CPU steps alone"),
                Device::Gpu => assert!(grouped >= 24, "{what}: {grouped} grouped"),
            }
            params = new;
            let dispatches = gpu::dispatch_count();
            eval((&params, opt.state())).unwrap();
            let kernels = gpu::dispatch_count() - dispatches;
            if apply.is_some() {
                opt.state_mut().settle(apply == Some(1.0)).unwrap();
            }
            if device == Device::Gpu {
                assert!(kernels < shapes().len() / 2, "{what}: {kernels} kernels");
            }
            assert_eq!(
                storage_at(params.get_array("layers.00.w").unwrap()),
                before,
                "{what}: in place"
            );
            for (path, [p, m, v]) in &want {
                assert_same(
                    device,
                    params.get_array(path).unwrap(),
                    p,
                    &format!("{what}: {path}"),
                );
                assert_same(
                    device,
                    opt.state().get(path, "m").unwrap(),
                    m,
                    &format!("{what}: {path}.m"),
                );
                assert_same(
                    device,
                    opt.state().get(path, "v").unwrap(),
                    v,
                    &format!("{what}: {path}.v"),
                );
            }
            if apply == Some(0.0) {
                for (path, [p, ..]) in &want {
                    assert_eq!(
                        bits(params.get_array(path).unwrap()),
                        bits(p),
                        "{what}: {path} kept"
                    );
                }
            }
        }
    });
}

#[test]
fn grouped_steps_on_the_gpu() {
    if !mlx_array::conformance::gpu_or_skip() {
        return;
    }
    grouped_steps_equal_single_steps(Device::Gpu);
}

#[test]
fn steps_on_the_cpu_are_not_grouped() {
    grouped_steps_equal_single_steps(Device::Cpu);
}
