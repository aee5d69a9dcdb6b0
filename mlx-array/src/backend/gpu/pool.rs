//! GPU arrays on the context's buffer pool (`buffers`): made fresh
//! ([`alloc`]), the dtypes they can hold ([`supported`]), and the buffer
//! behind one ([`buffer_of`]).

use std::sync::Arc;

use super::buffers::DeviceBuffer;
use super::device::context;
use crate::data::ArrayData;
use crate::memory::Storage;
use crate::shape::contiguous_strides;
use crate::{Dtype, Error, Result};

/// A fresh, contiguous GPU array of `shape` and `dtype`.
pub(crate) fn alloc(shape: &[usize], dtype: Dtype) -> Result<ArrayData> {
    supported(dtype)?;
    let bytes = crate::shape::size_of_shape(shape) * dtype.size_of();
    let c = context()?;
    let buffer = c.pool.buffer(&c.device, &c.limits, &c.info.name, bytes)?;
    Ok(ArrayData::new(
        Arc::new(Storage::Device(Box::new(buffer))),
        contiguous_strides(shape),
        0,
    ))
}

/// Fails for dtypes the GPU backend cannot hold.
pub(crate) fn supported(dtype: Dtype) -> Result<()> {
    if dtype == Dtype::I64 {
        return Err(Error::gpu(
            "i64 has no WGSL type (it would need the `shader-int64` feature, which this backend \
             does not use); cast to i32 or build the op on the CPU",
        ));
    }
    Ok(())
}

/// The GPU buffer behind `data` (which must live on the GPU).
pub(crate) fn buffer_of(data: &ArrayData) -> Result<&wgpu::Buffer> {
    data.storage()
        .device_buffer::<DeviceBuffer>()
        .map(DeviceBuffer::raw)
        .ok_or_else(|| Error::gpu("a GPU kernel was given an array that lives on the CPU"))
}
