//! Runs survive what users do to them, each tried with the real program:
//! two runs into one folder (the second is refused, naming the first), a
//! crashed run's folder (refused without --fresh or --resume), --resume of
//! nothing, --fresh with --resume, a resumed run's metrics (no step twice)
//! and options (run.toml kept), a finished run resumed, a closed pipe on
//! standard output, SIGKILL in the middle of a checkpoint's publish, a full
//! disk during a checkpoint, SIGTERM under `mlx-launch` at world 2 and the
//! resume after it, and `export` into a non-empty or checkpoint folder.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// The tiny run of these tests (after [`common::TINY_MODEL_ARGS`]).
const TINY: &[&str] = &[
    "--global-batch",
    "2",
    "--data",
    "offline",
    "--eval-every",
    "0",
];

fn cache() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("mlx-data-cache")
}

/// `mlx-llama train` of the tiny model into `out` with `args`.
fn train_cmd(out: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-llama"));
    c.arg("train")
        .args(common::TINY_MODEL_ARGS)
        .args(TINY)
        .args(args)
        .arg("--out")
        .arg(out)
        .arg("--data-cache")
        .arg(cache())
        .env_remove("MLX_PROGRESS")
        .env_remove("MLX_TEST_KILL_AT")
        .env_remove("MLX_RESTART_COUNT")
        .stdin(Stdio::null());
    c
}

fn train(out: &Path, args: &[&str]) -> Output {
    train_cmd(out, args).output().expect("running mlx-llama")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Every record of `run`'s metrics.jsonl as (step, loss bits), in order.
fn records(run: &Path) -> Vec<(u64, u32)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                (v["loss"].as_f64().unwrap() as f32).to_bits(),
            )
        })
        .collect()
}

/// An uninterrupted run of `steps` steps into a fresh folder under `dir`.
fn reference(dir: &Path, steps: u64) -> Vec<(u64, u32)> {
    let run = dir.join(format!("reference{steps}"));
    let o = train(&run, &["--steps", &steps.to_string()]);
    assert!(o.status.success(), "{}", text(&o));
    records(&run)
}

fn steps_of(r: &[(u64, u32)]) -> Vec<u64> {
    r.iter().map(|s| s.0).collect()
}

/// Kills a child it is dropped with (a failed assertion leaves no process).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits (at most 60 s) until `cond` holds.
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let t = Instant::now();
    while !cond() {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "waited 60 s for {what}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_second_run_into_a_folder_in_use_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut first = train_cmd(&run, &["--steps", "100000"]);
    let first = Reaped(
        first
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = first.0.id();
    // Training has begun once a step is recorded.
    wait_for("the first run's first step", || {
        std::fs::read_to_string(run.join("metrics.jsonl")).is_ok_and(|t| t.contains("\"step\""))
    });
    let second = train(&run, &["--steps", "2", "--fresh"]);
    let said = text(&second);
    assert_eq!(second.status.code(), Some(1), "{said}");
    assert!(said.contains("is in use by another run"), "{said}");
    assert!(said.contains(&format!("pid {pid} on host ")), "{said}");
    assert!(
        said.contains("started ") && said.contains(" s ago"),
        "{said}"
    );
    // --fresh was not acted on: the first run's records are still there.
    assert!(run.join("metrics.jsonl").exists());
    drop(first);
    // Its lock went with it: the folder is free again.
    let third = train(&run, &["--steps", "2", "--fresh"]);
    assert!(third.status.success(), "{}", text(&third));
    assert_eq!(steps_of(&records(&run)), [1, 2]);
}

#[test]
fn a_crashed_runs_folder_needs_fresh_and_resume_needs_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Killed after step 2's metrics, before any checkpoint.
    let crashed = train_cmd(&run, &["--steps", "4"])
        .env("MLX_TEST_KILL_AT", "0:2")
        .output()
        .unwrap();
    assert!(!crashed.status.success(), "{}", text(&crashed));
    assert_eq!(steps_of(&records(&run)), [1, 2]);
    assert!(!run.join("checkpoints").join("latest").exists());

    let again = train(&run, &["--steps", "4"]);
    let said = text(&again);
    assert_eq!(again.status.code(), Some(1), "{said}");
    assert!(
        said.contains("metrics.jsonl of an earlier run that left no checkpoint"),
        "{said}"
    );
    assert!(said.contains("--fresh"), "{said}");
    let resumed = train(&run, &["--steps", "4", "--resume"]);
    let said = text(&resumed);
    assert_eq!(resumed.status.code(), Some(1), "{said}");
    assert!(
        said.contains("holds no checkpoint to resume from"),
        "{said}"
    );
    assert_eq!(steps_of(&records(&run)), [1, 2], "nothing appended");

    let fresh = train(&run, &["--steps", "4", "--fresh"]);
    assert!(fresh.status.success(), "{}", text(&fresh));
    assert_eq!(records(&run), reference(dir.path(), 4));
}

