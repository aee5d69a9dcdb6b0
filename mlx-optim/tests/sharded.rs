//! `Sharded` on real two- and three-rank worlds, against averaging whole
//! gradients and updating every parameter on every rank.

use mlx_array::{Dtype, Tree, eval, random};
use mlx_nn::{AverageOptions, average_gradients};
use mlx_optim::{AdamW, Optimizer, Sharded};

/// Parameters of awkward sizes (none divides by 2 or 3 evenly, one is
/// smaller than the world).
const SHAPES: [(&str, &[usize]); 4] = [
    ("embed.weight", &[7, 5]),
    ("layers.0.bias", &[1]),
    ("layers.0.weight", &[4, 4]),
    ("norm.weight", &[11]),
];

fn tree(seed: u64, scale: f64) -> Tree {
    Tree::unflatten(SHAPES.iter().enumerate().map(|(i, (name, shape))| {
        let k = random::key(seed * 100 + i as u64);
        let a = random::normal(&k, shape, Dtype::F32)
            .unwrap()
            .mul_scalar(scale)
            .unwrap();
        (name.to_string(), a)
    }))
    .unwrap()
}

fn values(t: &Tree) -> Vec<(String, Vec<f32>)> {
    t.flatten()
        .into_iter()
        .map(|(n, a)| (n, a.to_vec::<f32>().unwrap()))
        .collect()
}

/// Parameters after `steps` AdamW steps on every rank's own gradients,
/// sharded (with buckets of `bucket` bytes) or whole.
fn train(world: usize, steps: u64, sharded: bool, bucket: usize) -> Vec<Vec<(String, Vec<f32>)>> {
    mlx_dist::run_local(world, |g| {
        let adamw = || AdamW::new(1e-2).weight_decay(0.1);
        let mut params = tree(0, 1.0);
        let mut whole = adamw();
        let mut shards = Sharded::new(adamw(), &g).bucket_bytes(bucket);
        for step in 0..steps {
            let grads = tree(1 + step * 10 + g.rank() as u64, 0.5);
            if sharded {
                shards.update_tree(&mut params, &grads).unwrap();
                eval((&params, shards.state())).unwrap();
            } else {
                let avg = average_gradients(&grads, &g, &AverageOptions::default()).unwrap();
                whole.update_tree(&mut params, &avg).unwrap();
                eval((&params, whole.state())).unwrap();
            }
        }
        values(&params)
    })
    .unwrap()
}

#[test]
fn two_ranks_give_the_parameters_of_whole_averaging_bit_for_bit() {
    let whole = train(2, 4, false, 32 << 20);
    for bucket in [32 << 20, 0, 64] {
        let sharded = train(2, 4, true, bucket);
        assert_eq!(
            sharded[0], sharded[1],
            "the ranks disagree (bucket {bucket})"
        );
        assert_eq!(sharded[0], whole[0], "bucket {bucket}");
    }
}

#[test]
fn three_ranks_give_the_parameters_of_whole_averaging() {
    let whole = train(3, 3, false, 32 << 20);
    let sharded = train(3, 3, true, 100);
    for rank in &sharded {
        assert_eq!(rank, &sharded[0], "the ranks disagree");
    }
    for ((name, a), (_, b)) in sharded[0].iter().zip(&whole[0]) {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-6 * y.abs().max(1.0),
                "{name}: {x} vs {y}"
            );
        }
    }
}

#[test]
fn each_rank_keeps_only_its_shard_of_the_state() {
    let sizes = mlx_dist::run_local(3, |g| {
        let mut opt = Sharded::new(AdamW::new(1e-2), &g);
        let mut params = tree(0, 1.0);
        opt.update_tree(&mut params, &tree(1, 1.0)).unwrap();
        eval((&params, opt.state())).unwrap();
        opt.state()
            .flatten()
            .into_iter()
            .map(|(n, a)| (n, a.shape().to_vec()))
            .collect::<Vec<_>>()
    })
    .unwrap();
    // 35, 1, 16 and 11 elements over 3 ranks: ceil(n / 3) each.
    let expected = [12, 1, 6, 4];
    for rank in sizes {
        let got: Vec<usize> = rank.iter().map(|(_, s)| s[0]).collect();
        let mut want = vec![];
        for e in expected {
            want.extend([e, e]); // m and v
        }
        assert_eq!(got, want);
    }
}

#[test]
fn clipping_shards_clips_by_the_norm_of_the_whole_averaged_gradients() {
    let out = mlx_dist::run_local(2, |g| {
        let opt = Sharded::new(AdamW::new(1e-2), &g);
        let grads = tree(5 + g.rank() as u64, 3.0);
        let shards = opt.shard_gradients(&grads).unwrap();
        let (_, norm) = opt.clip_grad_norm(&shards, 0.5).unwrap();
        let avg = average_gradients(&grads, &g, &AverageOptions::default()).unwrap();
        let (_, whole) = mlx_optim::clip_grad_norm(&avg, 0.5).unwrap();
        (norm.item::<f32>().unwrap(), whole.item::<f32>().unwrap())
    })
    .unwrap();
    for (sharded, whole) in out {
        assert!(whole > 0.5, "the test should clip");
        assert!(
            (sharded - whole).abs() <= 1e-5 * whole,
            "{sharded} vs {whole}"
        );
    }
}

