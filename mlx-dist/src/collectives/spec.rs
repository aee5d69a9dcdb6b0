//! Conformance specifications of the collectives.
//!
//! Values: each collective runs in real worlds of 2 and 3 ranks (threads
//! over loopback TCP) and every rank's result is compared with an f64
//! reference computed from all the ranks' inputs, over every dtype the
//! device holds, empty, 1-long and 0-d shapes, dense, transposed, strided
//! and reversed inputs, and inputs the collective may overwrite (a buffer
//! only it sees) or must leave alone (one the caller keeps). Then a world of
//! one, where every collective gives back its input (send and recv refuse:
//! there is no peer). The same worlds check the vector-Jacobian products
//! across ranks against the analytic gradient of `Σ_r <c_r, out_r>`, which
//! finite differences on one rank cannot see (a perturbation on one rank
//! moves every rank's output).
//!
//! Devices: a collective runs on the communication stream, on the CPU
//! ([`Primitive::device`]). On the GPU the inputs are GPU arrays (views of
//! GPU buffers); the collective brings them to the CPU, and in a world of
//! more than one rank its result is a CPU array (the next op built on the
//! GPU copies it back). In a world of one there is no node: the input
//! itself comes back, on its own device. The values do not depend on where
//! the input lived: the GPU checks use the CPU's tolerances.
//!
//! Gradients (the harness's finite differences on one rank): through the
//! primitive's own node in a world of one (the public functions return
//! their input there and would never reach the VJP); all_max and all_min
//! refuse; send and recv pass no gradient, on rank 0 of a world of two.
//! sum_partials and sum_gradients, the collectives of model parallelism,
//! check values as all_sum and the identity, and their gradients across
//! ranks as the identity and the sum.