#[test]
fn resume_of_nothing_and_fresh_with_resume_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing");
    let o = train(&missing, &["--steps", "2", "--resume"]);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(1), "{said}");
    assert!(
        said.contains("does not exist, so there is no run to resume"),
        "{said}"
    );
    assert!(!missing.join("metrics.jsonl").exists());
    let o = train(&missing, &["--steps", "2", "--resume", "--fresh"]);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(2), "a usage error: {said}");
    assert!(
        said.contains("--fresh") && said.contains("cannot be used with"),
        "{said}"
    );
}

#[test]
fn a_resumed_run_records_each_step_once_and_keeps_its_options() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Killed after step 3's metrics; the newest checkpoint is step 2's.
    let killed = train_cmd(&run, &["--steps", "4", "--checkpoint-every", "2"])
        .env("MLX_TEST_KILL_AT", "0:3")
        .output()
        .unwrap();
    assert!(!killed.status.success());
    assert_eq!(steps_of(&records(&run)), [1, 2, 3]);
    let original = std::fs::read_to_string(run.join("run.toml")).unwrap();
    assert!(original.contains("steps = 4"), "{original}");

    let resumed = train(
        &run,
        &["--steps", "4", "--checkpoint-every", "2", "--resume"],
    );
    assert!(resumed.status.success(), "{}", text(&resumed));
    assert_eq!(
        records(&run),
        reference(dir.path(), 4),
        "steps 3 and 4 once, as uninterrupted"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("run.toml")).unwrap(),
        original
    );
    assert!(!run.join("run.resume-1.toml").exists(), "no option changed");

    // More steps: a changed option, recorded beside the original.
    let more = train(
        &run,
        &["--steps", "6", "--checkpoint-every", "2", "--resume"],
    );
    let said = text(&more);
    assert!(more.status.success(), "{said}");
    assert!(
        said.contains("resuming with changed options (steps: 4 -> 6)"),
        "{said}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("run.toml")).unwrap(),
        original
    );
    let changed = std::fs::read_to_string(run.join("run.resume-1.toml")).unwrap();
    assert!(changed.contains("steps = 6"), "{changed}");
    assert_eq!(records(&run), reference(dir.path(), 6));

    // Finished: said so, nothing trained, no NaN.
    let done = train(
        &run,
        &["--steps", "6", "--checkpoint-every", "2", "--resume"],
    );
    let said = text(&done);
    assert!(done.status.success(), "{said}");
    assert!(
        said.contains("is finished: its checkpoint is at step 6, and --steps is 6"),
        "{said}"
    );
    assert!(
        !said.contains("NaN") && !said.contains("checkpoint none"),
        "{said}"
    );
    assert_eq!(steps_of(&records(&run)), [1, 2, 3, 4, 5, 6]);

    // A refused resume (the checkpoint's model is another shape) leaves
    // the folder as it was: no run.resume-2.toml, no new event file.
    let before = listing(&run);
    let refused = train(
        &run,
        &[
            "--steps",
            "8",
            "--checkpoint-every",
            "2",
            "--resume",
            "--dims",
            "64",
        ],
    );
    let said = text(&refused);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("different configuration"), "{said}");
    assert_eq!(listing(&run), before, "{said}");

    // Moved elsewhere, the folder resumes with the same options: `out`
    // is where it is, not an option of the run (the steps are 6 since the
    // first resume).
    let moved = dir.path().join("moved");
    std::fs::rename(&run, &moved).unwrap();
    let again = train(
        &moved,
        &["--steps", "6", "--checkpoint-every", "2", "--resume"],
    );
    let said = text(&again);
    assert!(again.status.success(), "{said}");
    assert!(
        said.contains("resuming with changed options (steps: 4 -> 6)"),
        "only the steps changed: {said}"
    );
}

