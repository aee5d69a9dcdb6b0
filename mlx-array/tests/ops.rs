//! Composite ops, creation, errors and display, against known values.

use mlx_array::{Array, Dtype, Error, SliceArg, arange, eye, linspace, random};

fn close(a: &[f32], b: &[f32], tol: f32) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= tol * y.abs().max(1.0), "{a:?} vs {b:?}");
    }
}

fn arr(v: &[f32], s: &[usize]) -> Array {
    Array::from_slice(v, s).unwrap()
}

#[test]
fn softmax_logsumexp_mean_var() {
    let x = arr(&[1.0, 2.0, 3.0, -1.0, 0.0, 1000.0], &[2, 3]);
    let s = x.softmax(&[-1]).unwrap().to_vec::<f32>().unwrap();
    let e = [1f32.exp(), 2f32.exp(), 3f32.exp()];
    let z: f32 = e.iter().sum();
    close(&s, &[e[0] / z, e[1] / z, e[2] / z, 0.0, 0.0, 1.0], 1e-6);
    let l = x.logsumexp(&[1], false).unwrap().to_vec::<f32>().unwrap();
    close(&l, &[z.ln(), 1000.0], 1e-6);
    let neg_inf = arr(&[f32::NEG_INFINITY, f32::NEG_INFINITY], &[2])
        .logsumexp(&[0], false)
        .unwrap();
    assert_eq!(neg_inf.item::<f32>().unwrap(), f32::NEG_INFINITY);
    let m = x.mean(&[0], true).unwrap();
    assert_eq!(m.shape(), &[1, 3]);
    close(&m.to_vec::<f32>().unwrap(), &[0.0, 1.0, 501.5], 1e-6);
    let v = arr(&[1.0, 2.0, 3.0, 4.0], &[4])
        .var(&[0], false, 1)
        .unwrap();
    close(&[v.item::<f32>().unwrap()], &[5.0 / 3.0], 1e-6);
    let ints = Array::from_slice(&[1i32, 2], &[2])
        .unwrap()
        .mean_all()
        .unwrap();
    assert_eq!(
        (ints.dtype(), ints.item::<f32>().unwrap()),
        (Dtype::F32, 1.5)
    );
}

#[test]
fn creation_ops() {
    assert_eq!(
        eye(2, 3, 1, Dtype::I32).unwrap().to_vec::<i32>().unwrap(),
        vec![0, 1, 0, 0, 0, 1]
    );
    close(
        &linspace(0.0, 1.0, 5, Dtype::F32)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        &[0.0, 0.25, 0.5, 0.75, 1.0],
        0.0,
    );
    assert_eq!(
        Array::full(&[2, 2], 7.0, Dtype::I64)
            .to_vec::<i64>()
            .unwrap(),
        vec![7; 4]
    );
    assert_eq!(
        Array::zeros(&[0, 3], Dtype::F32).to_vec::<f32>().unwrap(),
        Vec::<f32>::new()
    );
    let t = arange(1.0, 10.0, 1.0, Dtype::F32)
        .unwrap()
        .reshape(&[3, 3])
        .unwrap();
    assert_eq!(
        t.tril(0).unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 0.0, 0.0, 4.0, 5.0, 0.0, 7.0, 8.0, 9.0]
    );
    assert_eq!(
        t.triu(1).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0, 2.0, 3.0, 0.0, 0.0, 6.0, 0.0, 0.0, 0.0]
    );
}

#[test]
fn split_stack_squeeze_expand() {
    let x = arange(0.0, 6.0, 1.0, Dtype::I32)
        .unwrap()
        .reshape(&[2, 3])
        .unwrap();
    let parts = x.split(3, 1).unwrap();
    assert_eq!(parts.len(), 3);
    assert_eq!(parts[1].to_vec::<i32>().unwrap(), vec![1, 4]);
    let s = mlx_array::stack(&parts, 0).unwrap();
    assert_eq!(s.shape(), &[3, 2, 1]);
    assert_eq!(
        s.squeeze(&[]).unwrap().to_vec::<i32>().unwrap(),
        vec![0, 3, 1, 4, 2, 5]
    );
    assert_eq!(x.expand_dims(&[0, -1]).unwrap().shape(), &[1, 2, 3, 1]);
    assert_eq!(
        x.swapaxes(0, 1).unwrap().to_vec::<i32>().unwrap(),
        vec![0, 3, 1, 4, 2, 5]
    );
    assert_eq!(x.flatten(0, -1).unwrap().shape(), &[6]);
    let uneven = mlx_array::split_at(&x, &[1], 1).unwrap();
    assert_eq!(
        (uneven[0].shape(), uneven[1].shape()),
        (&[2usize, 1][..], &[2usize, 2][..])
    );
    assert!(x.split(4, 1).is_err());
}