use std::sync::{Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use mlx_array::conformance::*;
use mlx_array::{ALL_DTYPES, Array, Device, Dtype, Primitive, SliceArg, value_and_grad};
use proptest::prelude::*;
use proptest::strategy::ValueTree;

use super::{AllGather, AllReduce, Recv, SumGradients, SumPartials, SumScatter};
use crate::config::Config;
use crate::local::run_local_with;
use crate::{Group, ReduceOp};

/// The world sizes the value checks run in, besides one.
const WORLDS: [usize; 2] = [2, 3];

/// Every collective's specification.
pub(crate) fn specs() -> Vec<Spec> {
    vec![
        reduction(ReduceOp::Sum),
        reduction(ReduceOp::Max),
        reduction(ReduceOp::Min),
        Spec::new::<AllGather>("all_gather", all_gather_values, || {
            GradCase::new(vec![uniform(11, &[2, 3], -2.0, 2.0)], &[0], |a| {
                let x = a[0].transpose(&[])?;
                let group = Group::single();
                Ok(node(AllGather { group }, &x, x.shape().to_vec()))
            })
        }),
        scatter(false),
        scatter(true),
        Spec::new::<SumPartials>("sum_partials", sum_partials_values, || {
            GradCase::new(vec![uniform(15, &[3, 2], -2.0, 2.0)], &[0], |a| {
                let x = a[0].transpose(&[])?;
                let group = Group::single();
                Ok(node(SumPartials { group }, &x, x.shape().to_vec()))
            })
        }),
        Spec::new::<SumGradients>("sum_gradients", sum_gradients_values, || {
            GradCase::new(vec![uniform(16, &[3, 2], -2.0, 2.0)], &[0], |a| {
                let x = a[0].transpose(&[])?;
                let group = Group::single();
                Ok(node(SumGradients { group }, &x, x.shape().to_vec()))
            })
        }),
        Spec::new::<super::Send>(
            "send",
            |cx: &Ctx| point_to_point_values(cx, Side::Send),
            || {
                let pair = Pair::new();
                GradCase::new(vec![uniform(13, &[2, 3], -2.0, 2.0)], &[0], move |a| {
                    super::send(&a[0], 1, &pair.group)
                })
                .zero()
            },
        ),
        Spec::new::<Recv>(
            "recv",
            |cx: &Ctx| point_to_point_values(cx, Side::Recv),
            || {
                // Recv has no inputs: a received array is a constant to
                // differentiation, and a function of it has no gradient
                // with respect to the local array it was shaped like.
                let pair = Pair::new();
                GradCase::new(vec![uniform(14, &[2, 3], -2.0, 2.0)], &[0], move |a| {
                    super::recv_like(&a[0], 1, &pair.group)
                })
                .zero()
            },
        ),
    ]
}

/// A collective's node on `x`, built directly (on a group of one the public
/// functions return `x` itself).
fn node(p: impl Primitive, x: &Array, shape: Vec<usize>) -> Array {
    Array::from_primitive(p, vec![x.clone()], shape, x.dtype())
}

// ---------------------------------------------------------------- worlds

/// Timeouts for a test: a rank stuck in a collective fails after a minute
/// (software Vulkan between collectives is slow), not ten.
fn quick(c: &mut Config) {
    c.collective_timeout = Duration::from_secs(60);
}

/// Runs `f` on every rank of a world of `n` (a group of one for `n == 1`)
/// with ops placed on the device under test; each rank's result in rank
/// order. Panics with the first rank's error.
fn in_world<T: Send>(cx: &Ctx, n: usize, f: impl Fn(&Group) -> Result<T, String> + Sync) -> Vec<T> {
    let device = cx.device();
    let out = run_local_with(n, quick, |g| cx.on(|| f(&g)))
        .unwrap_or_else(|e| panic!("a world of {n} on {device}: {e}"));
    out.into_iter()
        .enumerate()
        .map(|(r, x)| x.unwrap_or_else(|e| panic!("a world of {n} on {device}, rank {r}: {e}")))
        .collect()
}

/// Rank 0 of a world of two, for the gradient cases of send and recv; its
/// rank 1 (a thread) waits until the pair is dropped. The harness does not
/// evaluate the forward pass of a zero-gradient case; were it to, a send
/// would wait in rank 1's socket, and a recv would fail after the world's
/// collective timeout naming rank 1, not hang.
struct Pair {
    group: Group,
    stop: Option<mpsc::Sender<()>>,
    world: Option<JoinHandle<()>>,
}

impl Pair {
    fn new() -> Pair {
        let (give, take) = mpsc::channel::<Group>();
        let (stop, stopped) = mpsc::channel::<()>();
        let (give, stopped) = (Mutex::new(give), Mutex::new(stopped));
        let world = std::thread::spawn(move || {
            run_local_with(2, quick, |g| {
                if g.rank() == 0 {
                    let _ = give.lock().expect("rank 0's channel").send(g);
                } else {
                    let _ = stopped.lock().expect("rank 1's channel").recv();
                }
            })
            .unwrap_or_else(|e| panic!("the world of two of a gradient case: {e}"));
        });
        let group = take
            .recv()
            .expect("the world of two of a gradient case started");
        Pair {
            group,
            stop: Some(stop),
            world: Some(world),
        }
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(world) = self.world.take() {
            let _ = world.join();
        }
    }
}

// ---------------------------------------------------------------- cases

/// One input case of a value check.
#[derive(Clone, Debug)]
struct Case {
    dtype: Dtype,
    shape: Vec<usize>,
    layout: Layout,
    seed: u64,
    /// The input is a buffer only the collective sees (which it may
    /// overwrite), not one the caller keeps (which it must leave alone).
    owned: bool,
}

/// The cases of one world: for each dtype of `dtypes` the device holds, the
/// shapes `fixed` (layouts and ownership in turn), then the runner's draws
/// of a shape from `shapes`, a layout, a seed and an ownership.
fn draw_cases(
    cx: &Ctx,
    dtypes: &[Dtype],
    shapes: impl Strategy<Value = Vec<usize>>,
    fixed: &[Vec<usize>],
) -> Vec<Case> {
    let mut runner = cx.runner();
    let draws = runner.config().cases;
    let strategy = (shapes, layout(), any::<u64>(), any::<bool>());
    let mut out = vec![];
    for dtype in cx.dtypes(dtypes) {
        for (i, shape) in fixed.iter().enumerate() {
            out.push(Case {
                dtype,
                shape: shape.clone(),
                layout: LAYOUTS[i % LAYOUTS.len()],
                seed: i as u64,
                owned: i % 2 == 1,
            });
        }
        for _ in 0..draws {
            let (shape, layout, seed, owned) =
                strategy.new_tree(&mut runner).expect("a case").current();
            out.push(Case {
                dtype,
                shape,
                layout,
                seed,
                owned,
            });
        }
    }
    out
}

/// Where the inputs of a dtype lie: small floats (so that sums round
/// little), integers large enough that 32-bit sums wrap, booleans of both
/// values.
fn range(dtype: Dtype) -> (f64, f64) {
    match dtype {
        Dtype::Bool => (-1.0, 1.0),
        d if d.is_float() => (-1.0, 1.0),
        _ => (-2e9, 2e9),
    }
}

/// The values rank `r` contributes to `case`.
fn rank_values(case: &Case, r: usize) -> Nd {
    let (lo, hi) = range(case.dtype);
    let seed = case.seed ^ (r as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    fill(&case.shape, case.dtype, lo, hi, seed)
}

/// `nd` as an array of `dtype` on the device under test, laid out as
/// `layout` (on the GPU, a view of a GPU buffer).
fn placed(cx: &Ctx, nd: &Nd, dtype: Dtype, layout: Layout) -> mlx_array::Result<Array> {
    if cx.device() == Device::Cpu {
        return Ok(make(nd, dtype, layout));
    }
    let up = |nd: &Nd| make(nd, dtype, Layout::Dense).to_device(Device::Gpu);
    let n = nd.shape.len();
    cx.on(|| {
        let a = match layout {
            _ if n == 0 => up(nd),
            Layout::Dense => up(nd),
            Layout::Transposed => {
                let rev = |i: &[usize]| i.iter().rev().copied().collect::<Vec<_>>();
                let t = Nd::from_fn(&rev(&nd.shape), |i| nd.at(&rev(i)));
                up(&t).transpose(&[])?
            }
            Layout::Strided => {
                let mut big = nd.shape.clone();
                big[n - 1] *= 2;
                let b = Nd::from_fn(&big, |i| {
                    let mut j = i.to_vec();
                    j[n - 1] /= 2;
                    if i[n - 1] % 2 == 0 { nd.at(&j) } else { 77.0 }
                });
                let mut args = vec![SliceArg::FULL; n];
                args[n - 1] = SliceArg::FULL.step(2);
                up(&b).slice(&args)?
            }
            Layout::Reversed => {
                let r = Nd::from_fn(&nd.shape, |i| {
                    let mut j = i.to_vec();
                    j[0] = nd.shape[0] - 1 - i[0];
                    nd.at(&j)
                });
                let mut args = vec![SliceArg::FULL; n];
                args[0] = SliceArg::FULL.step(-1);
                up(&r).slice(&args)?
            }
        };
        a.eval()?;
        Ok(a)
    })
}

/// Rank `r`'s input of `case` (values `nd`) given to `f` and the result
/// evaluated; a kept input is checked to be unchanged afterwards.
fn run_case(
    cx: &Ctx,
    case: &Case,
    nd: &Nd,
    f: impl FnOnce(&Array) -> mlx_array::Result<Array>,
) -> Result<Array, String> {
    let err = |e: mlx_array::Error| format!("{case:?}: {e}");
    let x = placed(cx, nd, case.dtype, case.layout).map_err(err)?;
    if x.device() != cx.device() {
        return Err(format!("{case:?}: the input is on {}", x.device()));
    }
    let (out, kept) = if case.owned {
        // A fresh buffer that nothing but the collective will see.
        let y = x.contiguous().map_err(err)?;
        drop(x);
        (f(&y).map_err(err)?, None)
    } else {
        (f(&x).map_err(err)?, Some(x))
    };
    out.eval().map_err(err)?;
    if let Some(x) = kept
        && values(&x) != nd.v
    {
        return Err(format!(
            "{case:?}: the input the caller keeps was overwritten"
        ));
    }
    Ok(out)
}

/// `out`, which in a group of one must be the input `x` itself (a 0-d
/// input to all_gather excepted: it comes back as `[1]`).
fn itself(
    op: &'static str,
    n: usize,
    x: &Array,
    out: mlx_array::Result<Array>,
) -> mlx_array::Result<Array> {
    let out = out?;
    if n == 1 && x.ndim() > 0 && out.id() != x.id() {
        return Err(mlx_array::Error::Invalid {
            op,
            message: "a group of one must give back the input itself".into(),
        });
    }
    Ok(out)
}

/// Asserts that `got` lies on `device` and matches `want` within `rel`.
fn check_at(got: &Array, want: &Nd, dtype: Dtype, rel: f64, device: Device, what: &str) {
    assert_eq!(got.device(), device, "{what}: placed on {}", got.device());
    assert_close(got, want, dtype, rel, what);
}

/// Where a collective's result lies in a world of `n`: the CPU, where it
/// ran, or for a world of one the input's own device.
fn result_device(cx: &Ctx, n: usize) -> Device {
    if n == 1 { cx.device() } else { Device::Cpu }
}

/// Shapes with empty, 1-long and no axes.
fn edge_shapes() -> Vec<Vec<usize>> {
    vec![
        vec![],
        vec![0],
        vec![1],
        vec![1, 1],
        vec![3, 0, 2],
        vec![2, 1, 3],
        vec![1, 5],
    ]
}

/// Concatenation along axis 0 of arrays of one shape (0-d counts as `[1]`).
fn concat0(parts: &[Nd]) -> Nd {
    let mut shape = parts[0].shape.clone();
    if shape.is_empty() {
        shape.push(1);
    }
    shape[0] *= parts.len();
    Nd::new(&shape, parts.iter().flat_map(|p| p.v.clone()).collect())
}

/// Block `r` of `size` equal blocks of `x` along axis 0.
fn block0(x: &Nd, r: usize, size: usize) -> Nd {
    let mut shape = x.shape.clone();
    shape[0] /= size;
    let len = x.v.len() / size;
    Nd::new(&shape, x.v[r * len..(r + 1) * len].to_vec())
}

/// The elementwise `op` over the ranks' values, as the dtype computes it:
/// integer sums wrap, float sums round, boolean sums and maxima are OR and
/// minima AND.
fn combine(op: ReduceOp, dtype: Dtype, parts: &[Nd]) -> Nd {
    let v = (0..parts[0].v.len())
        .map(|i| {
            let xs = parts.iter().map(|p| p.v[i]);
            if dtype == Dtype::Bool {
                let truth: Vec<bool> = xs.map(|x| x != 0.0).collect();
                return match op {
                    ReduceOp::Sum | ReduceOp::Max => truth.iter().any(|&t| t),
                    ReduceOp::Min => truth.iter().all(|&t| t),
                } as u8 as f64;
            }
            match op {
                ReduceOp::Sum => quantize(wrap(xs.sum(), dtype), dtype),
                ReduceOp::Max => xs.fold(f64::NEG_INFINITY, f64::max),
                ReduceOp::Min => xs.fold(f64::INFINITY, f64::min),
            }
        })
        .collect();
    Nd::new(&parts[0].shape, v)
}

/// The tolerance of a sum over `n` ranks in `dtype`: one rounding per
/// combining step for floats; integers exact.
fn sum_tol(dtype: Dtype, n: usize) -> f64 {
    tol(dtype) * (n - 1).max(1) as f64
}

// ---------------------------------------------------------------- gradients across ranks

/// The cotangent rank `r` applies to its output of `shape`.
fn cotangent(r: usize, shape: &[usize]) -> Nd {
    fill(shape, Dtype::F32, -1.0, 1.0, 1000 + r as u64)
}

/// In a world of `n`, each rank's gradient with respect to its float32
/// input of `shape` of `Σ_r <c_r, op(x_r)>` (value and gradient evaluated
/// together, so forward and backward collectives share the communication
/// stream); `Err` holds what differentiating reported.
fn rank_gradients(
    cx: &Ctx,
    n: usize,
    shape: &[usize],
    op: impl Fn(&Array, &Group) -> mlx_array::Result<Array> + Sync,
) -> Vec<Result<Array, String>> {
    in_world(cx, n, |g| {
        let nd = fill(shape, Dtype::F32, -1.0, 1.0, 500 + g.rank() as u64);
        let x = placed(cx, &nd, Dtype::F32, Layout::Transposed).map_err(|e| e.to_string())?;
        let out_shape = op(&x, g).map_err(|e| e.to_string())?.shape().to_vec();
        let c = make(&cotangent(g.rank(), &out_shape), Dtype::F32, Layout::Dense);
        let f = |a: &[Array]| op(&a[0], g)?.multiply(&c)?.sum_all();
        Ok(match value_and_grad(f, &[0])(&[x]) {
            Ok((loss, grads)) => {
                mlx_array::eval((&loss, &grads[0])).map_err(|e| e.to_string())?;
                Ok(grads[0].clone())
            }
            Err(e) => Err(e.to_string()),
        })
    })
}

/// Asserts each rank's gradient against `want(r)`, placed with its input.
fn expect_gradients(
    cx: &Ctx,
    name: &str,
    got: Vec<Result<Array, String>>,
    want: impl Fn(usize) -> Nd,
) {
    let n = got.len();
    for (r, g) in got.into_iter().enumerate() {
        let what = format!("{name} gradient in a world of {n}, rank {r}");
        let g = g.unwrap_or_else(|e| panic!("{what}: {e}"));
        check_at(
            &g,
            &want(r),
            Dtype::F32,
            tol(Dtype::F32) * n as f64,
            cx.device(),
            &what,
        );
    }
}

// ---------------------------------------------------------------- all_sum, all_max, all_min

fn reduction(op: ReduceOp) -> Spec {
    let name = reduce_name(op);
    Spec::new::<AllReduce>(
        name,
        move |cx: &Ctx| reduction_values(cx, op),
        move || {
            let case = GradCase::new(vec![uniform(12, &[3, 2], -2.0, 2.0)], &[0], move |a| {
                let x = a[0].transpose(&[])?;
                let group = Group::single();
                Ok(node(AllReduce { op, group }, &x, x.shape().to_vec()))
            });
            if op == ReduceOp::Sum {
                case
            } else {
                case.refused()
            }
        },
    )
}

fn reduce_name(op: ReduceOp) -> &'static str {
    AllReduce {
        op,
        group: Group::single(),
    }
    .name()
}

fn reduce(op: ReduceOp, x: &Array, g: &Group) -> mlx_array::Result<Array> {
    match op {
        ReduceOp::Sum => super::all_sum(x, g),
        ReduceOp::Max => super::all_max(x, g),
        ReduceOp::Min => super::all_min(x, g),
    }
}

fn reduction_values(cx: &Ctx, op: ReduceOp) {
    let name = reduce_name(op);
    reduced_values(cx, name, op, |x, g| reduce(op, x, g));
    for n in WORLDS {
        let grads = rank_gradients(cx, n, &[2, 3], |x, g| reduce(op, x, g));
        if op == ReduceOp::Sum {
            // d/dx_r Σ_s <c_s, Σ_t x_t> = Σ_s c_s.
            let cs: Vec<Nd> = (0..n).map(|s| cotangent(s, &[2, 3])).collect();
            expect_gradients(cx, name, grads, |_| combine(ReduceOp::Sum, Dtype::F32, &cs));
        } else {
            for (r, g) in grads.into_iter().enumerate() {
                let e = g.err().unwrap_or_else(|| {
                    panic!("{name} in a world of {n}, rank {r}: differentiating must fail")
                });
                assert!(
                    e.contains(name),
                    "rank {r}: the error must name {name}: {e}"
                );
            }
        }
    }
}

/// The values of `f`, the reduction `op` named `name`, in worlds of 1, 2
/// and 3: every rank gets the reduction of all the ranks' inputs, with the
/// same bits.
fn reduced_values(
    cx: &Ctx,
    name: &'static str,
    op: ReduceOp,
    f: impl Fn(&Array, &Group) -> mlx_array::Result<Array> + Sync,
) {
    for n in [1, 2, 3] {
        let cases = draw_cases(cx, &ALL_DTYPES, shape(3), &edge_shapes());
        let got = in_world(cx, n, |g| {
            cases
                .iter()
                .map(|c| {
                    let nd = rank_values(c, g.rank());
                    run_case(cx, c, &nd, |x| itself(name, n, x, f(x, g)))
                })
                .collect::<Result<Vec<_>, _>>()
        });
        for (i, c) in cases.iter().enumerate() {
            let parts: Vec<Nd> = (0..n).map(|r| rank_values(c, r)).collect();
            let want = combine(op, c.dtype, &parts);
            let rel = if op == ReduceOp::Sum {
                sum_tol(c.dtype, n)
            } else {
                0.0
            };
            for r in 0..n {
                let what = format!("{name} in a world of {n}, rank {r}, {c:?}");
                check_at(&got[r][i], &want, c.dtype, rel, result_device(cx, n), &what);
                assert_eq!(
                    values(&got[r][i]),
                    values(&got[0][i]),
                    "{what}: every rank must get the same bits"
                );
            }
        }
    }
}

// ---------------------------------------------------------------- sum_partials, sum_gradients

/// sum_partials sums as all_sum does; its gradient is each rank's own
/// cotangent (every rank computes the same loss from the one sum).
fn sum_partials_values(cx: &Ctx) {
    reduced_values(cx, "sum_partials", ReduceOp::Sum, super::sum_partials);
    for n in WORLDS {
        let grads = rank_gradients(cx, n, &[2, 3], super::sum_partials);
        expect_gradients(cx, "sum_partials", grads, |r| cotangent(r, &[2, 3]));
    }
}

/// sum_gradients gives each rank its own input, where it lies; its
/// gradient is the sum of the ranks' cotangents.
fn sum_gradients_values(cx: &Ctx) {
    for n in [1, 2, 3] {
        let cases = draw_cases(cx, &ALL_DTYPES, shape(3), &edge_shapes());
        let got = in_world(cx, n, |g| {
            cases
                .iter()
                .map(|c| {
                    let nd = rank_values(c, g.rank());
                    run_case(cx, c, &nd, |x| {
                        itself("sum_gradients", n, x, super::sum_gradients(x, g))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        });
        for (i, c) in cases.iter().enumerate() {
            for (r, got) in got.iter().enumerate() {
                let what = format!("sum_gradients in a world of {n}, rank {r}, {c:?}");
                check_at(
                    &got[i],
                    &rank_values(c, r),
                    c.dtype,
                    0.0,
                    cx.device(),
                    &what,
                );
            }
        }
    }
    for n in WORLDS {
        let grads = rank_gradients(cx, n, &[2, 3], super::sum_gradients);
        let cs: Vec<Nd> = (0..n).map(|s| cotangent(s, &[2, 3])).collect();
        expect_gradients(cx, "sum_gradients", grads, |_| {
            combine(ReduceOp::Sum, Dtype::F32, &cs)
        });
    }
}

// ---------------------------------------------------------------- all_gather

fn all_gather_values(cx: &Ctx) {
    for n in [1, 2, 3] {
        let cases = draw_cases(cx, &ALL_DTYPES, shape(3), &edge_shapes());
        let got = in_world(cx, n, |g| {
            cases
                .iter()
                .map(|c| {
                    let nd = rank_values(c, g.rank());
                    run_case(cx, c, &nd, |x| {
                        itself("all_gather", n, x, super::all_gather(x, g))
                    })
                })
                .collect::<Result<Vec<_>, _>>()
        });
        for (i, c) in cases.iter().enumerate() {
            let parts: Vec<Nd> = (0..n).map(|r| rank_values(c, r)).collect();
            let want = concat0(&parts);
            for (r, got) in got.iter().enumerate() {
                let what = format!("all_gather in a world of {n}, rank {r}, {c:?}");
                check_at(&got[i], &want, c.dtype, 0.0, result_device(cx, n), &what);
            }
        }
    }
    for n in WORLDS {
        // d/dx_r Σ_s <c_s, concat_t x_t> = Σ_s (block r of c_s).
        let grads = rank_gradients(cx, n, &[2, 3], super::all_gather);
        let cs: Vec<Nd> = (0..n).map(|s| cotangent(s, &[2 * n, 3])).collect();
        let sum = combine(ReduceOp::Sum, Dtype::F32, &cs);
        expect_gradients(cx, "all_gather", grads, |r| block0(&sum, r, n));
    }
}

// ---------------------------------------------------------------- sum_scatter, mean_scatter

fn scatter(mean: bool) -> Spec {
    let name = if mean { "mean_scatter" } else { "sum_scatter" };
    Spec::new::<SumScatter>(
        name,
        move |cx: &Ctx| scatter_values(cx, mean),
        move || {
            GradCase::new(vec![uniform(15, &[3, 2], -2.0, 2.0)], &[0], move |a| {
                let x = a[0].transpose(&[])?;
                let group = Group::single();
                Ok(node(SumScatter { group, mean }, &x, x.shape().to_vec()))
            })
        },
    )
}

fn scatter_op(mean: bool) -> fn(&Array, &Group) -> mlx_array::Result<Array> {
    if mean {
        super::mean_scatter
    } else {
        super::sum_scatter
    }
}

fn scatter_values(cx: &Ctx, mean: bool) {
    let name = if mean { "mean_scatter" } else { "sum_scatter" };
    let op = scatter_op(mean);
    // mean_scatter is this primitive for float32 only; other dtypes are a
    // sum_scatter and a division.
    let dtypes: &[Dtype] = if mean { &[Dtype::F32] } else { &ALL_DTYPES };
    for n in [1, 2, 3] {
        // Axis 0 splits over the ranks: n blocks of 0, 1 or more rows.
        let shapes = prop::collection::vec(dim(), 1..=3).prop_map(move |mut s| {
            s[0] *= n;
            s
        });
        let fixed: Vec<Vec<usize>> = [vec![0], vec![1], vec![1, 1], vec![0, 3], vec![2, 1, 0]]
            .into_iter()
            .map(|mut s| {
                s[0] *= n;
                s
            })
            .collect();
        let cases = draw_cases(cx, dtypes, shapes, &fixed);
        let got = in_world(cx, n, |g| {
            // A 0-d input, and for several ranks an axis 0 they do not divide.
            let bad = [vec![], vec![n + 1, 2]];
            for bad in &bad[..if n == 1 { 1 } else { 2 }] {
                let x = Array::zeros(bad, Dtype::F32);
                let e = op(&x, g)
                    .err()
                    .ok_or(format!("{name} of {bad:?} must fail"))?;
                let e = e.to_string();
                if !(e.contains(name) && e.contains(&format!("does not split over {n} ranks"))) {
                    return Err(format!("{name} of {bad:?}: {e}"));
                }
            }
            cases
                .iter()
                .map(|c| {
                    let nd = rank_values(c, g.rank());
                    run_case(cx, c, &nd, |x| itself(name, n, x, op(x, g)))
                })
                .collect::<Result<Vec<_>, _>>()
        });
        for (i, c) in cases.iter().enumerate() {
            let parts: Vec<Nd> = (0..n).map(|r| rank_values(c, r)).collect();
            let sum = combine(ReduceOp::Sum, c.dtype, &parts);
            let rel = sum_tol(c.dtype, n);
            for (r, got) in got.iter().enumerate() {
                let mut want = block0(&sum, r, n);
                if mean {
                    want = want.map(|v| quantize(v / n as f64, Dtype::F32));
                }
                let what = format!("{name} in a world of {n}, rank {r}, {c:?}");
                check_at(&got[i], &want, c.dtype, rel, result_device(cx, n), &what);
            }
        }
    }
    for n in WORLDS {
        // d/dx_s Σ_r <c_r, block r of Σ_t x_t> = concat_r c_r (over n for the mean).
        let grads = rank_gradients(cx, n, &[2 * n, 3], op);
        let cs: Vec<Nd> = (0..n).map(|r| cotangent(r, &[2, 3])).collect();
        let scale = if mean { n as f64 } else { 1.0 };
        expect_gradients(cx, name, grads, |_| concat0(&cs).map(|v| v / scale));
    }
}

// ---------------------------------------------------------------- send, recv

#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Send,
    Recv,
}

/// Each rank sends its input to the next rank and receives the previous
/// one's (even ranks send first); the send's output is the input, the
/// recv's the previous rank's input, both on the CPU.
fn point_to_point_values(cx: &Ctx, side: Side) {
    let name = if side == Side::Send { "send" } else { "recv" };
    for n in WORLDS {
        let cases = draw_cases(cx, &ALL_DTYPES, shape(3), &edge_shapes());
        let got = in_world(cx, n, |g| {
            let r = g.rank();
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            for peer in [r, n] {
                refused(name, side, peer, g)?;
            }
            cases
                .iter()
                .map(|c| {
                    let nd = rank_values(c, r);
                    let receive = || super::recv(&c.shape, c.dtype, prev, g);
                    let mut received = None;
                    if r % 2 == 1 {
                        let got = receive().and_then(|a| a.eval().map(|()| a));
                        received = Some(got.map_err(|e| format!("{c:?}: {e}"))?);
                    }
                    let sent = run_case(cx, c, &nd, |x| super::send(x, next, g))?;
                    if r % 2 == 0 {
                        let got = receive().and_then(|a| a.eval().map(|()| a));
                        received = Some(got.map_err(|e| format!("{c:?}: {e}"))?);
                    }
                    Ok((sent, received.expect("received")))
                })
                .collect::<Result<Vec<_>, String>>()
        });
        for (i, c) in cases.iter().enumerate() {
            for (r, got) in got.iter().enumerate() {
                let what = format!("{name} in a world of {n}, rank {r}, {c:?}");
                let (sent, received) = &got[i];
                match side {
                    Side::Send => {
                        check_at(sent, &rank_values(c, r), c.dtype, 0.0, Device::Cpu, &what)
                    }
                    Side::Recv => {
                        let want = rank_values(c, (r + n - 1) % n);
                        check_at(received, &want, c.dtype, 0.0, Device::Cpu, &what)
                    }
                }
            }
        }
    }
    // A group of one has no peer.
    in_world(cx, 1, |g| refused(name, side, 0, g));
}

/// Asserts that sending to or receiving from `peer` is refused, naming it.
fn refused(name: &str, side: Side, peer: usize, g: &Group) -> Result<(), String> {
    let x = Array::zeros(&[2], Dtype::F32);
    let got = match side {
        Side::Send => super::send(&x, peer, g),
        Side::Recv => super::recv(&[2], Dtype::F32, peer, g),
    };
    let e = got
        .err()
        .ok_or(format!("{name} with rank {peer} must be refused"))?
        .to_string();
    if e.contains(name) && e.contains(&format!("rank {peer} is not another rank")) {
        Ok(())
    } else {
        Err(format!("{name} with rank {peer}: {e}"))
    }
}
