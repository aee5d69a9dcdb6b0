//! The `Primitive` trait: one node kind of the lazy graph.

use std::fmt;
use std::sync::Arc;

use crate::array::OutputSpec;
use crate::memory::Storage;
use crate::shape::{contiguous_strides, is_row_contiguous, size_of_shape};
use crate::{Array, Dtype, Element, Result};

/// A computation that produces one array from its inputs.
///
/// Ops validate their arguments, compute the output shape and dtype, and build
/// an [`Array`] whose node holds a primitive (see [`Array::from_primitive`]).
/// When the array is evaluated, every input is already evaluated and the
/// primitive's kernel runs. Other crates add primitives of their own (the
/// collectives of `mlx-dist`, for example) by implementing this trait.
pub trait Primitive: Send + Sync + fmt::Debug + 'static {
    /// A short stable name (`add`, `matmul`, `all_sum`) used in errors and in
    /// the conformance suite.
    fn name(&self) -> &'static str;

    /// Runs the CPU kernel. Every input is evaluated; `out` carries the output
    /// shape and dtype chosen when the op was built. Every single-output
    /// primitive implements it (primitives with several outputs implement
    /// [`eval_cpu_outputs`](Self::eval_cpu_outputs) instead); the default
    /// says there is no CPU kernel.
    fn eval_cpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let _ = (inputs, out);
        Err(crate::Error::eval(self.name(), "no CPU kernel"))
    }

    /// Runs the GPU kernel (WGSL through wgpu). Every input is evaluated and
    /// lives on the GPU; the result must too. The default says there is no
    /// GPU kernel: placing such a primitive on the GPU is an error at eval,
    /// never a silent CPU fallback.
    fn eval_gpu(&self, inputs: &[Array], out: &Array) -> Result<ArrayData> {
        let _ = (inputs, out);
        Err(no_gpu_kernel(self.name()))
    }

    /// For a primitive with several outputs (built with
    /// [`Array::from_primitive_outputs`]): runs the CPU kernel once for all
    /// of them, returning one buffer per entry of `outputs`, of its shape
    /// and dtype.
    fn eval_cpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let _ = (inputs, outputs);
        Err(crate::Error::eval(
            self.name(),
            "a single-output primitive, built with Array::from_primitive",
        ))
    }

    /// [`eval_cpu_outputs`](Self::eval_cpu_outputs) on the GPU.
    fn eval_gpu_outputs(&self, inputs: &[Array], outputs: &[OutputSpec]) -> Result<Vec<ArrayData>> {
        let _ = (inputs, outputs);
        Err(no_gpu_kernel(self.name()))
    }

    /// For elementwise primitives: the WGSL expression computing one output
    /// element from `a0`, `a1`, … (each input's element in its compute
    /// type), so the GPU evaluator can fuse chains of them into one kernel.
    fn gpu_expression(&self, inputs: &[Array], out: &Array) -> Option<String> {
        let _ = (inputs, out);
        None
    }

    /// The device this primitive always runs on, whatever the default
    /// device (`None`: the default). Communication-stream primitives run
    /// on the CPU.
    fn device(&self) -> Option<crate::Device> {
        match self.stream() {
            Stream::Communication => Some(crate::Device::Cpu),
            Stream::Compute => None,
        }
    }

    /// Where the evaluator runs this primitive. Compute primitives run in
    /// graph order on the calling thread; [`Stream::Communication`] ones
    /// (collectives) are handed, in graph order, to one communication thread
    /// and run there while the evaluator goes on with nodes that do not need
    /// their result, so gradient communication overlaps the backward pass.
    fn stream(&self) -> Stream {
        Stream::Compute
    }

    /// The vector-Jacobian product: given the cotangent of the output, the
    /// cotangent of each input (`None` where no gradient flows, which counts
    /// as zero). Built lazily from ops, so backward graphs evaluate together
    /// with the forward one. `output` is this primitive's own output.
    ///
    /// The default says the primitive is not differentiable; primitives that
    /// are, and those whose inputs simply get no gradient, override it.
    fn vjp(
        &self,
        inputs: &[Array],
        output: &Array,
        cotangent: &Array,
    ) -> Result<Vec<Option<Array>>> {
        let _ = (inputs, output, cotangent);
        Err(crate::Error::invalid(
            "vjp",
            format!("primitive `{}` has no vector-Jacobian product", self.name()),
        ))
    }

    /// The vector-Jacobian product of a primitive with several outputs:
    /// given the cotangent of each output (`None` where none reaches it),
    /// the cotangent of each input. `outputs` are this primitive's outputs.
    fn vjp_outputs(
        &self,
        inputs: &[Array],
        outputs: &[Array],
        cotangents: &[Option<Array>],
    ) -> Result<Vec<Option<Array>>> {
        let _ = (inputs, outputs, cotangents);
        Err(crate::Error::invalid(
            "vjp",
            format!("primitive `{}` has no vector-Jacobian product", self.name()),
        ))
    }
}

