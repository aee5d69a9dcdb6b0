//! The evaluator: orders the graph, runs each primitive once, frees as it goes.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel, sync_channel};
use std::time::{Duration, Instant};

use crate::array::State;
use crate::data::ArrayData;
use crate::primitive::{Primitive, Stream};
use crate::{Array, Device, Result};

mod fusion;

/// Things that hold arrays to evaluate: an array, slices and vectors of
/// arrays, parameter trees, references and tuples of these.
pub trait Evaluable {
    /// Appends the arrays to evaluate.
    fn collect_arrays(&self, out: &mut Vec<Array>);
}

impl Evaluable for Array {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        out.push(self.clone());
    }
}

impl<T: Evaluable + ?Sized> Evaluable for &T {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        (**self).collect_arrays(out)
    }
}

impl<T: Evaluable> Evaluable for [T] {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.iter().for_each(|t| t.collect_arrays(out))
    }
}

impl<T: Evaluable, const N: usize> Evaluable for [T; N] {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.iter().for_each(|t| t.collect_arrays(out))
    }
}

impl<T: Evaluable> Evaluable for Vec<T> {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        self.iter().for_each(|t| t.collect_arrays(out))
    }
}

impl<T: Evaluable> Evaluable for Option<T> {
    fn collect_arrays(&self, out: &mut Vec<Array>) {
        if let Some(t) = self {
            t.collect_arrays(out)
        }
    }
}

macro_rules! tuple_evaluable {
    ($($t:ident $i:tt),+) => {
        impl<$($t: Evaluable),+> Evaluable for ($($t,)+) {
            fn collect_arrays(&self, out: &mut Vec<Array>) {
                $(self.$i.collect_arrays(out);)+
            }
        }
    };
}
tuple_evaluable!(A 0);
tuple_evaluable!(A 0, B 1);
tuple_evaluable!(A 0, B 1, C 2);
tuple_evaluable!(A 0, B 1, C 2, D 3);
tuple_evaluable!(A 0, B 1, C 2, D 3, E 4);

/// Computes every pending array reachable from `outputs`.
///
/// The graph is ordered without recursion (so graphs of any depth are fine),
/// each primitive runs once on multithreaded kernels, each evaluated array is
/// detached from its inputs, and an intermediate buffer is released as soon as
/// its last consumer has run (unless the caller still holds the array).
/// Collectives ([`Stream::Communication`]) run on a thread of their own, and
/// whatever does not wait for one runs first, while they travel
/// (`MLX_OVERLAP=0` keeps plain graph order instead). On the GPU, nodes
/// that nothing else reads fuse into their reader's kernel: elementwise
/// chains into one kernel, and a matrix product into the add that sums it
/// with another term (the product's kernel stores the sum, bit for bit
/// the unfused result).
///
/// ```
/// use mlx_array::{eval, Array, Dtype};
/// let x = Array::ones(&[4], Dtype::F32);
/// let y = x.exp().unwrap();
/// let z = y.sum(&[0], false).unwrap();
/// eval((&y, &z)).unwrap();
/// assert!(y.is_evaluated() && z.is_evaluated());
/// ```
pub fn eval(outputs: impl Evaluable) -> Result<()> {
    check_environment_once()?;
    let mut roots = Vec::new();
    outputs.collect_arrays(&mut roots);
    let order = overlap_communication(topological_order(roots));
    run(order)
}

