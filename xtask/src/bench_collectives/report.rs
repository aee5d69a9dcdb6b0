//! The report half of `cargo xtask bench collectives`: the goals of issue
//! 6 checked on what was measured, `collectives.md` (a table per backend,
//! collective and world size) and `collectives.json`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

use super::{CollectivesArgs, Measured, Row, Run};
use crate::report_common::{Goal, goals_table};

/// The goals of issue 6, at world 2 over the ring.
const GOAL_BYTES: u64 = 64 << 20;
const GOAL_RATIO: f64 = 0.7;
const GOAL_SMALL_BYTES: u64 = 1 << 10;
const GOAL_SMALL_US: f64 = 100.0;

/// Writes `collectives.md` and `collectives.json` into `out` and prints the
/// table; fails naming every run that failed.
pub(super) fn write(a: &CollectivesArgs, out: &Path, m: &Measured) -> Result<()> {
    let Measured { runs, avg, load } = m;
    let table = markdown(a, runs, avg.as_ref(), load);
    let md = out.join("collectives.md");
    std::fs::write(&md, &table).with_context(|| format!("writing {}", md.display()))?;
    let json = out.join("collectives.json");
    std::fs::write(
        &json,
        serde_json::to_string_pretty(&to_json(a, runs, avg.as_ref(), load))?,
    )
    .with_context(|| format!("writing {}", json.display()))?;
    println!("\n{table}");
    println!("xtask: table {}", md.display());
    println!("xtask: json  {}", json.display());

    // The first line of each reason; the rest (the log's end) is above and in the table.
    let first = |s: &str| s.lines().next().unwrap_or_default().to_string();
    let mut failed: Vec<String> = runs
        .iter()
        .filter(|r| r.status == "failed")
        .map(|r| {
            let reason = first(r.reason.as_deref().unwrap_or("?"));
            format!("{} world {}: {reason}", r.backend, r.world)
        })
        .collect();
    if let Some(Err(e)) = avg {
        failed.push(format!("average_gradients: {}", first(&format!("{e:#}"))));
    }
    if !failed.is_empty() {
        bail!(
            "{} run(s) failed (details in {}):\n  {}",
            failed.len(),
            md.display(),
            failed.join("\n  ")
        );
    }
    Ok(())
}

/// `1 KiB`, `64 MiB`.
pub(crate) fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{} MiB", b >> 20)
    } else {
        format!("{} KiB", b >> 10)
    }
}

/// A time in the unit that keeps it readable.
pub(crate) fn time(us: f64) -> String {
    if us >= 1_000.0 {
        format!("{:.2} ms", us / 1e3)
    } else {
        format!("{us:.1} us")
    }
}

/// The issue's goals, checked on the world-2 ring all_sum rows.
fn goals(runs: &[Run]) -> Vec<Goal> {
    let row_of = |backend: &'static str, bytes: u64| {
        runs.iter()
            .filter(move |r| r.backend == backend && r.world == 2)
            .flat_map(|r| &r.rows)
            .find(move |x| x.op == "all_sum" && x.bytes == bytes)
    };
    let row = |bytes: u64| row_of("ring", bytes);
    let ratio = |r: &Row| {
        (
            format!(
                "{:.0}% ({:.3} of {:.3} GB/s)",
                r.ratio * 100.0,
                r.busbw,
                r.ceiling
            ),
            r.ratio >= GOAL_RATIO,
        )
    };
    vec![
        (
            format!(
                "ring all_sum, world 2, 64 MiB: bus bandwidth at least {:.0}% of one TCP stream",
                GOAL_RATIO * 100.0
            ),
            row(GOAL_BYTES).map(ratio),
        ),
        (
            format!(
                "(the same over TCP only, ring-tcp: at least {:.0}%)",
                GOAL_RATIO * 100.0
            ),
            row_of("ring-tcp", GOAL_BYTES).map(ratio),
        ),
        (
            format!("ring all_sum, world 2, 1 KiB: under {GOAL_SMALL_US:.0} us"),
            row(GOAL_SMALL_BYTES)
                .map(|r| (format!("{:.1} us", r.time_us), r.time_us < GOAL_SMALL_US)),
        ),
    ]
}

