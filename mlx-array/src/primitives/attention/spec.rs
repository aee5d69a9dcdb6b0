//! Conformance specifications of the fused attention: its outputs (the
//! output and each row's logsumexp, and for half-precision inputs the
//! output in their dtype, which `fused_attention` returns), and
//! `dq`, `dk`, `dv` that its vector-Jacobian product computes, each against
//! an f64 reference on the CPU and the GPU. Grouped-query and multi-query
//! problems (fewer key/value heads than query heads) are checked against
//! the multi-head reference of `k` and `v` repeated over each group, the
//! gradients of a key/value head summed over its group.

use proptest::prelude::*;

use super::{Attention, AttentionGrad};
use crate::conformance::*;
use crate::{Array, Dtype};

/// Every attention primitive's specification.
pub fn specs() -> Vec<Spec> {
    vec![
        Spec::new::<Attention>("attention", attention_values, || {
            // Causal with fewer queries than keys (a cache), then plain, with
            // q and v read through transposed views; then grouped-query (4
            // query heads on those 2 key/value heads, causal) and
            // multi-query (2 query heads on 1, plain).
            GradCase::new(
                vec![
                    uniform(25, &[1, 2, 3, 4], -1.0, 1.0),
                    uniform(26, &[1, 2, 5, 4], -1.0, 1.0),
                    uniform(27, &[1, 5, 2, 3], -1.0, 1.0),
                    uniform(28, &[1, 4, 3, 4], -1.0, 1.0),
                    uniform(29, &[1, 1, 5, 4], -1.0, 1.0),
                    uniform(30, &[1, 1, 5, 3], -1.0, 1.0),
                ],
                &[0, 1, 2, 3, 4, 5],
                |a| {
                    let v = a[2].transpose(&[0, 2, 1, 3])?;
                    let causal = crate::fused_attention(&a[0], &a[1], &v, 0.7, true)?;
                    let q = a[0].swapaxes(1, 2)?.contiguous()?.swapaxes(1, 2)?;
                    let plain = crate::fused_attention(&q, &a[1], &v, 0.4, false)?;
                    let grouped = crate::fused_attention(&a[3], &a[1], &v, 0.6, true)?;
                    let multi = crate::fused_attention(&a[0], &a[4], &a[5], 0.5, false)?;
                    crate::concatenate(&[causal, plain, grouped, multi], 1)
                },
            )
        }),
        Spec::new::<AttentionGrad>("attention_grad", grad_values, || {
            // The gradient, differentiated again: no second derivatives.
            GradCase::new(qkv_inputs(), &[0, 1, 2], |a| {
                let loss =
                    |x: &[Array]| crate::fused_attention(&x[0], &x[1], &x[2], 0.7, true)?.sum_all();
                Ok(crate::grad(loss, &[0, 1, 2])(a)?[0].clone())
            })
            .refused()
        }),
    ]
}

/// Small f32 `q`, `k`, `v` (fewer queries than keys, values narrower).
fn qkv_inputs() -> Vec<Array> {
    vec![
        uniform(25, &[1, 2, 3, 4], -1.0, 1.0),
        uniform(26, &[1, 2, 5, 4], -1.0, 1.0),
        uniform(27, &[1, 2, 5, 3], -1.0, 1.0),
    ]
}

/// The f64 reference of attention: the output, each row's logsumexp, and
/// the gradients for the cotangent `ct` of the output.
struct Reference {
    o: Nd,
    lse: Nd,
    dq: Nd,
    dk: Nd,
    dv: Nd,
}

