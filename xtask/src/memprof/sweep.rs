//! The comparison of `--shard` modes and `--grad-checkpoint` policies:
//! per-rank peak RSS and array bytes at each world size, one line per
//! combination, in `sharding.md` and `sharding.png`.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context, Result};

use super::report::stats;
use super::{Args, Who, WorldRun};
use crate::report_common::register_chart_font;

const MIB: f64 = (1u64 << 20) as f64;

/// One combination's figures: per world size, the largest rank's peak RSS
/// and peak array bytes.
pub(super) struct Config {
    shard: String,
    grad_checkpoint: String,
    /// (world, max rank peak RSS, max rank array peak).
    worlds: Vec<(usize, u64, u64)>,
}

impl Config {
    /// The figures of `runs`, run with `--shard shard --grad-checkpoint gc`.
    pub(super) fn new(shard: &str, gc: &str, runs: &[WorldRun]) -> Config {
        let worlds = runs
            .iter()
            .map(|run| {
                let (per, _) = stats(run);
                let ranks = per.iter().filter(|s| matches!(s.who, Who::Rank(_)));
                let rss = ranks.clone().map(|s| s.peak).max().unwrap_or(0);
                let arrays = ranks.filter_map(|s| s.array_peak).max().unwrap_or(0);
                (run.world, rss, arrays)
            })
            .collect();
        Config {
            shard: shard.to_string(),
            grad_checkpoint: gc.to_string(),
            worlds,
        }
    }

    fn label(&self) -> String {
        format!(
            "--shard {} --grad-checkpoint {}",
            self.shard, self.grad_checkpoint
        )
    }
}

/// Writes `sharding.md` and `sharding.png` into `out` and prints the table.
pub(super) fn write(a: &Args, out: &Path, configs: &[Config]) -> Result<()> {
    let mut s = format!(
        "# Per-rank memory by sharding mode\n\n`cargo xtask memprof --worlds {} --shards {} --grad-checkpoints {} --steps {} --per-rank-batch {}{}`: \
         the largest rank's peak RSS and peak array bytes (`memory::peak`), MiB.\n\n\
         | --shard | --grad-checkpoint | world | peak RSS MiB | peak arrays MiB | arrays vs world 1 |\n|---|---|---|---|---|---|\n",
        join(&a.worlds),
        a.shards.join(","),
        a.grad_checkpoints.join(","),
        a.steps,
        a.per_rank_batch,
        if a.trainer.is_empty() {
            String::new()
        } else {
            format!(" -- {}", a.trainer.join(" "))
        }
    );
    for c in configs {
        let base = c.worlds.first().map_or(0, |w| w.2).max(1) as f64;
        for &(world, rss, arrays) in &c.worlds {
            writeln!(
                s,
                "| {} | {} | {world} | {:.1} | {:.1} | {:.2} |",
                c.shard,
                c.grad_checkpoint,
                rss as f64 / MIB,
                arrays as f64 / MIB,
                arrays as f64 / base
            )?;
        }
    }
    let md = out.join("sharding.md");
    std::fs::write(&md, &s).with_context(|| format!("writing {}", md.display()))?;
    let png = out.join("sharding.png");
    chart(&png, configs)?;
    println!("{s}");
    println!("xtask: sharding table {}", md.display());
    println!("xtask: sharding chart {}", png.display());
    Ok(())
}

fn join(xs: &[usize]) -> String {
    xs.iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Two panels (peak RSS, peak arrays) against the world size; every
/// combination a line of its own colour, shifted a little sideways, all in
/// the legend.
fn chart(path: &Path, configs: &[Config]) -> Result<()> {
    use plotters::prelude::*;

    const COLORS: [(u8, u8, u8); 8] = [
        (31, 119, 180),
        (255, 127, 14),
        (44, 160, 44),
        (214, 39, 40),
        (148, 103, 189),
        (140, 86, 75),
        (227, 119, 194),
        (23, 190, 207),
    ];
    register_chart_font();
    let root = BitMapBackend::new(path, (1200, 520)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let panels = root.split_evenly((1, 2));
    let worlds: Vec<usize> = configs
        .iter()
        .flat_map(|c| c.worlds.iter().map(|w| w.0))
        .collect();
    let x_max = worlds.iter().copied().max().unwrap_or(1) as f64 + 0.5;
    for (panel, (title, pick)) in panels.iter().zip([
        ("peak RSS per rank", 1usize),
        ("peak array bytes per rank", 2usize),
    ]) {
        let value = |w: &(usize, u64, u64)| if pick == 1 { w.1 } else { w.2 } as f64 / MIB;
        let y_max = configs
            .iter()
            .flat_map(|c| c.worlds.iter().map(value))
            .fold(1.0f64, f64::max)
            * 1.15;
        let mut chart = ChartBuilder::on(panel)
            .caption(title, ("sans-serif", 20))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(64)
            .build_cartesian_2d(0.5f64..x_max, 0f64..y_max)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        chart
            .configure_mesh()
            .x_desc("ranks (world size)")
            .y_desc("MiB")
            .x_labels(x_max as usize + 1)
            .x_label_formatter(&|x| {
                if (x - x.round()).abs() < 1e-6 {
                    format!("{x:.0}")
                } else {
                    String::new()
                }
            })
            .label_style(("sans-serif", 14))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        for (i, c) in configs.iter().enumerate() {
            let (r, g, b) = COLORS[i % COLORS.len()];
            let color = RGBAColor(r, g, b, 1.0);
            // Each line a little to the side of the others, so that lines
            // with the same figures (stages 1 and 2 here) stay visible.
            let shift = (i as f64 - (configs.len() as f64 - 1.0) / 2.0) * 0.03;
            let pts: Vec<(f64, f64)> = c
                .worlds
                .iter()
                .map(|w| (w.0 as f64 + shift, value(w)))
                .collect();
            let style = color.stroke_width(2);
            let series = chart.draw_series(LineSeries::new(pts, style).point_size(4));
            series
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .label(c.label())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperRight)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .label_font(("sans-serif", 12))
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
