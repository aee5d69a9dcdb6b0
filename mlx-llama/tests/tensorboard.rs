//! TensorBoard event files read back by TensorBoard's own reader
//! (`EventAccumulator`, from `pip install tensorboard`): the same scalars as
//! metrics.jsonl, and the run's options as the HParams dashboard's plugin
//! reads them. Skips, saying why, where Python or the package is missing,
//! except under CI (the `CI` variable set), where it fails.

mod common;

use std::process::Command;

use mlx_llama::metrics::ReportTo;
use mlx_llama::tensorboard::HParam;
use mlx_llama::train;

const READ_BACK: &str = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
out = {tag: [[e.step, e.value, e.wall_time] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
print(json.dumps(out))
"#;

/// The hyperparameters as the HParams plugin reads them: through the data
/// provider TensorBoard serves from (`hparams_metadata`), parsed with the
/// plugin's own `parse_session_start_info_plugin_data`, and the experiment
/// the dashboard infers from them (its hyperparameters and metrics).
const READ_HPARAMS: &str = r#"
import json, sys
from tensorboard import context
from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
from tensorboard.plugins import base_plugin
from tensorboard.plugins.hparams import backend_context, metadata
logdir = sys.argv[1]
mux = plugin_event_multiplexer.EventMultiplexer()
mux.AddRunsFromDirectory(logdir)
mux.Reload()
provider = data_provider.MultiplexerDataProvider(mux, logdir)
hp = backend_context.Context(base_plugin.TBContext(logdir=logdir, multiplexer=mux, data_provider=provider))
rc = context.RequestContext()
content = hp.hparams_metadata(rc, experiment_id="")
sessions = []
for run, tags in content.items():
    for tag, c in tags.items():
        assert tag == metadata.SESSION_START_INFO_TAG, tag
        info = metadata.parse_session_start_info_plugin_data(c)
        sessions.append({
            "hparams": {k: getattr(v, v.WhichOneof("kind")) for k, v in info.hparams.items()},
            "group": info.group_name,
            "start": info.start_time_secs,
        })
exp = hp.experiment_from_metadata(rc, "", include_metrics=True, hparams_run_to_tag_to_content=content, data_provider_hparams=None)
print(json.dumps({
    "sessions": sessions,
    "hparams": sorted(h.name for h in exp.hparam_infos),
    "metrics": sorted(m.name.tag for m in exp.metric_infos),
}))
"#;

/// Whether TensorBoard's reader can run here; `None` with the reason when
/// not (a failure under CI).
fn reader_missing() -> Option<String> {
    let why = match Command::new("python3")
        .args(["-c", "import tensorboard"])
        .output()
    {
        Err(e) => format!("python3 cannot run: {e}"),
        Ok(o) if !o.status.success() => format!(
            "python3 cannot import tensorboard (pip install tensorboard): {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ),
        Ok(_) => return None,
    };
    if std::env::var_os("CI").is_some() {
        panic!("under CI TensorBoard's reader must be installed: {why}");
    }
    Some(why)
}

#[test]
fn tensorboard_reads_back_the_scalars_of_metrics_jsonl() {
    if let Some(why) = reader_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let cfg = mlx_llama::TrainConfig {
        eval_every: 2,
        eval_batches: 1,
        ..common::tiny(&out, 4)
    };
    train(&cfg, &mlx_dist::Group::single()).unwrap();
    let events: Vec<_> = std::fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("events.out.tfevents."))
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    let o = Command::new("python3")
        .args(["-c", READ_BACK])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rows: Vec<serde_json::Value> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let series = |tag: &str| -> Vec<(u64, f64, f64)> {
        got[tag]
            .as_array()
            .unwrap_or_else(|| panic!("no {tag} in {got}"))
            .iter()
            .map(|e| {
                (
                    e[0].as_u64().unwrap(),
                    e[1].as_f64().unwrap(),
                    e[2].as_f64().unwrap(),
                )
            })
            .collect()
    };
    for (tag, key) in [
        ("train/loss", "loss"),
        ("train/learning_rate", "learning_rate"),
        ("train/epoch", "epoch"),
        ("perf/tokens_per_s", "tokens_per_s"),
        ("perf/ms_per_step", "ms_per_step"),
        ("perf/comm_ms", "comm_ms"),
        ("perf/comm_wait_ms", "comm_wait_ms"),
        ("memory/peak_mib", "peak_mib"),
        ("memory/active_mib", "active_mib"),
    ] {
        let s = series(tag);
        assert_eq!(s.len(), rows.len(), "{tag}");
        for ((step, value, wall), row) in s.iter().zip(&rows) {
            assert_eq!(*step, row["step"].as_u64().unwrap(), "{tag}");
            let want = row[key].as_f64().unwrap();
            // Stored as float32, as TensorBoard's simple_value (compared as
            // float32: the JSON between may move the last bit of a double).
            assert_eq!(*value as f32, want as f32, "{tag} step {step}");
            let unix_time = row["unix_time"].as_f64().unwrap();
            assert!(
                (wall - unix_time).abs() < 1e-6,
                "{tag}: {wall} vs {unix_time}"
            );
        }
    }
    let eval: Vec<(u64, f32)> = series("eval/loss")
        .iter()
        .map(|e| (e.0, e.1 as f32))
        .collect();
    let want: Vec<(u64, f32)> = rows
        .iter()
        .filter_map(|r| {
            r.get("eval_loss")
                .map(|v| (r["step"].as_u64().unwrap(), v.as_f64().unwrap() as f32))
        })
        .collect();
    assert_eq!(eval, want);
    assert_eq!(want.iter().map(|e| e.0).collect::<Vec<_>>(), vec![2, 4]);
    // The validation's own time, on the steps that evaluate.
    let eval_ms: Vec<(u64, f32)> = series("perf/eval_ms")
        .iter()
        .map(|e| (e.0, e.1 as f32))
        .collect();
    let want: Vec<(u64, f32)> = rows
        .iter()
        .filter_map(|r| {
            r.get("eval_ms")
                .map(|v| (r["step"].as_u64().unwrap(), v.as_f64().unwrap() as f32))
        })
        .collect();
    assert_eq!(eval_ms, want);
    assert_eq!(want.len(), 2);

    // The options, as the HParams dashboard reads them.
    let o = Command::new("python3")
        .args(["-c", READ_HPARAMS])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let got: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let sessions = got["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1, "{got}");
    let hp = &sessions[0]["hparams"];
    // The options given, by their run.toml names.
    assert_eq!(hp["steps"], 4.0);
    assert_eq!(hp["lr"], 3e-3);
    assert_eq!(hp["eval_every"], 2.0);
    assert_eq!(hp["schedule"], "constant");
    assert_eq!(hp["data"], "offline");
    assert_eq!(hp["no_overlap_steps"], false);
    assert_eq!(hp["report_to"], "tensorboard,jsonl,csv");
    assert!(
        hp.get("min_lr").is_none(),
        "unset options are left out: {hp}"
    );
    // Every one the run writes, with its value.
    let ours = mlx_llama::metrics::hparams(&cfg);
    assert_eq!(hp.as_object().unwrap().len(), ours.len(), "{hp}");
    for (name, value) in &ours {
        let read = &hp[name.as_str()];
        match value {
            HParam::Number(x) => assert_eq!(read.as_f64(), Some(*x), "{name}"),
            HParam::Text(t) => assert_eq!(read.as_str(), Some(t.as_str()), "{name}"),
            HParam::Bool(b) => assert_eq!(read.as_bool(), Some(*b), "{name}"),
        }
    }
    assert_eq!(sessions[0]["group"].as_str().unwrap().len(), 64);
    let start = sessions[0]["start"].as_f64().unwrap();
    assert!(start > 1.7e9 && start <= rows[0]["unix_time"].as_f64().unwrap());
    // The dashboard's columns: the options, and the scalars as metrics.
    let names: Vec<&str> = got["hparams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"lr") && names.contains(&"schedule"),
        "{got}"
    );
    let metrics: Vec<&str> = got["metrics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    for tag in ["train/loss", "eval/loss", "train/learning_rate"] {
        assert!(metrics.contains(&tag), "{tag} not in {got}");
    }
}

#[test]
fn report_to_chooses_the_files_a_run_writes() {
    for (to, tensorboard, jsonl, csv) in [
        ("tensorboard", true, false, false),
        ("jsonl", false, true, false),
        ("csv", false, true, true),
        ("none", false, false, false),
        ("jsonl,tensorboard", true, true, false),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let cfg = mlx_llama::TrainConfig {
            report_to: to.parse::<ReportTo>().unwrap(),
            ..common::tiny(&out, 1)
        };
        train(&cfg, &mlx_dist::Group::single()).unwrap();
        let names: Vec<String> = std::fs::read_dir(&out)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let has = |p: &str| names.iter().any(|n| n.starts_with(p));
        assert_eq!(has("events.out.tfevents."), tensorboard, "{to}: {names:?}");
        assert_eq!(has("metrics.jsonl"), jsonl, "{to}: {names:?}");
        assert_eq!(
            has("metrics.csv") && has("loss.png"),
            csv,
            "{to}: {names:?}"
        );
    }
    let e = "tensorboard,wandb".parse::<ReportTo>().unwrap_err();
    assert!(e.contains("`wandb`"), "{e}");
    assert_eq!("all".parse::<ReportTo>().unwrap(), ReportTo::default());
    assert_eq!(ReportTo::default().to_string(), "tensorboard,jsonl,csv");
}