/// The reference of grouped-query attention (`k` and `v` with fewer heads
/// than `q`): the multi-head [`reference`] of `k` and `v` repeated over
/// each group of query heads, the gradients of each key/value head summed
/// over its group.
fn grouped_reference(q: &Nd, k: &Nd, v: &Nd, ct: &Nd, scale: f64, causal: bool) -> Reference {
    let (h, hkv) = (q.shape[1], k.shape[1]);
    if h == hkv {
        return reference(q, k, v, ct, scale, causal);
    }
    assert!(
        h.is_multiple_of(hkv),
        "{h} query heads, {hkv} key/value heads"
    );
    let group = h / hkv;
    let repeat = |x: &Nd| {
        let mut shape = x.shape.clone();
        shape[1] = h;
        Nd::from_fn(&shape, |i| x.at(&[i[0], i[1] / group, i[2], i[3]]))
    };
    let mut r = reference(q, &repeat(k), &repeat(v), ct, scale, causal);
    let sum = |g: &Nd, like: &Nd| {
        Nd::from_fn(&like.shape, |i| {
            (0..group)
                .map(|j| g.at(&[i[0], i[1] * group + j, i[2], i[3]]))
                .sum()
        })
    };
    r.dk = sum(&r.dk, k);
    r.dv = sum(&r.dv, v);
    r
}

