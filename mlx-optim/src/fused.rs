//! A fused Adam(W) update: one pass over the parameter, gradient and both
//! moments instead of a dozen elementwise ops.
//!
//! Op by op, an Adam step is about thirteen elementwise kernels, each of which
//! allocates a whole tensor and streams one or two tensors through memory.
//! This primitive reads `p`, `g`, `m`, `v` once and writes `p'`, `m'`, `v'`
//! once (seven tensor passes, against memcpy's two), into one buffer of shape
//! `[3, ...]` whose three rows are handed out as views. It performs exactly
//! the float32 operations of the op-by-op graph in the same order, so the
//! results are bit-identical to it.

use mlx_array::{Array, ArrayData, Dtype, Primitive, Result};
use rayon::prelude::*;

/// Elements per parallel work item.
const CHUNK: usize = 1 << 16;

/// The scalar coefficients of one Adam(W) step, already rounded to float32
/// the way MLX rounds them.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamCoefficients {
    /// Weight-decay factor `1 - lr * wd` applied to the parameter first, if any.
    pub decay: Option<f32>,
    pub b1: f32,
    pub one_minus_b1: f32,
    pub b2: f32,
    pub one_minus_b2: f32,
    /// Multiplies `m'`: `lr`, or `lr / (1 - b1^t)` with bias correction.
    pub numerator: f32,
    /// Divides `sqrt(v')`: `sqrt(1 - b2^t)` with bias correction.
    pub denominator: Option<f32>,
    pub eps: f32,
}

#[derive(Debug)]
struct FusedAdam(AdamCoefficients);

impl Primitive for FusedAdam {
    fn name(&self) -> &'static str {
        "fused_adam"
    }

    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let n = inputs[0].size();
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let [p, g, m, v] = [0, 1, 2, 3].map(|i| data[i].as_slice::<f32>(n));
        let mut result = ArrayData::alloc(out.shape(), Dtype::F32);
        let buf = result.as_mut_slice::<f32>(3 * n);
        let (p_out, rest) = buf.split_at_mut(n);
        let (m_out, v_out) = rest.split_at_mut(n);
        let c = self.0;
        p_out
            .par_chunks_mut(CHUNK)
            .zip(m_out.par_chunks_mut(CHUNK))
            .zip(v_out.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, ((po, mo), vo))| {
                let r = i * CHUNK..(i * CHUNK + po.len());
                step(
                    &c,
                    (&p[r.clone()], &g[r.clone()], &m[r.clone()], &v[r]),
                    po,
                    mo,
                    vo,
                );
            });
        Ok(result)
    }
}

/// The elementwise body, in the op-by-op graph's order of float32 operations.
#[inline(always)]
fn step(
    c: &AdamCoefficients,
    (p, g, m, v): (&[f32], &[f32], &[f32], &[f32]),
    po: &mut [f32],
    mo: &mut [f32],
    vo: &mut [f32],
) {
    let n = po.len();
    let (p, g, m, v, mo, vo) = (
        &p[..n],
        &g[..n],
        &m[..n],
        &v[..n],
        &mut mo[..n],
        &mut vo[..n],
    );
    for i in 0..n {
        let gi = g[i];
        let mi = m[i] * c.b1 + gi * c.one_minus_b1;
        let vi = v[i] * c.b2 + (gi * gi) * c.one_minus_b2;
        let pi = match c.decay {
            Some(d) => p[i] * d,
            None => p[i],
        };
        let root = match c.denominator {
            Some(d) => vi.sqrt() / d,
            None => vi.sqrt(),
        };
        po[i] = pi - (mi * c.numerator) / (root + c.eps);
        mo[i] = mi;
        vo[i] = vi;
    }
}

/// True when the fused kernel applies: every array float32 with one shape.
pub(crate) fn applies(arrays: &[&Array]) -> bool {
    arrays
        .iter()
        .all(|a| a.dtype() == Dtype::F32 && a.shape() == arrays[0].shape())
}

/// Builds the fused step; returns `(p', m', v')`, views of one buffer.
pub(crate) fn adam_step(
    c: AdamCoefficients,
    param: &Array,
    grad: &Array,
    m: &Array,
    v: &Array,
) -> Result<(Array, Array, Array)> {
    let shape = param.shape().to_vec();
    let inputs = [param, grad, m, v]
        .iter()
        .map(|a| a.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let mut out_shape = vec![3];
    out_shape.extend_from_slice(&shape);
    let all = Array::from_primitive(FusedAdam(c), inputs, out_shape, Dtype::F32);
    let row =
        |i: i64| -> Result<Array> { mlx_array::reshape_to(&all.slice_axis(0, i, i + 1)?, &shape) };
    Ok((row(0)?, row(1)?, row(2)?))
}
