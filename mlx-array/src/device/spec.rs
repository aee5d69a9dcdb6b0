//! The conformance specification of [`Transfer`]: values cross between
//! devices bit for bit in every dtype the devices share, from any layout,
//! and the gradient crosses back.

use half::{bf16, f16};
use proptest::prelude::*;

use super::{Transfer, with_device};
use crate::conformance::*;
use crate::{ALL_DTYPES, Array, Bool8, Device, Dtype, SliceArg};

/// The transfer's specification.
pub fn specs() -> Vec<Spec> {
    vec![Spec::new::<Transfer>("transfer", transfer_values, || {
        GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |a| {
            // On the GPU: to the host, an op there, and back, so that each
            // transfer's vjp carries the cotangent to the other device. On
            // the CPU: a transfer node from the host to the host.
            let here = a[0].device();
            let on_host = with_device(Device::Cpu, || transfer(&a[0], Device::Cpu).t()?.exp())?;
            Ok(transfer(&on_host, here))
        })
    })]
}

/// `x` on `to` through a transfer node, even when it is already there (as
/// `to_device` would skip it).
fn transfer(x: &Array, to: Device) -> Array {
    if x.device() == to {
        Array::from_primitive(
            Transfer { to },
            vec![x.clone()],
            x.shape().to_vec(),
            x.dtype(),
        )
    } else {
        x.to_device(to)
    }
}

/// The raw bits of every element, read on the host in the array's own dtype.
fn bits(a: &Array) -> Vec<u64> {
    let read = || -> crate::Result<Vec<u64>> {
        Ok(match a.dtype() {
            Dtype::F32 => a
                .to_vec::<f32>()?
                .iter()
                .map(|v| v.to_bits() as u64)
                .collect(),
            Dtype::F16 => a
                .to_vec::<f16>()?
                .iter()
                .map(|v| v.to_bits() as u64)
                .collect(),
            Dtype::BF16 => a
                .to_vec::<bf16>()?
                .iter()
                .map(|v| v.to_bits() as u64)
                .collect(),
            Dtype::I32 => a
                .to_vec::<i32>()?
                .iter()
                .map(|&v| v as u32 as u64)
                .collect(),
            Dtype::U32 => a.to_vec::<u32>()?.iter().map(|&v| v as u64).collect(),
            Dtype::I64 => a.to_vec::<i64>()?.iter().map(|&v| v as u64).collect(),
            Dtype::Bool => a.to_vec::<Bool8>()?.iter().map(|v| v.0 as u64).collect(),
        })
    };
    read().expect("reading bits")
}

/// Whether `b` holds the bits of a NaN of the float `dtype`.
fn is_nan(b: u64, dtype: Dtype) -> bool {
    let (exponent, mantissa) = match dtype {
        Dtype::F32 => (0x7f80_0000, 0x007f_ffff),
        Dtype::F16 => (0x7c00, 0x03ff),
        Dtype::BF16 => (0x7f80, 0x007f),
        _ => return false,
    };
    b & exponent == exponent && b & mantissa != 0
}

/// Values that conversions would alter: signed zeros, infinities, NaNs with
/// payloads, subnormals and the extremes of each dtype.
fn specials(dtype: Dtype) -> Array {
    match dtype {
        Dtype::F32 => {
            let b: [u32; 10] = [
                0,
                0x8000_0000,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0001,
                0xffc1_2345,
                1,
                0x807f_ffff,
                0x7f7f_ffff,
                0x3f80_0000,
            ];
            Array::from_slice(&b.map(f32::from_bits), &[10])
        }
        Dtype::F16 => {
            let b: [u16; 8] = [0, 0x8000, 0x7c00, 0xfc00, 0x7e01, 1, 0x83ff, 0x7bff];
            Array::from_slice(&b.map(f16::from_bits), &[8])
        }
        Dtype::BF16 => {
            let b: [u16; 8] = [0, 0x8000, 0x7f80, 0xff80, 0x7fc1, 1, 0x807f, 0x7f7f];
            Array::from_slice(&b.map(bf16::from_bits), &[8])
        }
        Dtype::I32 => Array::from_slice(&[0, -1, i32::MIN, i32::MAX, 123_456_789], &[5]),
        Dtype::U32 => Array::from_slice(&[0, u32::MAX, 0x8000_0000, 1], &[4]),
        Dtype::I64 => Array::from_slice(&[0, -1, i64::MIN, i64::MAX], &[4]),
        Dtype::Bool => Array::from_slice(&[Bool8(0), Bool8(1)], &[2]),
    }
    .expect("sizes match")
}

