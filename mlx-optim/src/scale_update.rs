//! The dynamic loss scale's update after a step, in one kernel (PyTorch's
//! `_amp_update_scale_`).
//!
//! From the step's summed non-finite flag, the scale and the count of good
//! steps (0-d float32 arrays on the device), one primitive computes
//! whether the step was finite, the new scale (doubled after
//! `growth_interval` good steps in a row, halved on an overflow, never
//! below the smallest normal float32), the new count, and the next step's
//! inverse scale. Op by op that was seven scalar kernels a step, each a
//! dispatch the host records (tens of microseconds on an H100's driver)
//! for four bytes of work. The four results are views of one buffer; every
//! operation is the op-by-op graph's, in float32, so they are its values
//! bit for bit.

use mlx_array::backend::gpu::custom;
use mlx_array::{Array, ArrayData, Dtype, OutputSpec, Primitive, Result};

#[cfg(feature = "conformance")]
pub(crate) mod spec;

/// The results of one update (0-d float32 arrays).
pub(crate) struct Updated {
    /// 1 when the flag was 0 (every gradient finite), else 0.
    pub finite: Array,
    /// The scale of the next step.
    pub scale: Array,
    /// Finite steps in a row since the scale last changed.
    pub good_steps: Array,
    /// `1 / scale`, what the next step unscales its gradients by.
    pub inverse: Array,
}

/// The update of `scale` and `good_steps` after a step whose summed
/// non-finite `flag` (0 when every gradient was finite) is given, growing
/// the scale after `growth_interval` good steps (at most 2^24: the count is
/// a float32). Lazy.
pub(crate) fn update(
    flag: &Array,
    scale: &Array,
    good_steps: &Array,
    growth_interval: u64,
) -> Result<Updated> {
    let inputs = [flag, scale, good_steps]
        .into_iter()
        .map(|a| a.astype(Dtype::F32)?.contiguous())
        .collect::<Result<Vec<_>>>()?;
    let spec = OutputSpec {
        shape: Vec::new(),
        dtype: Dtype::F32,
    };
    let interval = growth_interval as f32;
    let out = Array::from_primitive_outputs(ScaleUpdate { interval }, inputs, vec![spec; 4]);
    let [finite, scale, good_steps, inverse]: [Array; 4] = out.try_into().expect("four outputs");
    Ok(Updated {
        finite,
        scale,
        good_steps,
        inverse,
    })
}

/// The primitive: inputs `[flag, scale, good_steps]` (0-d float32),
/// outputs `[finite, scale', good_steps', 1 / scale']`.
#[derive(Debug)]
struct ScaleUpdate {
    /// The growth interval, exactly a float32.
    interval: f32,
}

/// One update, in the op-by-op graph's float32 operations:
/// `finite = (flag == 0)`, `good = finite ? good + 1 : 0`,
/// `grow = good >= interval`, the scale `finite ? (grow ? 2s : s) :
/// max(s / 2, smallest normal)`, the count `grow ? 0 : good`.
fn step(flag: f32, scale: f32, good: f32, interval: f32) -> [f32; 4] {
    let finite = if flag == 0.0 { 1.0 } else { 0.0 };
    let good = if finite != 0.0 { good + 1.0 } else { 0.0 };
    let grow = good >= interval;
    let kept = if grow { scale * 2.0 } else { scale };
    let halved = (scale * 0.5).max(f32::MIN_POSITIVE);
    let scale = if finite != 0.0 { kept } else { halved };
    let good = if grow { 0.0 } else { good };
    [finite, scale, good, 1.0 / scale]
}

/// The kernel: one invocation, [`step`] in WGSL.
const SOURCE_BODY: &str = "@compute @workgroup_size(1)\n\
    fn main() {\n\
    \x20   let flag = load_flag(params[0]);\n\
    \x20   let s = load_scale(params[1]);\n\
    \x20   let g0 = load_good(params[2]);\n\
    \x20   let interval = bitcast<f32>(params[3]);\n\
    \x20   let finite = select(0.0, 1.0, flag == 0.0);\n\
    \x20   let good = select(0.0, g0 + 1.0, finite != 0.0);\n\
    \x20   let grow = good >= interval;\n\
    \x20   let kept = select(s, s * 2.0, grow);\n\
    \x20   let halved = max(s * 0.5, bitcast<f32>(0x00800000u));\n\
    \x20   let s1 = select(halved, kept, finite != 0.0);\n\
    \x20   let o = params[4];\n\
    \x20   out[o] = finite;\n\
    \x20   out[o + 1u] = s1;\n\
    \x20   out[o + 2u] = select(good, 0.0, grow);\n\
    \x20   out[o + 3u] = 1.0 / s1;\n\
    }\n";

impl Primitive for ScaleUpdate {
    fn name(&self) -> &'static str {
        "loss_scale_update"
    }

    fn eval_cpu_outputs(&self, inputs: &[Array], _: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let v: Vec<f32> = inputs
            .iter()
            .map(|a| Ok(a.data()?.as_slice::<f32>(1)[0]))
            .collect::<Result<_>>()?;
        let out = ArrayData::from_slice(&step(v[0], v[1], v[2], self.interval), &[4]);
        Ok(views(&out))
    }

    fn eval_gpu_outputs(&self, inputs: &[Array], _: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let data: Vec<ArrayData> = inputs.iter().map(Array::data).collect::<Result<_>>()?;
        let out = custom::alloc(&[4], Dtype::F32)?;
        let mut meta: Vec<u32> = data.iter().map(|d| d.offset() as u32).collect();
        meta.extend([self.interval.to_bits(), out.offset() as u32]);
        let source = || {
            let mut s =
                String::from("@group(0) @binding(0) var<storage, read> params: array<u32>;\n");
            for (k, name) in ["flag", "scale", "good"].iter().enumerate() {
                s += &custom::input(name, k as u32 + 1, Dtype::F32);
            }
            s += "@group(0) @binding(4) var<storage, read_write> out: array<f32>;\n";
            s + SOURCE_BODY
        };
        let bound: Vec<&ArrayData> = data.iter().collect();
        custom::dispatch("loss_scale_update", source, &meta, &bound, &out, 1)?;
        Ok(views(&out))
    }
}

/// The four 0-d views of a result buffer.
fn views(out: &ArrayData) -> Vec<ArrayData> {
    (0..4)
        .map(|k| ArrayData::new(out.storage().clone(), Vec::new(), out.offset() + k))
        .collect()
}
