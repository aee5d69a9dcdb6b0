//! A float16 step's gradients unscaled and checked for overflow in one pass
//! per group of gradients (PyTorch's
//! `_amp_foreach_non_finite_check_and_unscale_`).
//!
//! Op by op, each gradient is multiplied by the inverse loss scale (one
//! kernel) and summed for the overflow check (one or two more), and the
//! sums are added up: about three GPU dispatches a gradient, some 120 a step
//! of the reference model, each costing the host tens of microseconds to
//! record. This primitive takes a group of gradients ([`group_size`]: as
//! many as the GPU kernel may bind) and writes each
//! one's product with the inverse scale, in float32, and one flag: 0 when
//! every product is finite, 1 otherwise. Its float32 products are the op-by-op
//! graph's bit for bit (one correctly rounded multiply).
//!
//! A float32 gradient that is a pending widening of a half-precision one
//! (the master weights' gradient: the cast's own gradient) is read in half
//! precision and widened inside the kernel, exactly as the cast would, so
//! the cast runs no kernel of its own.
//!
//! On the GPU the outputs are views of one buffer: the flag at its start,
//! then each gradient at an offset rounded up to [`ALIGN`] elements (so that
//! vector loads of the next kernels stay aligned). The buffer lives until
//! the last of them is dropped; a gated step holds every gradient until its
//! update anyway, since the gate depends on all of them.

use mlx_array::{Array, ArrayData, Dtype, OutputSpec, Primitive, Result};
use rayon::prelude::*;

mod gpu;
#[cfg(feature = "conformance")]
pub(crate) mod spec;

/// Gradients per primitive where the adapter's limit does not say more
/// (and on the CPU): the GPU kernel binds `GROUP + 3` storage buffers (the
/// dispatch's arguments, the inverse scale, the gradients and the output),
/// and 8 is the least any WebGPU adapter offers a shader stage.
pub(crate) const GROUP: usize = 5;

/// Gradients per primitive on the GPU at most (each invocation compares
/// its index with every gradient's range).
const MAX_GPU_GROUP: usize = 24;

/// Gradients per primitive for a step built on the current default device:
/// on the GPU as many as its kernel may bind (the adapter's storage-buffer
/// limit less 3: 29 on lavapipe, many more on an H100's driver), at most
/// [`MAX_GPU_GROUP`]; [`GROUP`] on the CPU, whose kernel loops over them
/// either way.
pub(crate) fn group_size() -> usize {
    if mlx_array::device::default_device() != mlx_array::Device::Gpu {
        return GROUP;
    }
    mlx_array::backend::gpu::custom::storage_buffer_limit().map_or(GROUP, |limit| {
        limit.saturating_sub(3).clamp(GROUP, MAX_GPU_GROUP)
    })
}

/// Elements per primitive at most: the GPU kernel indexes in 32 bits, and
/// counts in groups of four.
const MAX_ELEMENTS: usize = 1 << 30;

/// Offsets of the gradients in the GPU output buffer are multiples of this
/// many elements (256 bytes).
pub(crate) const ALIGN: usize = 64;

/// Elements per parallel work item on the CPU.
const CHUNK: usize = 1 << 16;

/// Each of `grads` (float32, or half-precision ones read as they are)
/// times `inverse` (a 0-d float32), in float32, and a 0-d float32 flag: 0
/// when every product is finite, a positive count otherwise. One primitive
/// per [`group_size`] gradients; their flags are added. Lazy.
pub(crate) fn unscale_and_check(grads: &[Array], inverse: &Array) -> Result<(Vec<Array>, Array)> {
    let sources: Vec<Array> = grads.iter().map(crate::widen::widened_from).collect();
    let inverse = inverse.contiguous()?;
    let mut unscaled = Vec::with_capacity(grads.len());
    let mut flag: Option<Array> = None;
    let sizes: Vec<usize> = sources.iter().map(Array::size).collect();
    for range in groups(&sizes, group_size()) {
        let inputs = std::iter::once(Ok(inverse.clone()))
            .chain(sources[range.clone()].iter().map(Array::contiguous))
            .collect::<Result<Vec<_>>>()?;
        let specs = sources[range]
            .iter()
            .map(|g| OutputSpec {
                shape: g.shape().to_vec(),
                dtype: Dtype::F32,
            })
            .chain(std::iter::once(OutputSpec {
                shape: Vec::new(),
                dtype: Dtype::F32,
            }))
            .collect();
        let mut outputs = Array::from_primitive_outputs(UnscaleCheck, inputs, specs);
        let group_flag = outputs.pop().expect("the flag");
        unscaled.extend(outputs);
        flag = Some(match flag {
            None => group_flag,
            Some(f) => f.add(&group_flag)?,
        });
    }
    let flag = match flag {
        Some(f) => f,
        None => inverse.multiply(&inverse.scalar_like(0.0))?,
    };
    Ok((unscaled, flag))
}