/// Every file under `dir` (but the run's lock) with its contents.
fn listing(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = vec![];
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else if p.file_name().is_some_and(|n| n != "run.lock") {
                files.push((
                    p.strip_prefix(dir).unwrap().to_path_buf(),
                    std::fs::read(&p).unwrap(),
                ));
            }
        }
    }
    files.sort();
    files
}

#[test]
fn a_closed_pipe_on_standard_output_does_not_stop_training() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut child = Reaped(
        train_cmd(&run, &["--steps", "30"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // `| head -2`: two lines read, then the pipe closed.
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    for _ in 0..2 {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
    }
    drop(out);
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.0.wait().unwrap();
    assert!(st.success(), "{st:?}: {err}");
    assert_eq!(
        err.matches("standard output cannot be written").count(),
        1,
        "noted once: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(steps_of(&records(&run)), (1..=30).collect::<Vec<_>>());
    assert!(run.join("checkpoints").join("step_00000030").is_dir());
    assert!(run.join("loss.png").exists());
}

#[test]
fn sigkill_while_a_checkpoint_is_published_resumes_from_an_intact_one() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Step 4's folder renamed into place, `latest` still at step 2.
    let killed = train_cmd(&run, &["--steps", "6", "--checkpoint-every", "2"])
        .env("MLX_TEST_KILL_AT", "0:4:publish")
        .output()
        .unwrap();
    assert!(!killed.status.success(), "{}", text(&killed));
    let latest = std::fs::read_to_string(run.join("checkpoints").join("latest")).unwrap();
    assert_eq!(latest.trim(), "step_00000002");
    assert!(run.join("checkpoints").join("step_00000004").is_dir());

    let resumed = train(
        &run,
        &["--steps", "6", "--checkpoint-every", "2", "--resume"],
    );
    let said = text(&resumed);
    assert!(resumed.status.success(), "{said}");
    assert!(said.contains("at step 2"), "{said}");
    assert_eq!(records(&run), reference(dir.path(), 6));
    mlx_llama::checkpoint::verify(&run.join("checkpoints").join("step_00000006")).unwrap();
}

/// Whether this process may mount file systems (root, and a kernel that lets it).
fn mount_tmpfs(at: &Path, size: &str) -> bool {
    std::fs::create_dir_all(at).unwrap();
    Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
        .arg(at)
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Unmounts the tmpfs it is dropped with.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_during_a_checkpoint_is_a_clear_error_and_leaves_the_previous_one() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk");
    // A checkpoint of the tiny model takes 37 MiB: one fits, two do not.
    if !mount_tmpfs(&disk, "60m") {
        eprintln!("skipped: cannot mount a tmpfs here (needs root and a kernel that allows it)");
        return;
    }
    let _mounted = Mounted(disk.clone());
    let run = disk.join("run");
    let o = train(&run, &["--steps", "4", "--checkpoint-every", "2"]);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(1), "{said}");
    assert!(said.contains("writing the checkpoint of step 4"), "{said}");
    assert!(said.contains("No space left on device"), "{said}");
    assert!(
        said.contains("the previous checkpoint, if any, is intact"),
        "{said}"
    );
    let found = mlx_llama::checkpoint::latest_good(&run).unwrap().unwrap();
    assert_eq!(found.manifest.step, 2);
    assert!(found.rejected.is_empty(), "{:?}", found.rejected);
    let left: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !left.iter().any(|n| n.ends_with(".tmp")),
        "the failed checkpoint's space is freed: {left:?}"
    );
}

