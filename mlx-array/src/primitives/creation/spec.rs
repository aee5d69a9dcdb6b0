//! Conformance specifications of the creation primitives: ranges in every
//! dtype against f64 arithmetic, and random bits against Threefry-2x32-20
//! written from the Random123 specification.

use proptest::prelude::*;

use super::{Arange, RandomBits};
use crate::conformance::*;
use crate::{ALL_DTYPES, Array, Dtype, random};

/// Every creation primitive's specification.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec::new::<Arange>("arange", arange_values, || {
            // No inputs: nothing flows back through a range.
            GradCase::new(vec![uniform(4, &[2, 3], -2.0, 2.0)], &[0], |a| {
                crate::arange(0.0, 6.0, 1.0, Dtype::F32)?
                    .reshape(&[2, 3])?
                    .add(&a[0].stop_gradient()?)
            })
            .zero()
        }),
        Spec::new::<RandomBits>("random_bits", random_bits_values, || {
            // A key computed from a float input: random bits pass no gradient to it.
            GradCase::new(vec![uniform(5, &[2], 0.0, 9.0)], &[0], |a| {
                random::bits(&a[0].astype(Dtype::U32)?, &[2, 3])?.astype(Dtype::F32)
            })
            .zero()
        }),
    ]
}

// ---------------------------------------------------------------- arange

/// `start, start + step, ...` below `stop` (above it for a negative step),
/// as `arange` gives them in `dtype`: computed in f64, then converted.
fn range(start: f64, stop: f64, step: f64, dtype: Dtype) -> Nd {
    let n = ((stop - start) / step).ceil().max(0.0) as usize;
    Nd::from_fn(&[n], |i| quantize(start + i[0] as f64 * step, dtype))
}

fn arange_values(cx: &Ctx) {
    for dtype in cx.dtypes(&ALL_DTYPES) {
        cx.runner()
            .run(
                &(-20i32..20, -20i32..20, prop_oneof![1i32..4, -4i32..-1]),
                |(start, stop, step)| {
                    let got = cx
                        .on(|| crate::arange(start as f64, stop as f64, step as f64, dtype))
                        .expect("arange");
                    // Counted by stepping, independently of the op's length formula.
                    let mut v = vec![];
                    let mut x = start;
                    while (step > 0 && x < stop) || (step < 0 && x > stop) {
                        v.push(quantize(x as f64, dtype));
                        x += step;
                    }
                    let what = format!("arange {dtype} {start} {stop} {step}");
                    cx.check(&got, &Nd::new(&[v.len()], v), dtype, 0.0, &what);
                    Ok(())
                },
            )
            .unwrap_or_else(|e| panic!("{e}"));
        // Fractional steps, long ranges, empty ones and large values; integer
        // outputs truncate toward zero and saturate (u32 from a negative start).
        for (start, stop, step) in [
            (0.0, 10.0, 1.0),
            (-7.0, 40.0, 3.0),
            (5.0, -6.0, -2.0),
            (-1.0, 1.0, 0.1),
            (0.25, 300.0, 0.75),
            (3.0, 3.0, 1.0),
            (2_000_000_000.0, 2_000_000_100.0, 7.0),
            (-3.25, 4.0, 0.5),
            (-5.0, 5.0, 1.0),
        ] {
            let got = cx
                .on(|| crate::arange(start, stop, step, dtype))
                .expect("arange");
            let rel = if dtype.is_float() { 1e-6 } else { 0.0 };
            let what = format!("arange {dtype} {start} {stop} {step}");
            cx.check(&got, &range(start, stop, step, dtype), dtype, rel, &what);
        }
    }
    for (start, stop, step) in [(0.0, 1.0, 0.0), (0.0, f64::INFINITY, 1.0)] {
        let err = cx
            .on(|| crate::arange(start, stop, step, Dtype::F32))
            .expect_err("a zero step or an infinite end")
            .to_string();
        assert!(err.contains("finite with a non-zero step"), "{err}");
    }
}

// ---------------------------------------------------------------- random_bits