/// The stream a primitive runs on (see [`Primitive::stream`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// The evaluating thread, in graph order.
    Compute,
    /// The communication thread of the evaluating thread (one per process
    /// when a process evaluates on one thread), in the order the evaluator
    /// reaches the nodes (the same order on every rank for the same graph).
    Communication,
}

fn no_gpu_kernel(name: &str) -> crate::Error {
    crate::Error::gpu(format!(
        "primitive `{name}` has no GPU kernel; build it on the CPU (Device::Cpu)"
    ))
}

/// The `vjp` of a primitive through which no gradient flows to any input.
pub fn no_gradient(inputs: &[Array]) -> Result<Vec<Option<Array>>> {
    Ok(vec![None; inputs.len()])
}

/// The evaluated contents of an array: a view (strides and offset, in
/// elements) into a shared [`Storage`].
///
/// Views let transpose, broadcast, slicing and most reshapes share memory with
/// their input instead of copying it.
#[derive(Clone)]
pub struct ArrayData {
    storage: Arc<Storage>,
    strides: Vec<isize>,
    offset: usize,
}

impl fmt::Debug for ArrayData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArrayData")
            .field("bytes", &self.storage.capacity())
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .finish()
    }
}

impl ArrayData {
    /// A view of `storage` with the given element strides and element offset.
    pub fn new(storage: Arc<Storage>, strides: Vec<isize>, offset: usize) -> ArrayData {
        ArrayData {
            storage,
            strides,
            offset,
        }
    }

    /// A fresh, uninitialised, contiguous buffer for `shape` and `dtype`.
    pub fn alloc(shape: &[usize], dtype: Dtype) -> ArrayData {
        let bytes = size_of_shape(shape) * dtype.size_of();
        ArrayData::new(Arc::new(Storage::new(bytes)), contiguous_strides(shape), 0)
    }

    /// A contiguous buffer holding a copy of `values`.
    pub fn from_slice<T: Element>(values: &[T], shape: &[usize]) -> ArrayData {
        let mut d = ArrayData::alloc(shape, T::DTYPE);
        d.as_mut_slice::<T>(values.len()).copy_from_slice(values);
        d
    }

    /// Element strides, one per dimension (may be 0 for broadcast, negative for reversed views).
    pub fn strides(&self) -> &[isize] {
        &self.strides
    }

    /// Offset of the first element, in elements.
    pub fn offset(&self) -> usize {
        self.offset
    }

    /// The underlying allocation.
    pub fn storage(&self) -> &Arc<Storage> {
        &self.storage
    }

    /// A view sharing this storage with other strides and offset.
    pub fn view(&self, strides: Vec<isize>, offset: usize) -> ArrayData {
        ArrayData {
            storage: self.storage.clone(),
            strides,
            offset,
        }
    }

    /// True when the view is dense and row-major for `shape`.
    pub fn is_contiguous(&self, shape: &[usize]) -> bool {
        is_row_contiguous(shape, &self.strides)
    }

