//! A fused Adam(W) update: one pass over the parameter, gradient and both
//! moments instead of a dozen elementwise ops.
//!
//! Op by op, an Adam step is about thirteen elementwise kernels, each of which
//! allocates a whole tensor and streams one or two tensors through memory.
//! This primitive reads `p`, `g`, `m`, `v` once and writes `p'`, `m'`, `v'`
//! once (seven tensor passes, against memcpy's two): three outputs, the rows
//! of one buffer, which the next step writes over. It performs exactly
//! the float32 operations of the op-by-op graph in the same order, so the
//! results are bit-identical to it on the CPU.
//!
//! On the GPU the same primitives run WGSL passes with the same buffer
//! layout and in-place rule (`fused/group.rs` for whole steps,
//! `fused/gpu.rs` for a parameter kept apart from its moments): a GPU
//! training step then keeps every parameter and moment on the device, and
//! uploads no per-step scalar coefficients (they travel with the
//! dispatch's arguments). Whole steps of several parameters may share one
//! node (`fused_adam_group`, built by Adam(W)'s `apply_many` on the GPU),
//! which the GPU runs in a few dispatches instead of one per parameter.
//!
//! A float32 gradient that is a pending widening of a half-precision one
//! (a mixed-precision step's gradient of its master weights) is read in
//! half precision and widened inside the kernel, exactly as the cast would
//! (`crate::widen`): the cast runs no kernel of its own.
//!
//! A gated step (see [`crate::Gate`]) takes one more input, a float32
//! scalar computed on the device: 0 keeps the parameter and moments as
//! they are (PyTorch's fused Adam with `found_inf`), `j + 1` applies the
//! step with the `j`-th of its candidate coefficients (one per step count
//! the host cannot rule out yet). The decision is read inside the kernel,
//! so skipping costs no extra pass and no host read: the in-place kernel
//! then writes nothing, the others copy their inputs.

use mlx_array::{Array, ArrayData, Dtype, OutputSpec, Primitive, Result};
use rayon::prelude::*;

use crate::widen::{f32_values, widened_from};
use gpu::Pass;

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

/// The coefficients one fused step may use.
#[derive(Clone, Debug)]
pub(crate) struct StepCoefficients {
    /// One set per candidate step count (the first is the step's when
    /// ungated); all share `decay.is_some()` and `denominator.is_some()`.
    pub candidates: Vec<AdamCoefficients>,
    /// The primitive's last input is the gate's control scalar: 0 keeps
    /// the state, `j + 1` applies candidate `j`.
    pub gated: bool,
}

impl StepCoefficients {
    /// An ordinary step with coefficients `c`.
    pub(crate) fn always(c: AdamCoefficients) -> StepCoefficients {
        StepCoefficients {
            candidates: vec![c],
            gated: false,
        }
    }

    /// The coefficients to apply, read from the control input (the last of
    /// `data`, on the host) when gated; `None`: keep the state.
    fn chosen(&self, data: &[ArrayData]) -> Result<Option<AdamCoefficients>> {
        self.chosen_by(data.last())
    }

    /// [`StepCoefficients::chosen`] with the control's data (on the host)
    /// given apart (ignored unless gated).
    fn chosen_by(&self, control: Option<&ArrayData>) -> Result<Option<AdamCoefficients>> {
        let Some(control) = control.filter(|_| self.gated) else {
            return Ok(Some(self.candidates[0]));
        };
        let control = control.as_slice::<f32>(1)[0];
        if control == 0.0 {
            return Ok(None);
        }
        let j = control as usize;
        match self.candidates.get(j.wrapping_sub(1)) {
            Some(c) if control == j as f32 => Ok(Some(*c)),
            _ => Err(mlx_array::Error::eval(
                "fused_adam",
                format!(
                    "gate control {control} chooses none of {} candidates",
                    self.candidates.len()
                ),
            )),
        }
    }
}

/// The whole step; `.1`: also write the new parameter cast to this dtype
/// (a fourth output, in a buffer of its own).
#[derive(Debug)]
struct FusedAdam(StepCoefficients, Option<Dtype>);

