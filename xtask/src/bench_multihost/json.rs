//! `multihost.json`: written from a run's results, and read back to analyse
//! them again (`--from-run`).

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::{Value, json};

use crate::alpha_beta::{self, Fit, Projection};
use crate::bench_collectives::{CollectivesArgs, Row, Run};

use super::goals::goals;
use super::mlx::{MlxRow, MlxRun};
use super::projection::{Projections, efficiency};
use super::report::Report;
use super::results::{RateFits, RateResult};
use super::{BACKENDS, analyse};

/// `--from-run DIR`: the measurements of an earlier run (its
/// `multihost.json`) analysed again, with this command's projection options,
/// into the same folder.
pub(super) fn reanalyse(a: &CollectivesArgs, dir: &Path) -> Result<()> {
    let path = dir.join("multihost.json");
    let text =
        std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    let v: Value =
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    let (report, results) = from_json(&v, a)
        .with_context(|| format!("{} is not a multi-host report", path.display()))?;
    analyse(a, &report, &results, dir)
}

/// The report and measurements [`to_json`] wrote (`None` if something is missing).
fn from_json(v: &Value, a: &CollectivesArgs) -> Option<(Report, Vec<RateResult>)> {
    let strs = |x: &Value| -> Vec<String> {
        x.as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str().map(String::from))
            .collect()
    };
    let text = |x: &Value| x.as_str().map(String::from);
    let mut results = Vec::new();
    for r in v["rates"].as_array()? {
        let runs = r["runs"]
            .as_array()?
            .iter()
            .map(|x| Run {
                backend: text(&x["backend"]).unwrap_or_default(),
                world: x["world"].as_u64().unwrap_or(0) as usize,
                status: text(&x["status"]).unwrap_or_default(),
                reason: text(&x["reason"]),
                wall_s: x["wall_s"].as_f64().unwrap_or(0.0),
                ceiling: vec![],
                rows: x["rows"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|y| {
                        Some(Row {
                            op: text(&y["op"])?,
                            bytes: y["bytes"].as_u64()?,
                            time_us: y["time_us"].as_f64()?,
                            algbw: y["algbw_gbs"].as_f64()?,
                            busbw: y["busbw_gbs"].as_f64()?,
                            ceiling: 0.0,
                            ratio: y["ratio"].as_f64()?,
                        })
                    })
                    .collect(),
            })
            .collect();
        let mlx = r["mlx"]
            .as_array()?
            .iter()
            .map(|m| MlxRun {
                world: m["world"].as_u64().unwrap_or(0) as usize,
                status: text(&m["status"]).unwrap_or_default(),
                reason: text(&m["reason"]),
                rows: m["rows"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|y| {
                        Some(MlxRow {
                            bytes: y["bytes"].as_u64()?,
                            secs: y["median_s"].as_f64()?,
                            busbw: y["busbw_gbs"].as_f64()?,
                            ok: y["ok"].as_bool().unwrap_or(false),
                        })
                    })
                    .collect(),
            })
            .collect();
        let floats = |x: &Value| -> Vec<f64> {
            x.as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_f64)
                .collect()
        };
        results.push(RateResult {
            rate: text(&r["rate"])?,
            bits: r["bits_per_sec"].as_u64()?,
            ceiling: match r["ceiling_gbs"].as_f64() {
                Some(g) => Ok(g),
                None => Err(text(&r["ceiling_error"]).unwrap_or_else(|| "not measured".into())),
            },
            ceiling_each: floats(&r["ceiling_transfers_gbs"]),
            concurrent: r["concurrent_streams"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| {
                    let n = c["n"].as_u64().unwrap_or(0) as usize;
                    match c["gbs"].as_array() {
                        Some(_) => (n, Ok(floats(&c["gbs"]))),
                        None => (n, Err(text(&c["error"]).unwrap_or_default())),
                    }
                })
                .collect(),
            runs,
            mlx,
            load_before: text(&r["load_average_before"]),
        });
    }
    let worlds: Vec<usize> = v["worlds"]
        .as_array()?
        .iter()
        .filter_map(|w| w.as_u64().map(|w| w as usize))
        .collect();
    let mut backends: Vec<String> = Vec::new();
    for b in BACKENDS {
        let present = results
            .iter()
            .any(|r| r.runs.iter().any(|x| x.backend == b) || (b == "mlx" && !r.mlx.is_empty()));
        if present {
            backends.push(b.into());
        }
    }
    let report = Report {
        command: text(&v["command"])?,
        reanalysis: Some(a.command_line()),
        n_hosts: v["hosts"].as_u64()? as usize,
        worlds,
        backends,
        // What the rows hold, where the report does not say.
        ops: match strs(&v["ops"]) {
            ops if !ops.is_empty() => ops,
            _ => ["all_sum", "all_gather", "sum_scatter"]
                .into_iter()
                .filter(|op| {
                    results
                        .iter()
                        .flat_map(|r| r.runs.iter().flat_map(|x| &x.rows))
                        .any(|x| x.op == *op)
                })
                .map(String::from)
                .collect(),
        },
        max_bytes: v["max_bytes"].as_u64().unwrap_or_else(|| {
            results
                .iter()
                .flat_map(|r| r.runs.iter().flat_map(|x| &x.rows))
                .map(|x| x.bytes)
                .max()
                .unwrap_or(0)
        }),
        cores: v["cores"].as_u64().unwrap_or(0) as usize,
        load: (
            text(&v["load_average_before"]),
            text(&v["load_average_after"]),
        ),
        wall_s: v["wall_s"].as_f64().unwrap_or(0.0),
        grad_bytes: alpha_beta::reference_llama_parameters() * 4,
        compute_s: a.compute_ms / 1e3,
    };
    Some((report, results))
}

