//! What `mlx-llama train` prints against what it records: with
//! `--log-every N` a line's loss, step time and throughput are the means of
//! the per-step records of metrics.jsonl since the line before; an
//! evaluation's time is `eval_ms`, outside `ms_per_step`; metrics.csv has
//! every field of metrics.jsonl.

mod common;

use std::collections::BTreeMap;
use std::process::Command;

/// `key=value` pairs of a logfmt line.
fn fields(line: &str) -> BTreeMap<String, String> {
    line.split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn logged_lines_are_interval_means_and_evaluation_is_timed_apart() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let mut args: Vec<&str> = vec![
        "train",
        "--data",
        "offline",
        "--global-batch",
        "2",
        "--steps",
        "8",
        "--log-every",
        "3",
        "--eval-every",
        "4",
        "--eval-batches",
        "24",
        // Every step finished at once: a step's record is written when its
        // validation, if any, is done, so consecutive records' wall times
        // are each one's step and validation.
        "--no-overlap-steps",
        "--checkpoint-interval-s",
        "0",
        "--out",
        run.to_str().unwrap(),
    ];
    args.extend(common::TINY_MODEL_ARGS);
    let out = Command::new(env!("CARGO_BIN_EXE_mlx-llama"))
        .args(&args)
        .arg("--data-cache")
        .arg(common::data_cache())
        .env_remove("MLX_PROGRESS")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let records: Vec<serde_json::Value> = std::fs::read_to_string(run.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(records.len(), 8);
    let num = |r: &serde_json::Value, k: &str| r[k].as_f64().unwrap();
    let lines: Vec<BTreeMap<String, String>> = stdout
        .lines()
        .filter(|l| l.starts_with("step="))
        .map(fields)
        .collect();
    let at: Vec<(u64, bool)> = lines
        .iter()
        .map(|l| (l["step"].parse().unwrap(), l.contains_key("loss")))
        .collect();
    // Lines after steps 3 and 6 and the last; the validation after step 4
    // has a line of its own; the last step's validation joins its line.
    assert_eq!(
        at,
        [(3, true), (4, false), (6, true), (8, true)],
        "{stdout}"
    );
    for (line, from) in lines
        .iter()
        .filter(|l| l.contains_key("loss"))
        .zip([0, 3, 6])
    {
        let to: usize = line["step"].parse().unwrap();
        let interval = &records[from..to];
        let n = interval.len() as f64;
        let loss = interval.iter().map(|r| num(r, "loss")).sum::<f64>() / n;
        let ms = interval.iter().map(|r| num(r, "ms_per_step")).sum::<f64>() / n;
        // Tokens over time: each step's tokens are its rate times its time.
        let tokens: f64 = interval
            .iter()
            .map(|r| num(r, "tokens_per_s") * num(r, "ms_per_step") / 1e3)
            .sum();
        assert_eq!(line["loss"], format!("{loss:.4}"), "steps {from}..{to}");
        assert_eq!(
            line["ms_per_step"],
            format!("{ms:.1}"),
            "steps {from}..{to}"
        );
        assert_eq!(
            line["tokens_per_s"],
            format!("{:.0}", tokens / (ms * n / 1e3)),
            "steps {from}..{to}"
        );
        // The rate is the line's own step's.
        let lr: f64 = line["lr"].parse().unwrap();
        assert!((lr - num(&records[to - 1], "learning_rate")).abs() < 1e-9);
    }
    // A validation's loss and time are its step's record's.
    for (step, line) in [(4, &lines[1]), (8, &lines[3])] {
        let r = &records[step - 1];
        assert_eq!(line["eval_loss"], format!("{:.4}", num(r, "eval_loss")));
        assert_eq!(line["eval_ms"], format!("{:.1}", num(r, "eval_ms")));
    }
    // The validation's time is outside its step's: one after the other,
    // each step's record comes its time (and its validation's) after the
    // one before (24 validation batches take several steps' time).
    for k in 1..8 {
        let gap_ms = (num(&records[k], "unix_time") - num(&records[k - 1], "unix_time")) * 1e3;
        let step_ms = num(&records[k], "ms_per_step");
        let eval_ms = records[k]
            .get("eval_ms")
            .map_or(0.0, |v| v.as_f64().unwrap());
        assert_eq!(eval_ms > 0.0, k + 1 == 4 || k + 1 == 8, "step {}", k + 1);
        assert!(
            (gap_ms - step_ms - eval_ms).abs() < 20.0 + 0.05 * gap_ms,
            "step {}: {gap_ms:.1} ms after the one before, of which {step_ms:.1} ms the step and {eval_ms:.1} ms its validation",
            k + 1
        );
        if eval_ms > 0.0 {
            assert!(eval_ms > step_ms, "step {}: {eval_ms} vs {step_ms}", k + 1);
        }
    }
    // metrics.csv: every field of metrics.jsonl, as its columns.
    let csv = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let header: Vec<&str> = csv.lines().next().unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    assert_eq!(rows.len(), 8);
    for (record, row) in records.iter().zip(&rows) {
        for (key, value) in record.as_object().unwrap() {
            let col = header
                .iter()
                .position(|h| h == key)
                .unwrap_or_else(|| panic!("metrics.csv has no column {key}: {header:?}"));
            let cell: f64 = row[col].parse().unwrap();
            assert_eq!(cell, value.as_f64().unwrap(), "{key}");
        }
    }
}