fn markdown(
    a: &CollectivesArgs,
    runs: &[Run],
    avg: Option<&Result<Value>>,
    load: &(Option<String>, Option<String>),
) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "`{}`: loopback, {} logical cores, load average {} before and {} after. Time is the mean \
         per operation on rank 0; bus bandwidth (busbw) follows the NCCL convention (all_sum: \
         algbw x 2(n-1)/n; all_gather: output bytes, x (n-1)/n; sum_scatter: input bytes, x \
         (n-1)/n); \"TCP\" is one loopback TCP \
         stream copying the same bytes, measured just before each run, and the ratio is busbw \
         over it.\n",
        a.command_line(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load.0.as_deref().unwrap_or("?"),
        load.1.as_deref().unwrap_or("?"),
    );
    let _ = writeln!(s, "### Goals (issue 6)\n");
    goals_table(&mut s, goals(runs), "no");
    for r in runs {
        match r.status.as_str() {
            "skipped" => {
                let _ = writeln!(
                    s,
                    "### {}: skipped\n\n{}\n",
                    r.backend,
                    r.reason.as_deref().unwrap_or("")
                );
                continue;
            }
            "failed" => {
                let _ = writeln!(
                    s,
                    "### {} world {}: FAILED\n\n```\n{}\n```\n",
                    r.backend,
                    r.world,
                    r.reason.as_deref().unwrap_or("")
                );
            }
            _ => {}
        }
        for op in &a.ops {
            let rows: Vec<&Row> = r.rows.iter().filter(|x| &x.op == op).collect();
            if rows.is_empty() {
                continue;
            }
            let _ = writeln!(
                s,
                "### {} {}, world {} ({:.0} s)\n",
                r.backend, op, r.world, r.wall_s
            );
            let _ = writeln!(
                s,
                "| size | time | algbw GB/s | busbw GB/s | TCP GB/s | busbw / TCP |"
            );
            let _ = writeln!(s, "|---:|---:|---:|---:|---:|---:|");
            for x in rows {
                let _ = writeln!(
                    s,
                    "| {} | {} | {:.3} | {:.3} | {:.3} | {:.0}% |",
                    human(x.bytes),
                    time(x.time_us),
                    x.algbw,
                    x.busbw,
                    x.ceiling,
                    x.ratio * 100.0
                );
            }
            let _ = writeln!(s);
        }
    }
    if let Some(avg) = avg {
        let _ = writeln!(
            s,
            "### average_gradients on the reference Llama's gradient tree, world 2, ring\n"
        );
        match avg {
            Ok(v) => {
                let _ = writeln!(
                    s,
                    "{} tensors, {:.1}M f32 parameters; median of {} ({}).\n",
                    v["tensors"],
                    v["parameters"].as_f64().unwrap_or(0.0) / 1e6,
                    v["iters"],
                    v["backend"].as_str().unwrap_or("?")
                );
                let _ = writeln!(s, "| | ms |");
                let _ = writeln!(s, "|---|---:|");
                for row in v["rows"].as_array().into_iter().flatten() {
                    let _ = writeln!(
                        s,
                        "| {} | {:.1} |",
                        row["label"].as_str().unwrap_or("?"),
                        row["ms"].as_f64().unwrap_or(f64::NAN)
                    );
                }
                let _ = writeln!(s);
            }
            Err(e) => {
                let _ = writeln!(s, "FAILED:\n\n```\n{e:#}\n```\n");
            }
        }
    }
    s
}

fn to_json(
    a: &CollectivesArgs,
    runs: &[Run],
    avg: Option<&Result<Value>>,
    load: &(Option<String>, Option<String>),
) -> Value {
    let runs: Vec<Value> = runs
        .iter()
        .map(|r| {
            let rows: Vec<Value> = r
                .rows
                .iter()
                .map(|x| {
                    json!({
                        "op": x.op, "bytes": x.bytes, "time_us": x.time_us,
                        "algbw_gbs": x.algbw, "busbw_gbs": x.busbw,
                        "tcp_gbs": x.ceiling, "ratio": x.ratio,
                    })
                })
                .collect();
            let ceiling: Vec<Value> = r
                .ceiling
                .iter()
                .map(|(b, g)| json!({"bytes": b, "gbs": g}))
                .collect();
            json!({
                "backend": r.backend,
                "world": if r.status == "skipped" { Value::Null } else { json!(r.world) },
                "status": r.status,
                "reason": r.reason,
                "wall_s": r.wall_s,
                "tcp_ceiling": ceiling,
                "rows": rows,
            })
        })
        .collect();
    json!({
        "command": a.command_line(),
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "load_average_before": load.0,
        "load_average_after": load.1,
        "max_bytes": a.max_bytes(),
        "runs": runs,
        "average_gradients": match avg {
            None => Value::Null,
            Some(Ok(v)) => v.clone(),
            Some(Err(e)) => json!({"error": format!("{e:#}")}),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(bytes: u64, time_us: f64, ratio: f64) -> Row {
        Row {
            op: "all_sum".into(),
            bytes,
            time_us,
            algbw: 1.0,
            busbw: ratio,
            ceiling: 1.0,
            ratio,
        }
    }

    fn ring2(rows: Vec<Row>) -> Run {
        Run {
            backend: "ring".into(),
            world: 2,
            status: "ok".into(),
            reason: None,
            wall_s: 1.0,
            ceiling: vec![],
            rows,
        }
    }

    #[test]
    fn goals_read_the_world_2_ring_all_sum() {
        let mut tcp = ring2(vec![row(64 << 20, 30_000.0, 0.71)]);
        tcp.backend = "ring-tcp".into();
        let runs = [
            ring2(vec![row(1024, 12.0, 1.5), row(64 << 20, 30_000.0, 0.69)]),
            tcp,
        ];
        let g = goals(&runs);
        assert_eq!(g[0].1.as_ref().map(|x| x.1), Some(false));
        assert!(g[0].1.as_ref().unwrap().0.starts_with("69%"));
        assert_eq!(
            g[1].1.as_ref().map(|x| x.1),
            Some(true),
            "ring-tcp read apart"
        );
        assert!(g[1].1.as_ref().unwrap().0.starts_with("71%"));
        assert_eq!(g[2].1, Some(("12.0 us".into(), true)));
        // Other backends or worlds do not count.
        let mut quic = ring2(vec![row(1024, 12.0, 1.0)]);
        quic.backend = "quic".into();
        assert!(goals(&[quic]).iter().all(|(_, v)| v.is_none()));
    }

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(human(1024), "1 KiB");
        assert_eq!(human(64 << 20), "64 MiB");
        assert_eq!(time(12.34), "12.3 us");
        assert_eq!(time(999.94), "999.9 us");
        assert_eq!(time(36_500.0), "36.50 ms");
    }
}
