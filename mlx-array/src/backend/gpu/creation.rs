//! Creation kernels: `arange` and Threefry-2x32 `random_bits`.

use super::codegen;
use super::device::context;
use super::dispatch::dispatch;
use super::indexing::{Meta, entry, header};
use super::pool::{alloc, supported};
use crate::data::{ArrayData, Operand};
use crate::{Dtype, Result};

/// `start + i * step` for `n` elements of `dtype`. Integer outputs whose
/// start, step and every value are exact integers in range are computed in
/// integer arithmetic (exact); the rest in f32 with the f64 start and step
/// each split into two f32 parts, then converted as the CPU's `from_f64`
/// does (saturating, NaN to zero).
pub fn arange(start: f64, step: f64, n: usize, dtype: Dtype) -> Result<ArrayData> {
    supported(dtype)?;
    codegen::check_size("arange", n, &[])?;
    let last = start + n.saturating_sub(1) as f64 * step;
    let (lo, hi) = match dtype {
        Dtype::I32 => (i32::MIN as f64, i32::MAX as f64),
        Dtype::U32 => (0.0, u32::MAX as f64),
        _ => (1.0, 0.0),
    };
    let integral = start.fract() == 0.0
        && step.fract() == 0.0
        && start.min(last) >= lo
        && start.max(last) <= hi
        && step.abs() <= u32::MAX as f64;
    let split = |v: f64| {
        let h = v as f32;
        [h.to_bits(), ((v - h as f64) as f32).to_bits()]
    };
    let mut meta = vec![n as u32];
    let (key, body) = if integral {
        meta.extend([start as i64 as u32, step as i64 as u32]);
        let e = match dtype {
            Dtype::I32 => "bitcast<i32>(params[1]) + i32(i) * bitcast<i32>(params[2])",
            _ => "params[1] + i * params[2]",
        };
        (
            format!("arange:int:{dtype}"),
            format!("    store_out(i, {e});\n"),
        )
    } else {
        meta.extend(split(start));
        meta.extend(split(step));
        // Finite start and step: `v` is never NaN.
        let conv = match dtype {
            Dtype::I32 => {
                "select(select(i32(v), 2147483647, v >= 2147483648.0), -2147483647 - 1, v < -2147483648.0)"
            }
            Dtype::U32 => "select(u32(max(v, 0.0)), 4294967295u, v >= 4294967296.0)",
            Dtype::Bool => "select(0u, 1u, v != 0.0)",
            _ => "v",
        };
        let body = format!(
            "    let fi = f32(i);
    let v = bitcast<f32>(params[1]) + (fi * bitcast<f32>(params[3]) + (bitcast<f32>(params[2]) + fi * bitcast<f32>(params[4])));
    store_out(i, {conv});\n"
        );
        (format!("arange:float:{dtype}"), body)
    };
    let pipeline = context()?.pipeline(&key, || {
        let mut s = header();
        s.push_str(&codegen::output(1, dtype));
        s.push_str(&entry());
        s.push_str(&body);
        s.push_str("}\n");
        s
    })?;
    let out = alloc(&[n], dtype)?;
    dispatch(
        &pipeline,
        &meta,
        &[],
        &out,
        n * dtype.size_of(),
        codegen::packed(dtype),
        n,
    )?;
    Ok(out)
}

const ROTATIONS: [[u32; 4]; 2] = [[13, 15, 26, 6], [17, 29, 16, 24]];

/// Threefry-2x32 (20 rounds) in WGSL, unrolled exactly as the CPU's
/// `threefry2x32`: `fn threefry(k0, k1, c0, c1) -> vec2<u32>`.
fn threefry_wgsl() -> String {
    let mut s = String::from(
        "fn rotl(x: u32, r: u32) -> u32 { return (x << r) | (x >> (32u - r)); }\n\
         fn threefry(k0: u32, k1: u32, c0: u32, c1: u32) -> vec2<u32> {\n\
         let ks = array<u32, 3>(k0, k1, k0 ^ k1 ^ 0x1BD11BDAu);\n\
         var x0 = c0 + ks[0];\n    var x1 = c1 + ks[1];\n",
    );
    for round in 0..5 {
        for r in ROTATIONS[round % 2] {
            s.push_str(&format!("    x0 = x0 + x1; x1 = rotl(x1, {r}u) ^ x0;\n"));
        }
        let i = round + 1;
        s.push_str(&format!(
            "    x0 = x0 + ks[{}]; x1 = x1 + ks[{}] + {i}u;\n",
            i % 3,
            (i + 1) % 3
        ));
    }
    s.push_str("    return vec2<u32>(x0, x1);\n}\n");
    s
}

/// `n` random words from the `[2]` uint32 `key` (any view): word `i` is
/// half of block `i / 2`, bit-identical to the CPU's `random_bits`.
pub fn random_bits(key: &Operand<'_>, shape: &[usize]) -> Result<ArrayData> {
    let (n, key_shape, key) = (crate::shape::size_of_shape(shape), key.shape, &key.data);
    let blocks = n.div_ceil(2);
    codegen::check_size("random_bits", n, &[key])?;
    let mut m = Meta(vec![blocks as u32, n as u32, 0]);
    m.0[2] = m.view(key, key_shape);
    let pipeline = context()?.pipeline("random_bits", || {
        let mut s = header();
        s.push_str(&codegen::input("k", 1, Dtype::U32));
        s.push_str(&codegen::output(2, Dtype::U32));
        s.push_str(&threefry_wgsl());
        s.push_str(&entry());
        s.push_str(
            "    let kb = params[2];\n    let b = threefry(load_k(vloc(0u, kb)), load_k(vloc(1u, kb)), i, 0u);\n    store_out(2u * i, b.x);\n    if (2u * i + 1u < params[1]) { store_out(2u * i + 1u, b.y); }\n}\n",
        );
        s
    })?;
    let out = alloc(shape, Dtype::U32)?;
    dispatch(&pipeline, &m.0, &[key], &out, n * 4, false, blocks)?;
    Ok(out)
}