impl Primitive for FusedAdam {
    fn name(&self) -> &'static str {
        "fused_adam"
    }

    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let control = self.0.gated.then(|| &inputs[4]);
        self.step_cpu(&inputs[..4], control, &outputs[0].shape)
    }

    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let mut out = step_gpu(&self.0, self.1, inputs, outputs, 1)?;
        Ok(out.remove(0))
    }
}

/// The whole steps of `count` parameters, by the GPU group kernel:
/// `inputs` are each one's `[p, g, m, v]`, then a gated step's control;
/// `outputs` each one's `p'`, `m'`, `v'` and, with `copy`, its copy.
fn step_gpu(
    c: &StepCoefficients,
    copy: Option<Dtype>,
    inputs: &[Array],
    outputs: &[OutputSpec],
    count: usize,
) -> Result<Vec<Vec<ArrayData>>> {
    let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
    let per = 3 + usize::from(copy.is_some());
    let params: Vec<group::Param> = (0..count)
        .map(|j| {
            let (ins, data) = (&inputs[4 * j..4 * j + 4], &data[4 * j..4 * j + 4]);
            group::Param {
                data,
                shape: &outputs[per * j].shape,
                in_place: rows_donated(ins, data, &[0, 2, 3], ins[0].size(), 1),
                grad: ins[1].dtype(),
            }
        })
        .collect();
    let control = c.gated.then(|| &data[data.len() - 1]);
    group::run(c, copy, &params, control)
}

/// The whole steps of several parameters in one node (see `group.rs`):
/// inputs `[p, g, m, v]` per parameter, then a gated step's control;
/// outputs `p'`, `m'`, `v'` (rows of one buffer) and, with `.1`, the copy,
/// per parameter. `.2`: the number of parameters.
#[derive(Debug)]
struct FusedAdamGroup(StepCoefficients, Option<Dtype>, usize);

impl Primitive for FusedAdamGroup {
    fn name(&self) -> &'static str {
        "fused_adam_group"
    }

    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let single = FusedAdam(self.0.clone(), self.1);
        let per = 3 + usize::from(self.1.is_some());
        let control = self.0.gated.then(|| &inputs[inputs.len() - 1]);
        let mut out = Vec::with_capacity(outputs.len());
        for j in 0..self.2 {
            let shape = &outputs[per * j].shape;
            out.extend(single.step_cpu(&inputs[4 * j..4 * j + 4], control, shape)?);
        }
        Ok(out)
    }

    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        Ok(step_gpu(&self.0, self.1, inputs, outputs, self.2)?
            .into_iter()
            .flatten()
            .collect())
    }
}

impl FusedAdam {
    /// The step of `inputs` (`[p, g, m, v]`) on the CPU, with a gated
    /// step's `control`: the three state rows, then the copy.
    fn step_cpu(
        &self,
        inputs: &[Array],
        control: Option<&Array>,
        shape: &[usize],
    ) -> Result<Vec<ArrayData>> {
        let mut out = self.state_cpu(inputs, control, shape)?;
        if let Some(d) = self.1 {
            let copy = cast_copy(&out[0], shape, d)?;
            out.push(copy);
        }
        Ok(out)
    }

    /// The step's three state rows on the CPU.
    fn state_cpu(
        &self,
        inputs: &[Array],
        control: Option<&Array>,
        shape: &[usize],
    ) -> Result<Vec<ArrayData>> {
        let n = inputs[0].size();
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let donated = rows_donated(inputs, &data, &[0, 2, 3], n, 1);
        let control = control.map(Array::data).transpose()?;
        let Some(c) = self.0.chosen_by(control.as_ref())? else {
            return Ok(kept(&data, &[0, 2, 3], donated, shape));
        };
        if donated {
            // SAFETY: `rows_donated` proved that the three rows of this buffer are
            // seen only through this node's inputs, which it consumes.
            let buf = unsafe { data[0].as_mut_slice_unchecked::<f32>(3 * n) };
            let g = &*f32_values(&data[1], inputs[1].dtype(), n);
            let (p, rest) = buf.split_at_mut(n);
            let (m, v) = rest.split_at_mut(n);
            p.par_chunks_mut(CHUNK)
                .zip(m.par_chunks_mut(CHUNK))
                .zip(v.par_chunks_mut(CHUNK))
                .enumerate()
                .for_each(|(i, ((p, m), v))| {
                    let g = &g[i * CHUNK..i * CHUNK + p.len()];
                    for j in 0..p.len() {
                        (p[j], m[j], v[j]) = element(&c, p[j], g[j], m[j], v[j]);
                    }
                });
            return Ok(rows(&data[0], shape, 3));
        }
        let [p, m, v] = [0, 2, 3].map(|i| data[i].as_slice::<f32>(n));
        let g = &*f32_values(&data[1], inputs[1].dtype(), n);
        let mut result = ArrayData::alloc(&[3 * n], Dtype::F32);
        let buf = result.as_mut_slice::<f32>(3 * n);
        let (p_out, rest) = buf.split_at_mut(n);
        let (m_out, v_out) = rest.split_at_mut(n);
        p_out
            .par_chunks_mut(CHUNK)
            .zip(m_out.par_chunks_mut(CHUNK))
            .zip(v_out.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, ((po, mo), vo))| {
                let r = i * CHUNK..(i * CHUNK + po.len());
                let (p, g, m, v) = (&p[r.clone()], &g[r.clone()], &m[r.clone()], &v[r]);
                for j in 0..po.len() {
                    (po[j], mo[j], vo[j]) = element(&c, p[j], g[j], m[j], v[j]);
                }
            });
        Ok(rows(&result, shape, 3))
    }
}

