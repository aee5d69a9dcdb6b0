//! The communication stream: primitives that say `Stream::Communication` run
//! on their own thread, in graph order, while the evaluator goes on.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use mlx_array::{Array, ArrayData, Dtype, Error, Primitive, Result, Stream, eval};

/// A communication primitive that waits (up to a deadline) for `flag` and
/// returns 1 if it was set while it waited, 0 if not; it also records the
/// order in which communication nodes ran.
#[derive(Debug)]
struct WaitForFlag {
    flag: Arc<AtomicBool>,
    ticket: Arc<AtomicUsize>,
    ran_as: Arc<AtomicUsize>,
    fail: bool,
}

impl Primitive for WaitForFlag {
    fn name(&self) -> &'static str {
        "wait_for_flag"
    }
    fn stream(&self) -> Stream {
        Stream::Communication
    }
    fn eval_cpu(&self, _inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        self.ran_as
            .store(self.ticket.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
        if self.fail {
            return Err(Error::eval("wait_for_flag", "peer 3 closed the connection"));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.flag.load(Ordering::SeqCst) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        let seen = self.flag.load(Ordering::SeqCst) as u8 as f32;
        Ok(ArrayData::from_slice(&[seen], &[]))
    }
}

/// A compute primitive that sets `flag`.
#[derive(Debug)]
struct SetFlag(Arc<AtomicBool>);

impl Primitive for SetFlag {
    fn name(&self) -> &'static str {
        "set_flag"
    }
    fn eval_cpu(&self, _inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        self.0.store(true, Ordering::SeqCst);
        Ok(ArrayData::from_slice(&[2.0f32], &[]))
    }
}

fn wait(
    flag: &Arc<AtomicBool>,
    ticket: &Arc<AtomicUsize>,
    fail: bool,
) -> (Array, Arc<AtomicUsize>) {
    wait_reading(flag, ticket, fail, Array::scalar(0.0f32))
}

/// [`wait`] as a reader of `input`.
fn wait_reading(
    flag: &Arc<AtomicBool>,
    ticket: &Arc<AtomicUsize>,
    fail: bool,
    input: Array,
) -> (Array, Arc<AtomicUsize>) {
    let ran_as = Arc::new(AtomicUsize::new(usize::MAX));
    let prim = WaitForFlag {
        flag: flag.clone(),
        ticket: ticket.clone(),
        ran_as: ran_as.clone(),
        fail,
    };
    let x = Array::from_primitive(prim, vec![input], vec![], Dtype::F32);
    (x, ran_as)
}

#[test]
fn compute_runs_while_a_communication_node_is_in_flight() {
    let flag = Arc::new(AtomicBool::new(false));
    let ticket = Arc::new(AtomicUsize::new(0));
    let (comm, _) = wait(&flag, &ticket, false);
    let compute = Array::from_primitive(SetFlag(flag.clone()), vec![], vec![], Dtype::F32);
    // The communication node comes first in graph order; run sequentially it
    // would time out before the flag is set.
    let total = comm.add(&compute).unwrap();
    eval((&comm, &compute, &total)).unwrap();
    assert_eq!(
        comm.item::<f32>().unwrap(),
        1.0,
        "the collective did not overlap compute"
    );
    assert_eq!(total.item::<f32>().unwrap(), 3.0);
}

#[test]
fn communication_nodes_run_in_graph_order_and_errors_reach_eval() {
    let flag = Arc::new(AtomicBool::new(true));
    let ticket = Arc::new(AtomicUsize::new(0));
    let (a, a_ran) = wait(&flag, &ticket, false);
    let (b, b_ran) = wait(&flag, &ticket, false);
    let (c, c_ran) = wait(&flag, &ticket, false);
    eval((&a, &b, &c)).unwrap();
    let order = [a_ran, b_ran, c_ran].map(|r| r.load(Ordering::SeqCst));
    assert!(
        order[0] < order[1] && order[1] < order[2],
        "ran out of order: {order:?}"
    );

    let (bad, _) = wait(&flag, &ticket, true);
    let after = bad.add_scalar(1.0).unwrap();
    let err = eval(&after).unwrap_err().to_string();
    assert!(err.contains("peer 3 closed the connection"), "{err}");
    assert!(!after.is_evaluated());
}

