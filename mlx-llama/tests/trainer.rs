//! The trainer on small configurations: data-parallel equivalence, learning,
//! exact resume, refusing bad checkpoints, checksums and falling back past
//! corrupt ones, keeping the newest N.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex};

use mlx_llama::checkpoint;
use mlx_llama::testing::tiny_model;
use mlx_llama::{Batching, LlamaConfig, TrainConfig, train};
use sha2::{Digest, Sha256};

mod common;
use common::{tiny, weights};

/// Every file of a checkpoint folder but the manifest: name to (size, sha256).
fn files_on_disk(dir: &Path) -> BTreeMap<String, (u64, String)> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap() != "manifest.json")
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            let hash: String = Sha256::digest(&bytes)
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, (bytes.len() as u64, hash))
        })
        .collect()
}

/// Checks that the manifest lists exactly the folder's files, with their sizes and hashes.
fn assert_manifest_covers(dir: &Path) {
    let text = std::fs::read_to_string(dir.join("manifest.json")).unwrap();
    let m: checkpoint::Manifest = serde_json::from_str(&text).unwrap();
    assert_eq!(m.format, checkpoint::FORMAT);
    let listed: BTreeMap<String, (u64, String)> = m
        .files
        .into_iter()
        .map(|f| (f.name, (f.bytes, f.sha256)))
        .collect();
    assert_eq!(listed, files_on_disk(dir), "in {}", dir.display());
}

/// Flips the last byte of a file (tensor data, not the header).
fn flip_last_byte(path: &Path) {
    let mut bytes = std::fs::read(path).unwrap();
    *bytes.last_mut().unwrap() ^= 0x01;
    std::fs::write(path, bytes).unwrap();
}

/// Cuts a file to half its length.
fn truncate(path: &Path) {
    let bytes = std::fs::read(path).unwrap();
    std::fs::write(path, &bytes[..bytes.len() / 2]).unwrap();
}

/// A `Write` into a shared buffer, for capturing log lines.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` on this thread with its warnings captured; returns both.
fn with_warnings<T>(f: impl FnOnce() -> T) -> (T, String) {
    let buf = Captured::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::WARN)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let out = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
    (out, text)
}

fn max_diff(a: &[(String, Vec<f32>)], b: &[(String, Vec<f32>)]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|((na, va), (nb, vb))| {
            assert_eq!(na, nb);
            va.iter()
                .zip(vb)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f32::max)
        })
        .fold(0.0, f32::max)
}

#[test]
fn two_ranks_with_a_global_batch_match_one_rank() {
    world_two_matches_world_one(Batching::Pack, tiny_model(2, 32));
}

/// Multi-query attention with heads wider than dims / heads and the output
/// projection tied to the embedding: one tensor, whose gradient (both
/// uses, every row) is averaged whole and whose AdamW state is sharded
/// once over the ranks.
#[test]
fn two_ranks_match_one_rank_with_one_key_value_head_and_tied_embeddings() {
    world_two_matches_world_one(
        Batching::Pack,
        LlamaConfig {
            num_heads: 4,
            num_kv_heads: 1,
            head_dim: 16,
            tie_embeddings: true,
            ..tiny_model(2, 32)
        },
    );
}

/// With padded rows each rank counts its own targets: the loss is normalised
/// by the world's count, so world 2 still follows world 1.
#[test]
fn two_ranks_with_padded_rows_match_one_rank() {
    world_two_matches_world_one(Batching::Pad, tiny_model(2, 32));
}

fn world_two_matches_world_one(batching: Batching, model: LlamaConfig) {
    let dir = tempfile::tempdir().unwrap();
    let one = dir.path().join("world1");
    let two = dir.path().join("world2");
    let cfg1 = TrainConfig {
        batching,
        model: model.clone(),
        ..tiny(&one, 10)
    };
    let s1 = train(&cfg1, &mlx_dist::Group::single()).unwrap();
    let cfg2 = TrainConfig {
        batching,
        model,
        ..tiny(&two, 10)
    };
    let s2 = mlx_dist::run_local(2, |g| train(&cfg2, &g).unwrap()).unwrap();
    assert_eq!(
        s2[0].losses, s2[1].losses,
        "ranks disagree on the world's loss"
    );
    for (a, b) in s1.losses.iter().zip(&s2[0].losses) {
        assert!(
            (a - b).abs() <= 1e-4 * a.abs(),
            "world 1 {:?} vs world 2 {:?}",
            s1.losses,
            s2[0].losses
        );
    }
    // Sums over 2,044 rows at world 1 and 2 x 1,022 at world 2 round
    // differently; Adam's m/sqrt(v) magnifies that in near-zero gradients,
    // where one step moves a weight by up to lr = 3e-3.
    let d = max_diff(&weights(&one), &weights(&two));
    assert!(d < 1e-3, "parameters differ by {d} after 10 steps");
}

