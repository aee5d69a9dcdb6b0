//! Random numbers from explicit keys (counter-based, reproducible across runs
//! and thread counts).
//!
//! ```
//! use mlx_array::{random, Dtype};
//! let k = random::key(42);
//! let [k1, k2] = random::split2(&k).unwrap();
//! let x = random::normal(&k1, &[3, 4], Dtype::F32).unwrap();
//! let y = random::normal(&k1, &[3, 4], Dtype::F32).unwrap();
//! assert_eq!(x.to_vec::<f32>().unwrap(), y.to_vec::<f32>().unwrap());
//! # let _ = k2;
//! ```

use crate::primitives::creation::RandomBits;
use crate::{Array, Dtype, Error, Result};

/// A key: a `[2]` uint32 array made from a seed.
pub fn key(seed: u64) -> Array {
    Array::from_slice(&[(seed >> 32) as u32, seed as u32], &[2]).expect("two values for shape [2]")
}

fn check_key(k: &Array) -> Result<()> {
    if k.dtype() != Dtype::U32 || k.shape() != [2] {
        return Err(Error::invalid(
            "random",
            format!(
                "a key is a [2] uint32 array, got {:?} {}",
                k.shape(),
                k.dtype()
            ),
        ));
    }
    Ok(())
}

/// Uniformly random uint32 words of `shape`.
pub fn bits(k: &Array, shape: &[usize]) -> Result<Array> {
    check_key(k)?;
    Ok(Array::from_primitive(
        RandomBits,
        vec![k.clone()],
        shape.to_vec(),
        Dtype::U32,
    ))
}

/// `num` new keys derived from `k`, as a `[num, 2]` array.
pub fn split(k: &Array, num: usize) -> Result<Array> {
    bits(k, &[num, 2])
}

/// `num` new keys derived from `k`, each a `[2]` key.
pub fn split_keys(k: &Array, num: usize) -> Result<Vec<Array>> {
    let ks = split(k, num)?;
    (0..num as i64)
        .map(|i| ks.slice_axis(0, i, i + 1)?.reshape(&[2]))
        .collect()
}

/// Two new keys derived from `k`.
pub fn split2(k: &Array) -> Result<[Array; 2]> {
    let mut ks = split_keys(k, 2)?;
    let b = ks.pop().expect("two keys");
    Ok([ks.pop().expect("two keys"), b])
}

/// Uniform float32 in `[0, 1)` with 23 random mantissa bits, plus an offset in ulps.
fn unit(k: &Array, shape: &[usize], half_ulp: bool) -> Result<Array> {
    let b = bits(k, shape)?
        .right_shift(&Array::scalar(9u32))?
        .astype(Dtype::F32)?;
    let b = if half_ulp { b.add_scalar(0.5)? } else { b };
    b.mul_scalar(1.0 / (1u32 << 23) as f64)
}

/// Uniform in `[low, high)`.
pub fn uniform(k: &Array, low: f64, high: f64, shape: &[usize], dtype: Dtype) -> Result<Array> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "uniform",
            dtype,
            "needs a floating point dtype",
        ));
    }
    if low.partial_cmp(&high) != Some(std::cmp::Ordering::Less) {
        return Err(Error::invalid(
            "uniform",
            format!("low {low} must be below high {high}"),
        ));
    }
    unit(k, shape, false)?
        .mul_scalar(high - low)?
        .add_scalar(low)?
        .astype(dtype)
}

/// Standard normal samples (Box-Muller on two independent uniform streams).
pub fn normal(k: &Array, shape: &[usize], dtype: Dtype) -> Result<Array> {
    if !dtype.is_float() {
        return Err(Error::dtype(
            "normal",
            dtype,
            "needs a floating point dtype",
        ));
    }
    let [k1, k2] = split2(k)?;
    let u1 = unit(&k1, shape, true)?; // in (0, 1): log is finite
    let u2 = unit(&k2, shape, false)?;
    let r = u1.log()?.mul_scalar(-2.0)?.sqrt()?;
    r.multiply(&u2.mul_scalar(std::f64::consts::TAU)?.cos()?)?
        .astype(dtype)
}

/// Normal samples with mean `loc` and standard deviation `scale`.
pub fn normal_with(
    k: &Array,
    shape: &[usize],
    dtype: Dtype,
    loc: f64,
    scale: f64,
) -> Result<Array> {
    normal(k, shape, Dtype::F32)?
        .mul_scalar(scale)?
        .add_scalar(loc)?
        .astype(dtype)
}

/// Integers uniform in `[low, high)`.
pub fn randint(k: &Array, low: i64, high: i64, shape: &[usize], dtype: Dtype) -> Result<Array> {
    if !dtype.is_integer() {
        return Err(Error::dtype("randint", dtype, "needs an integer dtype"));
    }
    if low >= high {
        return Err(Error::invalid(
            "randint",
            format!("low {low} must be below high {high}"),
        ));
    }
    let span = (high - low) as f64;
    let u = unit(k, shape, false)?
        .mul_scalar(span)?
        .floor()?
        .minimum(&Array::scalar((span - 1.0) as f32))?;
    u.astype(Dtype::I64)?
        .add(&Array::scalar(low))?
        .astype(dtype)
}

/// Samples category indices (uint32) from unnormalised log-probabilities along `axis`
/// (the Gumbel-max trick).
pub fn categorical(k: &Array, logits: &Array, axis: i32) -> Result<Array> {
    let u = unit(k, logits.shape(), true)?;
    let gumbel = u.log()?.negative()?.log()?.negative()?;
    logits.astype(Dtype::F32)?.add(&gumbel)?.argmax(axis, false)
}

/// `true` with probability `p` (broadcast to `shape`).
pub fn bernoulli(k: &Array, p: &Array, shape: &[usize]) -> Result<Array> {
    let p = p.astype(Dtype::F32)?.broadcast_to(shape)?;
    unit(k, shape, false)?.less(&p)
}
