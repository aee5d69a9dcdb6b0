//! Fused attention on bfloat16 `q`, `k`, `v`: on CPUs with AMX its products
//! take bfloat16 operands (the probabilities and score gradients rounded
//! to bfloat16 for them) with float32 sums; elsewhere, and in a child
//! process with `MLX_CPU_TUNING=amx=off`, it runs in f32 on converted operands. Either
//! way the output and the three gradients follow a float64 reference on the
//! same bfloat16 values within the error that rounding to bfloat16 where
//! the kernels round can make, bounded below term by term; with grouped
//! key/value heads too (a task per key/value head and its group on AMX).

use mlx_array::conformance::values as f64s;
use mlx_array::{Array, Dtype, fused_attention, grad, random};

/// bfloat16's unit roundoff: a rounding moves a value by at most this
/// fraction of it.
const U: f64 = 1.0 / 256.0;

/// Random bfloat16 values of `shape`.
fn values(shape: &[usize], seed: u64) -> Array {
    random::uniform(&random::key(seed), -1.5, 1.5, shape, Dtype::F32)
        .unwrap()
        .astype(Dtype::BF16)
        .unwrap()
}

/// A `[B, H, L, w]` operand's values, indexed `(b, h, l, c)`.
struct Nd {
    v: Vec<f64>,
    shape: [usize; 4],
}

impl Nd {
    fn of(x: &Array) -> Nd {
        let s = x.shape();
        Nd {
            v: f64s(&x.contiguous().unwrap()),
            shape: [s[0], s[1], s[2], s[3]],
        }
    }
    fn at(&self, b: usize, h: usize, l: usize, c: usize) -> f64 {
        let [_, hs, ls, cs] = self.shape;
        self.v[((b * hs + h) * ls + l) * cs + c]
    }
}

/// A result and the bound on its error, per element.
struct Expected {
    value: Vec<f64>,
    tolerance: Vec<f64>,
}

impl Expected {
    fn zeros(n: usize) -> Expected {
        Expected {
            value: vec![0.0; n],
            tolerance: vec![0.0; n],
        }
    }
    fn check(&self, got: &Array, what: &str) {
        assert_eq!(got.dtype(), Dtype::BF16, "{what}: the inputs' dtype");
        let got = f64s(&got.contiguous().unwrap());
        assert_eq!(got.len(), self.value.len(), "{what}");
        for (i, ((g, w), t)) in got.iter().zip(&self.value).zip(&self.tolerance).enumerate() {
            // The result is rounded to bfloat16 once more, at the end.
            let tol = t + U * w.abs() + 1e-6;
            assert!(
                (g - w).abs() <= tol,
                "{what}[{i}]: {g}, float64 says {w} (tolerance {tol})"
            );
        }
    }
}

