//! Collectives on Arrays, on real multi-rank worlds (threads over loopback TCP).

use mlx_array::{Array, Dtype, arange, random, value_and_grad};
use mlx_dist::{
    all_gather, all_max, all_min, all_sum, mean_scatter, recv_like, run_local, send, sum_scatter,
};

fn rank_data(r: usize, n: usize, dtype: Dtype) -> Array {
    arange(0.0, n as f64, 1.0, Dtype::F32)
        .unwrap()
        .add_scalar((r * 3) as f64)
        .unwrap()
        .astype(dtype)
        .unwrap()
}

#[test]
fn reductions_and_gathers_match_the_obvious_reference() {
    for world in [2, 3] {
        for dtype in [Dtype::F32, Dtype::BF16, Dtype::I32, Dtype::I64] {
            let out = run_local(world, |g| {
                let x = rank_data(g.rank(), 7, dtype);
                let s: Vec<f64> = all_sum(&x, &g)
                    .unwrap()
                    .astype(Dtype::F32)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap()
                    .into_iter()
                    .map(f64::from)
                    .collect();
                let mx = all_max(&x, &g)
                    .unwrap()
                    .astype(Dtype::F32)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let mn = all_min(&x, &g)
                    .unwrap()
                    .astype(Dtype::F32)
                    .unwrap()
                    .to_vec::<f32>()
                    .unwrap();
                let ga = all_gather(&x.reshape(&[7, 1]).unwrap(), &g).unwrap();
                (
                    s,
                    mx,
                    mn,
                    ga.shape().to_vec(),
                    ga.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(),
                )
            })
            .unwrap();
            for (s, mx, mn, gshape, gv) in out {
                let want_sum: Vec<f64> = (0..7)
                    .map(|i| (0..world).map(|r| (i + r * 3) as f64).sum())
                    .collect();
                assert_eq!(s, want_sum, "all_sum {dtype} world {world}");
                assert_eq!(
                    mx,
                    (0..7)
                        .map(|i| (i + (world - 1) * 3) as f32)
                        .collect::<Vec<_>>()
                );
                assert_eq!(mn, (0..7).map(|i| i as f32).collect::<Vec<_>>());
                assert_eq!(gshape, vec![7 * world, 1]);
                assert_eq!(
                    gv,
                    (0..world)
                        .flat_map(|r| (0..7).map(move |i| (i + r * 3) as f32))
                        .collect::<Vec<_>>()
                );
            }
        }
    }
}

#[test]
fn sum_scatter_send_recv_and_zero_sizes() {
    let out = run_local(2, |g| {
        let x = arange(0.0, 4.0, 1.0, Dtype::F32)
            .unwrap()
            .add_scalar(g.rank() as f64)
            .unwrap();
        let part = sum_scatter(&x, &g).unwrap().to_vec::<f32>().unwrap();
        let empty = all_sum(&Array::zeros(&[0, 3], Dtype::F32), &g).unwrap();
        let (other, peer) = (
            1 - g.rank(),
            Array::full(&[2], g.rank() as f64 + 10.0, Dtype::F32),
        );
        let got = if g.rank() == 0 {
            send(&peer, other, &g).unwrap().eval().unwrap();
            recv_like(&peer, other, &g)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
        } else {
            let r = recv_like(&peer, other, &g)
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            send(&peer, other, &g).unwrap().eval().unwrap();
            r
        };
        (part, empty.to_vec::<f32>().unwrap(), got)
    })
    .unwrap();
    assert_eq!(out[0].0, vec![1.0, 3.0]);
    assert_eq!(out[1].0, vec![5.0, 7.0]);
    assert!(out[0].1.is_empty());
    assert_eq!(out[0].2, vec![11.0, 11.0]);
    assert_eq!(out[1].2, vec![10.0, 10.0]);
    let single = mlx_dist::Group::single();
    assert!(send(&Array::ones(&[1], Dtype::F32), 0, &single).is_err());
    assert!(sum_scatter(&Array::ones(&[3], Dtype::F32), &single).is_ok());
}

#[test]
fn gradients_flow_through_all_sum() {
    // L = sum over ranks of sum(all_sum(w_r * x_r)); dL/dw_r = world * x_r.
    let out = run_local(2, |g| {
        let x = random::normal(&random::key(g.rank() as u64), &[3], Dtype::F32).unwrap();
        let w = Array::ones(&[3], Dtype::F32);
        let f = |a: &[Array]| all_sum(&a[0].multiply(&x)?, &g)?.sum_all();
        let (_, grads) = value_and_grad(f, &[0])(&[w]).unwrap();
        (
            grads[0].to_vec::<f32>().unwrap(),
            x.to_vec::<f32>().unwrap(),
        )
    })
    .unwrap();
    for (grad, x) in out {
        for (a, b) in grad.iter().zip(&x) {
            assert!((a - 2.0 * b).abs() < 1e-6);
        }
    }
}

/// `mean_scatter` is `sum_scatter` divided by the group's size, bit for bit
/// (float32 divides in the sum's buffer; other dtypes go through the graph),
/// and its gradient is the gathered cotangent divided by the size.
#[test]
fn mean_scatter_is_the_sum_scatter_divided_by_the_size() {
    for world in [2, 3] {
        for dtype in [Dtype::F32, Dtype::BF16] {
            let out = run_local(world, |g| {
                let x = random::normal(
                    &random::key(7 + g.rank() as u64),
                    &[world * 5, 3],
                    Dtype::F32,
                )
                .unwrap()
                .astype(dtype)
                .unwrap();
                let bits = |a: Array| {
                    a.astype(Dtype::F32)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap()
                        .iter()
                        .map(|v| v.to_bits())
                        .collect::<Vec<_>>()
                };
                let mean = mean_scatter(&x, &g).unwrap();
                assert_eq!(mean.shape(), [5, 3]);
                let want = sum_scatter(&x, &g)
                    .unwrap()
                    .div_scalar(world as f64)
                    .unwrap();
                (bits(mean), bits(want))
            })
            .unwrap();
            for (r, (got, want)) in out.into_iter().enumerate() {
                assert_eq!(got, want, "world {world}, {dtype:?}, rank {r}");
            }
        }
    }
    // d/dx_r of sum(mean_scatter(x) * c) over the ranks is c gathered / world.
    let out = run_local(2, |g| {
        let x = Array::ones(&[4], Dtype::F32);
        let c = arange(1.0, 3.0, 1.0, Dtype::F32)
            .unwrap()
            .add_scalar(g.rank() as f64 * 2.0)
            .unwrap();
        let f = |a: &[Array]| mean_scatter(&a[0], &g)?.multiply(&c)?.sum_all();
        let (_, grads) = value_and_grad(f, &[0])(&[x]).unwrap();
        grads[0].to_vec::<f32>().unwrap()
    })
    .unwrap();
    for got in out {
        assert_eq!(got, vec![0.5, 1.0, 1.5, 2.0]);
    }
    assert!(mean_scatter(&Array::ones(&[3], Dtype::F32), &mlx_dist::Group::single()).is_ok());
    let err = run_local(2, |g| {
        mean_scatter(&Array::ones(&[3], Dtype::F32), &g)
            .unwrap_err()
            .to_string()
    })
    .unwrap();
    assert!(
        err[0].contains("mean_scatter") && err[0].contains("does not split over 2"),
        "{}",
        err[0]
    );
}