#[test]
fn random_distributions_have_the_right_moments() {
    let k = random::key(42);
    let [k1, k2] = random::split2(&k).unwrap();
    let n = 200_000;
    let u = random::uniform(&k1, -1.0, 3.0, &[n], Dtype::F32).unwrap();
    let uv = u.to_vec::<f32>().unwrap();
    assert!(uv.iter().all(|&v| (-1.0..3.0).contains(&v)));
    let mean: f64 = uv.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    assert!((mean - 1.0).abs() < 0.02, "uniform mean {mean}");
    let z = random::normal(&k2, &[n], Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let m: f64 = z.iter().map(|&v| v as f64).sum::<f64>() / n as f64;
    let var: f64 = z.iter().map(|&v| (v as f64 - m).powi(2)).sum::<f64>() / n as f64;
    assert!(
        m.abs() < 0.01 && (var - 1.0).abs() < 0.02,
        "normal mean {m} var {var}"
    );
    let r = random::randint(&k1, 3, 7, &[10_000], Dtype::I32)
        .unwrap()
        .to_vec::<i32>()
        .unwrap();
    assert!(r.iter().all(|v| (3..7).contains(v)));
    for want in 3..7 {
        let c = r.iter().filter(|&&v| v == want).count();
        assert!(
            (2200..2800).contains(&c),
            "randint value {want} seen {c} times"
        );
    }
    let logits = arr(&[0.0, (3.0f32).ln()], &[1, 2])
        .broadcast_to(&[20_000, 2])
        .unwrap();
    let c = random::categorical(&k2, &logits, -1)
        .unwrap()
        .to_vec::<u32>()
        .unwrap();
    let ones = c.iter().filter(|&&v| v == 1).count() as f64 / c.len() as f64;
    assert!(
        (ones - 0.75).abs() < 0.02,
        "categorical picked class 1 {ones} of the time"
    );
    let b = random::bernoulli(&k1, &Array::scalar(0.3f32), &[20_000]).unwrap();
    let p = b
        .astype(Dtype::F32)
        .unwrap()
        .mean_all()
        .unwrap()
        .item::<f32>()
        .unwrap();
    assert!((p - 0.3).abs() < 0.02);
    // Different keys differ; the same key repeats.
    assert_ne!(
        random::bits(&k1, &[4]).unwrap().to_vec::<u32>().unwrap(),
        random::bits(&k2, &[4]).unwrap().to_vec::<u32>().unwrap()
    );
}

#[test]
fn user_errors_are_typed_and_name_the_op() {
    let a = arr(&[1.0, 2.0, 3.0], &[3]);
    let b = arr(&[1.0, 2.0], &[2]);
    match a.add(&b) {
        Err(Error::Shape { op, message }) => {
            assert!(op == "add" && message.contains("[3]") && message.contains("[2]"))
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        a.sum(&[1], false),
        Err(Error::Axis {
            op: "sum",
            axis: 1,
            ndim: 1
        })
    ));
    assert!(matches!(
        a.reshape(&[2, 2]),
        Err(Error::Shape { op: "reshape", .. })
    ));
    assert!(matches!(
        a.bitwise_and(&a),
        Err(Error::Dtype {
            op: "bitwise_and",
            ..
        })
    ));
    assert!(matches!(
        a.matmul(&b),
        Err(Error::Shape { op: "matmul", .. })
    ));
    assert!(matches!(
        a.transpose(&[0, 0]),
        Err(Error::Shape { .. } | Error::Invalid { .. })
    ));
    assert!(matches!(
        a.slice(&[SliceArg::FULL.step(0)]),
        Err(Error::Invalid { op: "slice", .. })
    ));
    assert!(Array::from_slice(&[1.0f32], &[2]).is_err());
    assert!(a.item::<f32>().is_err());
    assert!(random::normal(&a, &[2], Dtype::F32).is_err());
    assert!(mlx_array::concatenate(&[a.clone(), arr(&[1.0], &[1, 1])], 0).is_err());
    assert!(a.take(&a, 0).is_err());
}

#[test]
fn display_evaluates_and_prints_like_mlx() {
    let x = Array::from_slice(&[1i32, 2, 3, 4], &[2, 2]).unwrap();
    assert_eq!(
        format!("{x}"),
        "array([[1, 2],\n       [3, 4]], dtype=int32)"
    );
    let f = arr(&[0.5, 2.0], &[2]).exp().unwrap();
    let s = format!("{f}");
    assert!(
        s.starts_with("array([1.648721, 7.389056]") && s.ends_with("dtype=float32)"),
        "{s}"
    );
    let b = Array::from_slice(&[mlx_array::Bool8(1)], &[]).unwrap();
    assert_eq!(format!("{b}"), "array(true, dtype=bool)");
}

#[test]
fn weak_scalars_keep_the_array_dtype() {
    let h = Array::ones(&[2], Dtype::BF16);
    assert_eq!(h.mul_scalar(3.0).unwrap().dtype(), Dtype::BF16);
    let i = Array::ones(&[2], Dtype::I32);
    assert_eq!(i.add_scalar(1.0).unwrap().dtype(), Dtype::I32);
    assert_eq!(i.add_scalar(0.5).unwrap().dtype(), Dtype::F32);
}

#[test]
fn take_from_a_view_that_starts_inside_its_buffer() {
    // Rows 1.. of a table: a contiguous view with a non-zero offset.
    let table = arange(0.0, 12.0, 1.0, Dtype::F32)
        .unwrap()
        .reshape(&[4, 3])
        .unwrap();
    let tail = table.slice_axis(0, 1, 4).unwrap();
    let got = tail
        .take(&Array::from_slice(&[2i32, 0], &[2]).unwrap(), 0)
        .unwrap();
    assert_eq!(
        got.to_vec::<f32>().unwrap(),
        vec![9.0, 10.0, 11.0, 3.0, 4.0, 5.0]
    );
    let bf = tail
        .astype(Dtype::BF16)
        .unwrap()
        .slice_axis(0, 1, 3)
        .unwrap();
    let got = bf
        .take(&Array::from_slice(&[1i32], &[1]).unwrap(), 0)
        .unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), vec![9.0, 10.0, 11.0]);
}