/// The output and `dq`, `dk`, `dv` for the cotangent `ct`, in float64 (`k`
/// and `v` may have fewer heads: query head `h` reads key/value head
/// `h / (H / H_kv)`, whose gradients sum over its group), with
/// error bounds for kernels that round the probabilities `p` and the score
/// gradients `ds` to bfloat16 before their products (relative error `U`
/// each) and use the rounded output in `ds`' row term.
#[allow(clippy::needless_range_loop)] // the definition's indices, as written
fn reference(q: &Nd, k: &Nd, v: &Nd, ct: &Nd, scale: f64, causal: bool) -> [Expected; 4] {
    let [b, h, lq, d] = q.shape;
    let (hkv, lk, dv) = (k.shape[1], k.shape[2], v.shape[3]);
    let group = h / hkv;
    let ix = |heads: usize, l: usize, w: usize| {
        move |bi: usize, hi: usize, i: usize, c: usize| ((bi * heads + hi) * l + i) * w + c
    };
    let (io, iq) = (ix(h, lq, dv), ix(h, lq, d));
    let (ik, iv) = (ix(hkv, lk, d), ix(hkv, lk, dv));
    let mut o = Expected::zeros(b * h * lq * dv);
    let mut dq = Expected::zeros(b * h * lq * d);
    let mut dk = Expected::zeros(b * hkv * lk * d);
    let mut dvs = Expected::zeros(b * hkv * lk * dv);
    for bi in 0..b {
        for hi in 0..h {
            let kh = hi / group;
            for i in 0..lq {
                let seen = if causal { i + 1 + lk - lq } else { lk };
                let s: Vec<f64> = (0..seen)
                    .map(|j| {
                        scale
                            * (0..d)
                                .map(|c| q.at(bi, hi, i, c) * k.at(bi, kh, j, c))
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                // The output, and how far rounding p can move it.
                let mut o_err = vec![0.0; dv];
                for c in 0..dv {
                    let at = io(bi, hi, i, c);
                    for j in 0..seen {
                        o.value[at] += p[j] * v.at(bi, kh, j, c);
                        o_err[c] += U * (p[j] * v.at(bi, kh, j, c)).abs();
                    }
                    o.tolerance[at] = o_err[c];
                }
                let ct_i: Vec<f64> = (0..dv).map(|c| ct.at(bi, hi, i, c)).collect();
                let dot: f64 = (0..dv).map(|c| o.value[io(bi, hi, i, c)] * ct_i[c]).sum();
                let dot_err: f64 = (0..dv).map(|c| o_err[c] * ct_i[c].abs()).sum();
                for j in 0..seen {
                    let dp: f64 = (0..dv).map(|c| ct_i[c] * v.at(bi, kh, j, c)).sum();
                    let ds = scale * p[j] * (dp - dot);
                    // ds from the rounded output, then itself rounded.
                    let ds_err = scale * p[j] * dot_err + U * ds.abs();
                    for c in 0..dv {
                        let at = iv(bi, kh, j, c);
                        dvs.value[at] += p[j] * ct_i[c];
                        dvs.tolerance[at] += U * (p[j] * ct_i[c]).abs();
                    }
                    for c in 0..d {
                        let (kj, qi) = (k.at(bi, kh, j, c), q.at(bi, hi, i, c));
                        let (aq, ak) = (iq(bi, hi, i, c), ik(bi, kh, j, c));
                        dq.value[aq] += ds * kj;
                        dq.tolerance[aq] += ds_err * kj.abs();
                        dk.value[ak] += ds * qi;
                        dk.tolerance[ak] += ds_err * qi.abs();
                    }
                }
            }
        }
    }
    for e in [&mut o, &mut dq, &mut dk, &mut dvs] {
        // Float32 sums and exponentials, far below bfloat16's rounding.
        e.tolerance.iter_mut().for_each(|t| *t *= 1.05);
    }
    [o, dq, dk, dvs]
}

/// One problem: `q [B, H, Lq, d]` read through the `[B, Lq, H, d]` layout a
/// model's heads come in (or dense), `k`, `v`, and a cotangent.
fn check_problem(dims: (usize, usize, usize, usize, usize, usize), causal: bool, seed: u64) {
    check_grouped(dims, dims.1, causal, seed);
}

/// [`check_problem`] with `k` and `v` of `hkv` heads.
fn check_grouped(
    dims: (usize, usize, usize, usize, usize, usize),
    hkv: usize,
    causal: bool,
    seed: u64,
) {
    let (b, h, lq, lk, d, dv) = dims;
    let what = format!("{dims:?} key/value heads {hkv} causal {causal}");
    let q = values(&[b, lq, h, d], seed)
        .transpose(&[0, 2, 1, 3])
        .unwrap();
    let k = values(&[b, hkv, lk, d], seed + 1);
    let v = values(&[b, lk, hkv, dv], seed + 2)
        .transpose(&[0, 2, 1, 3])
        .unwrap();
    let ct = values(&[b, h, lq, dv], seed + 3)
        .astype(Dtype::F32)
        .unwrap();
    let scale = 1.0 / (d as f64).sqrt();
    let out = fused_attention(&q, &k, &v, scale, causal).unwrap();
    let loss = |x: &[Array]| {
        fused_attention(&x[0], &x[1], &x[2], scale, causal)?
            .astype(Dtype::F32)?
            .multiply(&x[3])?
            .sum_all()
    };
    let grads = grad(loss, &[0, 1, 2])(&[q.clone(), k.clone(), v.clone(), ct.clone()]).unwrap();
    let [eo, edq, edk, edv] = reference(
        &Nd::of(&q),
        &Nd::of(&k),
        &Nd::of(&v),
        &Nd::of(&ct),
        scale,
        causal,
    );
    eo.check(&out, &format!("output, {what}"));
    edq.check(&grads[0], &format!("dq, {what}"));
    edk.check(&grads[1], &format!("dk, {what}"));
    edv.check(&grads[2], &format!("dv, {what}"));
}

#[test]
fn bf16_attention_follows_float64_within_its_roundings() {
    // Whole and partial blocks of 64 queries, key counts on and off the
    // tiles' 32 columns, fewer queries than keys, head widths 32 and 64.
    check_problem((1, 2, 70, 70, 32, 64), true, 10);
    check_problem((2, 1, 40, 100, 64, 32), false, 20);
    check_problem((1, 1, 33, 97, 32, 32), true, 30);
    // Widths off the tiles: converted to f32 on every CPU.
    check_problem((1, 2, 9, 12, 8, 5), true, 40);
    // Grouped-query (4 query heads on 2 key/value heads) and multi-query.
    check_grouped((1, 4, 70, 70, 32, 64), 2, true, 50);
    check_grouped((2, 2, 40, 100, 64, 32), 1, false, 60);
    check_grouped((1, 4, 9, 12, 8, 5), 1, true, 70);
    eprintln!(
        "bfloat16 products: {:?}",
        mlx_array::backend::cpu::bf16_products()
    );
}

/// The test above in a child process with `MLX_CPU_TUNING=amx=off`: f32 on converted
/// operands (AVX512_BF16 has no attention kernel), on a CPU with AMX too.
#[test]
fn bf16_attention_follows_float64_without_amx() {
    mlx_array::conformance::rerun_without_amx(
        "bf16_attention_follows_float64_within_its_roundings",
    );
}
