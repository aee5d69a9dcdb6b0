//! The `mlx-llama` program as a user runs it: `--config`, the run folder's
//! files (run.toml, metrics.jsonl with `eval_loss`, metrics.csv, loss.png),
//! a second run into a folder with checkpoints refused with what to do,
//! `--resume`, no ANSI escapes in output that is not a terminal, and
//! `generate --parallel tensor|pipeline` under `mlx-launch`.

mod common;

use std::path::Path;
use std::process::{Command, Output};

const TINY: &str = r#"
steps = 4
eval_every = 2
eval_batches = 1
layers = 1
dims = 32
heads = 2
mlp_dims = 64
block_size = 32
global_batch = 2
data = "offline"
"#;

fn mlx_llama(args: &[&str], cache: &Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .args(args)
        .arg("--data-cache")
        .arg(cache)
        .env_remove("MLX_PROGRESS")
        .output()
        .expect("running mlx-llama")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn losses(run: &Path) -> Vec<(u64, String, Option<String>)> {
    std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            (
                v["step"].as_u64().unwrap(),
                v["loss"].to_string(),
                v.get("eval_loss").map(|e| e.to_string()),
            )
        })
        .collect()
}

#[test]
fn a_run_folder_holds_what_a_user_needs_and_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let run = dir.path().join("run");
    let (cfg, out) = (config.to_str().unwrap(), run.to_str().unwrap());

    let first = mlx_llama(&["train", "--config", cfg, "--out", out], &cache);
    let all = text(&first);
    assert!(first.status.success(), "{all}");
    assert!(
        !all.contains('\u{1b}'),
        "ANSI escapes in non-terminal output:\n{all}"
    );
    let steps = losses(&run);
    assert_eq!(steps.iter().map(|s| s.0).collect::<Vec<_>>(), [1, 2, 3, 4]);
    assert!(steps[1].2.is_some() && steps[3].2.is_some(), "{steps:?}");
    assert!(steps[0].2.is_none() && steps[2].2.is_none(), "{steps:?}");
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert_eq!(csv.lines().count(), 5, "{csv}");
    assert!(csv.lines().next().unwrap().contains("eval_loss"));
    assert_eq!(
        &std::fs::read(run.join("loss.png")).unwrap()[..4],
        b"\x89PNG"
    );
    let resolved = std::fs::read_to_string(run.join("run.toml")).unwrap();
    assert!(
        resolved.contains("steps = 4") && resolved.contains("dims = 32"),
        "{resolved}"
    );

    // The same folder again: refused, with the ways out, and nothing touched.
    let again = mlx_llama(&["train", "--config", cfg, "--out", out], &cache);
    let said = text(&again);
    assert!(!again.status.success());
    for what in ["already holds checkpoints", "--resume", "--fresh", "--out"] {
        assert!(said.contains(what), "`{what}` missing from:\n{said}");
    }
    assert_eq!(losses(&run), steps);

    // The resolved options are the run: a new folder from run.toml trains
    // the same losses.
    let copy = dir.path().join("copy");
    let from_resolved = mlx_llama(
        &[
            "train",
            "--config",
            run.join("run.toml").to_str().unwrap(),
            "--out",
            copy.to_str().unwrap(),
        ],
        &cache,
    );
    assert!(from_resolved.status.success(), "{}", text(&from_resolved));
    assert_eq!(losses(&copy), steps);

    // --resume continues where the run stopped.
    let more = mlx_llama(
        &[
            "train", "--config", cfg, "--out", out, "--resume", "--steps", "6",
        ],
        &cache,
    );
    assert!(more.status.success(), "{}", text(&more));
    let steps = losses(&run);
    assert_eq!(
        steps.iter().map(|s| s.0).collect::<Vec<_>>(),
        [1, 2, 3, 4, 5, 6]
    );
    assert_eq!(
        std::fs::read_to_string(run.join("metrics.csv"))
            .unwrap()
            .lines()
            .count(),
        7
    );
}

#[test]
fn a_config_file_with_an_unknown_option_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "steps = 2\nlearning_rate = 0.1\n").unwrap();
    let o = mlx_llama(
        &[
            "train",
            "--config",
            config.to_str().unwrap(),
            "--out",
            dir.path().join("r").to_str().unwrap(),
        ],
        &dir.path().join("cache"),
    );
    assert!(!o.status.success());
    let said = text(&o);
    assert!(said.contains("unknown option `learning_rate`"), "{said}");
    assert!(said.contains("lr"), "the known options are listed: {said}");
    assert!(!dir.path().join("r").exists());
}

