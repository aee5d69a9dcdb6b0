//! Elementwise primitives: unary and binary math, `where`, `astype`, `stop_gradient`.

pub use crate::backend::common::elementwise::{BinaryOp, UnaryOp};
use crate::backend::{cpu, gpu};
use crate::primitive::no_gradient;
use crate::{Array, ArrayData, Primitive, Result};

/// Applies a [`UnaryOp`].
#[derive(Debug, Clone, Copy)]
pub struct Unary(pub UnaryOp);

impl Primitive for Unary {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn gpu_expression(&self, inputs: &[Array], _out: &Array) -> Option<String> {
        gpu::elementwise::unary_expression(self.0, inputs[0].dtype()).ok()
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        gpu::unary(self.0, &inputs[0].operand()?)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        cpu::unary::unary(self.0, &inputs[0].operand()?)
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        use UnaryOp::*;
        let x = &inputs[0];
        if !x.dtype().is_float() {
            return no_gradient(inputs);
        }
        let g = match self.0 {
            Neg => ct.negative()?,
            Abs => ct.multiply(&x.sign()?)?,
            Exp => ct.multiply(out)?,
            Log => ct.divide(x)?,
            Log1p => ct.divide(&x.add_scalar(1.0)?)?,
            Sqrt => ct.divide(&out.mul_scalar(2.0)?)?,
            // d/dx x^-1/2 = -1/2 x^-3/2 = -1/2 * out / x
            Rsqrt => ct.multiply(&out.divide(x)?.mul_scalar(-0.5)?)?,
            Square => ct.multiply(&x.mul_scalar(2.0)?)?,
            Sin => ct.multiply(&x.cos()?)?,
            Cos => ct.multiply(&x.sin()?.negative()?)?,
            Tanh => ct.multiply(&out.square()?.negative()?.add_scalar(1.0)?)?,
            Sigmoid => ct.multiply(&out.multiply(&out.negative()?.add_scalar(1.0)?)?)?,
            Erf => ct.multiply(
                &x.square()?
                    .negative()?
                    .exp()?
                    .mul_scalar(std::f64::consts::FRAC_2_SQRT_PI)?,
            )?,
            Sign | Floor | LogicalNot => return no_gradient(inputs),
        };
        Ok(vec![Some(g)])
    }
}

/// Applies a [`BinaryOp`] to two inputs already broadcast to the output shape
/// and cast to a common dtype.
#[derive(Debug, Clone, Copy)]
pub struct Binary(pub BinaryOp);

impl Primitive for Binary {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn gpu_expression(&self, inputs: &[Array], _out: &Array) -> Option<String> {
        gpu::elementwise::binary_expression(self.0, inputs[0].dtype())
            .ok()
            .map(|(e, _)| e)
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        gpu::binary(self.0, &inputs[0].operand()?, &inputs[1].operand()?)
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (a, b) = (&inputs[0], &inputs[1]);
        let (ad, bd) = (a.operand()?, b.operand()?);
        // Write over the first input when this node is its last reader.
        let donated = out.dtype() == a.dtype()
            && a.dtype().is_float()
            && a.shape() == out.shape()
            && a.is_donatable(&ad.data);
        cpu::binary::binary(self.0, &ad, &bd, donated)
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        use BinaryOp::*;
        let (a, b) = (&inputs[0], &inputs[1]);
        if !a.dtype().is_float() {
            return no_gradient(inputs);
        }
        let zero = ct.scalar_like(0.0);
        let (ga, gb) = match self.0 {
            Add => (ct.clone(), ct.clone()),
            Subtract => (ct.clone(), ct.negative()?),
            Multiply => (ct.multiply(b)?, ct.multiply(a)?),
            Divide => (ct.divide(b)?, ct.multiply(out)?.divide(b)?.negative()?),
            Power => {
                // d/da = b a^(b-1); d/db = a^b log a (0 where a <= 0).
                let da = ct.multiply(&b.multiply(&a.power(&b.sub_scalar(1.0)?)?)?)?;
                let pos = a.greater(&zero)?;
                let log_a = pos.where_(&pos.where_(a, &a.scalar_like(1.0))?.log()?, &zero)?;
                (da, ct.multiply(&out.multiply(&log_a)?)?)
            }
            // Ties send the gradient to the first argument.
            Maximum => {
                let first = a.greater_equal(b)?;
                (first.where_(ct, &zero)?, first.where_(&zero, ct)?)
            }
            Minimum => {
                let first = a.less_equal(b)?;
                (first.where_(ct, &zero)?, first.where_(&zero, ct)?)
            }
            _ => return no_gradient(inputs),
        };
        Ok(vec![Some(ga), Some(gb)])
    }
}

/// `silu(gate) * up`, the SwiGLU activation, in one pass. Inputs: two
/// floats of the output's shape and dtype. Under autodiff it keeps only
/// its inputs (the composite `gate * sigmoid(gate) * up` keeps the sigmoid
/// and the SiLU as well: two activations' worth per MLP).
#[derive(Debug, Clone, Copy)]
pub struct Swiglu;

/// `swiglu`'s WGSL expression.
const SWIGLU: &str = "a0 * (1.0 / (1.0 + exp(-a0))) * a1";

