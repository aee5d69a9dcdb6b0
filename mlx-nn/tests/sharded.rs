//! The tensor-parallel layers against the whole layers they are cut from:
//! forward passes, gradients and the cutting itself, in worlds of 2 and 3
//! ranks (threads over loopback TCP).

use mlx_array::{Array, Dtype, random, value_and_grad};
use mlx_nn::{
    AllToShardedLinear, AnyLinear, Linear, ModuleExt, Param, ShardedToAllLinear, Sharding,
    load_sharded_weights, shard_inplace, shard_linear,
};

fn values(a: &Array) -> Vec<f32> {
    a.astype(Dtype::F32).unwrap().to_vec::<f32>().unwrap()
}

/// Rows `rows` of a row-major `[_, cols]` matrix.
fn rows(v: &[f32], cols: usize, rows: std::ops::Range<usize>) -> Vec<f32> {
    v[rows.start * cols..rows.end * cols].to_vec()
}

/// Columns `cs` of a row-major `[_, cols]` matrix.
fn columns(v: &[f32], cols: usize, cs: std::ops::Range<usize>) -> Vec<f32> {
    v.chunks(cols)
        .flat_map(|r| r[cs.clone()].to_vec())
        .collect()
}

fn assert_close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
            "{what}[{i}]: {g} vs {w}"
        );
    }
}

const IN: usize = 6;
const HIDDEN: usize = 12;
const OUT: usize = 6;

/// The whole MLP's parameters (up with bias, down with bias) and an input.
fn whole() -> (Linear, Linear, Array) {
    let k = random::split_keys(&random::key(7), 3).unwrap();
    let up = Linear::new(IN, HIDDEN, true, &k[0]).unwrap();
    let down = Linear::new(HIDDEN, OUT, true, &k[1]).unwrap();
    let x = random::normal(&k[2], &[2, 3, IN], Dtype::F32).unwrap();
    (up, down, x)
}

/// `sum(down(silu(up(x)))^2)` and its gradients with respect to x and the
/// four parameters, with `layers` making (up, down) of the arrays given.
fn loss_and_grads<U, D>(x: &Array, params: [Array; 4], up: U, down: D) -> (f32, Vec<Vec<f32>>)
where
    U: Fn(&Array, &Array, &Array) -> mlx_array::Result<Array>,
    D: Fn(&Array, &Array, &Array) -> mlx_array::Result<Array>,
{
    let f = |a: &[Array]| {
        let h = mlx_nn::silu(&up(&a[0], &a[1], &a[2])?)?;
        down(&h, &a[3], &a[4])?.square()?.sum_all()
    };
    let mut args = vec![x.clone()];
    args.extend(params);
    let (loss, grads) = value_and_grad(f, &[0, 1, 2, 3, 4])(&args).unwrap();
    (
        loss.item::<f32>().unwrap(),
        grads.iter().map(values).collect(),
    )
}

#[test]
fn column_then_row_parallel_mlp_gives_the_whole_mlp_loss_and_gradients() {
    let (up, down, x) = whole();
    let param = |l: &Linear| {
        (
            l.weight.value().clone(),
            l.bias.as_ref().unwrap().value().clone(),
        )
    };
    let ((w1, b1), (w2, b2)) = (param(&up), param(&down));
    let plain = |x: &Array, w: &Array, b: &Array| {
        Linear {
            weight: Param::new(w.clone()),
            bias: Some(Param::new(b.clone())),
        }
        .forward(x)
    };
    let (want_loss, want) = loss_and_grads(&x, [w1, b1, w2, b2], plain, plain);
    for n in [2, 3] {
        let got = mlx_dist::run_local(n, |g| {
            let up_s = AllToShardedLinear::from_linear(&up, 1, &g).unwrap();
            let down_s = ShardedToAllLinear::from_linear(&down, 1, &g).unwrap();
            let (w1, b1) = (
                up_s.weight.value().clone(),
                up_s.bias.unwrap().value().clone(),
            );
            let (w2, b2) = (
                down_s.weight.value().clone(),
                down_s.bias.unwrap().value().clone(),
            );
            let group = g.clone();
            let up_f = move |x: &Array, w: &Array, b: &Array| {
                AllToShardedLinear {
                    weight: Param::new(w.clone()),
                    bias: Some(Param::new(b.clone())),
                    group: group.clone(),
                }
                .forward(x)
            };
            let group = g.clone();
            let down_f = move |x: &Array, w: &Array, b: &Array| {
                ShardedToAllLinear {
                    weight: Param::new(w.clone()),
                    bias: Some(Param::new(b.clone())),
                    group: group.clone(),
                }
                .forward(x)
            };
            loss_and_grads(&x, [w1, b1, w2, b2], up_f, down_f)
        })
        .unwrap();
        let part = HIDDEN / n;
        for (r, (loss, grads)) in got.iter().enumerate() {
            let what = |p: &str| format!("world {n}, rank {r}: {p}");
            assert_close(&[*loss], &[want_loss], &what("loss"));
            assert_close(&grads[0], &want[0], &what("d x"));
            let mine = r * part..(r + 1) * part;
            assert_close(
                &grads[1],
                &rows(&want[1], IN, mine.clone()),
                &what("d up.weight"),
            );
            assert_close(&grads[2], &want[2][mine.clone()], &what("d up.bias"));
            assert_close(
                &grads[3],
                &columns(&want[3], HIDDEN, mine),
                &what("d down.weight"),
            );
            assert_close(&grads[4], &want[4], &what("d down.bias"));
        }
    }
}

