//! Loader: pad/pack contents against independent expectations, batch splitting,
//! exactly-once per epoch across ranks, resume mid-epoch, prefetching.

mod common;

use common::*;
use mlx_data::{
    BatchMode, BatchSize, DataError, DataLoader, LoaderConfig, LoaderState, Prefetcher,
};
use std::collections::HashSet;
use std::sync::Arc;

const VOCAB: u32 = 1000;

fn store(n_docs: u64) -> (tempfile::TempDir, Arc<mlx_data::TokenStore>) {
    let dir = tempfile::tempdir().unwrap();
    let s = synthetic_store(&dir.path().join("l.tokens"), n_docs, VOCAB);
    (dir, Arc::new(s))
}

/// The concatenated stream, computed from the formula rather than the store.
fn stream(n_docs: u64) -> Vec<u32> {
    let mut s = vec![];
    for i in 0..n_docs {
        s.extend(doc_tokens(i, VOCAB));
        s.push(EOS);
    }
    s
}

fn cfg(mode: BatchMode, block: usize, batch: BatchSize, rank: usize, world: usize) -> LoaderConfig {
    LoaderConfig {
        block_size: block,
        batch,
        mode,
        seed: 5,
        rank,
        world,
        release_pages: true,
    }
}

#[test]
fn pad_rows_and_mask_match_the_documents() {
    let (_d, s) = store(300);
    let block = 20;
    let mut l =
        DataLoader::new(s, cfg(BatchMode::Pad, block, BatchSize::PerRank(4), 0, 1)).unwrap();
    let mut saw_short = false;
    let mut saw_long = false;
    for _ in 0..30 {
        let b = l.next_batch().unwrap();
        assert_eq!(b.tokens.len(), 4 * (block + 1));
        assert_eq!(b.loss_mask.len(), 4 * block);
        for r in 0..4 {
            let doc = doc_tokens(b.samples[r], VOCAB);
            let mut want = doc.clone();
            want.truncate(block + 1);
            want.resize(block + 1, EOS);
            assert_eq!(b.row(r), &want[..]);
            // Targets count up to and including the first EOS after the story.
            let want_mask: Vec<u8> = (0..block).map(|j| (j < doc.len()) as u8).collect();
            assert_eq!(b.mask(r), &want_mask[..]);
            assert_eq!(b.inputs(r), &want[..block]);
            assert_eq!(b.targets(r), &want[1..]);
            saw_short |= doc.len() < block;
            saw_long |= doc.len() > block + 1;
        }
    }
    assert!(saw_short && saw_long);
}

#[test]
fn pack_rows_are_contiguous_windows_of_the_stream() {
    let (_d, s) = store(200);
    let full = stream(200);
    let block = 16;
    let mut l =
        DataLoader::new(s, cfg(BatchMode::Pack, block, BatchSize::PerRank(3), 0, 1)).unwrap();
    assert_eq!(l.n_samples(), (full.len() as u64 - 1) / block as u64);
    for _ in 0..20 {
        let b = l.next_batch().unwrap();
        assert!(b.loss_mask.iter().all(|&m| m == 1));
        for r in 0..3 {
            let start = b.samples[r] as usize * block;
            assert_eq!(b.row(r), &full[start..start + block + 1]);
        }
    }
}