/// The new parameter `p` (dense f32 of `shape`, on the CPU) cast to `d` as
/// `astype` casts on the CPU (rounded to nearest even).
fn cast_copy(p: &ArrayData, shape: &[usize], d: Dtype) -> Result<ArrayData> {
    fn fill<T: Send>(from: &[f32], to: &mut [T], f: impl Fn(f32) -> T + Sync) {
        to.par_chunks_mut(CHUNK)
            .zip(from.par_chunks(CHUNK))
            .for_each(|(t, s)| t.iter_mut().zip(s).for_each(|(t, &s)| *t = f(s)));
    }
    let n: usize = shape.iter().product();
    let from = p.as_slice::<f32>(n);
    let mut copy = ArrayData::alloc(shape, d);
    match d {
        Dtype::F16 => fill(from, copy.as_mut_slice::<half::f16>(n), half::f16::from_f32),
        Dtype::BF16 => fill(
            from,
            copy.as_mut_slice::<half::bf16>(n),
            half::bf16::from_f32,
        ),
        _ => {
            return Err(mlx_array::Error::eval(
                "fused_adam",
                format!("a parameter's copy is float16 or bfloat16, not {d}"),
            ));
        }
    }
    Ok(copy)
}

/// The first `count` rows of `shape` in `buffer` (from its start), as one
/// output each.
fn rows(buffer: &ArrayData, shape: &[usize], count: usize) -> Vec<ArrayData> {
    let n: usize = shape.iter().product();
    let strides = mlx_array::shape::contiguous_strides(shape);
    (0..count)
        .map(|k| ArrayData::new(buffer.storage().clone(), strides.clone(), k * n))
        .collect()
}

/// The outputs of a skipped step: the state rows `rows` of `data` as they
/// are, their own buffer when `donated`, else copied into a new one (the
/// outputs are always the rows of one buffer, which the next step may
/// donate).
fn kept(data: &[ArrayData], rows_of: &[usize], donated: bool, shape: &[usize]) -> Vec<ArrayData> {
    if donated {
        return rows(&data[rows_of[0]], shape, rows_of.len());
    }
    let n: usize = shape.iter().product();
    let mut result = ArrayData::alloc(&[rows_of.len() * n], Dtype::F32);
    let buf = result.as_mut_slice::<f32>(rows_of.len() * n);
    for (k, &i) in rows_of.iter().enumerate() {
        buf[k * n..(k + 1) * n].copy_from_slice(data[i].as_slice::<f32>(n));
    }
    rows(&result, shape, rows_of.len())
}

/// True when the step may write over its inputs: the inputs `rows` are rows
/// 0, 1, ... (of `n` elements each) of one dense buffer (the previous step's
/// output) that no array but these inputs can see, and input `apart` (the
/// gradient) lies elsewhere. From the second step on, that is the case once
/// the optimizer has replaced its state (and the model its parameter), so
/// the update allocates nothing.
fn rows_donated(
    inputs: &[Array],
    data: &[ArrayData],
    rows: &[usize],
    n: usize,
    apart: usize,
) -> bool {
    let storage = data[rows[0]].storage();
    rows.iter().enumerate().all(|(k, &i)| {
        std::sync::Arc::ptr_eq(data[i].storage(), storage)
            && data[i].offset() == k * n
            && inputs[i].is_donatable_shared(&data[i], rows.len())
    }) && storage.capacity() >= rows.len() * n * size_of::<f32>()
        && !std::sync::Arc::ptr_eq(data[apart].storage(), storage)
}