#[test]
fn new_layers_are_the_shards_of_the_whole_layer_from_the_same_key() {
    let key = random::key(3);
    let whole = Linear::new(4, 6, true, &key).unwrap();
    let (w, b) = (
        values(whole.weight.value()),
        values(whole.bias.as_ref().unwrap().value()),
    );
    let got = mlx_dist::run_local(2, |g| {
        let a = AllToShardedLinear::new(4, 6, true, &g, &key).unwrap();
        let s = ShardedToAllLinear::new(4, 6, true, &g, &key).unwrap();
        (
            values(a.weight.value()),
            values(a.bias.unwrap().value()),
            values(s.weight.value()),
            values(s.bias.unwrap().value()),
        )
    })
    .unwrap();
    for (r, (aw, ab, sw, sb)) in got.into_iter().enumerate() {
        assert_eq!(
            aw,
            rows(&w, 4, 3 * r..3 * r + 3),
            "rank {r}: all-to-sharded weight"
        );
        assert_eq!(ab, b[3 * r..3 * r + 3], "rank {r}: all-to-sharded bias");
        assert_eq!(
            sw,
            columns(&w, 4, 2 * r..2 * r + 2),
            "rank {r}: sharded-to-all weight"
        );
        assert_eq!(sb, b, "rank {r}: sharded-to-all keeps the whole bias");
    }
    let e = mlx_dist::run_local(2, |g| {
        AllToShardedLinear::new(4, 5, false, &g, &key)
            .unwrap_err()
            .to_string()
    })
    .unwrap();
    assert!(
        e[0].contains("cannot shard the output of size 5 across 2 ranks"),
        "{}",
        e[0]
    );
}

#[test]
fn segments_split_each_block_of_a_fused_weight() {
    // A fused query-key-value projection: 3 blocks of 4 output rows.
    let fused = Linear::new(2, 12, false, &random::key(5)).unwrap();
    let w = values(fused.weight.value());
    let got = mlx_dist::run_local(2, |g| {
        let s = shard_linear(&fused, Sharding::AllToSharded, 3, &g).unwrap();
        assert_eq!(s.sharding(), Some(Sharding::AllToSharded));
        values(s.weight().value())
    })
    .unwrap();
    for (r, got) in got.into_iter().enumerate() {
        let want: Vec<f32> = (0..3)
            .flat_map(|block| rows(&w, 2, 4 * block + 2 * r..4 * block + 2 * r + 2))
            .collect();
        assert_eq!(got, want, "rank {r}");
    }
}

#[test]
fn shard_inplace_cuts_parameters_and_refuses_an_uneven_split_whole() {
    let layer = Linear::new(6, 4, true, &random::key(9)).unwrap();
    let (w, b) = (
        values(layer.weight.value()),
        values(layer.bias.as_ref().unwrap().value()),
    );
    let got = mlx_dist::run_local(2, |g| {
        let mut rows_cut = layer.clone();
        shard_inplace(&mut rows_cut, Sharding::AllToSharded, 1, &g).unwrap();
        let mut cols_cut = layer.clone();
        shard_inplace(&mut cols_cut, Sharding::ShardedToAll, 1, &g).unwrap();
        let mut uneven = layer.clone();
        let e = shard_inplace(&mut uneven, Sharding::ShardedToAll, 4, &g).unwrap_err();
        let unchanged = uneven.weight.value().shape().to_vec();
        (rows_cut, cols_cut, e.to_string(), unchanged)
    })
    .unwrap();
    for (r, (rows_cut, cols_cut, e, unchanged)) in got.into_iter().enumerate() {
        assert_eq!(
            values(rows_cut.weight.value()),
            rows(&w, 6, 2 * r..2 * r + 2)
        );
        assert_eq!(values(rows_cut.bias.unwrap().value()), b[2 * r..2 * r + 2]);
        assert_eq!(
            values(cols_cut.weight.value()),
            columns(&w, 6, 3 * r..3 * r + 3)
        );
        assert_eq!(values(cols_cut.bias.unwrap().value()), b);
        assert!(
            e.contains("parameter `weight`") && e.contains("4 segment(s) over 2 ranks"),
            "{e}"
        );
        assert_eq!(unchanged, vec![4, 6], "nothing changes on error");
    }
}