#[test]
fn global_batch_must_divide_by_world() {
    let (_d, s) = store(100);
    let err = DataLoader::new(
        s.clone(),
        cfg(BatchMode::Pad, 8, BatchSize::Global(6), 0, 4),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::BatchNotDivisible {
                global: 6,
                world: 4
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("not divisible"));
    let l = DataLoader::new(
        s.clone(),
        cfg(BatchMode::Pad, 8, BatchSize::Global(8), 1, 4),
    )
    .unwrap();
    assert_eq!(l.per_rank_batch(), 2);
    let l = DataLoader::new(s, cfg(BatchMode::Pad, 8, BatchSize::PerRank(3), 1, 4)).unwrap();
    assert_eq!(l.per_rank_batch(), 3);
}

#[test]
fn too_little_data_is_a_clear_error() {
    let (_d, s) = store(5);
    let err = DataLoader::new(s, cfg(BatchMode::Pad, 8, BatchSize::Global(8), 0, 2)).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::NotEnoughData {
                needed: 8,
                available: 5,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn one_epoch_across_ranks_uses_each_sample_once() {
    let (_d, s) = store(240);
    for mode in [BatchMode::Pad, BatchMode::Pack] {
        for world in 1..=8 {
            let mut seen = HashSet::new();
            let mut n_samples = 0;
            for rank in 0..world {
                let mut l =
                    DataLoader::new(s.clone(), cfg(mode, 10, BatchSize::PerRank(2), rank, world))
                        .unwrap();
                n_samples = l.n_samples();
                for _ in 0..l.batches_per_epoch() {
                    let b = l.next_batch().unwrap();
                    assert_eq!(b.epoch, 0);
                    for x in b.samples {
                        assert!(seen.insert(x), "{mode:?} world {world}: sample {x} twice");
                    }
                }
                assert_eq!(l.next_batch().unwrap().epoch, 1);
            }
            let per_rank = n_samples / world as u64;
            assert_eq!(seen.len() as u64, world as u64 * (per_rank - per_rank % 2));
        }
    }
}

#[test]
fn resume_mid_epoch_reproduces_the_uninterrupted_run() {
    let (_d, s) = store(100);
    let c = cfg(BatchMode::Pad, 12, BatchSize::Global(6), 1, 3);
    let mut straight = DataLoader::new(s.clone(), c.clone()).unwrap();
    let reference: Vec<_> = (0..40).map(|_| straight.next_batch().unwrap()).collect();
    assert!(straight.batches_per_epoch() < 40, "must cross epochs");

    let mut first = DataLoader::new(s.clone(), c.clone()).unwrap();
    for b in reference.iter().take(7) {
        assert_eq!(&first.next_batch().unwrap(), b);
    }
    let saved = first.state().to_json();
    drop(first);
    let mut resumed = DataLoader::new(s.clone(), c.clone()).unwrap();
    resumed
        .restore(&LoaderState::from_json(&saved).unwrap())
        .unwrap();
    for b in reference.iter().skip(7) {
        assert_eq!(&resumed.next_batch().unwrap(), b);
    }

    // A state whose batches have other rows across the world is refused.
    let mut other =
        DataLoader::new(s, cfg(BatchMode::Pad, 12, BatchSize::PerRank(3), 1, 3)).unwrap();
    let err = other
        .restore(&LoaderState::from_json(&saved).unwrap())
        .unwrap_err();
    assert!(
        matches!(
            err,
            DataError::StateMismatch {
                field: "the global batch",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("9 rows (3 on each of 3 ranks)"),
        "{err}"
    );
}

/// Each step's samples across the world: the union of every rank's batch.
fn world_steps(
    s: &Arc<mlx_data::TokenStore>,
    mode: BatchMode,
    world: usize,
    from: Option<&LoaderState>,
    steps: usize,
) -> Vec<(u64, Vec<u64>)> {
    let mut loaders: Vec<DataLoader> = (0..world)
        .map(|r| {
            let c = cfg(mode, 8, BatchSize::Global(12), r, world);
            let mut l = DataLoader::new(s.clone(), c).unwrap();
            if let Some(state) = from {
                l.restore(state).unwrap();
            }
            l
        })
        .collect();
    (0..steps)
        .map(|_| {
            let mut epoch = None;
            let mut samples = vec![];
            for l in &mut loaders {
                let b = l.next_batch().unwrap();
                assert!(
                    epoch.is_none_or(|e| e == b.epoch),
                    "ranks in different epochs"
                );
                epoch = Some(b.epoch);
                samples.extend(b.samples);
            }
            samples.sort();
            (epoch.unwrap(), samples)
        })
        .collect()
}

/// A run that stops at world N and resumes at world M (the same global
/// batch) takes, step by step, the samples of a run at world 1: every
/// sample of an epoch exactly once across the change, across epochs.
#[test]
fn a_state_resumes_at_another_world_size_with_each_sample_once() {
    let (_d, s) = store(150);
    for mode in [BatchMode::Pad, BatchMode::Pack] {
        let per_epoch = DataLoader::new(s.clone(), cfg(mode, 8, BatchSize::Global(12), 0, 1))
            .unwrap()
            .batches_per_epoch() as usize;
        // Past the end of the first epoch.
        let steps = per_epoch + 6;
        let one = world_steps(&s, mode, 1, None, steps);
        // Within an epoch no sample repeats: world 1 is a fair reference.
        for e in 0..2 {
            let mut seen = HashSet::new();
            for (_, samples) in one.iter().filter(|(ep, _)| *ep == e) {
                assert!(
                    samples.iter().all(|x| seen.insert(*x)),
                    "{mode:?}: a repeat"
                );
            }
        }
        for (n, m) in [(4, 2), (2, 3), (3, 1), (1, 4), (6, 4)] {
            for stop in [1, 5, per_epoch, per_epoch + 2] {
                let mut first: Vec<DataLoader> = (0..n)
                    .map(|r| {
                        let c = cfg(mode, 8, BatchSize::Global(12), r, n);
                        DataLoader::new(s.clone(), c).unwrap()
                    })
                    .collect();
                let mut got = vec![];
                for _ in 0..stop {
                    let mut samples = vec![];
                    let mut epoch = 0;
                    for l in &mut first {
                        let b = l.next_batch().unwrap();
                        epoch = b.epoch;
                        samples.extend(b.samples);
                    }
                    samples.sort();
                    got.push((epoch, samples));
                }
                // Every rank's state says the same position; take the last's.
                let state = LoaderState::from_json(&first[n - 1].state().to_json()).unwrap();
                got.extend(world_steps(&s, mode, m, Some(&state), steps - stop));
                assert_eq!(got, one, "{mode:?}: world {n} -> {m} after {stop} steps");
            }
        }
    }
}

#[test]
fn prefetcher_delivers_the_same_batches_and_resumes_exactly() {
    let (_d, s) = store(100);
    let c = cfg(BatchMode::Pack, 8, BatchSize::PerRank(4), 0, 2);
    let mut plain = DataLoader::new(s.clone(), c.clone()).unwrap();
    let reference: Vec<_> = (0..30).map(|_| plain.next_batch().unwrap()).collect();

    let mut p = Prefetcher::spawn(DataLoader::new(s.clone(), c.clone()).unwrap(), 3).unwrap();
    for b in reference.iter().take(11) {
        assert_eq!(&p.next_batch().unwrap(), b);
    }
    // The thread has read ahead; the saved state is the consumer's.
    let state = p.state();
    drop(p);
    let mut l = DataLoader::new(s, c).unwrap();
    l.restore(&state).unwrap();
    let mut p = Prefetcher::spawn(l, 2).unwrap();
    for b in reference.iter().skip(11) {
        assert_eq!(&p.next_batch().unwrap(), b);
    }
}

/// Restores a loader from `text` as a resume does (`loader_rank<N>.json`)
/// and takes two batches when it restores: an error or a loader that runs,
/// never a panic.
fn restore_from(text: &str) {
    let (_d, s) = store(7);
    let mut l = DataLoader::new(s, cfg(BatchMode::Pad, 4, BatchSize::Global(2), 0, 1)).unwrap();
    if let Ok(state) = LoaderState::from_json(text) {
        let _ = state.global_batch();
        // A restored loader gives its batches or an error (at the last
        // epoch a count can hold, there is no next one).
        if l.restore(&state).is_ok() && l.next_batch().is_ok() {
            let _ = l.next_batch();
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(200))]

    /// Arbitrary text as a loader state (the fuzz target `loader_state`
    /// runs the same reader under coverage guidance).
    #[test]
    fn arbitrary_text_is_a_loader_state_or_an_error(text in "\\PC{0,120}") {
        restore_from(&text);
    }

    /// A saved state with any number in any field, or a valid state (after
    /// three batches) with up to three fields set to anything.
    #[test]
    fn any_numbers_restore_or_are_refused(
        fields in proptest::collection::vec(proptest::prelude::any::<u64>(), 8),
        edits in proptest::collection::vec(
            (0usize..8, proptest::prop_oneof![
                proptest::prelude::any::<u64>(),
                proptest::strategy::Strategy::prop_map(0u64..4, |d| u64::MAX - d),
                0u64..8,
            ]),
            1..4,
        ),
        valid: bool,
        pack: bool,
    ) {
        let names = [
            "epoch", "batch_in_epoch", "seed", "rank", "world", "n_samples",
            "per_rank_batch", "block_size",
        ];
        let v: serde_json::Map<String, serde_json::Value> = if valid {
            let (_d, s) = store(7);
            let mut l = DataLoader::new(s, cfg(BatchMode::Pad, 4, BatchSize::Global(2), 0, 1)).unwrap();
            for _ in 0..3 {
                l.next_batch().unwrap();
            }
            let mut v: serde_json::Value = serde_json::from_str(&l.state().to_json()).unwrap();
            for (f, x) in &edits {
                v[names[*f]] = (*x).into();
            }
            v.as_object().unwrap().clone()
        } else {
            let mut v: serde_json::Map<String, serde_json::Value> = names
                .iter()
                .zip(&fields)
                .map(|(n, f)| (n.to_string(), (*f).into()))
                .collect();
            v.insert("mode".into(), if pack { "Pack" } else { "Pad" }.into());
            v
        };
        restore_from(&serde_json::Value::Object(v).to_string());
    }
}

/// Regression (found by `any_numbers_restore_or_are_refused`): a state
/// whose `per_rank_batch * world` overflows panicked in `global_batch`
/// ("attempt to multiply with overflow") on the way to being refused.
#[test]
fn a_state_whose_global_batch_overflows_is_refused() {
    let text = r#"{"epoch":0,"batch_in_epoch":0,"seed":5,"rank":0,"world":3,"n_samples":7,"per_rank_batch":6148914691236517206,"block_size":4,"mode":"Pad"}"#;
    let state = LoaderState::from_json(text).unwrap();
    assert_eq!(state.global_batch(), usize::MAX);
    let (_d, s) = store(7);
    let mut l = DataLoader::new(s, cfg(BatchMode::Pad, 4, BatchSize::Global(2), 0, 1)).unwrap();
    let err = l.restore(&state).unwrap_err();
    assert!(err.to_string().contains("global batch"), "{err}");
}

/// Regression: a state at the end of epoch `u64::MAX` restores (every
/// field matches), and the next batch, which would begin the epoch after
/// it, is an error rather than an overflow.
#[test]
fn the_last_epoch_has_no_next() {
    let (_d, s) = store(7);
    let mut l = DataLoader::new(s, cfg(BatchMode::Pad, 4, BatchSize::Global(2), 0, 1)).unwrap();
    let mut state = l.state();
    state.epoch = u64::MAX;
    state.batch_in_epoch = l.batches_per_epoch();
    l.restore(&state).unwrap();
    let err = l.next_batch().unwrap_err();
    assert!(err.to_string().contains("overflows"), "{err}");
}
