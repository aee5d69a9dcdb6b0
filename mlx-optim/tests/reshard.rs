//! Optimizer state saved at one world size and loaded at another: whole or
//! sharded over 1 to 4 ranks, either way, continues exactly as training
//! that never changed world size.
//!
//! The gradients are multiples of 1/64 below 4 and equal on every rank, so
//! the world's average of them is exact at any world size (`x + x + x` and
//! its third are exact): every world then trains the same parameters, bit
//! for bit, and any difference is the resharding's.

use std::path::{Path, PathBuf};

use mlx_array::{Array, Dtype, Tree, eval};
use mlx_optim::{AdamW, Optimizer, OptimizerState, Sharded, read_whole_state};

/// Parameters of awkward sizes: none divides by 2, 3 or 4, one is smaller
/// than the world.
const SHAPES: [(&str, &[usize]); 4] = [
    ("embed.weight", &[7, 5]),
    ("layers.0.bias", &[1]),
    ("layers.0.weight", &[3, 3]),
    ("norm.weight", &[11]),
];

/// A tree of `SHAPES` with values `(i * k + offset) mod 255 / 64 - 2`.
fn tree(k: usize, offset: usize) -> Tree {
    Tree::unflatten(SHAPES.iter().map(|(name, shape)| {
        let n: usize = shape.iter().product();
        let v: Vec<f32> = (0..n)
            .map(|i| ((i * k + offset) % 255) as f32 / 64.0 - 2.0)
            .collect();
        (name.to_string(), Array::from_slice(&v, shape).unwrap())
    }))
    .unwrap()
}

fn params() -> Tree {
    tree(7, 3)
}

fn grads(step: usize) -> Tree {
    tree(13 + step, 5 * step)
}

fn adamw() -> AdamW {
    AdamW::new(1e-2).weight_decay(0.1)
}

fn bits(t: &Tree) -> Vec<(String, Vec<u32>)> {
    t.flatten()
        .into_iter()
        .map(|(n, a)| {
            (
                n,
                a.to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|x| x.to_bits())
                    .collect(),
            )
        })
        .collect()
}

fn state_bits(s: &OptimizerState) -> (u64, Vec<(String, Vec<u32>)>) {
    (s.step(), bits(&s.tree().unwrap()))
}

/// One whole AdamW: the parameters and state after each of `steps` steps.
fn reference(steps: usize) -> Vec<(Tree, OptimizerState)> {
    let mut opt = adamw();
    let mut p = params();
    (0..steps)
        .map(|s| {
            opt.update_tree(&mut p, &grads(s)).unwrap();
            eval((&p, opt.state())).unwrap();
            (p.clone(), opt.state().clone())
        })
        .collect()
}

/// Trains `steps` steps at world `n` (sharded, or a whole AdamW at 1) and
/// saves the state into `dir`; returns its files in rank order.
fn save_at(n: usize, steps: usize, dir: &Path) -> Vec<PathBuf> {
    let file = |r: usize| dir.join(format!("opt{n}_{r}.safetensors"));
    mlx_dist::run_local(n, |g| {
        let mut p = params();
        let mut opt = Sharded::new(adamw(), &g);
        for s in 0..steps {
            opt.update_tree(&mut p, &grads(s)).unwrap();
            eval((&p, opt.state())).unwrap();
        }
        opt.save_state(&file(g.rank())).unwrap();
    })
    .unwrap();
    (0..n).map(file).collect()
}

#[test]
fn state_saved_at_any_world_size_continues_at_any_other_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let (before, after) = (3, 2);
    let want = reference(before + after);
    for n in 1..=4 {
        let files = save_at(n, before, dir.path());
        // Put together whole, the state is the whole optimizer's.
        let p = &want[before - 1].0;
        let whole = read_whole_state(&files, p, adamw().slot_names()).unwrap();
        assert_eq!(
            state_bits(&whole),
            state_bits(&want[before - 1].1),
            "world {n}: the whole state"
        );
        for m in 1..=4 {
            let got = mlx_dist::run_local(m, |g| {
                let mut p = want[before - 1].0.clone();
                let mut opt = Sharded::new(adamw(), &g);
                let whole = read_whole_state(&files, &p, opt.slot_names()).unwrap();
                opt.set_whole_state(&whole).unwrap();
                let sizes: Vec<usize> = opt
                    .state()
                    .flatten()
                    .iter()
                    .map(|(_, a)| a.size())
                    .collect();
                for s in before..before + after {
                    opt.update_tree(&mut p, &grads(s)).unwrap();
                    eval((&p, opt.state())).unwrap();
                }
                (bits(&p), sizes)
            })
            .unwrap();
            for (rank, (p, sizes)) in got.iter().enumerate() {
                assert_eq!(
                    *p,
                    bits(&want[before + after - 1].0),
                    "world {n} -> {m}, rank {rank}: the parameters"
                );
                // Each rank of a sharded world keeps only its shard.
                let full: Vec<usize> = want[0].1.flatten().iter().map(|(_, a)| a.size()).collect();
                let shard: Vec<usize> = full.iter().map(|n| n.div_ceil(m)).collect();
                assert_eq!(
                    *sizes, shard,
                    "world {n} -> {m}, rank {rank}: the shard sizes"
                );
            }
        }
        // A whole AdamW takes the state as it is.
        let mut opt = adamw();
        *opt.state_mut() = read_whole_state(&files, p, opt.slot_names()).unwrap();
        let mut p = p.clone();
        for s in before..before + after {
            opt.update_tree(&mut p, &grads(s)).unwrap();
        }
        assert_eq!(
            bits(&p),
            bits(&want[before + after - 1].0),
            "world {n} -> whole"
        );
    }
}

#[test]
fn files_that_are_not_one_saved_state_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let p = params();
    let slots = adamw().slot_names().to_vec();
    let three = save_at(3, 2, dir.path());
    // Two of three shards: the first file says it is shard 0 of 3.
    let e = read_whole_state(&three[..2], &p, &slots)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("opt3_0") && e.contains("shard 0/3") && e.contains("the 2 files given"),
        "{e}"
    );
    // Shards of two saves at different steps.
    let later = dir.path().join("later");
    std::fs::create_dir(&later).unwrap();
    let other = save_at(3, 1, &later);
    let mixed = vec![three[0].clone(), other[1].clone(), three[2].clone()];
    let e = read_whole_state(&mixed, &p, &slots)
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("step 1") && e.contains("step 2") && e.contains("not one saved state"),
        "{e}"
    );
    // Shards whose parameters do not fit this model.
    let bigger = Tree::unflatten([(
        "embed.weight".to_string(),
        Array::zeros(&[70, 5], Dtype::F32),
    )])
    .unwrap();
    let e = read_whole_state(&three, &bigger, &slots)
        .unwrap_err()
        .to_string();
    assert!(e.contains("embed.weight"), "{e}");
    assert!(read_whole_state(&[], &p, &slots).is_err());
}