/// Threefry-2x32-20 written from the Random123 specification, independently
/// of the library's version.
fn threefry(k: [u32; 2], c: [u32; 2]) -> [u32; 2] {
    const R: [u32; 8] = [13, 15, 26, 6, 17, 29, 16, 24];
    let ks = [k[0], k[1], 0x1BD11BDA ^ k[0] ^ k[1]];
    let (mut x0, mut x1) = (c[0].wrapping_add(ks[0]), c[1].wrapping_add(ks[1]));
    for r in 0..20 {
        x0 = x0.wrapping_add(x1);
        x1 = x1.rotate_left(R[r % 8]) ^ x0;
        if r % 4 == 3 {
            let s = r / 4 + 1;
            x0 = x0.wrapping_add(ks[s % 3]);
            x1 = x1.wrapping_add(ks[(s + 1) % 3]).wrapping_add(s as u32);
        }
    }
    [x0, x1]
}

/// The `n` words random_bits draws from `key`: block `i / 2`, word `i % 2`.
fn words(key: [u32; 2], n: usize) -> Vec<u32> {
    (0..n)
        .map(|i| threefry(key, [(i / 2) as u32, 0])[i % 2])
        .collect()
}

fn as_nd(shape: &[usize], words: &[u32]) -> Nd {
    Nd::new(shape, words.iter().map(|&w| w as f64).collect())
}

fn random_bits_values(cx: &Ctx) {
    cx.runner()
        .run(&(any::<u64>(), shape(3), layout()), |(seed, s, l)| {
            let kk = [(seed >> 32) as u32, seed as u32];
            // The key in any layout (a strided or reversed view).
            let k = make(&as_nd(&[2], &kk), Dtype::U32, l);
            let got = cx.on(|| random::bits(&k, &s)).expect("random_bits");
            let want = as_nd(&s, &words(kk, size(&s)));
            cx.check(
                &got,
                &want,
                Dtype::U32,
                0.0,
                &format!("random_bits {seed} {s:?} {l:?}"),
            );
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    for seed in [0u64, 42, u64::MAX, 0x1319_8a2e_0370_7344] {
        let kk = [(seed >> 32) as u32, seed as u32];
        let k = random::key(seed);
        for s in [vec![0], vec![1], vec![7], vec![3, 5], vec![2, 2]] {
            let got = cx.on(|| random::bits(&k, &s)).expect("random_bits");
            let want = as_nd(&s, &words(kk, size(&s)));
            cx.check(
                &got,
                &want,
                Dtype::U32,
                0.0,
                &format!("random_bits {seed} {s:?}"),
            );
        }
        // A key split on the device (a view at an offset into the [2, 2]
        // words), then uniform floats derived from its bits.
        let [_, k2] = cx.on(|| random::split2(&k)).expect("split");
        let kk2 = [words(kk, 4)[2], words(kk, 4)[3]];
        let got = cx.on(|| random::bits(&k2, &[9])).expect("random_bits");
        let w2 = words(kk2, 9);
        cx.check(
            &got,
            &as_nd(&[9], &w2),
            Dtype::U32,
            0.0,
            &format!("split {seed}"),
        );
        let got = cx
            .on(|| random::uniform(&k2, -1.0, 1.0, &[9], Dtype::F32))
            .expect("uniform");
        let want = Nd::new(
            &[9],
            w2.iter()
                .map(|&w| (w >> 9) as f64 / (1u64 << 23) as f64 * 2.0 - 1.0)
                .collect(),
        );
        cx.check(&got, &want, Dtype::F32, 0.0, &format!("uniform {seed}"));
    }
    // A known answer from the Random123 test vectors: key [0, 0], block 0.
    let k = Array::from_slice(&[0u32, 0], &[2]).expect("key");
    let got = cx.on(|| random::bits(&k, &[2])).expect("random_bits");
    let want = as_nd(&[2], &[0x6b20_0159, 0x99ba_4efe]);
    cx.check(&got, &want, Dtype::U32, 0.0, "Random123 known answer");
    // The primitive checks its key itself (the op checks it first).
    let bad = Array::from_slice(&[1u32, 2, 3], &[3]).expect("key");
    let err = cx
        .on(|| Array::from_primitive(RandomBits, vec![bad.clone()], vec![4], Dtype::U32))
        .eval()
        .expect_err("a three-word key")
        .to_string();
    assert!(err.contains("exactly two uint32 values"), "{err}");
    let err = cx
        .on(|| random::bits(&bad, &[4]))
        .expect_err("a three-word key")
        .to_string();
    assert!(err.contains("a key is a [2] uint32 array"), "{err}");
}