/// The collective's reader comes before the independent compute in graph
/// order; run in that order, the reader would wait for the collective, which
/// waits (until its deadline) for the compute. The evaluator runs what needs
/// no collective first.
#[test]
fn what_needs_no_collective_runs_before_what_waits_for_one() {
    let flag = Arc::new(AtomicBool::new(false));
    let ticket = Arc::new(AtomicUsize::new(0));
    let (comm, _) = wait(&flag, &ticket, false);
    let reader = comm.add_scalar(1.0).unwrap();
    let compute = Array::from_primitive(SetFlag(flag.clone()), vec![], vec![], Dtype::F32);
    let t0 = Instant::now();
    eval((&reader, &compute)).unwrap();
    assert_eq!(
        reader.item::<f32>().unwrap(),
        2.0,
        "the collective's reader ran before the compute that the collective waited for"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    assert_eq!(compute.item::<f32>().unwrap(), 2.0);
}

/// A collective fed by another collective's reader waits for that chain;
/// compute that needs neither still runs first, and every node sees its
/// inputs' values (the reordering keeps each node after its inputs).
#[test]
fn chained_collectives_keep_their_order_and_their_inputs() {
    let first_flag = Arc::new(AtomicBool::new(false));
    let ticket = Arc::new(AtomicUsize::new(0));
    let (first, first_ran) = wait(&first_flag, &ticket, false);
    let between = first.add_scalar(10.0).unwrap();
    let second_flag = Arc::new(AtomicBool::new(true));
    let (second, second_ran) = wait_reading(&second_flag, &ticket, false, between.clone());
    let last = second.add(&between).unwrap();
    let compute = Array::from_primitive(SetFlag(first_flag.clone()), vec![], vec![], Dtype::F32);
    let also = compute.mul_scalar(3.0).unwrap();
    eval((&last, &also)).unwrap();
    assert_eq!(first.item::<f32>().unwrap(), 1.0, "the compute ran late");
    assert_eq!(last.item::<f32>().unwrap(), 12.0);
    assert_eq!(also.item::<f32>().unwrap(), 6.0);
    assert!(first_ran.load(Ordering::SeqCst) < second_ran.load(Ordering::SeqCst));
}

/// A compute primitive with no inputs that records when it ran.
#[derive(Debug)]
struct Record {
    ticket: Arc<AtomicUsize>,
    ran_as: Arc<AtomicUsize>,
}

impl Primitive for Record {
    fn name(&self) -> &'static str {
        "record"
    }
    fn eval_cpu(&self, _inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        self.ran_as
            .store(self.ticket.fetch_add(1, Ordering::SeqCst), Ordering::SeqCst);
        Ok(ArrayData::from_slice(&[5.0f32], &[]))
    }
}

/// A computation that reads nothing pending and is read only after a
/// collective (like a first step's zero moments) runs just before its
/// reader, not early with the work the collective overlaps: its buffer is
/// not held while the collective travels.
#[test]
fn what_only_a_collective_reader_needs_runs_late() {
    let flag = Arc::new(AtomicBool::new(true));
    let ticket = Arc::new(AtomicUsize::new(0));
    let (comm, comm_ran) = wait(&flag, &ticket, false);
    let record = |t: &Arc<AtomicUsize>| {
        let ran_as = Arc::new(AtomicUsize::new(usize::MAX));
        let prim = Record {
            ticket: t.clone(),
            ran_as: ran_as.clone(),
        };
        (
            Array::from_primitive(prim, vec![], vec![], Dtype::F32),
            ran_as,
        )
    };
    let (late, late_ran) = record(&ticket);
    let reader = comm.add(&late).unwrap();
    let (work, work_ran) = record(&ticket);
    let more_work = work.add_scalar(1.0).unwrap();
    eval((&reader, &more_work)).unwrap();
    assert_eq!(reader.item::<f32>().unwrap(), 6.0);
    assert_eq!(more_work.item::<f32>().unwrap(), 6.0);
    let [c, l, w] = [comm_ran, late_ran, work_ran].map(|r| r.load(Ordering::SeqCst));
    assert!(
        l > w,
        "the collective reader's own input ran before the other work ({l} <= {w})"
    );
    assert!(c != usize::MAX);
}