#[test]
fn the_loss_falls_on_the_built_in_corpus() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(dir.path(), 40);
    cfg.eval_every = 40;
    let s = train(&cfg, &mlx_dist::Group::single()).unwrap();
    let first: f32 = s.losses[..5].iter().sum::<f32>() / 5.0;
    let last: f32 = s.losses[35..].iter().sum::<f32>() / 5.0;
    assert!(last < first - 1.0, "loss went from {first} to {last}");
    let (_, val) = s.eval_losses[0];
    assert!(
        val < first - 1.0,
        "validation loss {val} did not fall below {first}"
    );
}

#[test]
fn resuming_equals_an_uninterrupted_run_and_bad_checkpoints_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let parts = dir.path().join("parts");
    let full = train(&tiny(&whole, 6), &mlx_dist::Group::single()).unwrap();
    let first = train(&tiny(&parts, 3), &mlx_dist::Group::single()).unwrap();
    let rest = train(&tiny(&parts, 6), &mlx_dist::Group::single()).unwrap();
    assert_eq!(first.losses, full.losses[..3]);
    assert_eq!(
        rest.losses,
        full.losses[3..],
        "the resumed loss curve differs"
    );
    assert_eq!(max_diff(&weights(&whole), &weights(&parts)), 0.0);

    // A different model is refused with the reason.
    let mut other = tiny(&parts, 8);
    other.model.num_layers = 3;
    let err = format!(
        "{:#}",
        train(&other, &mlx_dist::Group::single()).unwrap_err()
    );
    assert!(
        err.contains("different configuration") && err.contains("num_layers"),
        "{err}"
    );
    // One flipped byte in the latest weights: the run resumes from the
    // checkpoint before it (step 3), warning which file is wrong.
    let step6 = checkpoint::step_dir(&parts, 6);
    flip_last_byte(&step6.join("model.safetensors"));
    let (again, warnings) = with_warnings(|| train(&tiny(&parts, 6), &mlx_dist::Group::single()));
    assert_eq!(
        again.unwrap().losses,
        full.losses[3..],
        "did not resume from step 3"
    );
    assert!(
        warnings.contains("step_00000006") && warnings.contains("model.safetensors"),
        "{warnings}"
    );
    // With every checkpoint corrupt (a changed byte in the step 6 that run
    // wrote again, a garbled manifest) the error says what is wrong with each.
    flip_last_byte(&step6.join("model.safetensors"));
    std::fs::write(
        checkpoint::step_dir(&parts, 3).join("manifest.json"),
        "{ not json",
    )
    .unwrap();
    let err = format!(
        "{:#}",
        train(&tiny(&parts, 8), &mlx_dist::Group::single()).unwrap_err()
    );
    for part in [
        "step_00000006",
        "model.safetensors",
        "sha256",
        "step_00000003",
        "manifest",
    ] {
        assert!(err.contains(part), "no `{part}` in: {err}");
    }
}

#[test]
fn a_checkpoint_lists_every_file_with_its_size_and_sha256() {
    let dir = tempfile::tempdir().unwrap();
    train(&tiny(dir.path(), 1), &mlx_dist::Group::single()).unwrap();
    let latest = checkpoint::latest(dir.path()).unwrap().unwrap();
    assert_manifest_covers(&latest);
    let names = files_on_disk(&latest).into_keys().collect::<Vec<_>>();
    assert_eq!(
        names,
        [
            "loader_rank0.json",
            "model.safetensors",
            "optimizer.safetensors"
        ]
    );
}