/// The multi-head reference (`q`, `k`, `v` of the same heads).
fn reference(q: &Nd, k: &Nd, v: &Nd, ct: &Nd, scale: f64, causal: bool) -> Reference {
    let (b, h, lq, d) = (q.shape[0], q.shape[1], q.shape[2], q.shape[3]);
    assert_eq!(k.shape[1], h, "the multi-head reference");
    let (lk, dv) = (k.shape[2], v.shape[3]);
    let zeros = |shape: &[usize]| Nd::from_fn(shape, |_| 0.0);
    let mut r = Reference {
        o: zeros(&[b, h, lq, dv]),
        lse: zeros(&[b, h, lq]),
        dq: zeros(&q.shape),
        dk: zeros(&k.shape),
        dv: zeros(&v.shape),
    };
    for bi in 0..b {
        for hi in 0..h {
            for i in 0..lq {
                let seen = if causal { i + 1 + lk - lq } else { lk };
                let s: Vec<f64> = (0..seen)
                    .map(|j| {
                        scale
                            * (0..d)
                                .map(|c| q.at(&[bi, hi, i, c]) * k.at(&[bi, hi, j, c]))
                                .sum::<f64>()
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                let at = r.lse.flat_index(&[bi, hi, i]);
                r.lse.v[at] = m + z.ln();
                let p: Vec<f64> = s.iter().map(|x| (x - m).exp() / z).collect();
                let dp: Vec<f64> = (0..seen)
                    .map(|j| {
                        (0..dv)
                            .map(|c| ct.at(&[bi, hi, i, c]) * v.at(&[bi, hi, j, c]))
                            .sum()
                    })
                    .collect();
                let mean: f64 = p.iter().zip(&dp).map(|(a, b)| a * b).sum();
                for j in 0..seen {
                    let ds = p[j] * (dp[j] - mean);
                    for c in 0..dv {
                        let o = r.o.flat_index(&[bi, hi, i, c]);
                        r.o.v[o] += p[j] * v.at(&[bi, hi, j, c]);
                        let g = r.dv.flat_index(&[bi, hi, j, c]);
                        r.dv.v[g] += p[j] * ct.at(&[bi, hi, i, c]);
                    }
                    for c in 0..d {
                        let gq = r.dq.flat_index(&[bi, hi, i, c]);
                        r.dq.v[gq] += scale * ds * k.at(&[bi, hi, j, c]);
                        let gk = r.dk.flat_index(&[bi, hi, j, c]);
                        r.dk.v[gk] += scale * ds * q.at(&[bi, hi, i, c]);
                    }
                }
            }
        }
    }
    r
}

/// One random problem: `(b, h, lq, extra keys)`, `(d, dv)`, causal, the
/// layout of `q` and `k`, a seed.
type Draw = (
    (usize, usize, usize, usize),
    (usize, usize),
    bool,
    Layout,
    u64,
);

/// One random grouped-query problem: `(b, key/value heads, query heads
/// per key/value head, lq, extra keys)`, `(d, dv)`, causal, the layout of
/// `q` and `k`, a seed.
type GroupedDraw = (
    (usize, usize, usize, usize, usize),
    (usize, usize),
    bool,
    Layout,
    u64,
);

fn grouped_strategy() -> impl Strategy<Value = GroupedDraw> {
    (
        (1usize..3, 1usize..3, 2usize..4, 1usize..6, 0usize..4),
        (1usize..6, 1usize..6),
        any::<bool>(),
        layout(),
        any::<u64>(),
    )
}

fn strategy() -> impl Strategy<Value = Draw> {
    (
        (1usize..3, 1usize..3, 1usize..6, 0usize..4),
        (1usize..6, 1usize..6),
        any::<bool>(),
        layout(),
        any::<u64>(),
    )
}

/// A problem's inputs: `q`, `k`, `v` and an output cotangent.
struct Problem {
    q: Nd,
    k: Nd,
    v: Nd,
    ct: Nd,
    scale: f64,
    causal: bool,
}

impl Problem {
    fn random(draw: &Draw, dtype: Dtype) -> Problem {
        let ((b, h, lq, extra), (d, dv), causal, _, seed) = *draw;
        let lk = lq + extra;
        Problem {
            q: fill(&[b, h, lq, d], dtype, -1.5, 1.5, seed),
            k: fill(&[b, h, lk, d], dtype, -1.5, 1.5, seed ^ 1),
            v: fill(&[b, h, lk, dv], dtype, -1.5, 1.5, seed ^ 2),
            ct: fill(&[b, h, lq, dv], dtype, -1.0, 1.0, seed ^ 3),
            scale: 0.6,
            causal,
        }
    }

    /// A grouped-query problem of `draw`: `k` and `v` of fewer heads.
    fn random_grouped(draw: &GroupedDraw, dtype: Dtype) -> Problem {
        let ((b, hkv, group, lq, extra), dims, causal, l, seed) = *draw;
        let p = Problem::random(&((b, hkv * group, lq, extra), dims, causal, l, seed), dtype);
        p.grouped(hkv, dtype, seed)
    }

    /// The problem with `k` and `v` of `hkv` heads instead (fresh values
    /// of `dtype` from `seed`), so that groups of query heads share them.
    fn grouped(mut self, hkv: usize, dtype: Dtype, seed: u64) -> Problem {
        let mut ks = self.k.shape.clone();
        let mut vs = self.v.shape.clone();
        assert!(ks[1].is_multiple_of(hkv));
        (ks[1], vs[1]) = (hkv, hkv);
        self.k = fill(&ks, dtype, -1.5, 1.5, seed ^ 5);
        self.v = fill(&vs, dtype, -1.5, 1.5, seed ^ 6);
        self
    }

    /// `[b, h, lq, d]` queries against `lk` keys and values of width `dv`.
    fn fixed([b, h, lq, lk, d, dv]: [usize; 6], scale: f64, causal: bool, seed: u64) -> Problem {
        Problem {
            q: fill(&[b, h, lq, d], Dtype::F32, -1.0, 1.0, seed),
            k: fill(&[b, h, lk, d], Dtype::F32, -1.0, 1.0, seed + 1),
            v: fill(&[b, h, lk, dv], Dtype::F32, -1.0, 1.0, seed + 2),
            ct: fill(&[b, h, lq, dv], Dtype::F32, -1.0, 1.0, seed + 3),
            scale,
            causal,
        }
    }

    /// [`Problem::fixed`] with inputs of `dtype` (exact in it).
    fn fixed_in(dtype: Dtype, dims: [usize; 6], causal: bool, seed: u64) -> Problem {
        let [b, h, lq, lk, d, dv] = dims;
        Problem {
            q: fill(&[b, h, lq, d], dtype, -1.0, 1.0, seed),
            k: fill(&[b, h, lk, d], dtype, -1.0, 1.0, seed + 1),
            v: fill(&[b, h, lk, dv], dtype, -1.0, 1.0, seed + 2),
            ct: fill(&[b, h, lq, dv], dtype, -1.0, 1.0, seed + 3),
            scale: 0.2,
            causal,
        }
    }

    fn reference(&self) -> Reference {
        grouped_reference(&self.q, &self.k, &self.v, &self.ct, self.scale, self.causal)
    }

    fn what(&self, dtype: Dtype, l: Layout) -> String {
        format!(
            "{dtype} q {:?} k {:?} v {:?} {l:?} scale {} causal {}",
            self.q.shape, self.k.shape, self.v.shape, self.scale, self.causal
        )
    }
}

/// Fixed f32 problems: several blocks of query rows, a cache of earlier
/// keys, a head wider than the SIMD lanes, more queries than keys without a
/// mask, and the shapes of the old GPU suite.
fn fixed_problems() -> Vec<(Problem, (f64, f64))> {
    let blocks = [(150, 150, true), (70, 200, true), (130, 97, false)]
        .into_iter()
        .map(|(lq, lk, causal)| {
            (
                Problem::fixed([1, 2, lq, lk, 40, 24], 0.3, causal, 5),
                (1e-4, 1e-4),
            )
        });
    // The GPU's tiles (16 to 64 rows) and one row more, the widest heads
    // (which take smaller tiles), widths that are not multiples of 16, and
    // more keys than queries under the causal mask.
    let tiles = [
        ([1, 1, 129, 129, 64, 64], true),
        ([2, 1, 64, 64, 64, 64], false),
        ([1, 1, 33, 70, 128, 128], true),
        ([1, 1, 17, 40, 100, 72], false),
        ([1, 1, 20, 83, 72, 100], true),
    ]
    .into_iter()
    .map(|(dims, causal)| (Problem::fixed(dims, 0.125, causal, 9), (1e-4, 1e-4)));
    let small = [
        ([2, 2, 3, 5, 4, 3], 0.5, true),
        ([2, 2, 3, 5, 4, 3], 0.5, false),
        ([1, 2, 4, 6, 5, 3], 0.7, true),
        ([1, 2, 7, 6, 5, 3], 0.7, false),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (dims, scale, causal))| {
        let rel = tol(Dtype::F32) * 8.0;
        (
            Problem::fixed(dims, scale, causal, 40 + 4 * i as u64),
            (rel, rel * 2.0),
        )
    });
    blocks
        .chain(tiles)
        .chain(small)
        .chain(grouped_problems())
        .collect()
}

/// Fixed f32 grouped-query and multi-query problems (`hkv` key/value
/// heads): several of the GPU's tiles with ragged ends, causal and not,
/// groups of 2, 3 and 4, and heads wide enough for the per-row kernels.
fn grouped_problems() -> Vec<(Problem, (f64, f64))> {
    [
        ([2, 4, 37, 45, 8, 8], 2, true),
        ([1, 4, 20, 20, 8, 6], 1, false),
        ([1, 6, 33, 40, 16, 12], 2, true),
        ([1, 4, 17, 9, 5, 7], 1, false),
        ([1, 4, 9, 12, 128, 128], 1, true),
        ([1, 4, 70, 70, 40, 24], 2, false),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (dims, hkv, causal))| {
        let seed = 80 + 4 * i as u64;
        let p = Problem::fixed(dims, 0.3, causal, seed).grouped(hkv, Dtype::F32, seed);
        (p, (1e-4, 1e-4))
    })
    .collect()
}

