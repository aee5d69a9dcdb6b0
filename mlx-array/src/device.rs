//! Where arrays are computed: the CPU or the GPU (through wgpu), with a
//! process-wide default and explicit transfers between the two.
//!
//! Every op is placed on the default device when it is built; inputs that
//! live on the other device reach it through a [`Transfer`] node, so crossing
//! devices is always visible in the graph and costs one copy.
//!
//! ```
//! use mlx_array::{Array, Device, Dtype};
//! let x = Array::ones(&[4], Dtype::F32);
//! assert_eq!(x.device(), Device::Cpu);
//! // With a GPU: `mlx_array::set_default_device(Device::Gpu)`, or MLX_DEVICE=gpu.
//! let y = x.to_device(Device::Cpu);   // already there: the same array
//! assert_eq!(y.id(), x.id());
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::backend::{cpu, gpu};
use crate::data::{ArrayData, Operand};
use crate::primitive::Primitive;
use crate::{Array, Error, Result};

/// A place arrays are computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Device {
    /// Multithreaded CPU kernels.
    Cpu,
    /// WGSL kernels on the adapter wgpu finds (Vulkan, Metal or DX12).
    Gpu,
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Device::Cpu => "cpu",
            Device::Gpu => "gpu",
        })
    }
}

impl FromStr for Device {
    type Err = Error;
    fn from_str(s: &str) -> Result<Device> {
        match s.trim().to_ascii_lowercase().as_str() {
            "cpu" => Ok(Device::Cpu),
            "gpu" => Ok(Device::Gpu),
            other => Err(Error::invalid(
                "device",
                format!("unknown device `{other}`; expected `cpu` or `gpu`"),
            )),
        }
    }
}

const UNSET: u8 = 0;
static DEFAULT: AtomicU8 = AtomicU8::new(UNSET);

fn encode(d: Device) -> u8 {
    match d {
        Device::Cpu => 1,
        Device::Gpu => 2,
    }
}

/// The device new ops are placed on: what [`set_default_device`] chose, else
/// the `MLX_DEVICE` environment variable (`cpu` or `gpu`), else the CPU.
///
/// An unreadable `MLX_DEVICE` falls back to the CPU with a warning on stderr;
/// call [`default_device_from_env`] to get the error instead.
pub fn default_device() -> Device {
    if let Some(d) = SCOPED.with(|s| s.get()) {
        return d;
    }
    match DEFAULT.load(Ordering::Relaxed) {
        1 => Device::Cpu,
        2 => Device::Gpu,
        _ => {
            let d = default_device_from_env().unwrap_or_else(|e| {
                eprintln!("mlx-array: {e}; using the CPU");
                Device::Cpu
            });
            let _ =
                DEFAULT.compare_exchange(UNSET, encode(d), Ordering::Relaxed, Ordering::Relaxed);
            d
        }
    }
}

/// The device `MLX_DEVICE` names (the CPU when it is unset).
pub fn default_device_from_env() -> Result<Device> {
    match std::env::var("MLX_DEVICE") {
        Ok(v) if !v.trim().is_empty() => v.parse().map_err(|_| {
            Error::invalid(
                "MLX_DEVICE",
                format!("`{v}` is not a device; use `cpu` or `gpu`"),
            )
        }),
        _ => Ok(Device::Cpu),
    }
}

/// Places every op built from now on (in any thread) on `device`.
///
/// Choosing the GPU checks that an adapter exists and fails with a clear
/// error when there is none (or when the crate was built without the `gpu`
/// feature), so a missing GPU is reported here, not at the first eval.
pub fn set_default_device(device: Device) -> Result<()> {
    if device == Device::Gpu {
        gpu_available()?;
    }
    DEFAULT.store(encode(device), Ordering::Relaxed);
    Ok(())
}