#[test]
fn corrupt_or_truncated_files_are_caught_and_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    let cfg = TrainConfig {
        checkpoint_every: 1,
        ..tiny(out, 3)
    };
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let good = checkpoint::latest_good(out).unwrap().unwrap();
    assert_eq!((good.manifest.step, good.rejected.len()), (3, 0));

    // A flipped byte: the previous checkpoint, naming the file.
    flip_last_byte(&checkpoint::step_dir(out, 3).join("model.safetensors"));
    let found = checkpoint::latest_good(out).unwrap().unwrap();
    assert_eq!(found.dir, checkpoint::step_dir(out, 2));
    assert!(
        found.rejected[0].contains("model.safetensors") && found.rejected[0].contains("sha256"),
        "{:?}",
        found.rejected
    );
    // A truncated file: caught by its size.
    truncate(&checkpoint::step_dir(out, 2).join("loader_rank0.json"));
    let found = checkpoint::latest_good(out).unwrap().unwrap();
    assert_eq!(found.manifest.step, 1);
    assert!(
        found.rejected[1].contains("loader_rank0.json") && found.rejected[1].contains("bytes"),
        "{:?}",
        found.rejected
    );
    // A missing file, then none left: an error naming each problem.
    std::fs::remove_file(checkpoint::step_dir(out, 1).join("optimizer.safetensors")).unwrap();
    let err = format!("{:#}", checkpoint::latest_good(out).unwrap_err());
    for part in [
        "step_00000003",
        "model.safetensors",
        "step_00000002",
        "loader_rank0.json",
        "step_00000001",
        "optimizer.safetensors",
    ] {
        assert!(err.contains(part), "no `{part}` in: {err}");
    }

    // A format-1 manifest (no checksums) is refused, naming the flag that
    // reads it anyway (unverified: the missing file goes unnoticed); an
    // unknown format is refused whatever the flag.
    let step1 = checkpoint::step_dir(out, 1);
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(step1.join("manifest.json")).unwrap())
            .unwrap();
    m["format"] = 1.into();
    m.as_object_mut().unwrap().remove("files");
    std::fs::write(step1.join("manifest.json"), m.to_string()).unwrap();
    let err = format!("{:#}", checkpoint::verify(&step1).unwrap_err());
    assert!(
        err.contains("format 1")
            && err.contains("no checksums")
            && err.contains("--allow-old-checkpoint-format")
            && err.contains("step_00000001"),
        "{err}"
    );
    assert_eq!(checkpoint::verify_allowing(&step1, true).unwrap().step, 1);
    m["format"] = (checkpoint::FORMAT + 1).into();
    std::fs::write(step1.join("manifest.json"), m.to_string()).unwrap();
    let err = format!("{:#}", checkpoint::verify(&step1).unwrap_err());
    let unknown = format!("format {}", checkpoint::FORMAT + 1);
    assert!(err.contains(&unknown), "{err}");
}

/// Writes `step` into the manifest of the checkpoint folder `dir` (its
/// files, and so their checksums, untouched).
fn set_manifest_step(dir: &Path, step: u64) {
    let path = dir.join("manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["step"] = step.into();
    std::fs::write(&path, m.to_string()).unwrap();
}

/// A manifest whose step is not its folder's is corrupt: `verify` says
/// which folder and both steps, and a resume passes it over for the
/// checkpoint before it, whose losses it then continues exactly (not
/// "at step 2" with step 4's weights).
#[test]
fn a_manifest_whose_step_is_not_its_folders_is_corrupt_and_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let parts = dir.path().join("parts");
    let every2 = |out: &Path, steps| TrainConfig {
        checkpoint_every: 2,
        ..tiny(out, steps)
    };
    let full = train(&every2(&whole, 6), &mlx_dist::Group::single()).unwrap();
    train(&every2(&parts, 4), &mlx_dist::Group::single()).unwrap();
    let step4 = checkpoint::step_dir(&parts, 4);
    set_manifest_step(&step4, 2);

    let err = format!("{:#}", checkpoint::verify(&step4).unwrap_err());
    assert!(
        err.contains("step_00000004") && err.contains("step 2") && err.contains("step 4"),
        "{err}"
    );
    let found = checkpoint::latest_good(&parts).unwrap().unwrap();
    assert_eq!(found.dir, checkpoint::step_dir(&parts, 2));
    assert!(
        found.rejected[0].contains("step_00000004"),
        "{:?}",
        found.rejected
    );

    let rest = train(&every2(&parts, 6), &mlx_dist::Group::single()).unwrap();
    assert_eq!(
        rest.losses,
        full.losses[2..],
        "did not resume from step 2's checkpoint"
    );
    assert_eq!(max_diff(&weights(&whole), &weights(&parts)), 0.0);
}

/// At world 2 every rank loads the checkpoint rank 0 chose and verified:
/// with step 4's manifest saying step 2, both ranks resume from step 2's
/// folder (rank 1 does not open one rank 0 never checked), and the run
/// continues the losses of an uninterrupted one.
#[test]
fn every_rank_resumes_from_the_checkpoint_rank_0_verified() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole");
    let parts = dir.path().join("parts");
    let every2 = |out: &Path, steps| TrainConfig {
        checkpoint_every: 2,
        ..tiny(out, steps)
    };
    let (full, first) = (every2(&whole, 6), every2(&parts, 4));
    let full = mlx_dist::run_local(2, |g| train(&full, &g).unwrap()).unwrap();
    mlx_dist::run_local(2, |g| train(&first, &g).unwrap()).unwrap();
    set_manifest_step(&checkpoint::step_dir(&parts, 4), 2);

    let rest = every2(&parts, 6);
    let rest = mlx_dist::run_local(2, |g| train(&rest, &g).unwrap()).unwrap();
    for (rank, s) in rest.iter().enumerate() {
        assert_eq!(
            s.losses,
            full[0].losses[2..],
            "rank {rank} did not resume from step 2's checkpoint"
        );
    }
    assert_eq!(max_diff(&weights(&whole), &weights(&parts)), 0.0);
}

