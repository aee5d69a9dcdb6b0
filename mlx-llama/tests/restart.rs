//! Restart on failure, end to end: `mlx-launch --max-restarts 1` runs a
//! 20-step training of a tiny model at world 2 and 3, one rank (chosen at
//! random, seeded) kills itself with SIGKILL at a random step between 6 and
//! 19 on the first attempt (`MLX_TEST_KILL_AT`, the trainer's test hook),
//! the launcher restarts the job, the trainer resumes from its newest
//! checkpoint, and the final parameters and every step's loss equal those
//! of an uninterrupted run at the same world size, bit for bit.
//!
//! The seed is printed; `MLX_TEST_SEED=N` replays a run. The `mlx-launch`
//! binary comes from `mlx-dist`: the test finds it beside `mlx-llama` and
//! builds it when it is missing or stale (see [`launcher`]).
//!
//! `cargo test -p mlx-llama --test restart -- --ignored --nocapture
//! restart_time` measures the time from a rank's death to training again
//! at world 2 (BENCHMARKS.md).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::launcher;

const STEPS: u64 = 20;

/// The tiny run of the proof (after `train` and [`common::TINY_MODEL_ARGS`]):
/// a checkpoint every 5 steps.
const TRAIN: &[&str] = &[
    "--global-batch",
    "6",
    "--data",
    "offline",
    "--eval-every",
    "0",
    "--checkpoint-every",
    "5",
    "--steps",
    "20",
];

fn unix_ms() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis()
}

