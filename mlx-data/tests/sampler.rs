//! Sharded sampler: exactly-once coverage, equal shards, determinism, reshuffling.

use mlx_data::ShardedSampler;
use std::collections::HashSet;

#[test]
fn every_sample_exactly_once_across_ranks_for_world_sizes_1_to_8() {
    for world in 1..=8usize {
        for n in [world as u64, 97, 1000, 4099] {
            for epoch in [0u64, 3] {
                let mut seen = HashSet::new();
                let mut per_rank = vec![];
                for rank in 0..world {
                    let s = ShardedSampler::new(rank, world, 42)
                        .unwrap()
                        .with_epoch(epoch);
                    let mine: Vec<u64> = s.indices(n).collect();
                    per_rank.push(mine.len());
                    for i in mine {
                        assert!(i < n);
                        assert!(seen.insert(i), "sample {i} twice (world {world}, n {n})");
                    }
                }
                // Equal shards, remainder dropped (pct1_dropremainder style).
                assert!(per_rank.iter().all(|&l| l as u64 == n / world as u64));
                assert_eq!(seen.len() as u64, n - n % world as u64);
            }
        }
    }
}

#[test]
fn deterministic_and_reshuffled_per_epoch() {
    let order = |seed, epoch| -> Vec<u64> {
        ShardedSampler::new(1, 3, seed)
            .unwrap()
            .with_epoch(epoch)
            .indices(3000)
            .collect()
    };
    assert_eq!(order(42, 0), order(42, 0));
    assert_ne!(order(42, 0), order(42, 1));
    assert_ne!(order(42, 0), order(7, 0));
    // A shuffled order, not the identity stride.
    let strided: Vec<u64> = (0..1000).map(|k| 1 + 3 * k).collect();
    assert_ne!(order(42, 0), strided);
}

#[test]
fn dropped_remainder_changes_between_epochs() {
    // With n = 10 and world 4, two samples are dropped each epoch; over a few
    // epochs every sample is eventually used.
    let mut used = HashSet::new();
    for epoch in 0..20 {
        for rank in 0..4 {
            used.extend(
                ShardedSampler::new(rank, 4, 1)
                    .unwrap()
                    .with_epoch(epoch)
                    .indices(10),
            );
        }
    }
    assert_eq!(used.len(), 10);
}