impl Primitive for Swiglu {
    fn name(&self) -> &'static str {
        "swiglu"
    }
    fn gpu_expression(&self, _inputs: &[Array], _out: &Array) -> Option<String> {
        Some(SWIGLU.to_string())
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let (g, u) = (&inputs[0], &inputs[1]);
        let d = out.dtype();
        gpu::elementwise::map(
            "swiglu",
            SWIGLU,
            out.shape(),
            &[(&g.data()?, d), (&u.data()?, d)],
            d,
        )
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (g, u) = (inputs[0].operand()?, inputs[1].operand()?);
        cpu::binary::swiglu(&g, &u)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        // d up = ct * silu(g); d gate = ct * up * s * (1 + g * (1 - s)),
        // with s = sigmoid(g), written as s + silu * (1 - s).
        let (g, u) = (&inputs[0], &inputs[1]);
        if g.device() == crate::Device::Gpu {
            // The same operations, with each use of `s` and `silu` its own
            // node: an elementwise node with one reader is computed inline
            // by it (`eval::fusion`), so each gradient is one kernel (two,
            // where a shared `s` and `silu` made four, with two buffers),
            // at the cost of an `exp` per use, which a memory-bound kernel
            // does not notice. The values are the same bit for bit.
            let s = || g.sigmoid();
            let silu = || g.multiply(&s()?);
            let slope = s()?.add(&silu()?.multiply(&s()?.negative()?.add_scalar(1.0)?)?)?;
            return Ok(vec![
                Some(ct.multiply(u)?.multiply(&slope)?),
                Some(ct.multiply(&silu()?)?),
            ]);
        }
        let s = g.sigmoid()?;
        let silu = g.multiply(&s)?;
        let slope = s.add(&silu.multiply(&s.negative()?.add_scalar(1.0)?)?)?;
        Ok(vec![
            Some(ct.multiply(u)?.multiply(&slope)?),
            Some(ct.multiply(&silu)?),
        ])
    }
}

/// `where(cond, a, b)`: inputs broadcast to the output shape, `cond` bool.
#[derive(Debug, Clone, Copy)]
pub struct Select;

impl Primitive for Select {
    fn name(&self) -> &'static str {
        "where"
    }
    fn gpu_expression(&self, _inputs: &[Array], _out: &Array) -> Option<String> {
        gpu::elementwise::where_expression().ok()
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let [c, a, b] = [&inputs[0], &inputs[1], &inputs[2]].map(Array::operand);
        gpu::where_(&c?, &a?, &b?)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let [c, a, b] = [&inputs[0], &inputs[1], &inputs[2]].map(Array::operand);
        Ok(cpu::binary::select(&c?, &a?, &b?))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let zero = ct.scalar_like(0.0);
        let c = &inputs[0];
        Ok(vec![
            None,
            Some(c.where_(ct, &zero)?),
            Some(c.where_(&zero, ct)?),
        ])
    }
}

/// A cast computed beside its input ([`Array::remember_cast`]): inputs
/// `[x, copy]`, the value `copy`'s own data (no kernel), the gradient
/// `astype`'s, to `x` only. What `astype` builds for an array that
/// remembers its cast, so that the graph still reads as a cast of `x`
/// (gathers and gradients see through it as through `astype`).
#[derive(Debug, Clone, Copy)]
pub struct RememberedCast;

impl Primitive for RememberedCast {
    fn name(&self) -> &'static str {
        "remembered_cast"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        // The copy's data, on whichever device it lives.
        self.eval_cpu(inputs, out)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[1].data()
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        Ok(vec![
            Some(crate::ops::cast_cotangent(ct, inputs[0].dtype())?),
            None,
        ])
    }
}

/// Converts to the output dtype (and makes the result contiguous).
#[derive(Debug, Clone, Copy)]
pub struct AsType;

impl Primitive for AsType {
    fn name(&self) -> &'static str {
        "astype"
    }
    fn gpu_expression(&self, inputs: &[Array], out: &Array) -> Option<String> {
        gpu::elementwise::astype_expression(inputs[0].dtype(), out.dtype()).ok()
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        gpu::astype(&inputs[0].operand()?, out.dtype())
    }
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        Ok(cpu::copy::copy_cast(&inputs[0].operand()?, out.dtype()))
    }
    fn vjp(&self, inputs: &[Array], out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        if !inputs[0].dtype().is_float() || !out.dtype().is_float() {
            return no_gradient(inputs);
        }
        // A cotangent that is itself a pending cast of an array of the
        // input's dtype goes back as that array. (The fused loss's f32 `dw`
        // of a bf16 copy of f32 master weights: cast to bf16 for the copy
        // and back for the master, two conversions of the whole table a
        // step, and the gradient rounded.)
        Ok(vec![Some(crate::ops::cast_cotangent(
            ct,
            inputs[0].dtype(),
        )?)])
    }
}

/// The identity, through which no gradient flows.
#[derive(Debug, Clone, Copy)]
pub struct StopGradient;

impl Primitive for StopGradient {
    fn name(&self) -> &'static str {
        "stop_gradient"
    }
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        self.eval_cpu(inputs, out)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        inputs[0].data()
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        no_gradient(inputs)
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
