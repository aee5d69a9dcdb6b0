//! Reading an array's values on the host without stalling the device that
//! computes them: [`Array::read_later`] queues the copy at once and
//! [`HostRead`] waits for it only when its values are asked for (as MLX's
//! `async_eval` or a PyTorch copy with `non_blocking=True` and an event).

use crate::backend::gpu::readback::{self, PendingDownload};
use crate::{Array, Dtype, Element, Result};

/// An array's values on their way to the host (see [`Array::read_later`]).
pub struct HostRead(Read);

enum Read {
    /// The values are on the host already.
    Host(Array),
    /// A copy from the GPU, queued behind the work that computes it.
    Device(PendingDownload, Vec<usize>, Dtype),
}

impl Array {
    /// Evaluates this array and starts copying it to the host; the returned
    /// [`HostRead`] waits for that copy alone when read. Work queued on
    /// the GPU after this call (the next training step, say) does not
    /// delay the read, so the host can record it in the meantime.
    ///
    /// ```
    /// use mlx_array::Array;
    /// let loss = Array::from_slice(&[1f32, 2., 3.], &[3]).unwrap().sum(&[0], false).unwrap();
    /// let read = loss.read_later().unwrap();
    /// // ... build and evaluate the next step here ...
    /// assert_eq!(read.item::<f32>().unwrap(), 6.0);
    /// ```
    pub fn read_later(&self) -> Result<HostRead> {
        self.eval()?;
        let x = self.operand()?;
        Ok(HostRead(if x.data.storage().is_device() {
            Read::Device(readback::start(&x)?, self.shape().to_vec(), self.dtype())
        } else {
            Read::Host(self.clone())
        }))
    }
}

impl HostRead {
    /// The values in row-major order, converted to `T` (as
    /// [`Array::to_vec`]), waiting for the copy if it is still under way.
    pub fn to_vec<T: Element>(self) -> Result<Vec<T>> {
        self.into_host()?.to_vec()
    }

    /// The single element, converted to `T` (as [`Array::item`]).
    pub fn item<T: Element>(self) -> Result<T> {
        self.into_host()?.item()
    }

    /// The values as an array on the host, once they are there.
    fn into_host(self) -> Result<Array> {
        Ok(match self.0 {
            Read::Host(a) => a,
            Read::Device(pending, shape, dtype) => {
                Array::from_data(pending.finish()?, shape, dtype)
            }
        })
    }
}