#[test]
fn any_linear_keeps_parameter_names_and_a_group_of_one_is_the_whole_layer() {
    let layer = Linear::new(3, 2, true, &random::key(1)).unwrap();
    let g = mlx_dist::Group::single();
    let x = random::normal(&random::key(2), &[4, 3], Dtype::F32).unwrap();
    for s in ["all-to-sharded", "sharded-to-all"] {
        let sharded = shard_linear(&layer, s.parse().unwrap(), 1, &g).unwrap();
        let names: Vec<String> = sharded
            .named_parameters()
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        assert_eq!(names, ["weight", "bias"]);
        assert_eq!(
            values(&sharded.forward(&x).unwrap()),
            values(&layer.forward(&x).unwrap())
        );
    }
    let whole = mlx_dist::run_local(2, |g| {
        let l = Linear::new(4, 6, true, &random::key(4)).unwrap();
        ["all-to-sharded", "sharded-to-all"].map(|s| {
            let back = shard_linear(&l, s.parse().unwrap(), 1, &g)
                .unwrap()
                .unshard()
                .unwrap();
            (
                values(back.weight.value()),
                values(back.bias.unwrap().value()),
            )
        })
    })
    .unwrap();
    let l = Linear::new(4, 6, true, &random::key(4)).unwrap();
    let want = (
        values(l.weight.value()),
        values(l.bias.as_ref().unwrap().value()),
    );
    for (r, both) in whole.into_iter().enumerate() {
        for (s, got) in both.into_iter().enumerate() {
            assert_eq!(
                got, want,
                "rank {r}, sharding {s}: unshard gives the whole layer back"
            );
        }
    }
    let plain = AnyLinear::from(layer.clone());
    assert!(plain.as_linear().is_some() && plain.sharding().is_none());
    let e = "row-parallel".parse::<Sharding>().unwrap_err().to_string();
    assert!(e.contains("`row-parallel` is not a sharding"), "{e}");
}

#[test]
fn sharded_weights_read_from_a_whole_file_are_the_shards_of_the_saved_layer() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layer.safetensors");
    let saved = Linear::new(4, 6, true, &random::key(8)).unwrap();
    saved.save_weights(&path).unwrap();
    let got = mlx_dist::run_local(2, |g| {
        // Started from other weights, then read in parts.
        let fresh = Linear::new(4, 6, true, &random::key(99)).unwrap();
        let mut rows = AllToShardedLinear::from_linear(&fresh, 1, &g).unwrap();
        load_sharded_weights(&mut rows, &path, &g).unwrap();
        let mut cols = ShardedToAllLinear::from_linear(&fresh, 1, &g).unwrap();
        load_sharded_weights(&mut cols, &path, &g).unwrap();
        let want_rows = AllToShardedLinear::from_linear(&saved, 1, &g).unwrap();
        let want_cols = ShardedToAllLinear::from_linear(&saved, 1, &g).unwrap();
        let other = Linear::new(4, 8, true, &random::key(1)).unwrap();
        let mut wrong = AllToShardedLinear::from_linear(&other, 1, &g).unwrap();
        let e = load_sharded_weights(&mut wrong, &path, &g)
            .unwrap_err()
            .to_string();
        let same = |a: &dyn mlx_nn::Module, b: &dyn mlx_nn::Module| {
            let v = |m: &dyn mlx_nn::Module| {
                m.named_parameters()
                    .into_iter()
                    .map(|(n, a)| (n, values(&a)))
                    .collect::<Vec<_>>()
            };
            v(a) == v(b)
        };
        (same(&rows, &want_rows), same(&cols, &want_cols), e)
    })
    .unwrap();
    for (r, (rows, cols, e)) in got.into_iter().enumerate() {
        assert!(rows && cols, "rank {r}");
        assert!(
            e.contains("has shape [6") && e.contains("is not a block of over 2 ranks"),
            "{e}"
        );
    }
}