/// One element of the step, in the op-by-op graph's order of float32
/// operations: `(p', m', v')` from `p`, `g`, `m`, `v`.
#[inline(always)]
fn element(c: &AdamCoefficients, p: f32, g: f32, m: f32, v: f32) -> (f32, f32, f32) {
    let (m, v) = moments(c, g, m, v);
    (parameter(c, p, m, v), m, v)
}

/// The new moments `(m', v')` of one element.
#[inline(always)]
fn moments(c: &AdamCoefficients, g: f32, m: f32, v: f32) -> (f32, f32) {
    (
        m * c.b1 + g * c.one_minus_b1,
        v * c.b2 + (g * g) * c.one_minus_b2,
    )
}

/// The new parameter of one element from its new moments.
#[inline(always)]
fn parameter(c: &AdamCoefficients, p: f32, m: f32, v: f32) -> f32 {
    let p = match c.decay {
        Some(d) => p * d,
        None => p,
    };
    let root = match c.denominator {
        Some(d) => v.sqrt() / d,
        None => v.sqrt(),
    };
    p - (m * c.numerator) / (root + c.eps)
}

/// The moments half of a step whose parameter lives apart from its moments:
/// `[g, m, v]` to `m'` and `v'` (two outputs, rows of one buffer), written
/// over `m` and `v` when they are the rows of an earlier output that nothing
/// else sees.
#[derive(Debug)]
struct FusedAdamMoments(StepCoefficients);

impl Primitive for FusedAdamMoments {
    fn name(&self) -> &'static str {
        "fused_adam_moments"
    }

    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let n = inputs[0].size();
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let shape = &outputs[0].shape;
        let donated = rows_donated(inputs, &data, &[1, 2], n, 0);
        let Some(c) = self.0.chosen(&data)? else {
            return Ok(kept(&data, &[1, 2], donated, shape));
        };
        let g = &*f32_values(&data[0], inputs[0].dtype(), n);
        let step = |m: &mut [f32], v: &mut [f32], g: &[f32], old: Option<(&[f32], &[f32])>| {
            for j in 0..m.len() {
                let (mo, vo) = old.map_or((m[j], v[j]), |(m0, v0)| (m0[j], v0[j]));
                (m[j], v[j]) = moments(&c, g[j], mo, vo);
            }
        };
        if donated {
            // SAFETY: `rows_donated` proved that both rows of this buffer
            // are seen only through this node's inputs, which it consumes.
            let buf = unsafe { data[1].as_mut_slice_unchecked::<f32>(2 * n) };
            let (m, v) = buf.split_at_mut(n);
            m.par_chunks_mut(CHUNK)
                .zip(v.par_chunks_mut(CHUNK))
                .enumerate()
                .for_each(|(i, (m, v))| step(m, v, &g[i * CHUNK..i * CHUNK + m.len()], None));
            return Ok(rows(&data[1], shape, 2));
        }
        let (m0, v0) = (data[1].as_slice::<f32>(n), data[2].as_slice::<f32>(n));
        let mut result = ArrayData::alloc(&[2 * n], Dtype::F32);
        let buf = result.as_mut_slice::<f32>(2 * n);
        let (m, v) = buf.split_at_mut(n);
        m.par_chunks_mut(CHUNK)
            .zip(v.par_chunks_mut(CHUNK))
            .enumerate()
            .for_each(|(i, (m, v))| {
                let r = i * CHUNK..i * CHUNK + m.len();
                step(m, v, &g[r.clone()], Some((&m0[r.clone()], &v0[r])));
            });
        Ok(rows(&result, shape, 2))
    }

    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let n = inputs[0].size();
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let in_place = rows_donated(inputs, &data, &[1, 2], n, 0).then_some(1);
        gpu::run(
            Pass::Moments,
            &self.0,
            &data,
            &outputs[0].shape,
            in_place,
            inputs[0].dtype(),
        )
    }
}

