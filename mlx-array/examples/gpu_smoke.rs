//! Runs a few ops on the GPU and compares them with the CPU.
use mlx_array::device::with_device;
use mlx_array::{Array, Device, Dtype};

fn main() -> mlx_array::Result<()> {
    mlx_array::device::gpu_available()?;
    println!("adapter: {}", mlx_array::backend::gpu::adapter_name()?);
    let x = Array::from_slice(&[1.0f32, -2.0, 3.5, 0.25, -0.5, 8.0], &[2, 3])?;
    let y = Array::from_slice(&[0.5f32, 2.0, -1.0], &[3])?;
    let f = |x: &Array, y: &Array| -> mlx_array::Result<Array> {
        let t = x.transpose(&[1, 0])?.exp()?;
        let s = x.add(y)?.mul(&x.sigmoid()?)?;
        let b = s.astype(Dtype::BF16)?.add(&s.astype(Dtype::BF16)?)?;
        t.reshape(&[6])?.add(&b.astype(Dtype::F32)?.reshape(&[6])?)
    };
    let g = with_device(Device::Gpu, || f(&x, &y))?;
    let c = with_device(Device::Cpu, || f(&x, &y))?;
    println!("gpu {:?}\ncpu {:?}", g.to_vec::<f32>()?, c.to_vec::<f32>()?);
    Ok(())
}