#[test]
fn a_state_file_resumes_only_on_its_own_rank_and_world() {
    let dir = tempfile::tempdir().unwrap();
    let path = |r: usize| dir.path().join(format!("opt{r}.safetensors"));
    let (before, errors): (Vec<_>, Vec<_>) = mlx_dist::run_local(2, |g| {
        let mut opt = Sharded::new(AdamW::new(1e-2), &g);
        let mut params = tree(0, 1.0);
        opt.update_tree(&mut params, &tree(1, 1.0)).unwrap();
        eval((&params, opt.state())).unwrap();
        opt.save_state(&path(g.rank())).unwrap();
        g.barrier().unwrap();
        let mut again = Sharded::new(AdamW::new(1e-2), &g);
        again.load_state(&path(g.rank()), &params).unwrap();
        assert_eq!(again.state().step(), 1);
        let same = values(&again.state().tree().unwrap()) == values(&opt.state().tree().unwrap());
        let other = again
            .load_state(&path(1 - g.rank()), &params)
            .unwrap_err()
            .to_string();
        (same, other)
    })
    .unwrap()
    .into_iter()
    .unzip();
    assert_eq!(before, vec![true, true]);
    for (rank, e) in errors.iter().enumerate() {
        let theirs = format!("shard {}/2", 1 - rank);
        assert!(
            e.contains(&theirs) && e.contains(&format!("{rank}/2")),
            "{e}"
        );
    }
    // A whole optimizer refuses a shard, and says why.
    let mut whole = AdamW::new(1e-2);
    let e = whole
        .load_state(&path(0), &tree(0, 1.0))
        .unwrap_err()
        .to_string();
    assert!(e.contains("shard 0/2") && e.contains("whole"), "{e}");
}

#[test]
fn the_moments_are_updated_in_place_from_the_second_step() {
    let buffers = mlx_dist::run_local(2, |g| {
        let mut opt = Sharded::new(AdamW::new(1e-2), &g);
        let mut params = tree(0, 1.0);
        let mut seen = vec![];
        for step in 0..3 {
            opt.update_tree(&mut params, &tree(1 + step, 1.0)).unwrap();
            eval((&params, opt.state())).unwrap();
            let m = opt.state().get("embed.weight", "m").unwrap();
            seen.push(m.data().unwrap().storage().as_ptr() as usize);
        }
        seen
    })
    .unwrap();
    for seen in buffers {
        // The first step allocates the [2, shard] moments; later ones reuse it.
        assert_eq!(seen[1], seen[2]);
    }
}

#[test]
fn empty_and_bf16_parameters_are_handled() {
    let out = mlx_dist::run_local(2, |g| {
        let mut params = Tree::unflatten([
            (
                "empty".to_string(),
                mlx_array::Array::zeros(&[0, 3], Dtype::F32),
            ),
            (
                "half".to_string(),
                mlx_array::Array::full(&[5], 1.0, Dtype::BF16),
            ),
        ])
        .unwrap();
        let grads = Tree::unflatten([
            (
                "empty".to_string(),
                mlx_array::Array::zeros(&[0, 3], Dtype::F32),
            ),
            (
                "half".to_string(),
                mlx_array::Array::full(&[5], 1.0 + g.rank() as f64, Dtype::BF16),
            ),
        ])
        .unwrap();
        let mut whole_params = params.clone();
        let mut opt = Sharded::new(AdamW::new(0.1), &g);
        opt.update_tree(&mut params, &grads).unwrap();
        eval((&params, opt.state())).unwrap();
        let avg = average_gradients(&grads, &g, &AverageOptions::default()).unwrap();
        let mut whole = AdamW::new(0.1);
        whole.update_tree(&mut whole_params, &avg).unwrap();
        let get = |t: &Tree, n: &str| {
            let a = t.get_array(n).unwrap();
            (
                a.shape().to_vec(),
                a.dtype(),
                a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap(),
            )
        };
        (
            get(&params, "empty") == get(&whole_params, "empty"),
            get(&params, "half") == get(&whole_params, "half"),
        )
    })
    .unwrap();
    assert_eq!(out, vec![(true, true), (true, true)]);
}

#[test]
fn the_shard_layout_cuts_ceil_n_over_w_per_rank_in_rank_order() {
    use mlx_optim::{shard_of, shard_range};
    // 5 elements over 2 ranks: 3 and 2 (padded); 1 over 4: only rank 0 owns any.
    assert_eq!(shard_range(5, 0, 2), 0..3);
    assert_eq!(shard_range(5, 1, 2), 3..5);
    assert_eq!(shard_range(1, 0, 4), 0..1);
    for r in 1..4 {
        assert!(shard_range(1, r, 4).is_empty(), "rank {r}");
    }
    let x = mlx_array::Array::from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0], &[5]).unwrap();
    let shard = |r, w| shard_of(&x, r, w).unwrap().to_vec::<f32>().unwrap();
    assert_eq!(shard(0, 2), [1.0, 2.0, 3.0]);
    assert_eq!(shard(1, 2), [4.0, 5.0, 0.0]);
    assert_eq!(shard(2, 3), [5.0, 0.0]);
    assert_eq!(shard(0, 1), [1.0, 2.0, 3.0, 4.0, 5.0]);
}

#[test]
fn own_shard_of_the_average_is_the_shard_shard_gradients_gives() {
    let out = mlx_dist::run_local(2, |g| {
        let opt = Sharded::new(AdamW::new(1e-2), &g);
        let grads = tree(7 + g.rank() as u64, 1.0);
        let shards = values(&opt.shard_gradients(&grads).unwrap());
        let avg = average_gradients(&grads, &g, &AverageOptions::default()).unwrap();
        let own = avg.map(|_, a| Ok(opt.own_shard(a).unwrap())).unwrap();
        (shards, values(&own))
    })
    .unwrap();
    // On two ranks each sum has one order: bit for bit.
    for (shards, own) in out {
        assert_eq!(shards, own);
    }
}