#[test]
fn keep_checkpoints_keeps_the_newest_n() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path();
    // Folders that are not checkpoints are never touched.
    let others = [
        out.join("checkpoints").join("notes"),
        out.join("checkpoints").join("step_old"),
    ];
    for o in &others {
        std::fs::create_dir_all(o).unwrap();
        std::fs::write(o.join("manifest.json"), "{}").unwrap();
    }
    let cfg = TrainConfig {
        checkpoint_every: 1,
        keep_checkpoints: 2,
        ..tiny(out, 5)
    };
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let steps = |out: &Path| {
        checkpoint::list(out)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect::<Vec<_>>()
    };
    assert_eq!(steps(out), [4, 5]);
    assert!(others.iter().all(|o| o.join("manifest.json").exists()));
    // 0 keeps all; the checkpoint `latest` points to is never deleted.
    assert!(checkpoint::prune(out, 0).unwrap().is_empty());
    std::fs::write(out.join("checkpoints").join("latest"), "step_00000004").unwrap();
    assert!(checkpoint::prune(out, 1).unwrap().is_empty());
    assert_eq!(steps(out), [4, 5]);
}

#[test]
fn sharded_optimizer_state_matches_whole_state_and_resumes_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let run = |cfg: &TrainConfig| mlx_dist::run_local(2, |g| train(cfg, &g).unwrap()).unwrap();
    // Two ranks: each sum of two gradients has one order, so sharding the
    // state changes nothing, bit for bit.
    let sharded = dir.path().join("sharded");
    let whole = dir.path().join("whole");
    let s = run(&tiny(&sharded, 4));
    let w = run(&TrainConfig {
        shard_optimizer: false,
        ..tiny(&whole, 4)
    });
    assert_eq!(s[0].losses, w[0].losses);
    assert_eq!(max_diff(&weights(&sharded), &weights(&whole)), 0.0);
    let latest = mlx_llama::checkpoint::latest(&sharded).unwrap().unwrap();
    for r in 0..2 {
        assert!(
            latest
                .join(format!("optimizer_rank{r}.safetensors"))
                .exists()
        );
    }
    assert!(!latest.join("optimizer.safetensors").exists());
    // The manifest covers every rank's files.
    assert_manifest_covers(&latest);
    assert_eq!(files_on_disk(&latest).len(), 5);

    // Resuming from the shards (with clipping by the global norm) continues
    // the uninterrupted run exactly.
    let clipped = |out: &Path, steps| TrainConfig {
        grad_clip: Some(0.5),
        ..tiny(out, steps)
    };
    let full_dir = dir.path().join("full");
    let parts = dir.path().join("parts");
    let full = run(&clipped(&full_dir, 6));
    let first = run(&clipped(&parts, 3));
    let rest = run(&clipped(&parts, 6));
    assert_eq!(first[0].losses, full[0].losses[..3]);
    assert_eq!(rest[0].losses, full[0].losses[3..]);
    assert_eq!(max_diff(&weights(&full_dir), &weights(&parts)), 0.0);

    // A corrupt shard of rank 1: both ranks resume from the step before.
    flip_last_byte(&checkpoint::step_dir(&parts, 6).join("optimizer_rank1.safetensors"));
    let again = run(&clipped(&parts, 6));
    assert_eq!(again[1].losses, full[0].losses[3..]);

    // Sharded state resumes with whole state, re-sharded, and continues a
    // sharded run within round-off: the gradients are the same bit for bit,
    // but the whole gradients' norm (for clipping) is summed in another
    // order than the sum of the shards' squared norms.
    let full8 = dir.path().join("full8");
    let want = run(&clipped(&full8, 8));
    let toggled = run(&TrainConfig {
        shard_optimizer: false,
        ..clipped(&parts, 8)
    });
    for (g, w) in toggled[0].losses.iter().zip(&want[0].losses[6..]) {
        assert!(
            (g - w).abs() <= 1e-5 * w,
            "loss {g} resumed whole, {w} sharded"
        );
    }
    let d = max_diff(&weights(&full8), &weights(&parts));
    eprintln!("resumed with whole state: parameters within {d:e}");
    assert!(d <= 1e-5, "parameters differ by {d}");
    let latest = mlx_llama::checkpoint::latest(&parts).unwrap().unwrap();
    assert!(latest.join("optimizer.safetensors").exists());
}