#[test]
fn generate_split_over_ranks_under_mlx_launch_prints_the_tokens_of_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, TINY.replace("layers = 1", "layers = 2")).unwrap();
    let run = dir.path().join("run");
    let (c, r) = (config.to_str().unwrap(), run.to_str().unwrap());
    let o = mlx_llama(&["train", "--config", c, "--out", r], &cache);
    assert!(o.status.success(), "{}", text(&o));
    let generate = [
        "generate",
        "--checkpoint",
        r,
        "--temperature",
        "0",
        "--max-tokens",
        "12",
    ];
    let one = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .args(generate)
        .output()
        .expect("running mlx-llama");
    assert!(one.status.success(), "{}", text(&one));
    let want = String::from_utf8_lossy(&one.stdout).to_string();
    assert!(want.starts_with("Once upon a time"), "{want}");
    let launch = |extra: &[&str]| {
        Command::new(common::launcher())
            .args(["-n", "2", "--"])
            .arg(env!("CARGO_BIN_EXE_mlx-llama"))
            .args(generate)
            .args(extra)
            .env_remove("MLX_PROGRESS")
            .output()
            .expect("running mlx-launch")
    };
    for mode in ["tensor", "pipeline"] {
        let o = launch(&["--parallel", mode]);
        assert!(o.status.success(), "{mode}: {}", text(&o));
        // Rank 0 prints the text, prefixed by the launcher with its rank.
        let got: String = String::from_utf8_lossy(&o.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("[0] "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(got, want, "{mode}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains(&format!("{mode} parallel over 2 ranks")),
            "{err}"
        );
    }
    let o = launch(&[]);
    assert!(!o.status.success());
    assert!(
        text(&o)
            .contains("generate runs on 2 ranks: pass --parallel tensor or --parallel pipeline"),
        "{}",
        text(&o)
    );
}

/// `--version` answers, and `--help` opens with what the tool does.
#[test]
fn version_and_help_answer() {
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("mlx-llama {}", env!("CARGO_PKG_VERSION"))
    );
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.starts_with("Train a small Llama"), "{help}");
}

