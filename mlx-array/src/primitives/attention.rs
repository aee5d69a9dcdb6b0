//! Fused scaled dot-product attention (see [`crate::fused_attention`]).
//!
//! Two primitives with several outputs: [`Attention`] computes the output
//! and each row's logsumexp in one pass; its vector-Jacobian product builds
//! one [`AttentionGrad`] node for `dq`, `dk` and `dv` together. Nothing of
//! size `[B, H, Lq, Lk]` outlives a kernel.

use std::sync::Arc;

pub use crate::backend::common::attention::AttentionDims;
use crate::backend::cpu::attention;
use crate::{Array, ArrayData, Dtype, OutputSpec, Primitive, Result};

impl AttentionDims {
    /// The sizes of attending `q` to `k` and `v` (4-d, checked by the op;
    /// `k` and `v` may have fewer heads, dividing `q`'s).
    pub(crate) fn of(q: &Array, k: &Array, v: &Array, scale: f32, causal: bool) -> AttentionDims {
        let (qs, ks, vs) = (q.shape(), k.shape(), v.shape());
        AttentionDims {
            b: qs[0],
            h: qs[1],
            hkv: ks[1],
            lq: qs[2],
            lk: ks[2],
            d: qs[3],
            dv: vs[3],
            scale,
            causal,
        }
    }
}

/// `softmax(scale * q @ k^T [causal]) @ v` (`[B, H, Lq, dv]`, `k` and `v`
/// of `H` or fewer heads, query head `h` reading key/value head
/// `h / (H / H_kv)`, in place) and the rows'
/// logsumexps (`[B, H, Lq]`), both f32: two outputs of one kernel, which
/// writes them into one buffer (the output stored `[B, Lq, H, dv]`). For
/// half-precision inputs a third output is the first in their dtype,
/// stored in the same order, rounded once as a cast would: what the model
/// reads on, so that no cast runs after the kernel (the gradient reads the
/// f32 output).
/// Inputs: `q`, `k`, `v` of one dtype, f32, f16 or bf16 (bf16 products the
/// CPU runs on AMX tiles where it has them; elsewhere the kernel converts
/// them to f32; the GPU kernels read them as they are and compute in f32,
/// or f16 on fragments).
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

    /// The node's outputs for `q`, `k`, `v` (4-d, of one float dtype, as
    /// [`crate::fused_attention`] checks): the f32 output and logsumexps,
    /// and for half-precision inputs the output in their dtype.
    pub fn build(self, q: &Array, k: &Array, v: &Array) -> Vec<Array> {
        let (qs, vs) = (q.shape(), v.shape());
        let out_shape = vec![qs[0], qs[1], qs[2], vs[3]];
        let spec = |shape: Vec<usize>, dtype| OutputSpec { shape, dtype };
        let mut outputs = vec![
            spec(out_shape.clone(), Dtype::F32),
            spec(vec![qs[0], qs[1], qs[2]], Dtype::F32),
        ];
        if q.dtype().is_half() {
            outputs.push(spec(out_shape, q.dtype()));
        }
        Array::from_primitive_outputs(self, vec![q.clone(), k.clone(), v.clone()], outputs)
    }
}

/// The output and logsumexp views of a forward buffer, and the half
/// output's view of its own buffer.
fn forward_outputs(
    packed: ArrayData,
    half: Option<ArrayData>,
    dims: &AttentionDims,
) -> Vec<ArrayData> {
    let (h, lq, dv) = (dims.h, dims.lq, dims.dv);
    let (n_out, _) = dims.packed_len();
    let strides = vec![(lq * h * dv) as isize, dv as isize, (h * dv) as isize, 1];
    let lse = packed.view(
        vec![(h * lq) as isize, lq as isize, 1],
        packed.offset() + n_out,
    );
    let mut outputs = vec![packed.view(strides.clone(), packed.offset()), lse];
    outputs.extend(half.map(|half| half.view(strides, half.offset())));
    outputs
}

/// The forward buffer behind an output and its logsumexps (views of one
/// buffer, as [`forward_outputs`] hands them out).
fn forward_buffer(out: &Array, lse: &Array, dims: &AttentionDims) -> Result<ArrayData> {
    let (o, l) = (out.data()?, lse.data()?);
    let (n_out, _) = dims.packed_len();
    if !Arc::ptr_eq(o.storage(), l.storage()) || l.offset() != o.offset() + n_out {
        return Err(crate::Error::eval(
            "attention_grad",
            "the output and logsumexps must come from one attention node",
        ));
    }
    Ok(o.view(vec![1], o.offset()))
}

