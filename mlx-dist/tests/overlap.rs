//! The evaluator overlaps collectives with computation: while a collective
//! is in flight, nodes that do not need its result run.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mlx_array::{Array, ArrayData, Dtype, Primitive, eval};

/// Set by the marker kernel when it runs.
static MARKED: AtomicBool = AtomicBool::new(false);

/// A compute node that records that it ran and passes its input through.
#[derive(Debug)]
struct Marker;

impl Primitive for Marker {
    fn name(&self) -> &'static str {
        "marker"
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> mlx_array::Result<ArrayData> {
        MARKED.store(true, Ordering::SeqCst);
        inputs[0].data()
    }
}

#[test]
fn independent_nodes_run_while_a_collective_waits_for_a_peer() {
    let out = mlx_dist::run_local(2, |g| {
        let x = Array::ones(&[4], Dtype::F32);
        if g.rank() == 1 {
            // Join the all_sum only once rank 0 has run its marker, which
            // comes after the all_sum's consumer in rank 0's graph. An
            // evaluator that ran nodes strictly in order would never get
            // there: give up after a while rather than hang.
            let start = Instant::now();
            while !MARKED.load(Ordering::SeqCst) && start.elapsed() < Duration::from_secs(30) {
                std::thread::sleep(Duration::from_millis(1));
            }
            let s = mlx_dist::all_sum(&x, &g).unwrap();
            s.eval().unwrap();
            return (MARKED.load(Ordering::SeqCst), s.to_vec::<f32>().unwrap());
        }
        let summed = mlx_dist::all_sum(&x, &g).unwrap().mul_scalar(10.0).unwrap();
        let w = Array::full(&[4], 3.0, Dtype::F32).add_scalar(1.0).unwrap();
        let marked = Array::from_primitive(Marker, vec![w], vec![4], Dtype::F32);
        // The all_sum's consumer first, the independent marker after it.
        eval((&summed, &marked)).unwrap();
        (true, summed.to_vec::<f32>().unwrap())
    })
    .unwrap();
    assert!(
        out[1].0,
        "the marker did not run while the all_sum was in flight"
    );
    assert_eq!(out[0].1, vec![20.0; 4]);
    assert_eq!(out[1].1, vec![2.0; 4]);
}
