//! average_gradients on real two- and three-rank worlds.

use mlx_array::{Array, Dtype, Tree, arange};
use mlx_nn::{AverageOptions, average_gradients};

fn grads(rank: usize) -> Tree {
    let r = rank as f64;
    Tree::unflatten(vec![
        (
            "layers.0.w".to_string(),
            arange(0.0, 6.0, 1.0, Dtype::F32)
                .unwrap()
                .add_scalar(r)
                .unwrap()
                .reshape(&[2, 3])
                .unwrap(),
        ),
        (
            "layers.1.w".to_string(),
            Array::full(&[5], 10.0 * r, Dtype::F32),
        ),
        ("norm.w".to_string(), Array::full(&[3], r, Dtype::BF16)),
        ("steps".to_string(), Array::full(&[1], 4.0 * r, Dtype::I32)),
    ])
    .unwrap()
}

#[test]
fn averages_match_the_mean_for_every_bucketing_and_dtype() {
    for world in [2usize, 3] {
        let mean = |v: f64| v + (world - 1) as f64 / 2.0;
        for opts in [
            AverageOptions::default(),
            AverageOptions {
                all_reduce_size: 0,
                communication_dtype: None,
            },
            AverageOptions {
                all_reduce_size: 24,
                communication_dtype: Some(Dtype::BF16),
            },
        ] {
            let outs = mlx_dist::run_local(world, |g| {
                let avg = average_gradients(&grads(g.rank()), &g, &opts).unwrap();
                avg.flatten()
                    .into_iter()
                    .map(|(n, a)| {
                        (
                            n,
                            a.dtype(),
                            a.shape().to_vec(),
                            a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(),
                        )
                    })
                    .collect::<Vec<_>>()
            })
            .unwrap();
            for out in outs {
                let get = |name: &str| out.iter().find(|(n, ..)| n == name).unwrap().clone();
                let (_, d, s, v) = get("layers.0.w");
                assert_eq!((d, s), (Dtype::F32, vec![2, 3]));
                assert_eq!(
                    v,
                    (0..6).map(|i| mean(i as f64) as f32).collect::<Vec<_>>(),
                    "{opts:?}"
                );
                assert_eq!(
                    get("layers.1.w").3,
                    vec![(10.0 * (world - 1) as f64 / 2.0) as f32; 5]
                );
                let (_, d, _, v) = get("norm.w");
                assert_eq!(d, Dtype::BF16);
                assert_eq!(v, vec![mean(0.0) as f32; 3]);
                let (_, d, _, v) = get("steps");
                assert_eq!(d, Dtype::I32);
                assert_eq!(v, vec![(4.0 * (world - 1) as f64 / 2.0).trunc() as f32]);
            }
        }
    }
}

#[test]
fn a_group_of_one_is_the_identity() {
    let g = grads(3);
    let avg =
        average_gradients(&g, &mlx_dist::Group::single(), &AverageOptions::default()).unwrap();
    assert_eq!(
        avg.get_array("layers.1.w").unwrap().id(),
        g.get_array("layers.1.w").unwrap().id()
    );
}
