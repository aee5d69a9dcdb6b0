//! Running a chain of elementwise GPU nodes as one kernel.
//!
//! The evaluator decides what fuses (`eval::fusion`: an elementwise node
//! whose only reader is another elementwise node of the same shape on the
//! GPU, and that nobody else holds, is computed inline by its reader) and
//! hands over a [`FusedChain`]; [`run`] writes its steps as WGSL
//! statements and runs them in one elementwise kernel, so the chain
//! `exp(x * y) + z` runs as one dispatch with no intermediate buffers.
//!
//! # What fusion promises
//!
//! A fused kernel evaluates every node with the same WGSL expression the
//! node's own kernel uses, in the same compute type, and rounds every
//! intermediate of a half dtype (`f16`, `bf16`) to that dtype exactly as
//! storing it would ([`super::codegen::round_to`]: round to nearest even in
//! integer arithmetic, the very function the stores use, so no driver's
//! choice of conversion rounding can split the two). Hence:
//!
//! - Half dtypes: fused and unfused results are equal bit for bit wherever
//!   each op is deterministic. A rounded intermediate is also a barrier to
//!   contraction, so no multiply-add can straddle it.
//! - `f32`: intermediates are the exact `f32` values the unfused kernels
//!   would store, so results are equal bit for bit except where a multiply
//!   feeds an add or subtract: WGSL lets an implementation contract
//!   `a * b + c` into one FMA, which inside a fused kernel can span what
//!   would be two kernels. There the fused result is the better rounded one and
//!   differs by at most one rounding of the product.
//!
//! `gpu_conformance`'s elementwise specs assert exactly this (bit equality
//! for half dtypes and for `f32` chains without a multiply-add, one rounding
//! of the product otherwise), plus agreement with the CPU backend.

use super::codegen::{compute_type, round_to};
use super::elementwise::map_with;
use crate::backend::common::fusion::{FusedChain, MAX_INPUTS, Step, StepInput};
use crate::{ArrayData, Dtype, Error, Result};

/// Computes `chain` in one kernel: its output, of `chain.shape` and the
/// last step's dtype.
pub(crate) fn run(chain: &FusedChain) -> Result<ArrayData> {
    let (statements, result) = statements(&chain.steps, chain.inputs.len())?;
    let dtype = chain
        .dtype()
        .ok_or_else(|| Error::gpu("a fused chain with no steps"))?;
    let inputs: Vec<(&ArrayData, Dtype)> = chain.inputs.iter().map(|(d, t)| (d, *t)).collect();
    let key = format!("fused:{statements}=>{result}");
    map_with(&key, &statements, &result, &chain.shape, &inputs, dtype)
}

/// The WGSL statements computing every step of a chain over `inputs`
/// inputs (`let t{j}: T = …;`, input `k` read as `a{k}`), and the name of
/// the last step's value.
fn statements(steps: &[Step], inputs: usize) -> Result<(String, String)> {
    if inputs > MAX_INPUTS {
        return Err(Error::gpu(format!(
            "a fused chain reads {inputs} inputs, more than the {MAX_INPUTS} a kernel binds"
        )));
    }
    let mut statements = String::new();
    for (j, step) in steps.iter().enumerate() {
        let operands: Vec<String> = step
            .operands
            .iter()
            .map(|o| match *o {
                StepInput::Input(k) if k < inputs => Ok(format!("a{k}")),
                StepInput::Step(s) if s < j => Ok(format!("t{s}")),
                _ => Err(Error::gpu(format!(
                    "fused chain step {j} reads {o:?}: no such input, or a step not before it"
                ))),
            })
            .collect::<Result<_>>()?;
        // Through placeholders, so a substituted name is never replaced again.
        let mut e = step.expression.clone();
        for n in 0..operands.len() {
            e = e.replace(&format!("a{n}"), &format!("@{n}@"));
        }
        for (n, v) in operands.iter().enumerate() {
            e = e.replace(&format!("@{n}@"), v);
        }
        statements.push_str(&format!(
            "    let t{j}: {} = {};\n",
            compute_type(step.dtype),
            round_to(step.dtype, &e)
        ));
    }
    match steps.len() {
        0 => Err(Error::gpu("a fused chain with no steps")),
        n => Ok((statements, format!("t{}", n - 1))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(expression: &str, operands: &[StepInput], dtype: Dtype) -> Step {
        Step {
            expression: expression.to_string(),
            operands: operands.to_vec(),
            dtype,
        }
    }

    #[test]
    fn steps_become_rounded_statements_over_inputs_and_temporaries() {
        use StepInput::{Input, Step as S};
        // maximum(exp(x * y) + x, y) in bf16, numbered as the planner does:
        // each step after its operands.
        let steps = [
            step("a0 * a1", &[Input(0), Input(1)], Dtype::BF16),
            step("exp(a0)", &[S(0)], Dtype::BF16),
            step("a0 + a1", &[S(1), Input(0)], Dtype::BF16),
            // `a0` becomes `a1`, which is not replaced again by `a1`'s value.
            step("max(a1, a0)", &[Input(1), S(2)], Dtype::F32),
        ];
        let (text, result) = statements(&steps, 2).unwrap();
        assert_eq!(
            text,
            "    let t0: f32 = round_bf16(a0 * a1);\n\
             \x20   let t1: f32 = round_bf16(exp(t0));\n\
             \x20   let t2: f32 = round_bf16(t1 + a0);\n\
             \x20   let t3: f32 = max(t2, a1);\n"
        );
        assert_eq!(result, "t3");
    }

    #[test]
    fn malformed_chains_are_errors_not_kernels() {
        let e = |steps: &[Step], inputs| statements(steps, inputs).unwrap_err().to_string();
        let late = [step("a0", &[StepInput::Step(0)], Dtype::F32)];
        assert!(
            e(&late, 1).contains("step 0 reads Step(0)"),
            "{}",
            e(&late, 1)
        );
        let missing = [step("a0", &[StepInput::Input(1)], Dtype::F32)];
        assert!(
            e(&missing, 1).contains("reads Input(1)"),
            "{}",
            e(&missing, 1)
        );
        assert!(e(&[], 1).contains("no steps"));
        let wide = [step("a0", &[StepInput::Input(0)], Dtype::F32)];
        assert!(e(&wide, MAX_INPUTS + 1).contains("more than the 6"));
    }
}