#[test]
fn sigterm_under_the_launcher_checkpoints_and_resume_continues_the_same_losses() {
    let dir = tempfile::tempdir().unwrap();
    let launch = |out: &Path, steps: &str, extra: &[&str]| {
        let mut c = Command::new(common::launcher());
        c.args(["-n", "2", "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .arg("train")
            .args(common::TINY_MODEL_ARGS)
            .args(TINY)
            .args(["--steps", steps, "--global-batch", "4"])
            .args(extra)
            .arg("--out")
            .arg(out)
            .arg("--data-cache")
            .arg(cache())
            .env_remove("MLX_PROGRESS")
            .env_remove("MLX_TEST_KILL_AT")
            .stdin(Stdio::null());
        c
    };
    // The learning rate is constant: a run's first 20 steps are the same
    // in a run of 20 and one of 100, which the signal stops early.
    let whole = dir.path().join("whole");
    let o = launch(&whole, "20", &[]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let want = records(&whole);
    assert_eq!(want.len(), 20);

    let run = dir.path().join("run");
    let mut child = Reaped(
        launch(&run, "100", &[])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(child.0.stdout.take().unwrap());
    let mut seen = String::new();
    // SIGTERM once step 3 is done.
    loop {
        let mut l = String::new();
        assert!(out.read_line(&mut l).unwrap() > 0, "no step 3:\n{seen}");
        seen += &l;
        if l.contains("step=3 ") {
            break;
        }
    }
    // SAFETY: kill(2) on the launcher this test started (still its child).
    assert_eq!(unsafe { libc::kill(child.0.id() as i32, libc::SIGTERM) }, 0);
    out.read_to_string(&mut seen).unwrap();
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.0.wait().unwrap();
    let all = format!("{seen}{err}");
    // 128 + SIGTERM, as each rank exits (see `train --help`).
    assert_eq!(st.code(), Some(143), "{all}");
    let stopped = records(&run);
    let at = stopped.last().unwrap().0;
    assert!(
        (3..20).contains(&at),
        "stopped after step {at}, not between 3 and 20:\n{all}"
    );
    // One line for the job, not one error per rank.
    assert_eq!(
        all.matches(&format!("stopped by SIGTERM after step {at} of 100"))
            .count(),
        1,
        "{all}"
    );
    assert!(!all.contains("error"), "{all}");
    assert!(all.contains("--resume"), "{all}");
    let latest = std::fs::read_to_string(run.join("checkpoints").join("latest")).unwrap();
    assert_eq!(latest.trim(), format!("step_{at:08}"), "{all}");
    assert!(run.join("loss.png").exists() && run.join("metrics.csv").exists());

    let o = launch(&run, "20", &["--resume"]).output().unwrap();
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains(&format!("at step {at}")), "{said}");
    assert_eq!(records(&run), want, "the resumed run's losses, bit for bit");
}

/// Under `mlx-launch` at world 2 (two processes), every rank resumes from
/// the checkpoint rank 0 verified: with step 4's manifest edited to say
/// step 2, rank 0 passes it over for step 2's folder and rank 1 opens that
/// same folder (before, rank 0 loaded step 4's files "at step 2" and rank 1
/// step 2's, and the job succeeded). The resumed losses are an
/// uninterrupted run's, bit for bit.
#[test]
fn ranks_in_two_processes_resume_from_the_checkpoint_rank_0_verified() {
    let dir = tempfile::tempdir().unwrap();
    let launch = |out: &Path, steps: &str, extra: &[&str]| {
        let o = Command::new(common::launcher())
            .args(["-n", "2", "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .arg("train")
            .args(common::TINY_MODEL_ARGS)
            .args(TINY)
            .args([
                "--steps",
                steps,
                "--global-batch",
                "4",
                "--checkpoint-every",
                "2",
            ])
            .args(extra)
            .arg("--out")
            .arg(out)
            .arg("--data-cache")
            .arg(cache())
            .env_remove("MLX_PROGRESS")
            .env_remove("MLX_TEST_KILL_AT")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        text(&o)
    };
    let whole = dir.path().join("whole");
    launch(&whole, "6", &[]);
    let want = records(&whole);
    let run = dir.path().join("run");
    launch(&run, "4", &[]);
    let manifest = run.join("checkpoints/step_00000004/manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    m["step"] = 2.into();
    std::fs::write(&manifest, m.to_string()).unwrap();
    let said = launch(&run, "6", &["--resume"]);
    assert!(said.contains("step_00000002 at step 2"), "{said}");
    assert_eq!(records(&run), want, "the resumed run's losses, bit for bit");
}

/// A checkpoint of format 1 (no list of files, no checksums) resumes only
/// when `--allow-old-checkpoint-format` asks for it: a manifest edited to
/// say format 1 no longer turns the checksums off. The flag is not kept in
/// the run's options.
#[test]
fn a_format_1_checkpoint_resumes_only_with_allow_old_checkpoint_format() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let o = train(&run, &["--steps", "2", "--checkpoint-every", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let path = run.join("checkpoints/step_00000002/manifest.json");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    m["format"] = 1.into();
    m.as_object_mut().unwrap().remove("files");
    m.as_object_mut().unwrap().remove("layout");
    std::fs::write(&path, m.to_string()).unwrap();

    let more = ["--steps", "3", "--checkpoint-every", "2", "--resume"];
    let o = train(&run, &more);
    let said = text(&o);
    assert!(!o.status.success(), "{said}");
    assert!(
        said.contains("step_00000002")
            && said.contains("format 1")
            && said.contains("--allow-old-checkpoint-format"),
        "{said}"
    );
    assert_eq!(records(&run).len(), 2, "nothing was trained: {said}");

    let o = train(
        &run,
        &[&more[..], &["--allow-old-checkpoint-format"]].concat(),
    );
    let said = text(&o);
    assert!(o.status.success(), "{said}");
    assert!(said.contains("at step 2"), "{said}");
    assert_eq!(steps_of(&records(&run)), [1, 2, 3]);
    for f in std::fs::read_dir(&run).unwrap() {
        let f = f.unwrap().path();
        if f.extension().is_some_and(|e| e == "toml") {
            let options = std::fs::read_to_string(&f).unwrap();
            assert!(
                !options.contains("allow_old_checkpoint_format"),
                "{}: {options}",
                f.display()
            );
        }
    }
}

/// `mlx-llama generate` of `checkpoint` (greedy, a few tokens), its
/// address space limited to 8 GiB and its time to 120 s: a read that
/// never ends fails instead of taking the machine's memory.
fn generate_bounded(checkpoint: &Path, extra: &[&str]) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-llama"));
    c.arg("generate")
        .arg("--checkpoint")
        .arg(checkpoint)
        .args(["--max-tokens", "3", "--temperature", "0"])
        .args(extra)
        .env_remove("MLX_PROGRESS")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit is async-signal-safe; it touches only the child.
    unsafe {
        c.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 8 << 30,
                rlim_max: 8 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = Reaped(c.spawn().expect("running mlx-llama generate"));
    let (mut out, mut err) = (String::new(), String::new());
    let mut so = child.0.stdout.take().unwrap();
    let mut se = child.0.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let _ = so.read_to_string(&mut out);
        out
    });
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.0.try_wait().unwrap() {
            break Some(st);
        }
        if t.elapsed() > Duration::from_secs(120) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = child.0.kill();
    let _ = se.read_to_string(&mut err);
    let out = reader.join().unwrap();
    let said = format!("{out}{err}");
    match status {
        Some(st) => (st.code(), said),
        None => (None, format!("timed out after 120 s: {said}")),
    }
}

/// A run's tokenizer file is copied into its checkpoints (listed, checked):
/// `generate` reads that copy, not the path the manifest names (the
/// original may be gone). A manifest naming a path outside the run folder
/// (`/dev/zero`) with no copy is refused at once, naming the path, instead
/// of read until memory runs out; a link inside the run folder leading
/// there is refused too, and a copy that differs from its recorded size is
/// not read past it.
#[test]
fn generate_reads_the_checkpoints_tokenizer_never_a_manifest_path_outside_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let own = dir.path().join("own");
    std::fs::create_dir_all(&own).unwrap();
    let tok = own.join("tokenizer.json");
    mlx_data::tokenizer::TextTokenizer::gpt2()
        .unwrap()
        .save(&tok)
        .unwrap();
    let run = dir.path().join("run");
    let o = train(
        &run,
        &["--steps", "1", "--tokenizer", tok.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", text(&o));
    let ckpt = run.join("checkpoints").join("step_00000001");
    let manifest = ckpt.join("manifest.json");
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest).unwrap()).unwrap();
    let listed = |m: &serde_json::Value| -> Vec<String> {
        m["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert!(listed(&m).contains(&"tokenizer.json".to_string()), "{m}");
    assert_eq!(
        std::fs::read(ckpt.join("tokenizer.json")).unwrap(),
        std::fs::read(&tok).unwrap()
    );
    std::fs::remove_dir_all(&own).unwrap();
    let (code, said) = generate_bounded(&ckpt, &[]);
    assert_eq!(code, Some(0), "{said}");
    assert!(said.starts_with("Once upon a time"), "{said}");

    // A checkpoint without the copy (as before copies were kept) whose
    // manifest names /dev/zero.
    let old_style = |tokenizer: &Path| {
        let mut m = m.clone();
        m["config"]["tokenizer"] = serde_json::json!({ "File": tokenizer });
        let files = m["files"].as_array_mut().unwrap();
        files.retain(|f| f["name"] != "tokenizer.json");
        std::fs::write(&manifest, m.to_string()).unwrap();
        let _ = std::fs::remove_file(ckpt.join("tokenizer.json"));
    };
    old_style(Path::new("/dev/zero"));
    let (code, said) = generate_bounded(&ckpt, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(
        said.contains("/dev/zero") && said.contains("outside its run folder"),
        "{said}"
    );
    // A link inside the run folder that leads there is outside too.
    let link = run.join("tokenizer.json");
    std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
    old_style(&link);
    let (code, said) = generate_bounded(&ckpt, &[]);
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("outside its run folder"), "{said}");
    // --tokenizer names the tokenizer instead: the manifest's path is not read.
    let gpt2 = dir.path().join("gpt2.json");
    mlx_data::tokenizer::TextTokenizer::gpt2()
        .unwrap()
        .save(&gpt2)
        .unwrap();
    let (code, said) = generate_bounded(&ckpt, &["--tokenizer", gpt2.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{said}");
}

#[test]
fn export_refuses_a_non_empty_folder_without_force_and_any_checkpoint_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let o = train(&run, &["--steps", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let export = |out: &Path, force: bool| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_mlx-llama"));
        c.args(["export", "--checkpoint"])
            .arg(&run)
            .arg("--out")
            .arg(out);
        if force {
            c.arg("--force");
        }
        c.output().unwrap()
    };
    let busy = dir.path().join("busy");
    std::fs::create_dir_all(&busy).unwrap();
    std::fs::write(busy.join("notes.txt"), "mine").unwrap();
    let o = export(&busy, false);
    let said = text(&o);
    assert_eq!(o.status.code(), Some(1), "{said}");
    assert!(said.contains("is not empty: pass --force"), "{said}");
    assert!(!busy.join("model.safetensors").exists());
    let o = export(&busy, true);
    assert!(o.status.success(), "{}", text(&o));
    assert!(busy.join("model.safetensors").exists());
    assert_eq!(
        std::fs::read_to_string(busy.join("notes.txt")).unwrap(),
        "mine"
    );

    let step = run.join("checkpoints").join("step_00000002");
    for inside in [
        step.clone(),
        step.join("hf"),
        run.join("checkpoints").join("hf"),
    ] {
        let o = export(&inside, true);
        let said = text(&o);
        assert_eq!(o.status.code(), Some(1), "{}: {said}", inside.display());
        assert!(said.contains("is inside a run's checkpoints"), "{said}");
    }
    assert!(!step.join("hf").exists() && !run.join("checkpoints").join("hf").exists());
    mlx_llama::checkpoint::verify(&step).unwrap();
}

#[test]
fn a_second_signal_stops_at_once_without_a_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // Longer steps than the tiny model's, so both signals land inside one.
    let mut child = Reaped(
        train_cmd(
            &run,
            &["--steps", "1000", "--block-size", "256", "--dims", "128"],
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    wait_for("the first step", || {
        std::fs::read_to_string(run.join("metrics.jsonl")).is_ok_and(|t| t.contains("\"step\""))
    });
    let pid = child.0.id() as i32;
    // SAFETY: kill(2) on the child this test started (not yet waited for).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    std::thread::sleep(Duration::from_millis(30));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let mut err = String::new();
    child
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let st = child.0.wait().unwrap();
    assert_eq!(st.code(), Some(130), "{err}");
    assert!(
        err.contains("signal received: stopping after this step"),
        "{err}"
    );
    assert!(err.contains("second signal: stopping at once"), "{err}");
    assert!(!run.join("checkpoints").join("latest").exists(), "{err}");
}

#[test]
fn checkpoints_come_by_time_by_default_and_checkpoint_every_rules() {
    let dir = tempfile::tempdir().unwrap();
    // The binary's default: a checkpoint every 600 s; --checkpoint-every
    // turns the clock off.
    let interval = |run: &Path| {
        let found = mlx_llama::checkpoint::latest_good(run).unwrap().unwrap();
        found.manifest.config["checkpoint_interval_s"].as_u64()
    };
    let by_default = dir.path().join("default");
    assert!(train(&by_default, &["--steps", "1"]).status.success());
    assert_eq!(interval(&by_default), Some(600));
    let by_steps = dir.path().join("steps");
    assert!(
        train(&by_steps, &["--steps", "1", "--checkpoint-every", "5"])
            .status
            .success()
    );
    assert_eq!(interval(&by_steps), Some(0));

    // 60 steps with checkpoints by the clock: the seconds they took and
    // the steps checkpointed.
    let by_clock = |name: &str, interval: u64, first: u64| {
        let run = dir.path().join(name);
        let cfg = mlx_llama::TrainConfig {
            checkpoint_interval_s: interval,
            first_checkpoint_s: first,
            ..common::tiny(&run, 60)
        };
        let t = Instant::now();
        mlx_llama::train(&cfg, &mlx_dist::Group::single()).unwrap();
        let secs = t.elapsed().as_secs_f64();
        let steps: Vec<u64> = mlx_llama::checkpoint::list(&run)
            .unwrap()
            .into_iter()
            .map(|(s, _)| s)
            .collect();
        eprintln!("{name}: {secs:.1} s of training, checkpoints at steps {steps:?}");
        (secs, steps)
    };
    // The clock at 1 s: checkpoints between the steps, not only at the end.
    let (secs, steps) = by_clock("clock", 1, 120);
    assert_eq!(steps.last(), Some(&60));
    assert!(
        secs < 2.0 || steps.len() >= 2,
        "{secs} s of training and checkpoints only at steps {steps:?}"
    );
    assert!(
        steps.len() as f64 <= secs.floor() + 1.0,
        "at most one a second: {steps:?} in {secs} s"
    );
    // The default interval with an early first checkpoint: one a second
    // into the run, then none until the end (the next is 600 s away).
    let (secs, steps) = by_clock("early", 600, 1);
    if secs > 1.5 {
        assert_eq!(steps.len(), 2, "one early, one at the end: {steps:?}");
        assert!(steps[0] < 60 && steps[1] == 60, "{steps:?}");
    }
}
