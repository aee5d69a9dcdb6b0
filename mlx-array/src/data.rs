//! The data a kernel sees: [`ArrayData`], a strided view into shared
//! storage, and [`Operand`], that view with the shape and dtype it is read
//! as (as candle pairs a storage with its layout), so a kernel takes one
//! value per operand.
//!
//! A leaf: it imports only dtypes, shape helpers and the memory
//! accounting. The backends read it, the arrays and primitives hand it to
//! them, and nothing here knows about either (`tests/layers.rs` checks it).

use std::fmt;
use std::sync::Arc;

use crate::dtype::{Dtype, Element};
use crate::memory::Storage;
use crate::shape::{contiguous_strides, is_row_contiguous, size_of_shape};

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

/// One operand of a kernel: an evaluated array's data with the shape and
/// dtype it is read as.
///
/// The data is owned (a reference-counted view: moving it in keeps the
/// count a kernel's donation checks see), the shape borrowed from the
/// array or the caller.
#[derive(Clone, Debug)]
pub struct Operand<'a> {
    /// The view into the operand's storage.
    pub data: ArrayData,
    /// The shape the view is read as.
    pub shape: &'a [usize],
    /// The element type.
    pub dtype: Dtype,
}

impl<'a> Operand<'a> {
    /// `data` read as an array of `shape` and `dtype`.
    pub fn new(data: ArrayData, shape: &'a [usize], dtype: Dtype) -> Operand<'a> {
        Operand { data, shape, dtype }
    }

    /// The number of elements.
    pub fn size(&self) -> usize {
        size_of_shape(self.shape)
    }

    /// The number of dimensions.
    pub fn ndim(&self) -> usize {
        self.shape.len()
    }

    /// True when the view is dense and row-major for its shape.
    pub fn is_contiguous(&self) -> bool {
        self.data.is_contiguous(self.shape)
    }

    /// The same data read with another shape of as many elements (a
    /// contiguous view, or one whose strides the caller knows fit).
    pub fn with_shape<'b>(&self, shape: &'b [usize]) -> Operand<'b> {
        Operand::new(self.data.clone(), shape, self.dtype)
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

#[cfg(test)]
mod operand_tests {
    use super::*;

    #[test]
    fn an_operand_reads_its_data_with_its_shape() {
        let shape = [2, 3];
        let x = Operand::new(
            ArrayData::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &shape),
            &shape,
            Dtype::F32,
        );
        assert_eq!((x.size(), x.ndim(), x.is_contiguous()), (6, 2, true));
        let shape_t = [3, 2];
        let t = Operand::new(x.data.view(vec![1, 3], 0), &shape_t, Dtype::F32);
        assert!(!t.is_contiguous(), "a transposed view is not row-major");
        let flat = [6];
        assert_eq!(x.with_shape(&flat).data.as_slice::<f32>(6)[5], 6.0);
    }
}