thread_local! {
    static SCOPED: std::cell::Cell<Option<Device>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with ops built on this thread placed on `device` (like MLX's
/// `with mx.stream(mx.gpu):`), then restores the previous placement.
///
/// ```
/// use mlx_array::{device::with_device, Array, Device, Dtype};
/// let y = with_device(Device::Cpu, || Array::ones(&[2], Dtype::F32).exp()).unwrap();
/// assert_eq!(y.device(), Device::Cpu);
/// ```
pub fn with_device<T>(device: Device, f: impl FnOnce() -> T) -> T {
    struct Restore(Option<Device>);
    impl Drop for Restore {
        fn drop(&mut self) {
            SCOPED.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SCOPED.with(|s| s.replace(Some(device))));
    f()
}

/// Ok when a GPU adapter can be used; otherwise the reason.
/// (Without the `gpu` feature the reason is that the crate was built
/// without it.)
pub fn gpu_available() -> Result<()> {
    gpu::context().map(|_| ())
}

/// Copies an array to another device; see [`Array::to_device`].
#[derive(Debug, Clone, Copy)]
pub struct Transfer {
    /// Where the copy lives.
    pub to: Device,
}

impl Primitive for Transfer {
    fn name(&self) -> &'static str {
        "transfer"
    }
    fn device(&self) -> Option<Device> {
        Some(self.to)
    }
    fn eval_cpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = inputs[0].operand()?;
        if !x.data.storage().is_device() {
            return Ok(x.data);
        }
        gpu::download(&x)
    }
    fn eval_gpu(&self, inputs: &[Array], _out: &Array) -> Result<ArrayData> {
        let x = &inputs[0];
        let data = x.data()?;
        if data.storage().is_device() {
            return Ok(data);
        }
        // A view that spans fewer elements than it shows (a broadcast such
        // as `zeros`, a row repeated) crosses as the elements it spans and
        // stays the same view on the GPU: zeros like a parameter upload one
        // element, not the parameter's size. Any other view is made dense
        // on the host, where the strided copy kernels are.
        if let Some(span) = compact_span(&data, x.shape()) {
            let flat = data.view(vec![1], data.offset());
            let up = gpu::upload(&Operand::new(flat, &[span], x.dtype()))?;
            return Ok(up.view(data.strides().to_vec(), 0));
        }
        let host = cpu::copy::contiguous(&Operand::new(data, x.shape(), x.dtype()));
        gpu::upload(&Operand::new(host, x.shape(), x.dtype()))
    }
    fn vjp(&self, inputs: &[Array], _out: &Array, ct: &Array) -> Result<Vec<Option<Array>>> {
        Ok(vec![Some(ct.to_device(inputs[0].device()))])
    }
}

/// The elements a non-contiguous view with non-negative strides reaches,
/// from its offset, when they are fewer than it shows (`None` otherwise,
/// and for empty arrays).
fn compact_span(data: &ArrayData, shape: &[usize]) -> Option<usize> {
    let size = crate::shape::size_of_shape(shape);
    if size == 0 || data.is_contiguous(shape) || data.strides().iter().any(|&s| s < 0) {
        return None;
    }
    let last: usize = shape
        .iter()
        .zip(data.strides())
        .map(|(&n, &s)| (n - 1) * s as usize)
        .sum();
    (last + 1 < size).then_some(last + 1)
}

impl Array {
    /// The device this array is (or will be) computed on.
    pub fn device(&self) -> Device {
        self.node.device
    }

    /// This array on `device`: itself when it is already there, otherwise a
    /// lazy [`Transfer`] node (one copy when evaluated).
    pub fn to_device(&self, device: Device) -> Array {
        if self.device() == device {
            return self.clone();
        }
        // Built directly: `from_primitive` would route the input through
        // another transfer.
        Array::with_state(
            self.shape().to_vec(),
            self.dtype(),
            device,
            crate::array::State::Pending {
                primitive: std::sync::Arc::new(Transfer { to: device }),
                inputs: vec![self.clone()],
            },
        )
    }
}

#[cfg(feature = "conformance")]
pub(crate) mod spec;