/// Both outputs of the primitive on the device under test: `[B, H, Lq, dv]`
/// and the `[B, H, Lq]` logsumexps, f32.
fn check_outputs(cx: &Ctx, p: &Problem, l: Layout, rel: f64) {
    let r = p.reference();
    let inputs = [
        make(&p.q, Dtype::F32, l),
        make(&p.k, Dtype::F32, l),
        make(&p.v, Dtype::F32, Layout::Dense),
    ];
    let node = Attention {
        scale: p.scale as f32,
        causal: p.causal,
    };
    let got = cx.on(|| node.build(&inputs[0], &inputs[1], &inputs[2]));
    let what = p.what(Dtype::F32, l);
    cx.check(&got[0], &r.o, Dtype::F32, rel, &format!("attention {what}"));
    cx.check(
        &got[1],
        &r.lse,
        Dtype::F32,
        rel,
        &format!("attention logsumexp {what}"),
    );
}

/// The half-precision output the node adds for f16 and bf16 inputs: its
/// first output rounded to their dtype as `astype` rounds, bit for bit, in
/// the same `[B, Lq, H, dv]` memory order; f32 inputs get no third output.
fn check_half_output(cx: &Ctx, p: &Problem, dtype: Dtype) {
    let inputs = [
        make(&p.q, dtype, Layout::Transposed),
        make(&p.k, dtype, Layout::Dense),
        make(&p.v, dtype, Layout::Dense),
    ];
    let node = Attention {
        scale: p.scale as f32,
        causal: p.causal,
    };
    let what = p.what(dtype, Layout::Transposed);
    let (got, cast) = cx.on(|| {
        let got = node.build(&inputs[0], &inputs[1], &inputs[2]);
        let cast = got[0].astype(dtype).expect("cast");
        (got, cast)
    });
    crate::eval((&got, &cast)).expect("evaluates");
    assert_eq!(got.len(), 3, "{what}: a half output");
    assert_eq!((got[2].dtype(), got[2].shape()), (dtype, got[0].shape()));
    let bits = |a: &Array| -> Vec<u32> {
        let f = a.astype(Dtype::F32).and_then(|f| f.to_vec::<f32>());
        f.expect("values").iter().map(|x| x.to_bits()).collect()
    };
    assert_eq!(
        bits(&got[2]),
        bits(&cast),
        "{what}: the f32 output's rounding"
    );
    let strides = |a: &Array| a.data().expect("evaluated").strides().to_vec();
    assert_eq!(strides(&got[2]), strides(&got[0]), "{what}: memory order");
    let f32_inputs = inputs.map(|x| x.astype(Dtype::F32).expect("cast"));
    let wide = cx.on(|| node.build(&f32_inputs[0], &f32_inputs[1], &f32_inputs[2]));
    assert_eq!(wide.len(), 2, "f32 attention has no half output");
}