/// A gather from a cast that is not yet computed converts only the rows
/// taken: the result is the cast of the gather (same values and dtype), the
/// whole cast table is never evaluated, and the gradient reaches the f32
/// table (each row's count of uses, summed in f32).
#[test]
fn take_from_a_pending_cast_converts_only_the_rows_taken() {
    let table = arange(0.0, 40.0, 1.0, Dtype::F32)
        .unwrap()
        .reshape(&[10, 4])
        .unwrap()
        .div_scalar(3.0)
        .unwrap();
    table.eval().unwrap();
    let ids = Array::from_slice(&[7i32, 2, 7], &[3]).unwrap();
    let cast = table.astype(Dtype::BF16).unwrap();
    let rows = cast.take(&ids, 0).unwrap();
    assert_eq!(rows.dtype(), Dtype::BF16);
    let want = table
        .take(&ids, 0)
        .unwrap()
        .astype(Dtype::BF16)
        .unwrap()
        .to_vec::<half::bf16>()
        .unwrap();
    assert_eq!(rows.to_vec::<half::bf16>().unwrap(), want);
    assert!(!cast.is_evaluated(), "the whole table was converted");

    let g = mlx_array::grad(
        |x| {
            x[0].astype(Dtype::BF16)?
                .take(&ids, 0)?
                .astype(Dtype::F32)?
                .sum_all()
        },
        &[0],
    )(std::slice::from_ref(&table))
    .unwrap();
    assert_eq!(g[0].dtype(), Dtype::F32);
    let uses: Vec<f32> = (0..10)
        .flat_map(|r| {
            let n = [7, 2, 7].iter().filter(|&&i| i == r).count() as f32;
            [n; 4]
        })
        .collect();
    assert_eq!(g[0].to_vec::<f32>().unwrap(), uses);
}

/// The gradient of an f32 parameter through its bf16 copy, when the op
/// that used the copy gives its gradient as a cast of an f32 array (the
/// fused loss's `dw`), is that f32 array itself: not rounded to bf16 and
/// converted back (two conversions of the whole table).
#[test]
fn a_gradient_cast_to_half_and_back_is_not_rounded() {
    let (rows, dims, vocab) = (3usize, 32usize, 5usize);
    let val = |n: usize, seed: usize| -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 37 + seed * 11) % 101) as f32 / 50.0 - 1.0) * 0.37)
            .collect()
    };
    let h = Array::from_vec(val(rows * dims, 1), &[rows, dims])
        .unwrap()
        .astype(Dtype::BF16)
        .unwrap();
    let w = Array::from_vec(val(vocab * dims, 2), &[vocab, dims]).unwrap();
    let t = Array::from_slice(&[1u32, 4, 0], &[rows]).unwrap();
    let rw = Array::ones(&[rows], Dtype::F32);
    let opts = mlx_array::primitives::loss::LinearCrossEntropyOptions::default();
    let loss = |p: &[Array]| {
        mlx_array::linear_cross_entropy_sum(&h, &p[0].astype(Dtype::BF16)?, &t, &rw, &opts)
    };
    let g = mlx_array::grad(loss, &[0])(std::slice::from_ref(&w)).unwrap();
    assert_eq!(g[0].dtype(), Dtype::F32);
    let got = g[0].to_vec::<f32>().unwrap();
    // The same gradient taken of the bf16 copy itself, in f32.
    let w16 = w.astype(Dtype::BF16).unwrap();
    w16.eval().unwrap();
    let packed = mlx_array::grad(
        |p: &[Array]| mlx_array::linear_cross_entropy_sum(&h, &p[0], &t, &rw, &opts),
        &[0],
    )(std::slice::from_ref(&w16))
    .unwrap();
    let rounded = packed[0]
        .astype(Dtype::F32)
        .unwrap()
        .to_vec::<f32>()
        .unwrap();
    let mut unrounded = 0;
    for (a, b) in got.iter().zip(&rounded) {
        // Within bf16's rounding of each other, and not all equal to it.
        assert!(
            (a - b).abs() <= b.abs() * 2f32.powi(-8) + 1e-12,
            "{a} vs {b}"
        );
        unrounded += usize::from(half::bf16::from_f32(*a).to_f32() != *a);
    }
    assert!(unrounded > 0, "the gradient was rounded to bf16: {got:?}");
}