/// The parameter half: `[p, m', v']` (the outputs above) to `p'`.
#[derive(Debug)]
struct FusedAdamParameter(StepCoefficients);

impl Primitive for FusedAdamParameter {
    fn name(&self) -> &'static str {
        "fused_adam_parameter"
    }

    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let n = inputs[0].size();
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let Some(c) = self.0.chosen(&data)? else {
            return Ok(kept(&data, &[0], false, out.shape()).remove(0));
        };
        let (pd, md, vd) = (&data[0], &data[1], &data[2]);
        let (p, m, v) = (
            pd.as_slice::<f32>(n),
            md.as_slice::<f32>(n),
            vd.as_slice::<f32>(n),
        );
        let mut result = ArrayData::alloc(out.shape(), Dtype::F32);
        result
            .as_mut_slice::<f32>(n)
            .par_chunks_mut(CHUNK)
            .enumerate()
            .for_each(|(i, o)| {
                let at = i * CHUNK;
                for (j, o) in o.iter_mut().enumerate() {
                    *o = parameter(&c, p[at + j], m[at + j], v[at + j]);
                }
            });
        Ok(result)
    }

    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let mut p = gpu::run(
            Pass::Parameter,
            &self.0,
            &data,
            out.shape(),
            None,
            Dtype::F32,
        )?;
        Ok(p.remove(0))
    }
}

/// True when `p`, `m` and `v` are evaluated and are the rows 0, 1, 2 of
/// one buffer (an earlier fused step's outputs): a step on them can write
/// over them and allocate nothing, so stepping it in a group with other
/// parameters (which keeps every member's inputs alive until the group has
/// run) costs no memory. A first step, whose fresh state lies in separate
/// buffers, allocates every output: alone, each parameter's old state is
/// freed as soon as its step has run.
pub(crate) fn state_in_rows(p: &Array, m: &Array, v: &Array) -> bool {
    let (Ok(pd), Ok(md), Ok(vd)) = (p.data(), m.data(), v.data()) else {
        return false;
    };
    let n = p.size();
    std::sync::Arc::ptr_eq(pd.storage(), md.storage())
        && std::sync::Arc::ptr_eq(pd.storage(), vd.storage())
        && md.offset() == pd.offset() + n
        && vd.offset() == pd.offset() + 2 * n
}

/// True when the fused kernel applies: every array float32 with one shape.
/// It runs where the step is built (the default device), on the CPU or the
/// GPU, like the op-by-op graph it replaces; inputs elsewhere reach it
/// through transfers (the fresh zero moments of a first step, built on the
/// host, cross as one element each).
pub(crate) fn applies(arrays: &[&Array]) -> bool {
    arrays
        .iter()
        .all(|a| a.dtype() == Dtype::F32 && a.shape() == arrays[0].shape())
}

/// Builds the fused step; returns `(p', m', v')`, its three outputs (rows of
/// one buffer), `p'` with its cast to `copy` when given (see
/// [`adam_step_with`]).
pub(crate) fn adam_step(
    c: AdamCoefficients,
    copy: Option<Dtype>,
    param: &Array,
    grad: &Array,
    m: &Array,
    v: &Array,
) -> Result<(Array, Array, Array)> {
    adam_step_with(StepCoefficients::always(c), None, copy, param, grad, m, v)
}

/// [`adam_step`] with candidate coefficients and, when `control` is given
/// (the gate's control scalar: see [`StepCoefficients::gated`]), applied
/// only where it says so. With `copy`, the kernel also writes the new
/// parameter cast to that dtype (float16 or bfloat16), recorded as its cast
/// ([`Array::remember_cast`]): a half-precision forward pass then reads it
/// instead of casting the parameter again.
pub(crate) fn adam_step_with(
    c: StepCoefficients,
    control: Option<&Array>,
    copy: Option<Dtype>,
    param: &Array,
    grad: &Array,
    m: &Array,
    v: &Array,
) -> Result<(Array, Array, Array)> {
    let mut steps = build_steps(c, control, copy, &[[param, grad, m, v]])?;
    Ok(steps.remove(0))
}