fn fit_json(f: &Option<Fit>, bits: u64) -> Value {
    match f {
        Some(x) => json!({
            "alpha_s": x.alpha, "beta_s_per_byte": x.beta, "inv_beta_gbs": 1.0 / x.beta / 1e9,
            "link_efficiency": efficiency(x, bits), "rms_rel_error": x.rms_rel,
            "max_rel_error": x.max_rel, "points": x.samples,
        }),
        None => Value::Null,
    }
}

fn proj_json(x: &Projection) -> Value {
    json!({
        "hosts": x.hosts, "all_sum_s": x.comm_s, "step_serial_s": x.step_serial_s,
        "step_overlap_s": x.step_overlap_s, "efficiency_serial": x.eff_serial,
        "efficiency_overlap": x.eff_overlap,
    })
}

pub(super) fn to_json(
    c: &Report,
    results: &[RateResult],
    fits: &[RateFits],
    proj: Option<&Projections>,
) -> Value {
    let rates: Vec<Value> = results
        .iter()
        .map(|r| {
            let runs: Vec<Value> = r
                .runs
                .iter()
                .map(|x| {
                    json!({
                        "backend": x.backend, "world": x.world, "status": x.status,
                        "reason": x.reason, "wall_s": x.wall_s,
                        "rows": x.rows.iter().map(|y| json!({
                            "op": y.op, "bytes": y.bytes, "time_us": y.time_us,
                            "algbw_gbs": y.algbw, "busbw_gbs": y.busbw, "ratio": y.ratio,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            let mlx: Vec<Value> = r
                .mlx
                .iter()
                .map(|m| {
                    json!({
                        "world": m.world, "status": m.status, "reason": m.reason,
                        "rows": m.rows.iter().map(|y| json!({
                            "op": "all_sum", "bytes": y.bytes, "median_s": y.secs,
                            "busbw_gbs": y.busbw, "ok": y.ok,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            json!({
                "rate": r.rate, "bits_per_sec": r.bits,
                "ceiling_gbs": r.ceiling.as_ref().ok(), "ceiling_error": r.ceiling.as_ref().err(),
                "ceiling_transfers_gbs": r.ceiling_each,
                "concurrent_streams": r.concurrent.iter().map(|(n, v)| json!({
                    "n": n, "gbs": v.as_ref().ok(), "error": v.as_ref().err(),
                })).collect::<Vec<_>>(),
                "load_average_before": r.load_before,
                "runs": runs, "mlx": mlx,
            })
        })
        .collect();
    let fits: Vec<Value> = fits
        .iter()
        .map(|f| {
            json!({
                "rate": f.rate, "joint": fit_json(&f.joint, f.bits),
                "per_world": f.per_world.iter().map(|(w, x)| json!({"world": w, "fit": fit_json(x, f.bits)})).collect::<Vec<_>>(),
            })
        })
        .collect();
    let goals: Vec<Value> = goals(results, &c.worlds)
        .into_iter()
        .map(|(g, got)| json!({"goal": g, "measured": got.as_ref().map(|x| &x.0), "met": got.map(|x| x.1)}))
        .collect();
    json!({
        "command": c.command,
        "analysed_again_by": c.reanalysis,
        "ops": c.ops,
        "max_bytes": c.max_bytes,
        "hosts": c.n_hosts,
        "worlds": c.worlds,
        "cores": c.cores,
        "load_average_before": c.load.0,
        "load_average_after": c.load.1,
        "wall_s": c.wall_s,
        "goals": goals,
        "rates": rates,
        "fits": fits,
        "projection": proj.map(|p| json!({
            "gradient_bytes": c.grad_bytes,
            "compute_s": c.compute_s,
            "fitted_over": p.over,
            "best_efficiency": p.best.as_ref().map(|(r, e)| json!({"rate": r, "efficiency": e})),
            "rates": p.rates.iter().map(|r| json!({
                "rate": r.name, "fit_from": r.from, "alpha_s": r.alpha,
                "link_efficiency": r.efficiency, "beta_s_per_byte": r.beta,
                "beta_at_best_efficiency_s_per_byte": r.beta_best,
                "rows": r.rows.iter().map(|(x, l)| json!({
                    "fit": proj_json(x), "at_best_efficiency": l.as_ref().map(proj_json),
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
        })),
    })
}