/// Consecutive groups of at most `per_group` arrays of these sizes and at
/// most [`MAX_ELEMENTS`] elements in all (an array larger than that alone
/// in its group, where the GPU refuses it).
pub(crate) fn groups(sizes: &[usize], per_group: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut elements = 0;
    for (i, &n) in sizes.iter().enumerate() {
        if i > start && (i - start == per_group || elements + n > MAX_ELEMENTS) {
            out.push(start..i);
            start = i;
            elements = 0;
        }
        elements += n;
    }
    if start < sizes.len() {
        out.push(start..sizes.len());
    }
    out
}

/// The primitive: inputs `[inverse, g...]` (dense), outputs the float32
/// products, then the flag.
#[derive(Debug)]
struct UnscaleCheck;

impl Primitive for UnscaleCheck {
    fn name(&self) -> &'static str {
        "unscale_check"
    }

    fn eval_cpu_outputs(&self, inputs: &[Array], _: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let inverse = inputs[0].data()?.as_slice::<f32>(1)[0];
        let mut outputs = Vec::with_capacity(inputs.len());
        let mut non_finite = false;
        for g in &inputs[1..] {
            let n = g.size();
            let data = g.data()?;
            let mut out = ArrayData::alloc(g.shape(), Dtype::F32);
            let products = out.as_mut_slice::<f32>(n);
            let bad = match g.dtype() {
                Dtype::F32 => unscale(products, data.as_slice::<f32>(n), inverse, |x| *x),
                Dtype::F16 => unscale(products, data.as_slice::<half::f16>(n), inverse, |x| {
                    x.to_f32()
                }),
                Dtype::BF16 => unscale(products, data.as_slice::<half::bf16>(n), inverse, |x| {
                    x.to_f32()
                }),
                d => {
                    return Err(mlx_array::Error::eval(
                        "unscale_check",
                        format!("gradients must be floating point, got {d:?}"),
                    ));
                }
            };
            non_finite |= bad;
            outputs.push(out);
        }
        outputs.push(ArrayData::from_slice(
            &[f32::from(u8::from(non_finite))],
            &[],
        ));
        Ok(outputs)
    }

    fn eval_gpu_outputs(&self, inputs: &[Array], _: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        gpu::run(inputs)
    }
}

/// `out = widen(x) * inverse`; true when a product is not finite.
fn unscale<T: Sync>(
    out: &mut [f32],
    x: &[T],
    inverse: f32,
    widen: impl Fn(&T) -> f32 + Sync,
) -> bool {
    out.par_chunks_mut(CHUNK)
        .zip(x.par_chunks(CHUNK))
        .map(|(o, x)| {
            let mut bad = false;
            for (o, x) in o.iter_mut().zip(x) {
                *o = widen(x) * inverse;
                bad |= !o.is_finite();
            }
            bad
        })
        .reduce(|| false, |a, b| a || b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_hold_at_most_five_arrays_and_a_billion_elements() {
        assert_eq!(groups(&[], GROUP), Vec::<std::ops::Range<usize>>::new());
        assert_eq!(groups(&[1; 12], GROUP), vec![0..5, 5..10, 10..12]);
        let big = MAX_ELEMENTS / 2;
        assert_eq!(groups(&[big, big, 1, 3], GROUP), vec![0..2, 2..4]);
        // Too large alone: its own group, which the GPU refuses.
        assert_eq!(
            groups(&[2, MAX_ELEMENTS + 1, 2], GROUP),
            vec![0..1, 1..2, 2..3]
        );
    }
}
