//! The limit of the crate's GPU kernels' 32-bit indices.

use mlx_array::{ArrayData, Result};

/// Fails naming `op` unless a kernel over `elements` elements and the
/// buffers of `data` indexes every element in 32 bits (with room for its
/// rows or groups of four: at most `u32::MAX / 4` elements, and buffers of
/// at most 2^32 four-byte words).
pub(crate) fn check<'a>(
    op: &str,
    elements: usize,
    data: impl IntoIterator<Item = &'a ArrayData>,
) -> Result<()> {
    if elements > u32::MAX as usize / 4
        || data
            .into_iter()
            .any(|d| d.storage().capacity() / 4 > u32::MAX as usize)
    {
        return Err(mlx_array::Error::gpu(format!(
            "{op}: {elements} elements exceed the GPU kernel's 32-bit indices"
        )));
    }
    Ok(())
}