/// A launch whose output lines are collected with the time each arrived;
/// the launcher (and with it its ranks) is killed when this is dropped.
struct Launch {
    child: Child,
    lines: Arc<Mutex<Vec<(u128, String)>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Launch {
    fn start(
        world: usize,
        out: &Path,
        cache: &Path,
        kill: Option<(usize, u64)>,
        extra: &[&str],
    ) -> Launch {
        let mut cmd = Command::new(launcher());
        cmd.args(["-n", &world.to_string(), "--max-restarts", "1", "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .arg("train")
            .args(common::TINY_MODEL_ARGS)
            .args(TRAIN)
            .args(extra)
            .arg("--out")
            .arg(out)
            .arg("--data-cache")
            .arg(cache)
            .env_remove("MLX_PROGRESS")
            .env_remove("MLX_TEST_KILL_AT")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if let Some((rank, step)) = kill {
            cmd.env("MLX_TEST_KILL_AT", format!("{rank}:{step}"));
        }
        let mut child = cmd.spawn().expect("starting mlx-launch");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        let streams: [Box<dyn Read + Send>; 2] = [
            Box::new(child.stdout.take().unwrap()),
            Box::new(child.stderr.take().unwrap()),
        ];
        for s in streams {
            let lines = lines.clone();
            readers.push(std::thread::spawn(move || {
                for l in BufReader::new(s).lines().map_while(Result::ok) {
                    lines.lock().unwrap().push((unix_ms(), l));
                }
            }));
        }
        Launch {
            child,
            lines,
            readers,
        }
    }

    /// Waits (at most `limit`) for the launcher to exit; returns its exit
    /// code and every output line with its arrival time.
    fn finish(mut self, limit: Duration) -> (Option<i32>, Vec<(u128, String)>) {
        let t = Instant::now();
        let st = loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                break st;
            }
            if t.elapsed() > limit {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let text = self.text();
                panic!("mlx-launch still running after {limit:?}:\n{text}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        let lines = std::mem::take(&mut *self.lines.lock().unwrap());
        (st.code(), lines)
    }

    fn text(&self) -> String {
        let lines = self.lines.lock().unwrap();
        lines
            .iter()
            .map(|(_, l)| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Launch {
    fn drop(&mut self) {
        // The ranks die with the launcher (mlx-launch's guarantee).
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs a 20-step job at `world` (killing `kill`'s rank after its step on
/// the first attempt), with `extra` trainer options, into `out`; returns
/// the launcher's output.
fn train(
    world: usize,
    out: &Path,
    cache: &Path,
    kill: Option<(usize, u64)>,
    extra: &[&str],
) -> String {
    let (code, lines) =
        Launch::start(world, out, cache, kill, extra).finish(Duration::from_secs(90));
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    assert_eq!(code, Some(0), "world {world}, kill {kill:?}:\n{text}");
    text
}

/// Every step's loss in `run`'s metrics.jsonl, its last record per step,
/// with the number of records (a step re-run after a restart replaces its
/// record from before).
fn losses(run: &Path) -> (BTreeMap<u64, f64>, usize) {
    let text = std::fs::read_to_string(run.join("metrics.jsonl")).unwrap();
    let mut by_step = BTreeMap::new();
    let mut records = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a metrics line that is not JSON ({e}): {line:?}"));
        by_step.insert(v["step"].as_u64().unwrap(), v["loss"].as_f64().unwrap());
        records += 1;
    }
    (by_step, records)
}

/// The tensors of the final checkpoint's model.safetensors: name, dtype,
/// shape and bytes.
fn final_parameters(run: &Path) -> BTreeMap<String, (String, Vec<usize>, Vec<u8>)> {
    let path = run
        .join("checkpoints")
        .join(format!("step_{STEPS:08}"))
        .join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(name, t)| {
            let v = (
                format!("{:?}", t.dtype()),
                t.shape().to_vec(),
                t.data().to_vec(),
            );
            (name, v)
        })
        .collect()
}

/// A small deterministic generator (SplitMix64) for the victim and step.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The rank to kill and the step after which it dies (6 to 19), from the
/// seed (`MLX_TEST_SEED`, else the clock), printed so a failure can be replayed.
fn victim(world: usize) -> (usize, u64) {
    let seed = std::env::var("MLX_TEST_SEED")
        .ok()
        .map(|s| s.parse::<u64>().expect("MLX_TEST_SEED is a whole number"))
        .unwrap_or_else(|| unix_ms() as u64);
    let mut state = seed ^ world as u64;
    let rank = (splitmix(&mut state) % world as u64) as usize;
    let step = 6 + splitmix(&mut state) % 14;
    eprintln!(
        "restart test, world {world}: seed {seed} kills rank {rank} after step {step} (replay with MLX_TEST_SEED={seed})"
    );
    (rank, step)
}

fn killed_run_equals_an_uninterrupted_one(world: usize, extra: &[&str]) {
    let (rank, step) = victim(world);
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let whole = dir.path().join("whole");
    let killed = dir.path().join("killed");
    let text = train(world, &whole, &cache, None, extra);
    assert!(!text.contains("restarting"), "{text}");
    let text = train(world, &killed, &cache, Some((rank, step)), extra);
    let dying = format!("rank {rank} kills itself (SIGKILL) after step {step}");
    assert!(text.contains(&dying), "no {dying:?}:\n{text}");
    assert!(
        text.contains(&format!("rank {rank} itself ended with killed by signal 9"))
            || text.contains(&format!("rank {rank} failed (killed by signal 9)")),
        "the launcher must name rank {rank} killed by SIGKILL:\n{text}"
    );
    assert!(
        text.contains("; restarting the job (restart 1 of 1) in 1.0s"),
        "no restart line:\n{text}"
    );
    // A survivor's log names the culprit as a rank (it said `Some(1)`).
    let blames: Vec<&str> = text.lines().filter(|l| l.contains("culprit=")).collect();
    eprintln!("the survivors' failure lines: {blames:?}");
    assert!(blames.iter().all(|l| !l.contains("Some(")), "{blames:?}");
    // The newest checkpoint before the death: step 5, 10 or 15 (the kill
    // comes before its own step's checkpoint).
    let resumed = (step - 1) / 5 * 5;
    if resumed > 0 {
        let line = format!("resuming from {}", killed.join("checkpoints").display());
        assert!(text.contains(&line), "no {line:?}:\n{text}");
        assert!(text.contains(&format!("at step {resumed}")), "{text}");
    }

    let (want, n) = losses(&whole);
    assert_eq!(
        n as u64, STEPS,
        "the uninterrupted run records each step once"
    );
    assert_eq!(
        want.keys().copied().collect::<Vec<_>>(),
        (1..=STEPS).collect::<Vec<_>>()
    );
    let (got, records) = losses(&killed);
    assert_eq!(
        records as u64,
        STEPS,
        "steps {}..={step} were run again after the restart: their records from before the kill must go",
        resumed + 1
    );
    for (s, w) in &want {
        let g = got.get(s).unwrap_or_else(|| panic!("step {s} has no loss"));
        assert_eq!(
            g.to_bits(),
            w.to_bits(),
            "step {s}: loss {g} after the restart, {w} without"
        );
    }
    assert_eq!(got.len(), want.len());

    let want = final_parameters(&whole);
    let got = final_parameters(&killed);
    assert!(!want.is_empty());
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>(),
        "the same tensors"
    );
    for (name, w) in &want {
        assert!(got[name] == *w, "tensor {name} differs after the restart");
    }
}

#[test]
fn a_rank_killed_at_world_2_is_restarted_and_the_run_is_unchanged() {
    killed_run_equals_an_uninterrupted_one(2, &[]);
}

#[test]
fn a_rank_killed_under_fully_sharded_parameters_is_restarted_and_the_run_is_unchanged() {
    killed_run_equals_an_uninterrupted_one(2, &["--shard", "parameters"]);
}

#[test]
fn a_rank_killed_at_world_3_is_restarted_and_the_run_is_unchanged() {
    killed_run_equals_an_uninterrupted_one(3, &[]);
}

/// The time from a rank's death to training again at world 2: from the
/// SIGKILL (the time the dying rank prints) to the restart line, to the
/// restarted job's first step (its first `step=` line).
#[test]
#[ignore = "a measurement for BENCHMARKS.md, not a check"]
fn restart_time_at_world_2() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    // Warm the data cache, so that the measured run prepares nothing.
    train(2, &dir.path().join("warm"), &cache, None, &[]);
    let out = dir.path().join("run");
    let (code, lines) =
        Launch::start(2, &out, &cache, Some((1, 12)), &[]).finish(Duration::from_secs(90));
    let text: String = lines.iter().map(|(_, l)| format!("{l}\n")).collect();
    assert_eq!(code, Some(0), "{text}");
    let killed: u128 = lines
        .iter()
        .find_map(|(_, l)| l.split("unix_ms=").nth(1)?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no kill line:\n{text}"));
    let at = |what: &str, after: u128| {
        lines
            .iter()
            .find(|(t, l)| *t >= after && l.contains(what))
            .map(|(t, _)| *t)
            .unwrap_or_else(|| panic!("no {what:?} after the kill:\n{text}"))
    };
    let restart = at("restarting the job (restart 1 of 1)", killed);
    let resumed = at("resuming from", restart);
    let step = at("] step=", restart);
    println!(
        "restart at world 2: rank 1 SIGKILLed after step 12; restart line +{} ms, resumed from step 10 +{} ms, first step of the new attempt done +{} ms (backoff 1.0 s included)",
        restart - killed,
        resumed - killed,
        step - killed
    );
}
