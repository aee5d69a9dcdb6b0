//! Fused scaled dot-product attention (see [`crate::fused_attention`]).
//!
//! Three nodes, like the fused loss: [`Attention`] computes the output and
//! each row's logsumexp into one buffer; [`AttentionOutput`] is the output
//! as a view of it, and its vector-Jacobian product builds one
//! [`AttentionGrad`] node for `dq`, `dk` and `dv` together, which hands them
//! out as views. Nothing of size `[B, H, Lq, Lk]` outlives a kernel.

pub use crate::backend::common::attention::AttentionDims;
use crate::backend::cpu::attention;
use crate::{Array, ArrayData, Primitive, Result};

impl AttentionDims {
    /// The sizes of attending `q` to `k` and `v` (4-d, checked by the op).
    pub(crate) fn of(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> AttentionDims {
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        AttentionDims {
            b: qs[0],
            h: qs[1],
            lq: qs[2],
            lk: ks[2],
            d: qs[3],
            dv: vs[3],
            scale,
            causal,
        }
    }
}

/// `softmax(scale * q @ k^T [causal]) @ v` and the rows' logsumexps, packed
/// (f32 `[B, Lq, H, dv]` then `[B, H, Lq]`). Inputs: f32 `q`, `k`, `v`.
#[derive(Debug, Clone, Copy)]
pub struct Attention {
    /// Multiplies the scores.
    pub scale: f32,
    /// Causal mask (queries are the last positions).
    pub causal: bool,
}

impl Attention {
    fn dims(&self, inputs: &[Array]) -> AttentionDims {
        AttentionDims::of(&inputs[0], &inputs[1], &inputs[2], self.scale, self.causal)
    }
}

impl Primitive for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        crate::backend::gpu::attention(&q.data()?, &k.data()?, &v.data()?, &self.dims(inputs))
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        Ok(attention::attention(
            &q.data()?,
            &k.data()?,
            &v.data()?,
            &self.dims(inputs),
        ))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        Err(crate::Error::invalid(
            "vjp",
            "attention is differentiated through the output view it packs",
        ))
    }
}

/// The attention output `[B, H, Lq, dv]` as a view of an [`Attention`]
/// buffer. Inputs: `q`, `k`, `v`, the packed buffer.
#[derive(Debug, Clone, Copy)]
pub struct AttentionOutput(pub Attention);

impl AttentionOutput {
    fn view(&self, inputs: &[Array]) -> Result<ArrayData> {
        let dims = self.0.dims(inputs);
        let packed = inputs[3].data()?;
        let (h, lq, dv) = (dims.h, dims.lq, dims.dv);
        let strides = vec![(lq * h * dv) as isize, dv as isize, (h * dv) as isize, 1];
        Ok(packed.view(strides, packed.offset()))
    }
}

impl Primitive for AttentionOutput {
    fn name(&self) -> &'static str {
        "attention_output"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        self.view(inputs)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        self.view(inputs)
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        let dims = self.0.dims(inputs);
        let (nq, nk, nv) = dims.grad_len();
        let grads = Array::from_primitive(
            AttentionGrad(self.0),
            vec![
                inputs[0].clone(),
                inputs[1].clone(),
                inputs[2].clone(),
                inputs[3].clone(),
                ct.astype(crate::Dtype::F32)?,
            ],
            vec![nq + nk + nv],
            crate::Dtype::F32,
        );
        // Each gradient is stored `[B, L, H, w]`: a view back to `[B, H, L, w]`.
        let part = |from: usize, len: usize, like: &Array| -> Result<Array> {
            let s = like.shape();
            let g = grads.slice_axis(0, from as i64, (from + len) as i64)?;
            crate::reshape_to(&g, &[s[0], s[2], s[1], s[3]])?.transpose(&[0, 2, 1, 3])
        };
        Ok(vec![
            Some(part(0, nq, &inputs[0])?),
            Some(part(nq, nk, &inputs[1])?),
            Some(part(nq + nk, nv, &inputs[2])?),
            None,
        ])
    }
}

/// `dq`, `dk`, `dv` of an [`Attention`] for the cotangent of its output,
/// packed (f32 `[B, Lq, H, d]`, `[B, Lk, H, d]`, `[B, Lk, H, dv]`). Inputs:
/// `q`, `k`, `v`, the packed forward buffer, the f32 cotangent.
#[derive(Debug, Clone, Copy)]
pub struct AttentionGrad(pub Attention);

impl Primitive for AttentionGrad {
    fn name(&self) -> &'static str {
        "attention_grad"
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let d = |i: usize| inputs[i].data();
        crate::backend::gpu::attention_grad(
            &d(0)?,
            &d(1)?,
            &d(2)?,
            &d(3)?,
            &d(4)?,
            &self.0.dims(inputs),
        )
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let d = |i: usize| inputs[i].data();
        Ok(attention::attention_grad(
            &d(0)?,
            &d(1)?,
            &d(2)?,
            &d(3)?,
            &d(4)?,
            &self.0.dims(inputs),
        ))
    }
    fn vjp(&self, _inputs: &[Array], _out: &Array, _ct: &Array) -> Result<Vec<Option<Array>>> {
        Err(crate::Error::invalid(
            "vjp",
            "attention_grad has no vector-Jacobian product (no second derivatives)",
        ))
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