/// Checks the environment variables once per process (every eval asks):
/// the settings' own, `MLX_DEVICE`, and that an `MLX_BLAS` library loads.
fn check_environment_once() -> Result<()> {
    static CHECKED: std::sync::OnceLock<std::result::Result<(), String>> =
        std::sync::OnceLock::new();
    CHECKED
        .get_or_init(|| {
            crate::settings::check()
                .and_then(|()| crate::device::default_device_from_env().map(drop))
                .and_then(|()| crate::backend::cpu::blas::check_choice())
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|m| crate::Error::invalid("settings", m))
}

/// Pending nodes reachable from `roots`, each after all of its inputs.
fn topological_order(roots: Vec<Array>) -> Vec<Array> {
    let mut order = Vec::new();
    let mut seen: HashSet<u64> = HashSet::new();
    // (array, inputs already pushed?)
    let mut stack: Vec<(Array, bool)> = Vec::new();
    for r in roots {
        stack.push((r, false));
        while let Some((a, expanded)) = stack.pop() {
            if expanded {
                order.push(a);
                continue;
            }
            if !seen.insert(a.id()) {
                continue;
            }
            let inputs = match a.lock().pending() {
                None => continue,
                Some((_, inputs)) => inputs.clone(),
            };
            stack.push((a, true));
            for i in inputs.into_iter().rev() {
                if !seen.contains(&i.id()) {
                    stack.push((i, false));
                }
            }
        }
    }
    order
}

/// Reorders a topological order so that communication overlaps computation.
///
/// Each node gets a level: the number of communication nodes on the
/// longest path of collectives it waits for (a collective counts for the
/// nodes after it, not for itself). Nodes run by level, and in their original
/// order within a level, which keeps every node after its inputs. So every
/// collective is submitted as soon as its inputs are computed, and the
/// computation that needs no pending collective runs while it travels: a
/// backward pass goes on to the next layer while the gradients of the last
/// one are summed, instead of waiting at each collective for the slower
/// rank. Every rank reorders the same graph the same way, so collectives
/// keep one order across ranks. A graph without collectives is unchanged.
///
/// A computation that reads only evaluated arrays (and other such
/// computations), like the zeros of a first step's optimizer moments, moves
/// down to the level of its first reader: run early it would gain no
/// overlap, and its buffer would be held through the whole backward pass.
fn overlap_communication(order: Vec<Array>) -> Vec<Array> {
    // Most graphs hold no collective: leave them as they are, before
    // building anything.
    let has_collective = |a: &Array| match a.lock().pending() {
        Some((primitive, _)) => primitive.stream() == Stream::Communication,
        None => false,
    };
    if !overlap_enabled() || !order.iter().any(has_collective) {
        return order;
    }
    let index: HashMap<u64, usize> = order.iter().enumerate().map(|(i, a)| (a.id(), i)).collect();
    let n = order.len();
    // Per node: its inputs among the pending nodes, whether it is a
    // collective, whether it reads only evaluated arrays and such nodes.
    let mut inputs = Vec::with_capacity(n);
    let mut comm = vec![false; n];
    let mut source = vec![false; n];
    let mut level = vec![0usize; n];
    for (i, a) in order.iter().enumerate() {
        let pending: Vec<usize> = match a.lock().pending() {
            None => Vec::new(),
            Some((primitive, inputs)) => {
                comm[i] = primitive.stream() == Stream::Communication;
                inputs
                    .iter()
                    .filter_map(|x| index.get(&x.id()).copied())
                    .collect()
            }
        };
        level[i] = pending
            .iter()
            .map(|&j| level[j] + usize::from(comm[j]))
            .max()
            .unwrap_or(0);
        source[i] = !comm[i] && pending.iter().all(|&j| source[j]);
        inputs.push(pending);
    }
    // Readers come after what they read: walking back, every reader's final
    // level is known before the nodes it reads.
    let mut first_reader = vec![usize::MAX; n];
    for i in (0..n).rev() {
        if source[i] && first_reader[i] != usize::MAX {
            level[i] = first_reader[i];
        }
        for &j in &inputs[i] {
            first_reader[j] = first_reader[j].min(level[i]);
        }
    }
    let mut keyed: Vec<(usize, Array)> = level.into_iter().zip(order).collect();
    keyed.sort_by_key(|&(l, _)| l);
    keyed.into_iter().map(|(_, a)| a).collect()
}

/// Whether [`overlap_communication`] reorders: yes, unless `MLX_OVERLAP=0`
/// asks for plain graph order (to measure what the overlap gains).
fn overlap_enabled() -> bool {
    crate::settings::overlap().unwrap_or(true)
}

fn run(order: Vec<Array>) -> Result<()> {
    let mut in_flight = InFlight::default();
    let result = run_nodes(order, &mut in_flight);
    // Whatever happened, no collective is left running behind the caller's back.
    let finished = in_flight.finish_all();
    // One command buffer per eval: everything the GPU kernels recorded goes now.
    let submitted = crate::backend::gpu::submit();
    result.and(finished).and(submitted)
}

fn run_nodes(order: Vec<Array>, in_flight: &mut InFlight) -> Result<()> {
    let mut fusion = fusion::Fusion::new(&order);
    for a in order {
        if fusion.defer(&a) {
            continue; // its one reader computes it inline
        }
        let (primitive, inputs) = match a.lock().pending() {
            None => continue,
            Some((primitive, inputs)) => (primitive.clone(), inputs.clone()),
        };
        for i in &inputs {
            in_flight.finish(i)?;
        }
        if let Some(outputs) = a.output_specs() {
            run_outputs(&a, &*primitive, inputs, outputs)?;
            continue;
        }
        match primitive.stream() {
            Stream::Compute => {
                // Also tags the GPU passes the kernel records, for their
                // execution times (see `crate::profile`).
                let timer = crate::profile::enabled().then(|| {
                    let name = fusion.label(&a).unwrap_or(primitive.name());
                    crate::profile::start(name, a.shape(), a.device() == Device::Gpu)
                });
                let data = match a.device() {
                    Device::Cpu => primitive.eval_cpu(&inputs, &a)?,
                    Device::Gpu => match fusion.run(&a)? {
                        Some(data) => data,
                        None => primitive.eval_gpu(&inputs, &a)?,
                    },
                };
                if let Some(timer) = timer {
                    timer.stop();
                }
                drop(inputs);
                set_ready(&a, data);
            }
            Stream::Communication => in_flight.submit(a, primitive, inputs),
        }
    }
    Ok(())
}

/// Runs a multi-output node's primitive once, for all its outputs.
fn run_outputs(
    a: &Array,
    primitive: &dyn Primitive,
    inputs: Vec<Array>,
    outputs: &[crate::OutputSpec],
) -> Result<()> {
    if primitive.stream() == Stream::Communication {
        return Err(crate::Error::eval(
            primitive.name(),
            "communication primitives have one output",
        ));
    }
    let timer = crate::profile::enabled().then(|| {
        let shape = outputs.first().map_or(&[][..], |o| &o.shape[..]);
        crate::profile::start(primitive.name(), shape, a.device() == Device::Gpu)
    });
    let data = match a.device() {
        Device::Cpu => primitive.eval_cpu_outputs(&inputs, outputs)?,
        Device::Gpu => primitive.eval_gpu_outputs(&inputs, outputs)?,
    };
    if data.len() != outputs.len() {
        return Err(crate::Error::eval(
            primitive.name(),
            format!(
                "computed {} outputs, {} expected",
                data.len(),
                outputs.len()
            ),
        ));
    }
    if let Some(timer) = timer {
        timer.stop();
    }
    drop(inputs);
    let old = std::mem::replace(&mut *a.lock(), State::ReadyOutputs(data));
    drop(old);
    Ok(())
}

/// Detach: replacing the pending state drops this node's references to its inputs.
fn set_ready(a: &Array, data: ArrayData) {
    let old = std::mem::replace(&mut *a.lock(), State::Ready(data));
    drop(old);
}

/// Communication-stream nodes submitted by one `eval` and not yet collected.
#[derive(Default)]
struct InFlight {
    pending: HashMap<u64, (Array, Receiver<Result<ArrayData>>)>,
}

impl InFlight {
    fn submit(&mut self, a: Array, primitive: Arc<dyn Primitive>, inputs: Vec<Array>) {
        let (tx, rx) = sync_channel(1);
        let out = a.clone();
        let busy = BUSY.with(Arc::clone);
        let job: Job = Box::new(move || {
            let t0 = Instant::now();
            let result = catch_unwind(AssertUnwindSafe(|| primitive.eval_cpu(&inputs, &out)))
                .unwrap_or_else(|_| {
                    Err(crate::Error::eval(primitive.name(), "the kernel panicked"))
                });
            let took = t0.elapsed();
            busy.fetch_add(
                u64::try_from(took.as_nanos()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            if crate::profile::enabled() {
                crate::profile::record(primitive.name(), out.shape(), took);
            }
            // Let go of the inputs, this handle and the primitive before the
            // result is announced: a kernel that runs next counts references
            // to decide whether it may write over a buffer, and a primitive
            // may hold the last handle on a connection (a collective's
            // group), whose clean closing must not race the evaluating
            // thread's exit.
            drop((inputs, out, primitive));
            let _ = tx.send(result);
        });
        let rx = match with_communication_thread(|t| t.send(job)) {
            Ok(()) => rx,
            _ => {
                let (tx, rx) = sync_channel(1);
                let _ = tx.send(Err(crate::Error::eval(
                    "eval",
                    "the communication thread is not running",
                )));
                rx
            }
        };
        self.pending.insert(a.id(), (a, rx));
    }

    /// Waits for `a` if it is in flight and stores its result.
    fn finish(&mut self, a: &Array) -> Result<()> {
        let Some((a, rx)) = self.pending.remove(&a.id()) else {
            return Ok(());
        };
        let t0 = Instant::now();
        let received = rx.recv();
        // Time the evaluating thread sat idle for a collective.
        let waited = t0.elapsed();
        WAITED.with(|w| w.set(w.get() + waited));
        if crate::profile::enabled() {
            crate::profile::record("wait for a collective", a.shape(), waited);
        }
        let data = received.unwrap_or_else(|_| {
            Err(crate::Error::eval(
                "eval",
                "the communication thread stopped before finishing a collective",
            ))
        })?;
        set_ready(&a, data);
        Ok(())
    }

    /// Waits for every node still in flight, in submission order; the first error wins.
    fn finish_all(&mut self) -> Result<()> {
        let mut ids: Vec<u64> = self.pending.keys().copied().collect();
        ids.sort_unstable();
        let mut first = Ok(());
        for id in ids {
            let (a, _) = &self.pending[&id];
            let a = a.clone();
            let r = self.finish(&a);
            if first.is_ok() {
                first = r;
            }
        }
        first
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Where the calling thread's evaluations spent time on collectives, since
/// the thread started: see [`communication_times`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommunicationTimes {
    /// Time the evaluating thread sat blocked, waiting for a collective's
    /// result (the communication it could not overlap, and the wait for
    /// slower ranks).
    pub waited: Duration,
    /// Time its communication thread spent running collectives (moving and
    /// reducing data, and waiting for the peers), overlapped or not.
    pub busy: Duration,
}

impl std::ops::Sub for CommunicationTimes {
    type Output = CommunicationTimes;
    /// The time spent between two readings (saturating).
    fn sub(self, earlier: CommunicationTimes) -> CommunicationTimes {
        CommunicationTimes {
            waited: self.waited.saturating_sub(earlier.waited),
            busy: self.busy.saturating_sub(earlier.busy),
        }
    }
}

thread_local! {
    /// Time this thread's evaluations waited for collectives.
    static WAITED: Cell<Duration> = const { Cell::new(Duration::ZERO) };
    /// Nanoseconds this thread's communication thread spent in collectives
    /// (each job adds its own).
    static BUSY: Arc<AtomicU64> = Arc::new(AtomicU64::new(0));
}

/// The time the calling thread's evaluations have waited for collectives
/// and the time its communication thread has spent in them, since the
/// thread started. Always counted (two clock readings per collective), so
/// that a trainer can report, per step, how long it waited on the network:
/// subtract two readings.
///
/// ```
/// let before = mlx_array::eval::communication_times();
/// // ... an eval with collectives ...
/// let step = mlx_array::eval::communication_times() - before;
/// assert!(step.waited <= std::time::Duration::from_secs(1));
/// ```
pub fn communication_times() -> CommunicationTimes {
    let busy = BUSY.with(|b| b.load(Ordering::Relaxed));
    CommunicationTimes {
        waited: WAITED.with(Cell::get),
        busy: Duration::from_nanos(busy),
    }
}

/// The communication thread of the calling thread: runs jobs one at a time,
/// in order. One per evaluating thread (a process normally evaluates on one
/// thread, so one per process), so that several ranks run as threads of one
/// process (as in `mlx_dist::run_local`) each keep their own order and never
/// wait behind another rank's collective. It stops when the evaluating thread
/// exits.
fn with_communication_thread<T>(f: impl FnOnce(&Sender<Job>) -> T) -> T {
    thread_local! {
        static THREAD: Sender<Job> = {
            let (tx, rx) = channel::<Job>();
            std::thread::Builder::new()
                .name("mlx-communication".into())
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .expect("cannot start the communication thread");
            tx
        };
    }
    THREAD.with(f)
}