/// Checks that `a` reaches the device under test through a transfer node
/// with its bits intact and, from the GPU, comes back to the host the same.
fn round_trip(cx: &Ctx, a: &Array, what: &str) {
    let here = cx.device();
    let there = transfer(a, here);
    assert_eq!(there.device(), here, "{what}: placed");
    assert_eq!(there.primitive_name(), Some("transfer"), "{what}");
    there.eval().unwrap_or_else(|e| panic!("{what}: {e}"));
    if here == Device::Gpu {
        let back = there.to_device(Device::Cpu);
        assert_eq!(back.primitive_name(), Some("transfer"), "{what}: back");
        assert_eq!(bits(&back), bits(a), "{what}: CPU -> GPU -> CPU");
    } else {
        assert_eq!(bits(&there), bits(a), "{what}: CPU -> CPU");
    }
}

fn transfer_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(&(shape(3), layout(), any::<u64>()), |(s, l, seed)| {
                let x = fill(&s, dtype, -300.0, 300.0, seed);
                let a = make(&x, dtype, l);
                let what = format!("transfer {dtype} {s:?} {l:?}");
                round_trip(cx, &a, &what);
                // Against the reference too, and to a device it is already on:
                // the same array, no node.
                let there = a.to_device(cx.device());
                cx.check(&there, &x, dtype, 0.0, &what);
                assert_eq!(there.to_device(cx.device()).id(), there.id(), "{what}");
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
        let v = specials(dtype);
        let host_view = |step| with_device(Device::Cpu, || v.slice(&[SliceArg::FULL.step(step)]));
        for (name, a) in [
            ("dense", v.clone()),
            ("reversed", host_view(-1).expect("view")),
            ("strided", host_view(2).expect("view")),
        ] {
            a.eval().expect("view evaluates");
            round_trip(cx, &a, &format!("transfer {dtype} special values {name}"));
        }
        // Views of device data go back to the host bit for bit too.
        if cx.device() == Device::Gpu {
            let g = v.to_device(Device::Gpu);
            let r = cx.on(|| g.slice(&[SliceArg::FULL.step(-1)])).expect("view");
            let want = host_view(-1).expect("view");
            // A view is made dense by the GPU's copy kernel first, which
            // computes f16 and bf16 in f32 and loses their NaN payloads
            // (0x7e01 comes back 0x7e00): only there a NaN need stay a NaN.
            let (got, want) = (bits(&r), bits(&want));
            let same = got.iter().zip(&want).all(|(&g, &w)| {
                g == w || (is_nan(g, dtype) && is_nan(w, dtype) && dtype != Dtype::F32)
            });
            assert!(
                same,
                "transfer {dtype}: a GPU view back: {got:x?}, want {want:x?}"
            );
        }
    }
    broadcasts(cx);
    // An op built on the device from a host array reads it through a transfer.
    let x = Array::ones(&[2], Dtype::F32);
    let y = cx.on(|| x.exp()).expect("exp");
    let e = std::f64::consts::E;
    cx.check(
        &y,
        &Nd::new(&[2], vec![e, e]),
        Dtype::F32,
        tol(Dtype::F32),
        "exp of a host array",
    );
}

/// Broadcast views (`full`, a row repeated) cross as the elements they
/// span, not as many as they show, and read the same on the other side.
fn broadcasts(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        let row = make(&fill(&[1, 5], dtype, -9.0, 9.0, 3), dtype, Layout::Dense);
        let cases = [
            ("full", crate::full(&[300, 7], 2.5, dtype), 1),
            (
                "row repeated",
                row.broadcast_to(&[3, 4, 5]).expect("view"),
                5,
            ),
            ("scalar", crate::full(&[], -1.0, dtype), 1),
        ];
        for (name, a, span) in cases {
            let what = format!("transfer {dtype} broadcast {name}");
            a.eval().expect("host view");
            let before = crate::backend::gpu::transfers();
            round_trip(cx, &a, &what);
            if cx.device() == Device::Gpu {
                let moved = crate::backend::gpu::transfers() - before;
                assert_eq!(
                    (moved.to_device, moved.to_device_bytes),
                    (1, (span * dtype.size_of()) as u64),
                    "{what}: uploads the {span} element(s) it spans"
                );
                assert_eq!(
                    (moved.to_host, moved.to_host_bytes),
                    (1, a.nbytes() as u64),
                    "{what}: comes back dense"
                );
            }
        }
    }
}