/// [`adam_step_with`] for several parameters (each `[p, g, m, v]`) at
/// once: one node, which the GPU runs in a few dispatches (see
/// `fused/group.rs`) instead of one per parameter. Bit-identical to
/// stepping each alone.
pub(crate) fn adam_group_with(
    c: StepCoefficients,
    control: Option<&Array>,
    copy: Option<Dtype>,
    params: &[[&Array; 4]],
) -> Result<Vec<(Array, Array, Array)>> {
    build_steps(c, control, copy, params)
}

/// The node of [`adam_step_with`] (one parameter) or
/// [`adam_group_with`] (several), and its outputs per parameter.
fn build_steps(
    c: StepCoefficients,
    control: Option<&Array>,
    copy: Option<Dtype>,
    params: &[[&Array; 4]],
) -> Result<Vec<(Array, Array, Array)>> {
    let c = StepCoefficients {
        gated: control.is_some(),
        ..c
    };
    let mut inputs = Vec::with_capacity(4 * params.len() + 1);
    let mut specs = Vec::new();
    for &[param, grad, m, v] in params {
        let grad = &widened_from(grad);
        for a in [param, grad, m, v] {
            inputs.push(a.contiguous()?);
        }
        let shape = param.shape().to_vec();
        specs.extend(f32_outputs(&shape, 3));
        specs.extend(copy.map(|dtype| OutputSpec { shape, dtype }));
    }
    if let Some(control) = control {
        inputs.push(control.contiguous()?);
    }
    let outputs = match params.len() {
        1 => Array::from_primitive_outputs(FusedAdam(c, copy), inputs, specs),
        k => Array::from_primitive_outputs(FusedAdamGroup(c, copy, k), inputs, specs),
    };
    let per = 3 + usize::from(copy.is_some());
    outputs
        .chunks(per)
        .map(|o| {
            let [p, m, v] = [&o[0], &o[1], &o[2]].map(Array::clone);
            if let Some(half) = o.get(3) {
                p.remember_cast(half)?;
            }
            Ok((p, m, v))
        })
        .collect()
}

/// `count` f32 outputs of `shape`.
fn f32_outputs(shape: &[usize], count: usize) -> Vec<OutputSpec> {
    let spec = OutputSpec {
        shape: shape.to_vec(),
        dtype: Dtype::F32,
    };
    vec![spec; count]
}

/// Builds the fused step for a parameter kept apart from its moments (a
/// shard that is gathered into a new buffer after the update): returns
/// `(p', m', v')`, where `m'` and `v'` are the rows of one buffer updated in
/// place from the second step and `p'` has a buffer of its own, so that
/// dropping `p'` frees it. Bit-identical to [`adam_step`].
pub(crate) fn adam_step_apart(
    c: AdamCoefficients,
    param: &Array,
    grad: &Array,
    m: &Array,
    v: &Array,
) -> Result<(Array, Array, Array)> {
    adam_step_apart_with(StepCoefficients::always(c), None, param, grad, m, v)
}

/// [`adam_step_apart`] with candidate coefficients and, when `control` is
/// given, applied only where it says so (both halves read it).
pub(crate) fn adam_step_apart_with(
    c: StepCoefficients,
    control: Option<&Array>,
    param: &Array,
    grad: &Array,
    m: &Array,
    v: &Array,
) -> Result<(Array, Array, Array)> {
    let c = StepCoefficients {
        gated: control.is_some(),
        ..c
    };
    let shape = param.shape().to_vec();
    let grad = &widened_from(grad);
    let [param, grad, m, v] = [param, grad, m, v].map(|a| a.contiguous());
    let control = control.map(Array::contiguous).transpose()?;
    let moments = Array::from_primitive_outputs(
        FusedAdamMoments(c.clone()),
        [grad?, m?, v?].into_iter().chain(control.clone()).collect(),
        f32_outputs(&shape, 2),
    );
    let p = Array::from_primitive(
        FusedAdamParameter(c),
        [param?, moments[0].clone(), moments[1].clone()]
            .into_iter()
            .chain(control)
            .collect(),
        shape,
        Dtype::F32,
    );
    Ok((p, moments[0].clone(), moments[1].clone()))
}

mod gpu;
mod group;
#[cfg(feature = "conformance")]
mod group_spec;
#[cfg(feature = "conformance")]
pub(crate) mod spec;