#[test]
fn a_global_batch_that_does_not_split_is_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(dir.path(), 1);
    cfg.global_batch = 3;
    let errs =
        mlx_dist::run_local(2, |g| train(&cfg, &g).map(|_| ()).unwrap_err().to_string()).unwrap();
    assert!(
        errs[0].contains("does not split evenly over 2 ranks"),
        "{}",
        errs[0]
    );
}

#[test]
fn metrics_rows_carry_the_wall_clock_time_and_the_fraction_of_an_epoch_seen() {
    let dir = tempfile::tempdir().unwrap();
    let words = [
        "the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far",
    ];
    let story = |seed: usize, n: usize| {
        (0..n)
            .map(|i| words[(seed * 7 + i * 3) % words.len()])
            .collect::<Vec<_>>()
            .join(" ")
    };
    let stories = |n: usize| {
        (0..n)
            .map(|i| story(i, 30))
            .collect::<Vec<_>>()
            .join("<|endoftext|>")
    };
    let (train_txt, valid_txt) = (dir.path().join("train.txt"), dir.path().join("valid.txt"));
    std::fs::write(&train_txt, stories(10)).unwrap();
    std::fs::write(&valid_txt, stories(3)).unwrap();
    let out = dir.path().join("run");
    let cfg = TrainConfig {
        data: mlx_llama::DataSource::Text {
            train: train_txt,
            validation: Some(valid_txt),
        },
        block_size: 16,
        eval_every: 0,
        sample_log: Some(dir.path().join("samples")),
        data_cache: Some(dir.path().join("cache")),
        ..tiny(&out, 12)
    };
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let before = unix();
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let after = unix();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 12);
    let times: Vec<f64> = rows
        .iter()
        .map(|r| r["unix_time"].as_f64().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    assert!(times[0] >= before && times[11] <= after, "{times:?}");
    // Each step's samples come from the epoch the previous row's fraction
    // had reached (the sample log's epochs, counted by the loader).
    let drawn: Vec<u64> = std::fs::read_to_string(dir.path().join("samples.rank0.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v["micro_batches"][0]["epoch"].as_u64().unwrap()
        })
        .collect();
    let epochs: Vec<f64> = rows.iter().map(|r| r["epoch"].as_f64().unwrap()).collect();
    let per_step = epochs[0];
    assert!(per_step > 0.0 && per_step < 1.0, "{epochs:?}");
    for (i, e) in epochs.iter().enumerate() {
        assert!((e - (i + 1) as f64 * per_step).abs() < 1e-9, "{epochs:?}");
        let before_step = e - per_step;
        assert_eq!(
            drawn[i],
            (before_step + 1e-9).floor() as u64,
            "step {}: {epochs:?}",
            i + 1
        );
    }
    assert!(drawn[11] >= 1, "the run crosses an epoch: {drawn:?}");
}

#[test]
fn the_logged_learning_rate_is_the_one_the_steps_update_used() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = tiny(dir.path(), 5);
    cfg.warmup = 3;
    cfg.schedule = mlx_llama::ScheduleKind::Constant;
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let logged = common::metric_column(&dir.path().join("metrics.jsonl"), "learning_rate");
    // Linear warmup from 0 over 3 updates, then constant: the update of
    // step s (1-based) has s - 1 updates before it.
    let want: Vec<f64> = (1..=5u64)
        .map(|s| cfg.learning_rate * (s - 1).min(3) as f64 / 3.0)
        .collect();
    assert_eq!(logged.len(), want.len());
    for (s, (got, want)) in logged.iter().zip(&want).enumerate() {
        assert!(
            (got - want).abs() <= 1e-12 * cfg.learning_rate,
            "step {}: logged {got}, the update used {want}",
            s + 1
        );
    }
}

#[test]
fn overlapping_steps_changes_no_loss_record_or_checkpoint() {
    // Validation after steps 3 and 6, checkpoints after 4 and 7: those are
    // finished at once, steps 1, 2 and 5 wait for the next step.
    let dir = tempfile::tempdir().unwrap();
    let cfg = TrainConfig {
        eval_every: 3,
        eval_batches: 1,
        checkpoint_every: 4,
        grad_clip: Some(1.0),
        ..tiny(dir.path(), 7)
    };
    common::overlapping_steps_change_nothing(&cfg, 0.0);
}