#[test]
fn generate_takes_mlx_lm_options_reads_the_prompt_from_stdin_and_refuses_bad_temperatures() {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache");
    let config = dir.path().join("tiny.toml");
    std::fs::write(&config, TINY).unwrap();
    let run = dir.path().join("run");
    let (c, r) = (config.to_str().unwrap(), run.to_str().unwrap());
    let o = mlx_llama(&["train", "--config", c, "--out", r], &cache);
    assert!(o.status.success(), "{}", text(&o));
    let generate = |args: &[&str], stdin: Option<&str>| {
        use std::io::Write;
        let mut child = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
            .args(["generate", "--checkpoint", r, "--max-tokens", "16"])
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("running mlx-llama");
        let mut input = child.stdin.take().unwrap();
        input.write_all(stdin.unwrap_or("").as_bytes()).unwrap();
        drop(input);
        child.wait_with_output().unwrap()
    };
    let greedy = generate(&["--temperature", "0"], None);
    assert!(greedy.status.success(), "{}", text(&greedy));
    let want = String::from_utf8_lossy(&greedy.stdout).to_string();
    assert!(want.starts_with("Once upon a time"), "{want}");
    assert!(!want.contains("<|endoftext|>"), "{want}");
    let err = String::from_utf8_lossy(&greedy.stderr);
    let prompt_tokens = mlx_data::tokenizer::TextTokenizer::gpt2()
        .unwrap()
        .encode("Once upon a time")
        .unwrap()
        .len();
    assert!(
        err.contains(&format!("Prompt: {prompt_tokens} tokens, ")),
        "{err}"
    );
    assert!(
        err.contains("Generation: ") && err.contains(" tokens-per-sec"),
        "{err}"
    );
    // `--prompt -` reads standard input; `--temp` is `--temperature`.
    let piped = generate(&["--prompt", "-", "--temp", "0"], Some("Once upon a time"));
    assert!(piped.status.success(), "{}", text(&piped));
    assert_eq!(String::from_utf8_lossy(&piped.stdout), want);
    // Top-k 1 is greedy at any temperature and seed.
    let k1 = generate(&["--top-k", "1", "--temp", "2", "--seed", "7"], None);
    assert!(k1.status.success(), "{}", text(&k1));
    assert_eq!(String::from_utf8_lossy(&k1.stdout), want);
    // A penalty of 1 penalises nothing (mlx-lm's meaning); the penalty's
    // arithmetic is sampling.rs's unit test.
    let unpenalised = generate(&["--temp", "0", "--repetition-penalty", "1"], None);
    assert!(unpenalised.status.success(), "{}", text(&unpenalised));
    assert_eq!(String::from_utf8_lossy(&unpenalised.stdout), want);
    let penalised = generate(&["--temp", "0", "--repetition-penalty", "1.3"], None);
    assert!(penalised.status.success(), "{}", text(&penalised));
    // A bad temperature is a usage error (clap's status 2), naming the option.
    for bad in ["nan", "-1", "inf"] {
        let o = generate(&[&format!("--temperature={bad}")], None);
        assert_eq!(o.status.code(), Some(2), "{bad}: {}", text(&o));
        assert!(text(&o).contains("--temperature"), "{}", text(&o));
    }
    let o = generate(&["--top-p", "1.5"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    // A negative number is a value, refused for what it is (it was taken
    // for a flag: "unexpected argument '-1'").
    let o = generate(&["--temp", "-1"], None);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("expected a finite number of at least 0, got `-1`"),
        "{}",
        text(&o)
    );
    // A repeated option takes the last value, as argparse's tools do.
    let twice = generate(&["--temp", "2", "--temp", "0"], None);
    assert!(twice.status.success(), "{}", text(&twice));
    assert_eq!(String::from_utf8_lossy(&twice.stdout), want);
    // A checkpoint path that does not exist is said not to.
    let o = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .args(["generate", "--checkpoint", "/nonexistent/run"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("`/nonexistent/run` does not exist"),
        "{}",
        text(&o)
    );
}

/// `train --help` groups its options under headings, as HF's and
/// torchtitan's do, names no internal module, and ends with the exit
/// statuses.
#[test]
fn train_help_groups_its_options_and_lists_the_exit_statuses() {
    let o = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .args(["train", "--help"])
        .output()
        .unwrap();
    assert!(o.status.success());
    let help = String::from_utf8_lossy(&o.stdout);
    let headings: Vec<&str> = help
        .lines()
        .filter(|l| l.ends_with(':') && !l.starts_with(' '))
        .collect();
    for want in [
        "Model:",
        "Optimisation:",
        "Data:",
        "Parallelism and communication:",
        "Checkpoints and the run folder:",
        "Logging:",
        "Precision, device and memory:",
        "Fine-tuning (adapters):",
    ] {
        assert!(headings.contains(&want), "{want} in {headings:?}");
    }
    // Each option under its heading.
    let line_at = |h: &str| help.find(&format!("\n{h}\n")).unwrap();
    let under = |option: &str| {
        let at = [" ", "\n"]
            .iter()
            .find_map(|end| help.find(&format!("\n      {option}{end}")))
            .unwrap();
        headings
            .iter()
            .filter(|h| line_at(h) < at)
            .max_by_key(|h| line_at(h))
            .copied()
    };
    assert_eq!(under("--lr"), Some("Optimisation:"));
    assert_eq!(under("--shard"), Some("Parallelism and communication:"));
    assert_eq!(under("--resume"), Some("Checkpoints and the run folder:"));
    assert_eq!(under("--layers"), Some("Model:"));
    assert_eq!(under("--lora-rank"), Some("Fine-tuning (adapters):"));
    assert!(!help.contains("crate::"), "{help}");
    assert!(
        help.contains("143 for\n           SIGTERM") || help.contains("143 for SIGTERM"),
        "{help}"
    );
}

/// A negative number after an option is its value (clap took `-1` for a
/// flag), refused for what it is.
#[test]
fn negative_values_are_values_refused_for_what_they_are() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let o = mlx_llama(
        &[
            "train",
            "--lr",
            "-1",
            "--steps",
            "1",
            "--out",
            run.to_str().unwrap(),
        ],
        &dir.path().join("cache"),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        text(&o).contains("--lr -1 must be a finite number of at least 0"),
        "{}",
        text(&o)
    );
    let o = mlx_llama(
        &["train", "--seed", "-3", "--out", run.to_str().unwrap()],
        &dir.path().join("cache"),
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("invalid value '-3' for '--seed"),
        "{}",
        text(&o)
    );
}