    /// Pointer to the first element, typed.
    pub fn ptr<T>(&self) -> *const T {
        // SAFETY: offset stays inside the allocation by construction of views.
        unsafe { (self.storage.as_ptr() as *const T).add(self.offset) }
    }

    /// The first `len` elements as a slice. Only valid for contiguous data.
    ///
    /// # Panics
    /// When the view's offset plus `len` elements of `T` do not fit in the
    /// storage: checked in every build (one comparison), as a caller's wrong
    /// length would otherwise read past the buffer.
    pub fn as_slice<T: bytemuck::Pod>(&self, len: usize) -> &[T] {
        let end = self
            .offset
            .checked_add(len)
            .and_then(|n| n.checked_mul(size_of::<T>()));
        assert!(
            end.is_some_and(|e| e <= self.storage.capacity()),
            "ArrayData::as_slice: {len} elements of {} bytes at element offset {} do not fit in a buffer of {} bytes",
            size_of::<T>(),
            self.offset,
            self.storage.capacity()
        );
        // SAFETY: in bounds (checked above), and Storage is 64-byte aligned.
        unsafe { std::slice::from_raw_parts(self.ptr::<T>(), len) }
    }

    /// The bytes of the first `len` elements of `dtype`, for contiguous data
    /// (the offset counts elements of `dtype`, not bytes).
    pub fn as_bytes(&self, dtype: Dtype, len: usize) -> &[u8] {
        let es = dtype.size_of();
        assert!(len == 0 || (self.offset + len) * es <= self.storage.capacity());
        // SAFETY: contiguous views of `len` elements lie inside the allocation.
        unsafe { std::slice::from_raw_parts(self.storage.as_ptr().add(self.offset * es), len * es) }
    }

    /// Mutable access to a buffer that other handles may still reference.
    ///
    /// # Safety
    /// The caller must guarantee that nothing reads the buffer through any
    /// other handle from now on (the evaluator's buffer donation), and that
    /// the view is contiguous with `len` elements.
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn as_mut_slice_unchecked<T: bytemuck::Pod>(&self, len: usize) -> &mut [T] {
        assert!((self.offset + len) * size_of::<T>() <= self.storage.capacity());
        // SAFETY: in bounds and aligned; exclusivity is the caller's promise.
        unsafe {
            std::slice::from_raw_parts_mut(self.storage.as_ptr().cast::<T>().add(self.offset), len)
        }
    }

    /// Mutable access to a freshly allocated buffer. Kernels call this only on
    /// data they just allocated and have not shared.
    #[allow(clippy::mut_from_ref)]
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self, len: usize) -> &mut [T] {
        assert!(
            Arc::strong_count(&self.storage) == 1,
            "kernels may only write to buffers they own"
        );
        assert!((self.offset + len) * size_of::<T>() <= self.storage.capacity());
        // SAFETY: unique owner (checked above), in bounds, aligned.
        unsafe {
            std::slice::from_raw_parts_mut(self.storage.as_ptr().cast::<T>().add(self.offset), len)
        }
    }
}

#[cfg(test)]
mod as_slice_tests {
    use super::*;

    #[test]
    fn a_length_within_the_buffer_reads_it() {
        let d = ArrayData::from_slice(&[1.0f32, 2.0, 3.0], &[3]);
        assert_eq!(d.as_slice::<f32>(3), [1.0, 2.0, 3.0]);
        assert!(d.as_slice::<f32>(0).is_empty());
    }

    /// The check is an `assert!`, not a `debug_assert!`: the message is the
    /// one release builds give too.
    #[test]
    #[should_panic(expected = "do not fit in a buffer of")]
    fn a_length_past_the_buffer_panics_in_every_build() {
        let d = ArrayData::alloc(&[4], Dtype::F32);
        let _ = d.as_slice::<f32>(1 << 20);
    }

    #[test]
    #[should_panic(expected = "do not fit in a buffer of")]
    fn a_length_that_overflows_panics_instead_of_wrapping() {
        let d = ArrayData::alloc(&[4], Dtype::F32);
        let _ = d.view(vec![1], 2).as_slice::<f32>(usize::MAX);
    }
}
