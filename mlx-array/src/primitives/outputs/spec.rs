//! Conformance specification of [`Output`], through a small two-output
//! primitive defined here: `x + 1` and `2 x`, computed together.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use proptest::prelude::*;

use super::Output;
use crate::backend::gpu;
use crate::conformance::*;
use crate::{Array, ArrayData, Dtype, Operand, OutputSpec, Primitive, Result};

/// `x + 1` and `2 x` in one primitive that counts its runs.
#[derive(Debug, Default)]
pub(crate) struct PlusOneAndDouble {
    runs: Arc<AtomicUsize>,
}

impl Primitive for PlusOneAndDouble {
    fn name(&self) -> &'static str {
        "plus_one_and_double"
    }
    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let shape = &outputs[0].shape;
        let x = crate::backend::cpu::copy::contiguous(&Operand::new(
            inputs[0].data()?,
            shape,
            Dtype::F32,
        ));
        let v = x.as_slice::<f32>(inputs[0].size());
        Ok(vec![
            ArrayData::from_slice(&v.iter().map(|x| x + 1.0).collect::<Vec<_>>(), shape),
            ArrayData::from_slice(&v.iter().map(|x| 2.0 * x).collect::<Vec<_>>(), shape),
        ])
    }
    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        self.runs.fetch_add(1, Ordering::Relaxed);
        let (x, shape) = (inputs[0].data()?, &outputs[0].shape);
        let f =
            |name, expr| gpu::elementwise::map(name, expr, shape, &[(&x, Dtype::F32)], Dtype::F32);
        Ok(vec![f("plus_one", "a0 + 1.0")?, f("double", "a0 * 2.0")?])
    }
    fn vjp_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[Array],
        cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        let zero = || crate::zeros_like(&inputs[0]);
        let a = cotangents[0].clone().unwrap_or_else(zero);
        let b = cotangents[1]
            .clone()
            .map_or_else(|| Ok(zero()), |c| c.mul_scalar(2.0))?;
        Ok(vec![Some(a.add(&b)?)])
    }
}

/// Both outputs of [`PlusOneAndDouble`] of `x` (f32).
fn plus_one_and_double(x: &Array, p: PlusOneAndDouble) -> Vec<Array> {
    let spec = OutputSpec {
        shape: x.shape().to_vec(),
        dtype: Dtype::F32,
    };
    Array::from_primitive_outputs(p, vec![x.clone()], vec![spec.clone(), spec])
}

/// The specifications of the output mechanism.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec::new::<Output>("output", values, gradient),
        Spec::new::<PlusOneAndDouble>("plus_one_and_double", values, gradient),
    ]
}

fn values(cx: &Ctx) {
    cx.runner()
        .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
            let x = fill(&s, Dtype::F32, -9.0, 9.0, seed);
            let a = make(&x, Dtype::F32, l);
            let p = PlusOneAndDouble::default();
            let runs = p.runs.clone();
            let outs = cx.on(|| plus_one_and_double(&a, p));
            // Evaluating the second output computes both, once: the first
            // then reads what was computed.
            outs[1].eval().expect("eval");
            cx.check(
                &outs[1],
                &x.map(|v| quantize(2.0 * v, Dtype::F32)),
                Dtype::F32,
                0.0,
                "double",
            );
            cx.check(
                &outs[0],
                &x.map(|v| quantize(v + 1.0, Dtype::F32)),
                Dtype::F32,
                0.0,
                "plus one",
            );
            assert_eq!(runs.load(Ordering::Relaxed), 1, "the primitive ran once");
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    // An output nobody holds is computed and dropped; the other is right.
    let a = make(
        &fill(&[3], Dtype::F32, -1.0, 1.0, 1),
        Dtype::F32,
        Layout::Dense,
    );
    let kept = cx.on(|| plus_one_and_double(&a, PlusOneAndDouble::default()).remove(0));
    let want = Nd::new(
        &[3],
        crate::conformance::values(&a)
            .iter()
            .map(|v| quantize(v + 1.0, Dtype::F32))
            .collect(),
    );
    cx.check(&kept, &want, Dtype::F32, 0.0, "one output kept");
}

fn gradient() -> GradCase {
    // Both outputs reach the loss (x + 1) * 2x: the cotangents of the two
    // meet in one vjp_outputs call.
    GradCase::new(vec![uniform(3, &[2, 3], -2.0, 2.0)], &[0], |x| {
        let outs = plus_one_and_double(&x[0], PlusOneAndDouble::default());
        outs[0].multiply(&outs[1])
    })
}