fn attention_values(cx: &Ctx) {
    cx.runner()
        .run(&strategy(), |draw| {
            let p = Problem::random(&draw, Dtype::F32);
            check_outputs(cx, &p, draw.3, tol(Dtype::F32) * 8.0);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    cx.runner()
        .run(&grouped_strategy(), |draw| {
            let p = Problem::random_grouped(&draw, Dtype::F32);
            check_outputs(cx, &p, draw.3, tol(Dtype::F32) * 8.0);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    for (p, (rel, _)) in fixed_problems() {
        check_outputs(cx, &p, Layout::Dense, rel);
    }
    output_values(cx);
}

/// `fused_attention` on the device under test; with `grads`, its vjp for
/// the problem's cotangent too. Every float dtype: f32 is the fused
/// primitive, the others cast around it. `rel` for the output, then for the
/// gradients.
fn check_fused(cx: &Ctx, p: &Problem, dtype: Dtype, l: Layout, rel: (f64, f64), grads: bool) {
    let (rel, grad_rel) = rel;
    let want = p.reference();
    let inputs = [
        make(&p.q, dtype, l),
        make(&p.k, dtype, l),
        make(&p.v, dtype, Layout::Dense),
    ];
    let (scale, causal) = (p.scale, p.causal);
    let f = |x: &[Array]| crate::fused_attention(&x[0], &x[1], &x[2], scale, causal);
    let what = p.what(dtype, l);
    if !grads {
        let got = cx.on(|| f(&inputs)).expect("fused_attention");
        cx.check(&got, &want.o, dtype, rel, &format!("attention {what}"));
        return;
    }
    let ct = [make(&p.ct, dtype, Layout::Dense)];
    let (outs, grads) = cx
        .on(|| crate::vjp(|x: &[Array]| Ok(vec![f(x)?]), &inputs, &ct))
        .expect("vjp");
    cx.check(&outs[0], &want.o, dtype, rel, &format!("attention {what}"));
    for (g, (w, name)) in grads
        .iter()
        .zip([(&want.dq, "dq"), (&want.dk, "dk"), (&want.dv, "dv")])
    {
        cx.check(g, w, dtype, grad_rel, &format!("attention {name} {what}"));
    }
}

fn output_values(cx: &Ctx) {
    for dtype in FLOATS {
        cx.runner()
            .run(&strategy(), |draw| {
                let p = Problem::random(&draw, dtype);
                let rel = tol(dtype) * 8.0;
                check_fused(cx, &p, dtype, draw.3, (rel, rel * 2.0), false);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
    for (p, rel) in fixed_problems() {
        for l in [Layout::Dense, Layout::Transposed] {
            check_fused(cx, &p, Dtype::F32, l, rel, false);
        }
    }
    for (dtype, p) in half_problems() {
        let rel = tol(dtype) * 8.0;
        check_fused(cx, &p, dtype, Layout::Transposed, (rel, rel), false);
        check_half_output(cx, &p, dtype);
    }
    // Bad arguments are refused when the op is built, naming what is wrong.
    let x = Array::zeros(&[1, 1, 3, 2], Dtype::F32);
    let short = Array::zeros(&[1, 1, 2, 2], Dtype::F32);
    cx.on(|| {
        let err = |r: crate::Result<Array>| r.expect_err("refused").to_string();
        let fa = crate::fused_attention;
        let e = err(fa(&x, &short, &short, 1.0, true));
        assert!(e.contains("no more queries than keys"), "{e}");
        let e = err(fa(&x, &x, &short, 1.0, false));
        assert!(e.contains("v [B, H_kv, Lk, dv]"), "{e}");
        // Key/value heads must divide the query heads: both counts named.
        let (q3, k2) = (
            Array::zeros(&[1, 3, 3, 2], Dtype::F32),
            Array::zeros(&[1, 2, 3, 2], Dtype::F32),
        );
        let e = err(fa(&q3, &k2, &k2, 1.0, false));
        assert!(e.contains("3 query heads and 2 key/value heads"), "{e}");
        let e = err(fa(&k2, &q3, &q3, 1.0, false));
        assert!(e.contains("2 query heads and 3 key/value heads"), "{e}");
        let e = err(fa(&x, &x, &x.astype(Dtype::F16).expect("f16"), 1.0, false));
        assert!(e.contains("one float dtype"), "{e}");
        let e = err(fa(&x.reshape(&[3, 2]).expect("2-d"), &x, &x, 1.0, false));
        assert!(e.contains("[B, H, L, d]"), "{e}");
    });
}

fn grad_values(cx: &Ctx) {
    for dtype in FLOATS {
        cx.runner()
            .run(&strategy(), |draw| {
                let p = Problem::random(&draw, dtype);
                let rel = tol(dtype) * 8.0;
                check_fused(cx, &p, dtype, draw.3, (rel, rel * 2.0), true);
                Ok(())
            })
            .unwrap_or_else(|e| panic!("{e}"));
    }
    cx.runner()
        .run(&grouped_strategy(), |draw| {
            let p = Problem::random_grouped(&draw, Dtype::F32);
            let rel = tol(Dtype::F32) * 8.0;
            check_fused(cx, &p, Dtype::F32, draw.3, (rel, rel * 2.0), true);
            Ok(())
        })
        .unwrap_or_else(|e| panic!("{e}"));
    for (p, rel) in fixed_problems() {
        check_fused(cx, &p, Dtype::F32, Layout::Transposed, rel, true);
    }
    for (dtype, p) in half_problems() {
        let rel = tol(dtype) * 8.0;
        check_fused(cx, &p, dtype, Layout::Dense, (rel, rel * 2.0), true);
    }
}

/// Half-precision problems over several blocks of the GPU's tiles, whose
/// kernels read these dtypes as they are, multi-head, grouped-query (4
/// query heads on 2 key/value heads, causal) and multi-query (plain).
fn half_problems() -> Vec<(Dtype, Problem)> {
    [Dtype::BF16, Dtype::F16]
        .into_iter()
        .flat_map(|dtype| {
            [
                ([1, 2, 70, 70, 40, 24], true, 2),
                ([1, 1, 33, 50, 64, 48], false, 1),
                ([1, 4, 40, 40, 40, 24], true, 2),
                ([1, 2, 33, 50, 32, 32], false, 1),
            ]
            .map(|(dims, causal, hkv)| {
                let p = Problem::fixed_in(dtype, dims, causal, 60);
                (
                    dtype,
                    if hkv == dims[1] {
                        p
                    } else {
                        p.grouped(hkv, dtype, 61)
                    },
                )
            })
        })
        .collect()
}