impl Primitive for Attention {
    fn name(&self) -> &'static str {
        "attention"
    }
    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        let dims = self.dims(inputs);
        let (dtype, [q, k, v]) = (q.dtype(), [q.data()?, k.data()?, v.data()?]);
        let half = outputs.get(2).map(|o| o.dtype);
        let (packed, half) = crate::backend::gpu::attention(&q, &k, &v, &dims, dtype, half)?;
        Ok(forward_outputs(packed, half, &dims))
    }
    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        let dims = self.dims(inputs);
        let packed = attention::attention(&q.data()?, &k.data()?, &v.data()?, &dims, q.dtype());
        // The half output: the f32 one's elements rounded, in their order.
        let (n_out, _) = dims.packed_len();
        let half = outputs
            .get(2)
            .map(|o| crate::backend::cpu::copy::cast_f32_prefix(&packed, n_out, o.dtype));
        Ok(forward_outputs(packed, half, &dims))
    }
    fn vjp_outputs(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        if cotangents[1].is_some() {
            return Err(crate::Error::invalid(
                "vjp",
                "attention's logsumexps are not differentiable",
            ));
        }
        // The output's cotangent: the f32 output's, the half output's, or
        // their sum where both were read.
        let ct = match (&cotangents[0], cotangents.get(2).and_then(Option::as_ref)) {
            (None, None) => return Ok(vec![None, None, None]),
            (Some(ct), None) | (None, Some(ct)) => ct.clone(),
            (Some(wide), Some(half)) => wide.add(&half.astype(Dtype::F32)?)?,
        };
        let ct = &ct;
        let (q, k, v) = (&inputs[0], &inputs[1], &inputs[2]);
        // The gradients in the inputs' dtype, stored by the kernel in its
        // `[B, L, H, w]` order (the heads' transposes back to the
        // projections' layout are then views).
        let spec = |like: &Array| OutputSpec {
            shape: like.shape().to_vec(),
            dtype: q.dtype(),
        };
        let grads = Array::from_primitive_outputs(
            AttentionGrad(*self),
            vec![
                q.clone(),
                k.clone(),
                v.clone(),
                outputs[0].clone(),
                outputs[1].clone(),
                half_or_f32_cotangent(ct, q.dtype())?,
            ],
            vec![spec(q), spec(k), spec(v)],
        );
        Ok(grads.into_iter().map(Some).collect())
    }
}

/// The cotangent as the gradient kernels read it: in the inputs' `dtype`
/// as it is (a half-precision model casts no cotangent), also where it is
/// a pending widening of such an array to f32 (the output's cast handing
/// its cotangent back: the same values, exactly); else as f32.
fn half_or_f32_cotangent(ct: &Array, dtype: Dtype) -> Result<Array> {
    if ct.dtype() == dtype {
        return Ok(ct.clone());
    }
    if ct.dtype() == Dtype::F32
        && dtype.is_half()
        && let Some(half) = crate::ops::pending_cast_from(ct, dtype)
    {
        return Ok(half);
    }
    ct.astype(Dtype::F32)
}

/// `dq`, `dk`, `dv` of an [`Attention`] for the cotangent of its output
/// (`dk`, `dv` of `k`'s and `v`'s shapes: with grouped key/value heads,
/// each the sum over its group of query heads, summed in the kernels):
/// three outputs of one kernel in the inputs' dtype (computed in f32,
/// rounded once as stored, `[B, L, H, w]` in one buffer). Inputs: `q`,
/// `k`, `v` (of one float dtype), the forward output and logsumexps, the
/// cotangent (f32 or the inputs' dtype).
#[derive(Debug, Clone, Copy)]
pub struct AttentionGrad(pub Attention);

impl AttentionGrad {
    /// The three gradients as `[B, H, L, w]` views of the kernel's buffer.
    fn outputs(grads: ArrayData, dims: &AttentionDims) -> Vec<ArrayData> {
        let (nq, nk, _) = dims.grad_len();
        let view = |at: usize, h: usize, l: usize, w: usize| {
            grads.view(
                vec![(l * h * w) as isize, w as isize, (h * w) as isize, 1],
                grads.offset() + at,
            )
        };
        vec![
            view(0, dims.h, dims.lq, dims.d),
            view(nq, dims.hkv, dims.lk, dims.d),
            view(nq + nk, dims.hkv, dims.lk, dims.dv),
        ]
    }
}

impl Primitive for AttentionGrad {
    fn name(&self) -> &'static str {
        "attention_grad"
    }
    fn eval_gpu_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[OutputSpec],
    ) -> Result<Vec<ArrayData>> {
        let dims = self.0.dims(inputs);
        let forward = forward_buffer(&inputs[3], &inputs[4], &dims)?;
        let dtype = inputs[0].dtype();
        let [q, k, v] = [inputs[0].data()?, inputs[1].data()?, inputs[2].data()?];
        let d_out = inputs[5].operand()?;
        let grads =
            crate::backend::gpu::attention_grad(&q, &k, &v, &forward, &d_out, &dims, dtype)?;
        Ok(Self::outputs(grads, &dims))
    }
    fn eval_cpu_outputs(
        &self,
        inputs: &[Array],
        _outputs: &[OutputSpec],
    ) -> Result<Vec<ArrayData>> {
        let d = |i: usize| inputs[i].data();
        let dims = self.0.dims(inputs);
        let forward = forward_buffer(&inputs[3], &inputs[4], &dims)?;
        let dtype = inputs[0].dtype();
        // The kernels read an f32 cotangent: a half-precision one is
        // widened (exactly) first.
        let d_out = match inputs[5].dtype() {
            Dtype::F32 => d(5)?,
            _ => crate::backend::cpu::copy::copy_cast(&inputs[5].operand()?, Dtype::F32),
        };
        let grads =
            attention::attention_grad(&d(0)?, &d(1)?, &d(2)?, &forward, &d_out, &dims, dtype);
        let grads = if dtype == Dtype::F32 {
            grads
        } else {
            let (nq, nk, nv) = dims.grad_len();
            crate::backend::cpu::copy::copy_cast(
                &crate::Operand::new(grads, &[nq + nk + nv], Dtype::F32),
                dtype,
            )
        };
        Ok(Self::outputs(grads, &dims))
    }
    fn vjp_outputs(
        &self,
        _inputs: &[Array],
        _outputs: &[Array],
        _cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        Err(crate::primitive::no_second_derivatives("attention_grad"))
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
