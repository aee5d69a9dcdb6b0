//! The evaluator: orders the graph, runs each primitive once, frees as it goes.

use std::collections::HashSet;

use crate::Array;
use crate::Result;
use crate::array::State;

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
    let mut roots = Vec::new();
    outputs.collect_arrays(&mut roots);
    let order = topological_order(roots);
    run(order)
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
            let inputs = match &*a.lock() {
                State::Ready(_) => continue,
                State::Pending { inputs, .. } => inputs.clone(),
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

fn run(order: Vec<Array>) -> Result<()> {
    for a in order {
        let (primitive, inputs) = match &*a.lock() {
            State::Ready(_) => continue,
            State::Pending { primitive, inputs } => (primitive.clone(), inputs.clone()),
        };
        let data = if crate::profile::enabled() {
            let t0 = std::time::Instant::now();
            let d = primitive.eval_cpu(&inputs, &a)?;
            crate::profile::record(primitive.name(), a.shape(), t0.elapsed());
            d
        } else {
            primitive.eval_cpu(&inputs, &a)?
        };
        drop(inputs);
        // Detach: replacing the pending state drops this node's references to its inputs.
        let old = std::mem::replace(&mut *a.lock(), State::Ready(data));
        drop(old);
    }
    Ok(())
}
