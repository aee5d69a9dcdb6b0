//! MLX's ring across the hosts: its Python and benchmark script, and one
//! run of it per world size ([`MlxRun`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::bench_collectives::{CollectivesArgs, describe};
use crate::hosts::Hosts;
use crate::util::{Ended, log_tail, root};

use super::measure::{in_namespace, run_together};

/// First port of MLX's ranks (each MLX run takes the next ten).
pub(super) const MLX_PORT: u16 = 42323;

/// MLX's message sizes (the anchor's defaults), cut at `--max-bytes`.
const MLX_SIZES: [(&str, u64); 6] = [
    ("1K", 1 << 10),
    ("64K", 64 << 10),
    ("1M", 1 << 20),
    ("16M", 16 << 20),
    ("64M", 64 << 20),
    ("256M", 256 << 20),
];

/// One MLX all_sum size.
pub(super) struct MlxRow {
    pub(super) bytes: u64,
    /// The slowest rank's median seconds.
    pub(super) secs: f64,
    pub(super) busbw: f64,
    pub(super) ok: bool,
}

/// MLX's ring at one world size.
pub(super) struct MlxRun {
    pub(super) world: usize,
    /// "ok", "failed" or "skipped".
    pub(super) status: String,
    pub(super) reason: Option<String>,
    pub(super) rows: Vec<MlxRow>,
}

/// MLX's Python and its benchmark script, or why MLX is skipped.
pub(super) fn mlx_setup() -> std::result::Result<(PathBuf, PathBuf), String> {
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let python = home.join("mlx-venv").join("bin").join("python");
    if !python.is_file() {
        return Err(format!(
            "{} is missing (set it up as ../shared/anchors/README.md says: `python3 -m venv \
             ~/mlx-venv && ~/mlx-venv/bin/pip install \"mlx[cpu]\" numpy`)",
            python.display()
        ));
    }
    let script = root()
        .join("..")
        .join("shared")
        .join("anchors")
        .join("mlx")
        .join("allsum_bench.py");
    if !script.is_file() {
        return Err(format!("{} is missing", script.display()));
    }
    Ok((python, script))
}

/// MLX's ring at world `w`: each rank started in its host's namespace with
/// `MLX_RANK` and `MLX_HOSTFILE` (the hosts' addresses), as the anchors'
/// README starts them.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_mlx(
    a: &CollectivesArgs,
    hosts: &Hosts,
    python: &Path,
    script: &Path,
    raw: &Path,
    tag: &str,
    w: usize,
    port: u16,
) -> MlxRun {
    let mut run = MlxRun {
        world: w,
        status: "failed".into(),
        reason: None,
        rows: vec![],
    };
    let hostfile = raw.join(format!("{tag}mlx-world{w}-hosts.json"));
    let list: Vec<Value> = hosts.ips[..w]
        .iter()
        .map(|ip| json!([format!("{ip}:{port}")]))
        .collect();
    if let Err(e) = std::fs::write(&hostfile, Value::Array(list).to_string()) {
        run.reason = Some(format!("writing {}: {e}", hostfile.display()));
        return run;
    }
    let sizes: Vec<&str> = MLX_SIZES
        .iter()
        .filter(|(_, b)| *b <= a.max_bytes())
        .map(|(s, _)| *s)
        .collect();
    let json_path = raw.join(format!("{tag}mlx-world{w}.json"));
    let _ = std::fs::remove_file(&json_path);
    let mut cmds = Vec::new();
    for r in 0..w {
        let mut c = in_namespace(&hosts.names[r]);
        c.arg(python)
            .arg(script)
            .args(["--backend", "ring", "--gather", ""])
            .args(["--sizes", &sizes.join(",")])
            .args(["--iters", if a.quick { "3" } else { "5" }])
            .args(["--warmup", "1"])
            .arg("--json")
            .arg(&json_path)
            .env("MLX_RANK", r.to_string())
            .env("MLX_HOSTFILE", &hostfile)
            .current_dir(root());
        if r == 0 {
            eprintln!(
                "\nxtask: {tag}mlx world {w}: MLX_RANK=r MLX_HOSTFILE={} {} (r = 0..{w})",
                hostfile.display(),
                describe(&c)
            );
        }
        cmds.push((c, raw.join(format!("{tag}mlx-world{w}-rank{r}.log"))));
    }
    let logs: Vec<PathBuf> = cmds.iter().map(|(_, l)| l.clone()).collect();
    let ended = run_together(cmds, Duration::from_secs(a.timeout.min(600)));
    for (r, e) in ended.into_iter().enumerate() {
        let why = match e {
            Ok(Ended::Exited(st)) if st.success() => continue,
            Ok(Ended::Exited(st)) => format!("rank {r} exited with {st}"),
            Ok(Ended::TimedOut) => format!("rank {r}: no result in time, stopped"),
            Err(e) => format!("rank {r}: {e:#}"),
        };
        run.reason = Some(format!(
            "{why}; the end of {}:\n{}",
            logs[r].display(),
            log_tail(&logs[r], 10)
        ));
        return run;
    }
    let report: Option<Value> = std::fs::read_to_string(&json_path)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let Some(report) = report else {
        run.reason = Some(format!("rank 0 wrote no {}", json_path.display()));
        return run;
    };
    run.rows = report["rows"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["op"] == "all_sum")
        .filter_map(|x| {
            Some(MlxRow {
                bytes: x["bytes"].as_u64()?,
                secs: x["med_maxrank_s"].as_f64()?,
                busbw: x["busbw_GBps"].as_f64()?,
                ok: x["ok"].as_bool().unwrap_or(false),
            })
        })
        .collect();
    run.status = "ok".into();
    run
}
