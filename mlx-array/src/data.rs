//! The data a kernel sees: [`ArrayData`], a strided view into shared
//! storage, and [`Operand`], that view with the shape and dtype it is read
//! as (as candle pairs a storage with its layout), so a kernel takes one
//! value per operand.
//!
//! A leaf: it imports only dtypes, shape helpers and the memory
//! accounting. The backends read it, the arrays and primitives hand it to
//! them, and nothing here knows about either (`cargo xtask layers` checks
//! it against `layers.toml`).

use std::fmt;
use std::sync::Arc;

use crate::dtype::{Dtype, Element};
use crate::error::Result;
use crate::memory::Storage;
use crate::shape::{checked_bytes_of_shape, contiguous_strides, is_row_contiguous, size_of_shape};

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
    ///
    /// # Panics
    /// When the shape's bytes overflow a `usize` ([`ArrayData::try_alloc`]
    /// says so as an error).
    pub fn alloc(shape: &[usize], dtype: Dtype) -> ArrayData {
        ArrayData::try_alloc(shape, dtype).unwrap_or_else(|e| panic!("ArrayData::alloc: {e}"))
    }

    /// [`ArrayData::alloc`], or an error naming the shape when its number
    /// of bytes overflows a `usize` (never a wrapped, short buffer).
    pub fn try_alloc(shape: &[usize], dtype: Dtype) -> Result<ArrayData> {
        let bytes = checked_bytes_of_shape(shape, dtype.size_of())?;
        Ok(ArrayData::new(
            Arc::new(Storage::new(bytes)),
            contiguous_strides(shape),
            0,
        ))
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
        self.check_fits("as_slice", len, size_of::<T>());
        // SAFETY: in bounds (checked above), and Storage is 64-byte aligned.
        unsafe { std::slice::from_raw_parts(self.ptr::<T>(), len) }
    }

    /// Panics, naming `what`, unless the view's offset plus `len` elements
    /// of `element_bytes` fit in the storage: checked arithmetic in every
    /// build (one comparison), as a wrapped product would pass for a short
    /// length and hand out a slice past the buffer.
    fn check_fits(&self, what: &str, len: usize, element_bytes: usize) {
        let end = self
            .offset
            .checked_add(len)
            .and_then(|n| n.checked_mul(element_bytes));
        assert!(
            end.is_some_and(|e| e <= self.storage.capacity()),
            "ArrayData::{what}: {len} elements of {element_bytes} bytes at element offset {} do not fit in a buffer of {} bytes",
            self.offset,
            self.storage.capacity()
        );
    }

    /// The bytes of the first `len` elements of `dtype`, for contiguous data
    /// (the offset counts elements of `dtype`, not bytes).
    ///
    /// # Panics
    /// As [`ArrayData::as_slice`], when the elements do not fit in the
    /// storage (or their count overflows).
    pub fn as_bytes(&self, dtype: Dtype, len: usize) -> &[u8] {
        let es = dtype.size_of();
        if len == 0 {
            return &[];
        }
        self.check_fits("as_bytes", len, es);
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
    ///
    /// # Panics
    /// As [`ArrayData::as_slice`], when the elements do not fit in the
    /// storage (or their count overflows).
    pub unsafe fn as_mut_slice_unchecked<T: bytemuck::Pod>(&self, len: usize) -> &mut [T] {
        self.check_fits("as_mut_slice_unchecked", len, size_of::<T>());
        // SAFETY: in bounds and aligned; exclusivity is the caller's promise.
        unsafe {
            std::slice::from_raw_parts_mut(self.storage.as_ptr().cast::<T>().add(self.offset), len)
        }
    }

    /// Mutable access to a freshly allocated buffer. Kernels call this only on
    /// data they just allocated and have not shared.
    ///
    /// # Panics
    /// When another handle shares the buffer, or as [`ArrayData::as_slice`]
    /// when the elements do not fit in the storage (or their count overflows).
    #[allow(clippy::mut_from_ref)]
    pub fn as_mut_slice<T: bytemuck::Pod>(&mut self, len: usize) -> &mut [T] {
        assert!(
            Arc::strong_count(&self.storage) == 1,
            "kernels may only write to buffers they own"
        );
        self.check_fits("as_mut_slice", len, size_of::<T>());
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

/// Sizes whose arithmetic overflows a `usize` are errors (or, for a
/// caller's length past its buffer, a panic saying so), never a wrapped
/// product and a short buffer.
#[cfg(test)]
mod overflow_tests {
    use super::*;
    use crate::shape::{checked_size_of_shape, size_of_shape};

    const HUGE: usize = 1 << (usize::BITS - 1);

    #[test]
    fn a_shape_whose_product_overflows_is_an_error_naming_it() {
        let e = checked_size_of_shape(&[HUGE, 2]).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{:?}", [HUGE, 2])) && e.contains("overflow"),
            "{e}"
        );
        assert_eq!(checked_size_of_shape(&[HUGE, 1]).unwrap(), HUGE);
        // A zero anywhere makes no elements, however large the rest.
        assert_eq!(checked_size_of_shape(&[HUGE, 2, 0]).unwrap(), 0);
        assert_eq!(checked_size_of_shape(&[]).unwrap(), 1);
    }

    #[test]
    #[should_panic(expected = "more elements than a usize counts")]
    fn size_of_shape_panics_on_overflow_instead_of_wrapping() {
        let _ = size_of_shape(&[HUGE, 2]);
    }

    #[test]
    fn allocating_a_shape_of_too_many_bytes_is_an_error() {
        // The elements fit in a usize, their bytes do not.
        let e = ArrayData::try_alloc(&[HUGE / 2, 3], Dtype::F32)
            .unwrap_err()
            .to_string();
        assert!(e.contains("bytes") && e.contains("overflow"), "{e}");
        let e = ArrayData::try_alloc(&[HUGE, 2], Dtype::F16)
            .unwrap_err()
            .to_string();
        assert!(e.contains("overflow"), "{e}");
        let d = ArrayData::try_alloc(&[2, 3], Dtype::F32).unwrap();
        assert!(d.storage().capacity() >= 24);
    }

    #[test]
    #[should_panic(expected = "do not fit in a buffer of")]
    fn as_bytes_of_a_length_that_overflows_panics() {
        let d = ArrayData::alloc(&[4], Dtype::F32).view(vec![1], 2);
        // (2 + 2^62) * 4 wraps to 8, which fits the buffer's 16 bytes.
        let _ = d.as_bytes(Dtype::F32, HUGE / 2);
    }

    #[test]
    #[should_panic(expected = "do not fit in a buffer of")]
    fn as_mut_slice_of_a_length_that_overflows_panics() {
        let mut d = ArrayData::alloc(&[4], Dtype::F32).view(vec![1], 2);
        let _ = d.as_mut_slice::<f32>(HUGE / 2);
    }

    #[test]
    #[should_panic(expected = "do not fit in a buffer of")]
    fn as_mut_slice_unchecked_of_a_length_that_overflows_panics() {
        let d = ArrayData::alloc(&[4], Dtype::F32).view(vec![1], 2);
        // SAFETY: nothing else reads `d`'s buffer; the call panics first.
        let _ = unsafe { d.as_mut_slice_unchecked::<f32>(HUGE / 2) };
    }

    #[test]
    fn lengths_that_fit_still_read_and_write() {
        let mut d = ArrayData::alloc(&[4], Dtype::F32);
        d.as_mut_slice::<f32>(4)
            .copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        let v = d.view(vec![1], 2);
        let want: &[u8] = bytemuck::cast_slice(&[3.0f32, 4.0]);
        assert_eq!(v.as_bytes(Dtype::F32, 2), want);
        assert!(v.as_bytes(Dtype::F32, 0).is_empty());
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
